"""pytest fixtures for plugin tests: import them into your conftest.py

    from tunecore.testing.fixtures import matmul_task, target  # noqa: F401
"""

import pytest


@pytest.fixture(scope="session")
def target():
    """This machine as an LLVM target (its real mcpu and core count)."""
    from tunecore.targets import host_target

    return host_target()


@pytest.fixture(scope="session")
def matmul_task():
    """A 64x64x64 matmul task on that target."""
    from tunecore.testing import tiny_task

    return tiny_task()
