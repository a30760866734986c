"""Running the real ``tunecore`` command in tests: a plugin's command, or the core's with a plugin installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def run_cli(*args: str, cwd: Any = None, env: dict[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``tunecore ARGS`` in a subprocess (this Python, ``env`` added to the environment)."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "tunecore.cli", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def cli_json(result: subprocess.CompletedProcess) -> Any:
    """The JSON a successful command printed."""
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def assert_one_line_exit_2(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """What a user's mistake must give: exit code 2 and one line on stderr naming the problem."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tunecore: error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.stderr
