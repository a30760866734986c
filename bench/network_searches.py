"""A network tuned by several search/cost-model pairs at the same budget, then built and timed together.

Each pair runs `tunecore run --model M --search S --cost-model C --trials N` as its own process into
its own store (timed from start to exit). Then, in this process, the network is built untuned and
once per store with the store's best schedules (what `tunecore compile` builds), every tuned build's
outputs are checked against the untuned build's, and all builds are timed in alternating passes so
that the machine's drift hits them alike; a build's latency is the median over passes.

    python bench/network_searches.py [--model zoo:resnet-18] [--pairs ansor:xgb,random:none] [--trials 1000]

Resumable: finished tuning runs are kept in --work and not repeated. Writes
bench/results/network_searches.{json,md}.
"""

from __future__ import annotations

import os
import sys
import tempfile

from tunecore import experiments
from tunecore.experiments import command_line, environment, write_results


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--model", default="zoo:resnet-18")
    parser.add_argument("--pairs", default="ansor:xgb,random:none", help="SEARCH:COST_MODEL, comma-separated")
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "tunecore-bench-network-searches"))
    args = parser.parse_args()
    pairs = [tuple(p.split(":")) for p in args.pairs.split(",")]
    if any(len(p) != 2 for p in pairs):
        parser.error("--pairs: expected SEARCH:COST_MODEL[,SEARCH:COST_MODEL...]")

    os.makedirs(args.work, exist_ok=True)
    runs, stores = {}, {}
    for search, cost_model in pairs:
        name = f"{search}+{cost_model}"
        key = f"{args.model} {name} {args.trials} {args.seed}"
        stores[name] = os.path.join(args.work, f"{args.model.replace(':', '-')}-{search}-{cost_model}-"
                                               f"{args.trials}-{args.seed}.db")
        runs[name] = experiments.cached_run(os.path.join(args.work, "runs.json"), key, lambda: experiments.run_tunecore(
            args.model, args.trials, args.seed, search=search, cost_model=cost_model, store=f"sqlite:{stores[name]}"))
        print(f"  {key}: {runs[name]['wall_s']:.0f} s, estimated {_estimate(runs[name])} ms",
              file=sys.stderr, flush=True)

    print("building and timing ...", file=sys.stderr, flush=True)
    timed = experiments.time_builds_together(args.model, stores, args.passes)
    report = {"benchmark": "network_searches", "model": args.model, "trials": args.trials, "seed": args.seed,
              "passes": args.passes, "runs": runs, "builds": timed, "environment": environment(),
              "command": command_line("network_searches.py")}
    write_results(args.out, "network_searches", report, markdown(report))


def markdown(report: dict) -> str:
    untuned = report["builds"]["untuned"]["latency_ms"]
    lines = [
        f"# {report['model']}: searches at {report['trials']} trials, built and timed together",
        "",
        experiments.environment_line(report),
        "",
        f"End-to-end latency: median of {report['passes']} alternating passes over all builds in one process "
        "(each pass of a tuned build: median of 5 calls). Estimated: the run's sum of weight × best kernel latency.",
        "",
        "| build | tuning wall s | measured (failed) | estimated ms | end-to-end ms | speedup over untuned | outputs |",
        "|---|---:|---:|---:|---:|---:|---|",
        f"| untuned | - | - | - | {untuned:.1f} | 1.00 | reference |",
    ]
    for name, run in report["runs"].items():
        b = report["builds"][name]
        lines.append(f"| {name} | {run['wall_s']:.0f} | {run['measured']} ({run['errors']}) | {_estimate(run)} "
                     f"| {b['latency_ms']:.1f} | {untuned / b['latency_ms']:.2f} "
                     f"| {b['tasks_tuned']}/{b['tasks_total']} tuned, max rel. error {b['max_relative_error']:.1g} |")
    lines.append("")
    return "\n".join(lines)


def _estimate(run: dict) -> str:
    """The run's estimated network latency; none while a task has no successful program (small budgets)."""
    return "-" if run["estimated_latency_ms"] is None else f"{run['estimated_latency_ms']:.1f}"


if __name__ == "__main__":
    main()
