"""``tunecore run``: tune a workload (resumable)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from tunecore.cli import render
from tunecore.cli.args import add_common, add_tuning, count, duration


def add_commands(register: Any) -> None:
    run = register("run", cmd_run, help="tune a workload (resumes: records of earlier runs of this workload count)")
    add_common(run)
    run.add_argument("--search", default="random", help="search policy (default: random; see `tunecore plugins`)")
    run.add_argument("--then", default=None, metavar="SEARCH",
                     help="per task, once --search has nothing new to propose, spend the rest of the budget with this "
                          "search policy, starting from what was measured (e.g. --search transfer --then ansor)")
    run.add_argument("--cost-model", default="none", help="cost model (default: none; see `tunecore plugins`)")
    run.add_argument("--trials", "-n", type=count(0), default=None,
                     help="total measured candidates for this workload, earlier runs included")
    run.add_argument("--time-budget", type=duration, default=None, metavar="DURATION",
                     help="total tuning time for this workload, earlier runs included, e.g. 30m, 2h, 900 "
                          "(with --trials: whichever ends first)")
    run.add_argument("--seed", type=int, default=0,
                     help="seed of every random choice (search, cost model, scheduler): the same seed on the same "
                          "records proposes the same candidates (default: 0)")
    run.add_argument("--round-size", type=count(1), default=None, help="candidates per round (default: by budget)")
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

    def on_tasks(tasks: list) -> None:  # the run starts: everything was checked
        for note in [] if "id" in bar else api.notes(config):
            print(f"tunecore: note: {note}", file=sys.stderr)
        bar["id"] = display.add_task(f"tuning {args.model}", total=args.trials, best="-", errors=0)
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

    table = Table(title=f"{summary['model']}  ·  search {summary['search']}  ·  cost model {summary['cost_model']}"
                        f"  ·  target {_target_label(summary['target'])}")
    table.add_column("task", overflow="fold")
    for column in ("weight", "GFLOP", "trials", "errors", "best ms", "GFLOPS"):
        table.add_column(column, justify="right", no_wrap=True)
    stopped = any(t["stopped"] for t in summary["tasks"])
    if stopped:  # why a task got fewer trials than the budget would give it (e.g. transfer ran out of pairs)
        table.add_column("stopped", overflow="fold")
    for t in summary["tasks"]:
        table.add_row(
            t["name"], str(t["weight"]), f"{t['flops'] / 1e9:.3g}", str(t["trials"]), str(t["errors"]),
            render.ms(t["best_latency_s"]), "-" if t["gflops"] is None else f"{t['gflops']:.1f}",
            *([t["stopped"] or ""] if stopped else []),
        )
    console = render.console()
    console.print(table)
    console.print(f"store {summary['store']}", markup=False)
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
    requested = summary["trials_requested"]
    if not summary["trials_measured"] and requested is not None and summary["trials_total"] >= requested:
        console.print(f"nothing to measure: runs of this workload already put {summary['trials_total']} records in "
                      f"the store, --trials asks for {requested} in all (raise it to go on)")
    if summary.get("phase_s"):
        console.print("time by phase: " + ", ".join(f"{k} {v:.1f} s" for k, v in summary["phase_s"].items()))
    _print_search_reports(summary, console)


def _target_label(target_json: str) -> str:
    """A target as a person reads it: kind, CPU or GPU model, cores."""
    try:
        target = json.loads(target_json)
    except json.JSONDecodeError:
        return target_json
    details = [str(target[key]) for key in ("mcpu", "arch") if target.get(key)]
    if target.get("num-cores"):
        details.append(f"{target['num-cores']} cores")
    return target.get("kind", "?") + (f" ({', '.join(details)})" if details else "")


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
