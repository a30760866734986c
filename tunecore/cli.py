"""The ``tunecore`` command.

Every user mistake ends as one line on stderr and exit code 2; an interrupted run exits 130 with
everything it measured already in the store.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from tunecore.errors import UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + error
        raise UsageError(f"{self.prog}: {message}")


def _add_common(p: argparse.ArgumentParser, *, model: bool = True, target: bool = True, store: bool = True,
                json_flag: bool = True) -> None:
    if model:
        p.add_argument("--model", "-m", required=True,
                       help="zoo:<name> | op:<name> | path to .onnx | path to a Relax module .json")
    if target:
        p.add_argument("--target", "-t", default="llvm",
                       help="llvm (this CPU, real mcpu) | cuda | a TVM JSON target dict (default: llvm)")
    if store:
        p.add_argument("--store", "-s", default=None,
                       help="record store: a file path (sqlite) or NAME:LOCATION, e.g. memory: (default: tunecore.db)")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tunecore", description="Tensor-program auto-tuning on Apache TVM, with pluggable parts.")
    parser.add_argument("--version", action="version", version=f"tunecore {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="tune a workload (resumes: records of earlier runs of this workload count)")
    _add_common(run)
    run.add_argument("--search", default="random", help="search policy (see `tunecore plugins`)")
    run.add_argument("--then", default=None, metavar="SEARCH",
                     help="per task, once --search has nothing new to propose, spend the rest of the budget with this "
                          "search policy, starting from what was measured (e.g. --search transfer --then ansor)")
    run.add_argument("--cost-model", default="none", help="cost model (see `tunecore plugins`)")
    run.add_argument("--measurer", default="local", help="measurer (see `tunecore plugins`)")
    run.add_argument("--trials", "-n", type=int, required=True, help="total measured candidates for this workload")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--scheduler", choices=["gradient", "round-robin"], default="gradient",
                     help="how trials are spread over a network's tasks (default: gradient, as in Ansor)")
    run.add_argument("--round-size", type=int, default=None, help="candidates per round (default: by budget)")
    run.add_argument("--option", "-O", action="append", metavar="ROLE.KEY=VALUE",
                     help="component option: ROLE.KEY=VALUE or NAME.KEY=VALUE, e.g. -O measurer.repeat=5 -O ansor.population=128")

    tasks = sub.add_parser("tasks", help="list a workload's tuning tasks")
    _add_common(tasks, store=False)

    sub.add_parser("plugins", help="installed plugins and their components, as JSON")

    records = sub.add_parser("records", help="inspect, export and import stored records")
    rsub = records.add_subparsers(dest="records_command", required=True, parser_class=_Parser)
    rlist = rsub.add_parser("list", help="per task: trials, errors, best latency")
    _add_common(rlist, model=False, target=False)
    rlist.add_argument("--model", "-m", default=None, help="only tasks of this workload (as given to `run`)")
    rbest = rsub.add_parser("best", help="the best record of each task, with its schedule")
    _add_common(rbest, model=False, target=False)
    rbest.add_argument("--model", "-m", default=None)
    rexport = rsub.add_parser("export", help="write records in another tool's format")
    _add_common(rexport, model=False, target=False, json_flag=False)
    rexport.add_argument("--format", choices=["metaschedule"], default="metaschedule")
    rexport.add_argument("--model", "-m", default=None, help="only tasks of this workload")
    rexport.add_argument("directory")
    rimport = rsub.add_parser("import", help="read records written by another tool")
    _add_common(rimport, model=False, json_flag=False)
    rimport.set_defaults(target=None)
    rimport.add_argument("--format", choices=["metaschedule"], default="metaschedule")
    rimport.add_argument("directory")

    comp = sub.add_parser("compile", help="build a workload with its best records; check and time it")
    _add_common(comp)
    comp.add_argument("--output", "-o", default=None, help="write the tuned library here (.so)")

    bench = sub.add_parser("bench", help="a matrix of models x searches x cost models x seeds (resumable)")
    bench.add_argument("--model", "-m", required=True, help="workloads, comma-separated (as for `run`)")
    bench.add_argument("--search", default="random", help="search policies, comma-separated")
    bench.add_argument("--cost-model", default="none", help="cost models, comma-separated")
    bench.add_argument("--trials", "-n", type=int, required=True, help="measured candidates per cell")
    bench.add_argument("--seeds", type=int, default=1, help="cells per combination, seeds 0..K-1")
    bench.add_argument("--out", "-o", default="bench-out", help="results directory (default: bench-out)")
    bench.add_argument("--store", "-s", default=None,
                       help="a SQLite store every cell starts from a copy of (default: cells start empty)")
    bench.add_argument("--target", "-t", default="llvm", help="as for `run` (default: llvm)")
    bench.add_argument("--measurer", default="local")
    bench.add_argument("--scheduler", choices=["gradient", "round-robin"], default="gradient")
    bench.add_argument("--option", "-O", action="append", metavar="ROLE.KEY=VALUE", help="as for `run`; NAME.KEY applies only to the component NAME, e.g. -O ansor.population=64")
    bench.add_argument("--no-e2e", action="store_true", help="skip compiling and timing networks after tuning")

    report = sub.add_parser("report", help="render a bench directory as one self-contained HTML page")
    report.add_argument("directory")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return _COMMANDS[args.command](args)
    except UsageError as error:
        print(f"tunecore: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tunecore: interrupted; every committed round is in the store, run the same command to resume",
              file=sys.stderr)
        return 130


def _version() -> str:
    from tunecore.plugins import _core_version

    return _core_version()


def _console(stderr: bool = False) -> Any:
    import os

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # rich assumes 80 columns when writing to a file or pipe; task names need more to stay readable
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 120
    return Console(stderr=stderr, width=width)


def _stop(progress: Any) -> None:
    """Stop a progress display; one that never started would print an empty line before a usage error."""
    if progress.live.is_started:
        progress.stop()


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.4g}"


# run


def cmd_run(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from tunecore import session
    from tunecore.options import parse_options

    options = parse_options(args.option, [args.search, args.cost_model, args.measurer, *filter(None, [args.then])])
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("trials"),
        TextColumn("best {task.fields[best]}"),
        TextColumn("errors {task.fields[errors]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=_console(stderr=True),
        transient=args.json,
    )
    bar: dict[str, Any] = {}

    def on_tasks(tasks: list) -> None:
        bar["id"] = progress.add_task(f"tuning {args.model}", total=None, best="-", errors=0)
        progress.start()

    def on_round(report: Any) -> None:
        best = "-" if report.estimated_latency is None else f"{report.estimated_latency * 1e3:.4g} ms"
        progress.update(bar["id"], total=report.budget, completed=report.measured, best=best, errors=report.errors)

    try:
        summary = session.tune(
            args.model, trials=args.trials, target=args.target, search=args.search, cost_model=args.cost_model,
            measurer=args.measurer, store=args.store, seed=args.seed, options=options, scheduler=args.scheduler,
            round_size=args.round_size, on_round=on_round, on_tasks=on_tasks, then=args.then,
        )
    finally:
        _stop(progress)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(summary)
    return 0


def _print_summary(summary: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"{summary['model']}  ·  search {summary['search']}  ·  cost model {summary['cost_model']}")
    table.add_column("task", overflow="fold")
    for column in ("weight", "GFLOP", "trials", "errors", "best ms", "GFLOPS"):
        table.add_column(column, justify="right", no_wrap=True)
    for t in summary["tasks"]:
        table.add_row(
            t["name"], str(t["weight"]), f"{t['flops'] / 1e9:.3g}", str(t["trials"]), str(t["errors"]),
            _ms(t["best_latency_s"]), "-" if t["gflops"] is None else f"{t['gflops']:.1f}",
        )
    console = _console()
    console.print(table)
    estimate = summary["estimated_latency_ms"]
    console.print(
        f"measured {summary['trials_measured']} candidates ({summary['errors']} failed) in {summary['elapsed_s']:.1f} s; "
        f"store holds {summary['trials_total']} for these tasks. "
        + (f"Estimated latency (sum of weight x best): {estimate:.4g} ms." if estimate is not None else "")
    )
    if summary.get("phase_s"):
        console.print("time by phase: " + ", ".join(f"{k} {v:.1f} s" for k, v in summary["phase_s"].items()))
    _print_search_reports(summary, console)


def _print_search_reports(summary: dict[str, Any], console: Any) -> None:
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
        table.add_row(name, *(_cell(report.get(c)) for c in columns))
    console.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return ", ".join(f"{v} {k}" for k, v in value.items()) or "-"
    return str(value)


# tasks


def cmd_tasks(args: argparse.Namespace) -> int:
    from tunecore.targets import resolve_target
    from tunecore.workloads import extract_tasks, load_workload

    target = resolve_target(args.target)
    tasks = extract_tasks(load_workload(args.model), target)
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
    _console().print(table)
    return 0


# plugins


def cmd_plugins(args: argparse.Namespace) -> int:
    from tunecore.registry import describe_plugins

    print(json.dumps(describe_plugins(), indent=2))
    return 0


# records


def cmd_records(args: argparse.Namespace) -> int:
    from tunecore import session

    store = session.open_store(args.store, create=args.records_command == "import")
    try:
        return _RECORD_COMMANDS[args.records_command](args, store)
    finally:
        store.close()


def _task_rows(store: Any, model: str | None) -> list[dict[str, Any]]:
    tasks = store.get_tasks(model=model)
    if model is not None and not tasks:
        raise UsageError(f"the store has no tasks of model {model!r}; models in it: {', '.join(_models(store)) or 'none'}")
    counts = store.counts([t.task_id for t in tasks])
    rows = []
    for t in tasks:
        best = store.best(t.task_id)
        records = store.records(t.task_id) if counts[t.task_id] else []
        rows.append({
            "name": t.name, "model": t.model, "task_id": t.task_id, "kernel_class": t.kernel_class, "weight": t.weight,
            "flops": t.flops, "trials": counts[t.task_id], "errors": sum(r.error is not None for r in records),
            "best_latency_s": best[0].latency if best else None, "best": best[0] if best else None,
        })
    return rows


def _models(store: Any) -> list[str]:
    return sorted({t.model for t in store.get_tasks() if t.model})


def _records_list(args: argparse.Namespace, store: Any) -> int:
    rows = _task_rows(store, args.model)
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "best"} for r in rows], indent=2))
        return 0
    from rich.table import Table

    table = Table(title=f"{len(rows)} tasks in the store")
    for column in ("task", "model", "kernel class", "trials", "errors", "best ms"):
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(r["name"], r["model"], r["kernel_class"], str(r["trials"]), str(r["errors"]), _ms(r["best_latency_s"]))
    _console().print(table)
    return 0


def _records_best(args: argparse.Namespace, store: Any) -> int:
    rows = [r for r in _task_rows(store, args.model) if r["best"] is not None]
    if args.json:
        out = [{"name": r["name"], "model": r["model"], "task_id": r["task_id"], "latency_s": r["best"].latency,
                "run_secs": r["best"].run_secs, "trial": r["best"].trial, "origin": r["best"].origin,
                "measured_at": r["best"].measured_at, "trace": json.loads(r["best"].trace_json)} for r in rows]
        print(json.dumps(out, indent=2))
        return 0
    console = _console()
    for r in rows:
        task = store.get_tasks(task_ids=[r["task_id"]])[0]
        console.rule(f"{r['name']}  ({r['model']})  best {_ms(r['best'].latency)} ms at trial {r['best'].trial}")
        console.print(str(r["best"].candidate(task).trace), markup=False, highlight=False)
    return 0


def _records_export(args: argparse.Namespace, store: Any) -> int:
    from tunecore.store.metaschedule import export_metaschedule

    tasks = store.get_tasks(model=args.model)
    written = export_metaschedule(store, args.directory, tasks)
    print(f"wrote {written} records of {len(tasks)} tasks to {args.directory} (MetaSchedule JSONDatabase)")
    return 0


def _records_import(args: argparse.Namespace, store: Any) -> int:
    from tunecore.store.metaschedule import import_metaschedule
    from tunecore.targets import resolve_target

    target = resolve_target(args.target) if args.target else None
    n_tasks, n_records = import_metaschedule(store, args.directory, target)
    print(f"imported {n_records} records of {n_tasks} tasks from {args.directory}")
    return 0


_RECORD_COMMANDS = {"list": _records_list, "best": _records_best, "export": _records_export, "import": _records_import}


# compile


def cmd_compile(args: argparse.Namespace) -> int:
    from tunecore import session
    from tunecore.compile import compile_and_check
    from tunecore.targets import resolve_target
    from tunecore.workloads import load_workload

    target = resolve_target(args.target)
    store = session.open_store(args.store, create=False)
    try:
        workload = load_workload(args.model)
        with _console(stderr=True).status(f"compiling {args.model} tuned and untuned, checking and timing both"):
            report = compile_and_check(workload, target, store, output=args.output)
    finally:
        store.close()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _console().print(
            f"{report['model']}: tuned {report['latency_ms']:.4g} ms, untuned {report['untuned_latency_ms']:.4g} ms "
            f"({report['speedup']:.2f}x); {report['tasks_tuned']}/{report['tasks_total']} tasks had records; "
            f"outputs {'match' if report['outputs_match'] else 'DIFFER'} (max relative error {report['max_relative_error']:.2g})"
            + (f"; library written to {report['output']}" if report["output"] else "")
        )
    if not report["outputs_match"]:
        print("tunecore: error: the tuned build's outputs differ from the untuned build's", file=sys.stderr)
        return 1
    return 0


# bench, report


def cmd_bench(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tunecore import bench, report
    from tunecore.options import parse_options

    searches, cost_models = bench.split_list(args.search, "--search"), bench.split_list(args.cost_model, "--cost-model")
    cells = bench.plan(bench.split_list(args.model, "--model"), searches, cost_models, args.seeds)
    options = parse_options(args.option, [*searches, *cost_models, args.measurer])
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=_console(stderr=True))
    matrix = progress.add_task("cells", total=len(cells), note="")
    cell_bar = progress.add_task("trials", total=args.trials, note="")

    def on_cell(index: int, cell: Any, skipped: bool) -> None:
        progress.start()  # only once the matrix was checked: a refused command prints one line
        progress.update(matrix, completed=index, note=cell.id + (" (finished earlier)" if skipped else ""))
        progress.reset(cell_bar, total=args.trials)

    def on_round(r: Any) -> None:
        best = "-" if r.estimated_latency is None else f"{r.estimated_latency * 1e3:.4g} ms"
        progress.update(cell_bar, total=r.budget, completed=r.measured, note=f"best {best}, errors {r.errors}")

    try:
        results = bench.run_matrix(cells, trials=args.trials, out=args.out, target=args.target, measurer=args.measurer,
                                   options=options, scheduler=args.scheduler,
                                   seed_store=args.store, e2e=not args.no_e2e, on_cell=on_cell, on_round=on_round)
        progress.update(matrix, completed=len(cells), note="")
    finally:
        _stop(progress)
    report.write_markdown_and_plots(results, args.out)
    print(report.markdown(results))
    print(f"wrote {args.out}/results.json, results.md, plots/; `tunecore report {args.out}` renders an HTML page",
          file=sys.stderr)
    return 0 if all(c["status"] == "finished" for c in results["cells"].values()) else 1


def cmd_report(args: argparse.Namespace) -> int:
    from tunecore import bench, report

    results = bench.load_results(args.directory)
    if results is None:
        raise UsageError(f"{args.directory}: no {bench.RESULTS} (run `tunecore bench --out {args.directory}` first)")
    print(report.write_html(results, args.directory))
    return 0


_COMMANDS = {"run": cmd_run, "tasks": cmd_tasks, "plugins": cmd_plugins, "records": cmd_records, "compile": cmd_compile,
             "bench": cmd_bench, "report": cmd_report}

if __name__ == "__main__":
    sys.exit(main())
