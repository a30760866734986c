"""``tunecore bench`` (a resumable matrix of models x searches x cost models x seeds) and ``tunecore report``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tunecore.cli import render
from tunecore.cli.args import add_tuning, count, names
from tunecore.errors import UsageError


def add_commands(register: Any) -> None:
    bench = register("bench", cmd_bench, help="a matrix of models x searches x cost models x seeds (resumable)")
    bench.add_argument("--model", "-m", type=names, required=True, help="workloads, comma-separated (as for `run`)")
    bench.add_argument("--search", type=names, default=["random"],
                       help="search policies, comma-separated (default: random)")
    bench.add_argument("--cost-model", type=names, default=["none"],
                       help="cost models, comma-separated (default: none)")
    bench.add_argument("--trials", "-n", type=count(1), required=True, help="measured candidates per cell")
    bench.add_argument("--seeds", type=count(1), default=1, help="cells per combination, seeds 0..K-1 (default: 1)")
    bench.add_argument("--out", "-o", default="bench-out", help="results directory (default: bench-out)")
    bench.add_argument("--store", "-s", default=None,
                       help="a SQLite store every cell starts from a copy of (default: cells start empty)")
    bench.add_argument("--target", "-t", default="llvm", help="as for `run` (default: llvm)")
    add_tuning(bench)
    bench.add_argument("--no-e2e", action="store_true", help="skip compiling and timing networks after tuning")

    report = register("report", cmd_report, help="render a bench directory as one self-contained HTML page")
    report.add_argument("directory")


def cmd_bench(args: argparse.Namespace) -> int:
    from rich.progress import TextColumn

    from tunecore import report
    from tunecore.api import TuneConfig
    from tunecore.experiments import matrix
    from tunecore.options import parse_options
    from tunecore.registry import Registry

    searches, cost_models = args.search, args.cost_model
    registry = Registry.shared()
    without_cost_model = [s for s in searches if not registry.get("search", s).uses_cost_model]
    if without_cost_model and cost_models != ["none"]:
        print(f"tunecore: note: {', '.join(without_cost_model)} use(s) no cost model: one cell per model and seed, "
              "with the cost model none", file=sys.stderr)
    cells = matrix.plan(args.model, searches, cost_models, args.seeds, without_cost_model)
    settings = TuneConfig("", trials=args.trials, target=args.target, measurer=args.measurer,
                          options=parse_options(args.option, [*searches, *cost_models, args.measurer]),
                          scheduler=args.scheduler)
    display = render.progress(TextColumn("{task.fields[note]}"))
    cells_bar = display.add_task("cells", total=len(cells), note="")
    cell_bar = display.add_task("trials", total=args.trials, note="")

    def on_cell(index: int, cell: Any, skipped: bool) -> None:
        display.start()  # only once the matrix was checked: a refused command prints one line
        display.update(cells_bar, completed=index, note=cell.id + (" (finished earlier)" if skipped else ""))
        display.reset(cell_bar, total=args.trials)

    def on_round(r: Any) -> None:
        display.update(cell_bar, total=r.budget, completed=r.measured,
                       note=f"best {render.best(r.estimated_latency)}, errors {r.errors}")

    try:
        results = matrix.run_matrix(cells, settings, out=args.out, seed_store=args.store, e2e=not args.no_e2e,
                                    on_cell=on_cell, on_round=on_round)
        display.update(cells_bar, completed=len(cells), note="")
    finally:
        render.stop(display)
    report.write_markdown_and_plots(results, args.out)
    print(report.markdown(results))
    print(f"wrote {args.out}/results.json, results.md, plots/; `tunecore report {args.out}` renders an HTML page",
          file=sys.stderr)
    return 0 if all(c["status"] == "finished" for c in results["cells"].values()) else 1


def cmd_report(args: argparse.Namespace) -> int:
    from tunecore import report
    from tunecore.experiments import matrix

    results = matrix.load_results(args.directory)
    if results is None:
        raise UsageError(f"{args.directory}: no {matrix.RESULTS} (run `tunecore bench --out {args.directory}` first)")
    print(report.write_html(results, args.directory))
    return 0
