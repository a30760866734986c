"""tunecore `ansor` + `xgb` against MetaSchedule's tune_tir (evolutionary search + XGBoost), per operator.

For every operator and seed, both tuners run as their own processes, one after the other, with the
same target, trial budget and seed, and are timed from process start to exit:

  tunecore       tunecore run --search ansor --cost-model xgb (local measurer, its own store)
  metaschedule   ms.tune_tir(strategy="evolutionary", cost model xgb, 64 trials per iteration), with
                 LocalBuilder(timeout_sec=600): its stock 30 s timeout builds nothing here (see throughput.py)

The machine's speed drifts by up to ~20% over an hour, so latencies recorded during the runs are not
compared across runs. After all seeds of an operator, the 3 best programs of every run are
re-measured together in one measurer, over 8 passes in random order (tunecore.experiments.remeasure_together);
a run's best latency is the minimum over its programs of the median over passes.

Then matmul-1024 fp32: tunecore after --big-trials trials against numpy's matmul (OpenBLAS), timed in
the same process right after.

    python bench/ansor_vs_metaschedule.py [--ops matmul-512,...] [--seeds 3] [--trials 256] [--big-trials 1000]
                                          [--tunecore-args "-O search.time_ratio=1 --round-size 64"]

Resumable: finished runs are kept in --work (default: a directory under /tmp) and skipped when
the command is repeated; a work folder whose runs were made on another machine (CPU model, mcpu, cores) is
refused. Writes bench/results/ansor_vs_metaschedule.{json,md}.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tempfile
import time

import numpy as np

from tunecore import experiments
from tunecore.experiments import BUILDER_TIMEOUT_S, command_line, environment, write_results

OPS = ["matmul-512", "conv2d-resnet50-c2", "dwconv-mobilenetv2", "dense-bert", "batch-matmul-bert"]
TOP_K = 3


def run_tunecore(op: str, trials: int, seed: int, work: str, extra_args: list[str]) -> dict:
    variant = re.sub(r"[^A-Za-z0-9_.=-]+", "_", "".join(f"-{a}" for a in extra_args))
    # emptied first: a repeated run's wall time is whole
    store = os.path.join(work, f"tunecore{variant}-{op}-{trials}-{seed}.db")
    run = experiments.run_tunecore(f"op:{op}", trials, seed, search="ansor", cost_model="xgb",
                                   store=f"sqlite:{store}", extra_args=extra_args)
    return {**run, "store": store}


def run_metaschedule(op: str, trials: int, seed: int, work: str) -> dict:
    work_dir = os.path.join(work, f"metaschedule-{op}-{trials}-{seed}")
    shutil.rmtree(work_dir, ignore_errors=True)
    return experiments.run_metaschedule(f"op:{op}", trials, seed, work_dir)


def remeasure(task, runs: dict[str, list]) -> dict[str, float]:
    """Best latency of each run's programs, measured together: min over programs of the median over passes."""
    from tunecore.experiments import remeasure_together

    return {name: latencies[0] for name, latencies in remeasure_together(task, runs).items()}


