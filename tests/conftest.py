import pytest

from tunecore.testing.fixtures import matmul_task, target  # noqa: F401


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server for the shared-store tests (see tests/fleet.py), in a directory of its own under /tmp:
    the postgres user cannot reach into pytest's (mode 0700, root's)."""
    import shutil
    import tempfile

    from tunecore.testing.fleet import Postgres

    directory = tempfile.mkdtemp(prefix="tunecore-pg-")
    server = Postgres(directory)
    yield server
    server.stop()
    shutil.rmtree(directory, ignore_errors=True)
