"""``tunecore run``: tune a workload (resumable)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from tunecore.cli import render
from tunecore.cli.args import add_common, add_tuning, duration


def add_commands(register: Any) -> None:
    run = register("run", cmd_run, help="tune a workload (resumes: records of earlier runs of this workload count)")
    add_common(run)
    run.add_argument("--search", default="random", help="search policy (see `tunecore plugins`)")
    run.add_argument("--then", default=None, metavar="SEARCH",
                     help="per task, once --search has nothing new to propose, spend the rest of the budget with this "
                          "search policy, starting from what was measured (e.g. --search transfer --then ansor)")
    run.add_argument("--cost-model", default="none", help="cost model (see `tunecore plugins`)")
    run.add_argument("--trials", "-n", type=int, default=None,
                     help="total measured candidates for this workload, earlier runs included")
    run.add_argument("--time-budget", type=duration, default=None, metavar="DURATION",
                     help="total tuning time for this workload, earlier runs included, e.g. 30m, 2h, 900 "
                          "(with --trials: whichever ends first)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--round-size", type=int, default=None, help="candidates per round (default: by budget)")
    add_tuning(run)


def cmd_run(args: argparse.Namespace) -> int:
    from rich.progress import TextColumn, TimeRemainingColumn

    from tunecore import api
    from tunecore.options import parse_options
    from tunecore.workloads import parse_input_shapes

    names = [args.search, args.cost_model, args.measurer, *filter(None, [args.then])]
    config = api.TuneConfig(
        args.model, input_shapes=parse_input_shapes(args.input_shape), layout=args.layout,
        winograd=bool(args.winograd), trials=args.trials,
        time_budget=args.time_budget, target=args.target, search=args.search,
        then=args.then, cost_model=args.cost_model, measurer=args.measurer, store=args.store, seed=args.seed,
        options=parse_options(args.option, names), scheduler=args.scheduler, round_size=args.round_size,
    )
    display = render.progress(TextColumn("trials"), TextColumn("best {task.fields[best]}"),
                              TextColumn("errors {task.fields[errors]}"),
                              after=(TextColumn("ETA"), TimeRemainingColumn()), transient=args.json)
    bar: dict[str, Any] = {}

    def on_tasks(tasks: list) -> None:
        bar["id"] = display.add_task(f"tuning {args.model}", total=None, best="-", errors=0)
        display.start()

    def on_round(report: Any) -> None:
        total = report.budget if math.isfinite(report.budget) else None  # a time budget alone: no end in trials
        display.update(bar["id"], total=total, completed=report.measured, best=render.best(report.estimated_latency),
                       errors=report.errors)

    try:
        summary = api.tune(config, on_round=on_round, on_tasks=on_tasks)
    finally:
        render.stop(display)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
    if summary["trials_measured"] and summary["errors"] == summary["trials_measured"]:
        # a run that measured nothing must not look like a success (apache/tvm#20314)
        print(f"tunecore: error: all {summary['errors']} measured candidates failed; their errors: "
              f"tunecore records list --json --store {args.store or 'tunecore.db'}", file=sys.stderr)
        return 1
    return 0


def print_summary(summary: Any) -> None:
    from rich.table import Table

    table = Table(title=f"{summary['model']}  ·  search {summary['search']}  ·  cost model {summary['cost_model']}")
    table.add_column("task", overflow="fold")
    for column in ("weight", "GFLOP", "trials", "errors", "best ms", "GFLOPS"):
        table.add_column(column, justify="right", no_wrap=True)
    for t in summary["tasks"]:
        table.add_row(
            t["name"], str(t["weight"]), f"{t['flops'] / 1e9:.3g}", str(t["trials"]), str(t["errors"]),
            render.ms(t["best_latency_s"]), "-" if t["gflops"] is None else f"{t['gflops']:.1f}",
        )
    console = render.console()
    console.print(table)
    choice = summary.get("layout_choice")
    if choice:
        measured = ", ".join(f"{layout} {p['latency_ms']:.4g} ms" for layout, p in choice.get("probes", {}).items())
        console.print(f"layout {choice['layout']}: {choice['why']}" + (f" ({measured})" if measured else ""),
                      markup=False)
    estimate = summary["estimated_latency_ms"]
    console.print(
        f"measured {summary['trials_measured']} candidates ({summary['errors']} failed) "
        f"in {summary['elapsed_s']:.1f} s"
        + (f" ({summary['elapsed_total_s']:.0f} s of the {summary['time_budget_s']:.0f} s time budget, earlier runs "
           "included)" if summary.get("time_budget_s") else "") + "; "
        f"store holds {summary['trials_total']} for these tasks. "
        + (f"Estimated latency (sum of weight x best): {estimate:.4g} ms." if estimate is not None else "")
    )
    if summary.get("phase_s"):
        console.print("time by phase: " + ", ".join(f"{k} {v:.1f} s" for k, v in summary["phase_s"].items()))
    _print_search_reports(summary, console)


def _print_search_reports(summary: Any, console: Any) -> None:
    """The search policy's per-task reports as one table, a column per key."""
    from rich.table import Table

    reports = [(t["name"], t.get("search_report") or {}) for t in summary["tasks"]]
    columns = list(dict.fromkeys(k for _, report in reports for k in report))
    if not columns:
        return
    table = Table(title=f"search {summary['search']}, per task")
    table.add_column("task", overflow="fold")
    for column in columns:
        table.add_column(column.replace("_", " "), overflow="fold")
    for name, report in reports:
        table.add_row(name, *(render.cell(report.get(c)) for c in columns))
    console.print(table)