def numpy_matmul_seconds(n: int) -> float:
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    for _ in range(5):
        a @ b
    times = []
    for _ in range(50):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=256)
    parser.add_argument("--big-trials", type=int, default=1000, help="trials for matmul-1024 (0: skip)")
    parser.add_argument("--tunecore-args", default="", metavar="ARGS",
                        help="more arguments for tunecore's side, e.g. \"-O search.time_ratio=1 --round-size 64\"")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "tunecore-bench-ansor-vs-metaschedule"))
    args = parser.parse_args()

    from tunecore.targets import resolve_target, use_target_threads
    from tunecore.testing import tiny_task

    target = resolve_target("llvm")
    threads = use_target_threads(target)  # children inherit it: both tuners run kernels on every core
    os.makedirs(args.work, exist_ok=True)
    done_path = os.path.join(args.work, "runs.json")
    env = environment()

    def run_once(key: str, run) -> dict:
        r = experiments.cached_run(done_path, key, run)
        print(f"  {key}: {r['wall_s']:.0f} s, best {r['best_latency_s'] * 1e3:.3f} ms during the run", file=sys.stderr)
        return r

    try:
        extra = shlex.split(args.tunecore_args)
    except ValueError as error:
        parser.error(f"--tunecore-args: {error}")
    tunecore = " ".join(["tunecore", *extra])  # the key of its runs in runs.json
    ops = {}
    for op in args.ops.split(","):
        runs = {}
        for seed in range(args.seeds):
            runs[f"tunecore/{seed}"] = run_once(f"{tunecore} {op} {args.trials} {seed}",
                                                lambda: run_tunecore(op, args.trials, seed, args.work, extra))
            runs[f"metaschedule/{seed}"] = run_once(f"metaschedule {op} {args.trials} {seed}",
                                                    lambda: run_metaschedule(op, args.trials, seed, args.work))
        task = tiny_task(op, target)
        best = remeasure(task, {name: experiments.best_programs(run, task, TOP_K) for name, run in runs.items()})
        per_seed = [{"seed": s,
                     "tunecore_best_s": best[f"tunecore/{s}"], "metaschedule_best_s": best[f"metaschedule/{s}"],
                     "tunecore_wall_s": runs[f"tunecore/{s}"]["wall_s"],
                     "metaschedule_wall_s": runs[f"metaschedule/{s}"]["wall_s"],
                     "tunecore_errors": runs[f"tunecore/{s}"]["errors"]} for s in range(args.seeds)]
        ops[op] = {
            "gflop": task.flops / 1e9,
            "seeds": per_seed,
            "best_latency_ratio": float(np.median([s["tunecore_best_s"] / s["metaschedule_best_s"] for s in per_seed])),
            "wall_time_ratio": float(np.median([s["tunecore_wall_s"] / s["metaschedule_wall_s"] for s in per_seed])),
        }
        print(f"{op}: latency ratio {ops[op]['best_latency_ratio']:.3f}, wall ratio {ops[op]['wall_time_ratio']:.3f}",
              file=sys.stderr, flush=True)

    big = None
    if args.big_trials:
        run = run_once(f"{tunecore} matmul-1024 {args.big_trials} 0",
                       lambda: run_tunecore("matmul-1024", args.big_trials, 0, args.work, extra))
        task = tiny_task("matmul-1024", target)
        tvm_s = remeasure(task, {"tunecore": experiments.best_programs(run, task, TOP_K)})["tunecore"]
        numpy_s = numpy_matmul_seconds(1024)
        flop = 2 * 1024**3
        big = {"trials": args.big_trials, "tunecore_wall_s": run["wall_s"], "tunecore_s": tvm_s, "numpy_s": numpy_s,
               "tunecore_gflops": flop / tvm_s / 1e9, "numpy_gflops": flop / numpy_s / 1e9, "ratio": numpy_s / tvm_s,
               "numpy_blas": _blas_name()}

    report = {"benchmark": "ansor_vs_metaschedule", "trials": args.trials, "seeds": args.seeds, "threads": threads,
              "tunecore_args": extra,
              "metaschedule_builder_timeout_s": BUILDER_TIMEOUT_S, "environment": env, "ops": ops,
              "median_best_latency_ratio": float(np.median([o["best_latency_ratio"]
                                                            for o in ops.values()])) if ops else None,
              "median_wall_time_ratio": float(np.median([o["wall_time_ratio"] for o in ops.values()])) if ops else None,
              "matmul_1024": big, "command": command_line("ansor_vs_metaschedule.py")}
    write_results(args.out, "ansor_vs_metaschedule", report, markdown(report))


def _blas_name() -> str:
    try:
        config = np.show_config(mode="dicts")
        return config["Build Dependencies"]["blas"]["name"]
    except Exception:
        return "unknown"


def markdown(report: dict) -> str:
    lines = [
        f"# tunecore `ansor`+`xgb` vs MetaSchedule tune_tir: {report['trials']} trials, {report['seeds']} seeds",
        "",
        experiments.environment_line(report, threads=report["threads"]),
        "",
        *([f"tunecore's side ran with `{' '.join(report['tunecore_args'])}`.", ""]
          if report.get("tunecore_args") else []),
        "Latencies: the 3 best programs of each run re-measured together (median of 8 passes in random order); "
        "ratios < 1 favour tunecore. Wall time: whole processes, start to exit.",
        "",
        "| operator | GFLOP | tunecore best ms (per seed) | MetaSchedule best ms (per seed) | latency ratio (median) "
        "| tunecore wall s | MetaSchedule wall s | wall ratio (median) |",
        "|---|---:|---|---|---:|---|---|---:|",
    ]
    for op, o in report["ops"].items():
        def each(field: str, scale: float = 1.0, digits: int = 3) -> str:
            return " / ".join(f"{s[field] * scale:.{digits}f}" for s in o["seeds"])

        lines.append(f"| {op} | {o['gflop']:.3f} | {each('tunecore_best_s', 1e3)} | {each('metaschedule_best_s', 1e3)} "
                     f"| {o['best_latency_ratio']:.3f} | {each('tunecore_wall_s', digits=0)} "
                     f"| {each('metaschedule_wall_s', digits=0)} | {o['wall_time_ratio']:.3f} |")
    if report["ops"]:
        lines += ["", f"Median over operators: latency ratio **{report['median_best_latency_ratio']:.3f}**, "
                      f"wall-time ratio **{report['median_wall_time_ratio']:.3f}**."]
    big = report["matmul_1024"]
    if big:
        lines += ["", f"## matmul-1024 fp32 after {big['trials']} trials", "",
                  "| | ms | GFLOPS |", "|---|---:|---:|",
                  f"| tunecore ansor+xgb ({big['tunecore_wall_s']:.0f} s of tuning) | {big['tunecore_s'] * 1e3:.3f} "
                  f"| {big['tunecore_gflops']:.1f} |",
                  f"| numpy ({big['numpy_blas']}) | {big['numpy_s'] * 1e3:.3f} | {big['numpy_gflops']:.1f} |",
                  "", f"tunecore reaches **{int(1000 * big['ratio']) / 10}%** of numpy's GFLOPS (rounded down)."]
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
