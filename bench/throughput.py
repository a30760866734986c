"""Measured candidates per minute: tunecore (`local` measurer, `random` search) vs MetaSchedule's tune_tir.

Every variant runs as its own process, one after the other in this script, on the same workload,
target and trial count, and is timed from process start to exit (imports and setup included):

  tunecore                     tunecore run --search random --measurer local
  metaschedule-evolutionary    ms.tune_tir defaults (evolutionary search + XGBoost, LocalBuilder, LocalRunner),
                               with the LocalBuilder timeout raised so that builds can finish (see below)
  metaschedule-replay-trace    the same with strategy="replay-trace": random sampling, like tunecore's random
  metaschedule-stock           tune_tir exactly as shipped (LocalBuilder timeout 30 s); only with --with-stock

LocalBuilder starts a fresh process pool for every batch and each worker imports all of
tvm.s_tir.tensor_intrin before its first build; where that import takes longer than the 30 s default
timeout, every stock build times out.

    python bench/throughput.py [--model op:matmul-512] [--trials 64] [--with-stock]

Writes bench/results/throughput.json and bench/results/throughput.md.
"""

from __future__ import annotations

import os
import sys
import tempfile

from tunecore import experiments
from tunecore.experiments import (
    BUILDER_TIMEOUT_S,
    command_line,
    environment,
    run_metaschedule,
    run_tunecore,
    write_results,
)


def run_metaschedule_once(model: str, trials: int, strategy: str, builder_timeout: float | None, seed: int) -> dict:
    return run_metaschedule(model, trials, seed, tempfile.mkdtemp(prefix="ms-throughput-"), strategy=strategy,
                            builder_timeout=builder_timeout)


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--model", default="op:matmul-512")
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--with-stock", action="store_true",
                        help="also run tune_tir with its stock 30 s builder timeout")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="tunecore-throughput-")
    # the default store (a SQLite file, every round committed before the next), as MetaSchedule writes its database
    variants = {"tunecore": lambda: run_tunecore(args.model, args.trials, args.seed, search="random", cost_model="none",
                                                 store=f"sqlite:{os.path.join(work, 'tunecore.db')}")}
    for strategy in ("evolutionary", "replay-trace"):
        variants[f"metaschedule-{strategy}"] = (
            lambda s=strategy: run_metaschedule_once(args.model, args.trials, s, BUILDER_TIMEOUT_S, args.seed))
    if args.with_stock:
        variants["metaschedule-stock"] = (
            lambda: run_metaschedule_once(args.model, args.trials, "evolutionary", None, args.seed))

    results = {}
    for name, run in variants.items():
        print(f"running {name} ...", file=sys.stderr, flush=True)
        r = run()
        r["candidates_per_min"] = r["measured"] / r["wall_s"] * 60
        r["ok_per_min"] = r["ok"] / r["wall_s"] * 60
        results[name] = r
        print(f"  {r['measured']} measured ({r['ok']} ok) in {r['wall_s']:.1f} s", file=sys.stderr, flush=True)
    base = results["tunecore"]["ok_per_min"]
    for r in results.values():
        r["tunecore_speedup"] = base / r["ok_per_min"] if r["ok_per_min"] else None

    report = {"benchmark": "throughput", "model": args.model, "trials": args.trials, "seed": args.seed,
              "metaschedule_builder_timeout_s": BUILDER_TIMEOUT_S, "runners": runner_settings(),
              "environment": environment(), "results": results, "command": command_line("throughput.py")}
    write_results(args.out, "throughput", report, markdown(report))


def runner_settings() -> dict:
    """How each tuner times a candidate, read from the code that does it: tunecore's `local` measurer
    defaults and MetaSchedule's LocalRunner (EvaluatorConfig) defaults."""
    import inspect

    from tvm.s_tir.meta_schedule.runner.config import EvaluatorConfig

    from tunecore.measure.local import LocalRunner

    local = {k: p.default for k, p in inspect.signature(LocalRunner).parameters.items()
             if k in ("repeat", "number", "min_repeat_ms", "cpu_cache_flush", "screen")}
    metaschedule = EvaluatorConfig._normalized(None)
    return {"tunecore": local, "metaschedule": {k: getattr(metaschedule, k) for k in
                                                ("number", "repeat", "min_repeat_ms", "enable_cpu_cache_flush")}}


def markdown(report: dict) -> str:
    lines = [
        f"# Throughput: {report['model']}, {report['trials']} trials",
        "",
        experiments.environment_line(report),
        "",
        "| variant | wall s | measured | succeeded | succeeded / min | tunecore is × faster | best latency ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in report["results"].items():
        speedup = "-" if r["tunecore_speedup"] is None else f"{r['tunecore_speedup']:.1f}"
        best = "-" if r["best_latency_s"] is None else f"{r['best_latency_s'] * 1e3:.3f}"
        lines.append(f"| {name} | {r['wall_s']:.1f} | {r['measured']} | {r['ok']} | {r['ok_per_min']:.1f} "
                     f"| {speedup} | {best} |")
    runners = report["runners"]
    tc, ms = runners["tunecore"], runners["metaschedule"]
    lines += ["", "Searches: `tunecore` is `tunecore run --search random --cost-model none` (random sampling of the "
              "design space, no cost model); `metaschedule-evolutionary` and `metaschedule-stock` are tune_tir's "
              "evolutionary search with its XGBoost model; `metaschedule-replay-trace` samples at random, like "
              "tunecore's row. One run of each variant.",
              "", "Wall time is the whole process, from start to exit. Both write every result to a database on disk "
              "(tunecore: its default SQLite store; MetaSchedule: its JSON database). MetaSchedule variants other than "
              f"`stock` use `LocalBuilder(timeout_sec={report['metaschedule_builder_timeout_s']})` so that "
              "builds can finish.",
              "",
              f"Timing per candidate: tunecore `local` takes one cold call, then {tc['repeat']} repeats of as many "
              f"calls as fill {tc['min_repeat_ms']} ms (median), and a candidate whose cold call is more than "
              f"{tc['screen']}× the "
              f"task's best so far is timed by that call alone; MetaSchedule's LocalRunner: one warm-up call, then "
              f"{ms['repeat']} repeat of {ms['number']} calls, raised to fill {ms['min_repeat_ms']} ms (mean). Neither "
              "flushes caches.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
