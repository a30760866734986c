"""``tunecore plugins``: installed plugins, their components and hooks, as JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_commands(register: Any) -> None:
    register("plugins", cmd_plugins, help="installed plugins and their components, as JSON")


def cmd_plugins(args: argparse.Namespace) -> int:
    from tunecore.registry import describe_plugins

    print(json.dumps(describe_plugins(), indent=2))
    return 0
