"""``tunecore predict``: a workload's latency predicted from its best records, optionally measured beside it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tunecore.cli import render
from tunecore.cli.args import add_common


def add_commands(register: Any) -> None:
    command = register("predict", cmd_predict, help="predict a workload's latency per task and end to end, "
                                                    "without measuring (--measure: and measure it too)")
    add_common(command)
    command.add_argument("--cost-model", default="cdmpp", help="a cost model that predicts latency (default: cdmpp)")
    command.add_argument("--option", "-O", action="append", metavar="NAME.KEY=VALUE",
                         help="cost model option, e.g. -O cdmpp.weights=model.pt")
    command.add_argument("--measure", action="store_true", help="also build and time the workload end to end")


def cmd_predict(args: argparse.Namespace) -> int:
    import os

    from tunecore import api
    from tunecore.options import options_for, parse_options
    from tunecore.predict import predict_workload
    from tunecore.registry import Registry
    from tunecore.targets import resolve_target
    from tunecore.workloads import load_workload, parse_input_shapes

    target = resolve_target(args.target)
    registry = Registry.shared()
    registry.check_target(target, cost_model=args.cost_model)
    options = parse_options(args.option, [args.cost_model])
    cost_model = api._construct(registry, "cost_model", args.cost_model,
                                **options_for(options, "cost_model", args.cost_model))
    # no store is fine: every task is predicted as it is (untuned)
    store = api.open_store(args.store, create=False) if args.store or os.path.exists("tunecore.db") else None
    try:
        workload = load_workload(args.model, parse_input_shapes(args.input_shape), args.layout,
                                          bool(args.winograd))
        doing = f"predicting {args.model}" + (" and measuring it" if args.measure else "")
        with render.console(stderr=True).status(doing):
            report = predict_workload(workload, target, store, cost_model, measure=args.measure)
    finally:
        cost_model.close()
        if store is not None:
            store.close()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    from rich.table import Table

    table = Table(title=f"{report['model']} on {report['device']}, predicted by {report['cost_model']}")
    for column in ("task", "calls", "schedule", "predicted ms", "stored ms"):
        table.add_column(column, justify="left" if column in ("task", "schedule") else "right")
    for row in report["tasks"]:
        table.add_row(row["task"], str(row["weight"]), row["schedule"], render.cell(row["predicted_ms"]),
                      render.cell(row["stored_ms"]))
    console = render.console()
    console.print(table)
    line = f"{report['model']}: predicted {report['predicted_ms']:.4g} ms end to end"
    if "measured_ms" in report:
        line += f", measured {report['measured_ms']:.4g} ms (error {report['error']:.1%})"
    console.print(line)
    if report["device_note"]:
        print(f"tunecore: note: {report['device_note']}", file=sys.stderr)
    return 0
