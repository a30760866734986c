"""``tunecore compile``: build a workload with its best records, check its outputs, time it against untuned."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tunecore.cli import render
from tunecore.cli.args import add_common


def add_commands(register: Any) -> None:
    command = register("compile", cmd_compile, help="build a workload with its best records; check and time it")
    add_common(command)
    command.add_argument("--output", "-o", default=None, help="write the tuned library here (.so)")


def cmd_compile(args: argparse.Namespace) -> int:
    from tunecore import api
    from tunecore.compile import compile_and_check
    from tunecore.layouts import last_tuned
    from tunecore.targets import resolve_target
    from tunecore.workloads import load_workload, parse_input_shapes

    target = resolve_target(args.target)
    store = api.open_store(args.store, create=False)
    try:
        workload = load_workload(args.model, parse_input_shapes(args.input_shape), args.layout, bool(args.winograd))
        tuned = last_tuned(store, workload.name)  # compile as the model was tuned, unless told otherwise
        if args.layout is None:
            workload.layout = tuned.get("layout", workload.layout)
        if args.winograd is None:
            workload.winograd = tuned.get("winograd", False)
        with render.console(stderr=True).status(f"compiling {args.model} tuned and untuned, checking and timing both"):
            report = compile_and_check(workload, target, store, output=args.output)
    finally:
        store.close()
    if not report["tasks_tuned"]:
        print(f"tunecore: nothing was tuned: no task of {report['model']} has a record in the store (run `tunecore "
              "run` with this --model, --target and --store first); the untuned build was checked and timed",
              file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=2))
    elif not report["tasks_tuned"]:
        render.console().print(
            f"{report['model']}: untuned {_ms(report['untuned_latency_ms'], report['untuned_passes_ms'])}; outputs "
            f"{'match' if report['outputs_match'] else 'DIFFER'}"
            + (f" (against {report['reference']} {report['reference_relative_error']:.2g})" if report["reference"]
               else ""), markup=False)
    else:
        if report["wrong_records"]:
            render.console(stderr=True).print(
                f"the best records of {', '.join(report['wrong_records'])} compute something else: marked failed in "
                "the store; built with the best correct record of each instead", markup=False)
        render.console().print(
            f"{report['model']}: tuned {_ms(report['latency_ms'], report['latency_passes_ms'])}, untuned "
            f"{_ms(report['untuned_latency_ms'], report['untuned_passes_ms'])}, {report['speedup']:.2f}x "
            f"({report['speedup_range'][0]:.2f}-{report['speedup_range'][1]:.2f}) over "
            f"{len(report['latency_passes_ms'])} alternating passes; "
            f"{report['tasks_tuned']}/{report['tasks_total']} tasks had records; "
            f"outputs {'match' if report['outputs_match'] else 'DIFFER'} "
            f"(max relative error {report['max_relative_error']:.2g}"
            + (f"; against {report['reference']} {report['reference_relative_error']:.2g}" if report["reference"]
               else "") + ")"
            + (f"; library written to {report['output']}" if report["output"] else "")
        )
    if not report["outputs_match"]:
        print("tunecore: error: the tuned build's outputs differ from the untuned build's"
              + (f" or {report['reference']}'s" if report["reference"] else ""), file=sys.stderr)
        return 1
    return 0


def _ms(median: float, passes: list[float]) -> str:
    return f"{median:.4g} ms ({min(passes):.4g}-{max(passes):.4g})"
