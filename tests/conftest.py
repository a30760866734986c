import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def target():
    from tunecore.targets import host_target

    return host_target()


@pytest.fixture(scope="session")
def matmul_task():
    from tunecore.testing import tiny_task

    return tiny_task()


def run_cli(*args, cwd=None, env=None, timeout=600):
    """Run the real `tunecore` command in a subprocess; returns CompletedProcess."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "tunecore.cli", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def assert_one_line_exit_2(result, *fragments):
    """What a user's mistake must give: exit code 2 and one line on stderr naming the problem."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tunecore: error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.stderr
