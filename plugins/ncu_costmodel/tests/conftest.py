"""Fixtures from tunecore's kit for plugin authors."""

from tunecore.testing.fixtures import matmul_task, target  # noqa: F401
