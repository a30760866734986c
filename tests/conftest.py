from tunecore.testing.fixtures import matmul_task, target  # noqa: F401
