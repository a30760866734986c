"""``tunecore tasks``: a workload's tuning tasks."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tunecore.cli import render
from tunecore.cli.args import add_common


def add_commands(register: Any) -> None:
    add_common(register("tasks", cmd_tasks, help="list a workload's tuning tasks"), store=False)


def cmd_tasks(args: argparse.Namespace) -> int:
    from tunecore.targets import resolve_target
    from tunecore.workloads import extract_tasks, load_workload, parse_input_shapes

    target = resolve_target(args.target)
    tasks = extract_tasks(load_workload(args.model, parse_input_shapes(args.input_shape), args.layout,
                                          bool(args.winograd)), target)
    rows = [{"name": t.name, "task_id": t.task_id, "kernel_class": t.kernel_class, "weight": t.weight, "flops": t.flops,
             "args": t.args} for t in tasks]
    if args.json:
        print(json.dumps({"model": args.model, "target": target.export()["kind"], "tasks": rows}, indent=2))
        return 0
    from rich.table import Table

    table = Table(title=f"{args.model}: {len(tasks)} tasks, {sum(t.flops * t.weight for t in tasks) / 1e9:.3g} GFLOP")
    for column in ("task", "kernel class", "weight", "GFLOP", "id"):
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(r["name"], r["kernel_class"], str(r["weight"]), f"{r['flops'] / 1e9:.3g}", r["task_id"])
    render.console().print(table)
    return 0
