"""Does the guided search pay off? `ansor`+`xgb` against `random` at the same trial budget, per seed.

For each seed, both searches tune the operator with the defaults a user gets from `tunecore run`
(each its own store), one after the other; then the 4 best programs of both runs are re-measured
together, in random order over several passes (`tunecore.experiments.remeasure_together`), because this machine's speed
drifts between runs. Reported: best and top-4 mean latency of each, their ratio, and tuning wall time.

`--cores` sets the target's `num-cores` (kernels use that many threads); `all` is the host default.
On this 2-core VM, timings of kernels using both cores swing by 25% and more, which also misleads
a search during tuning; single-core timings are steady to a few %.

    python bench/ansor_vs_random.py [--ops t2d-0,matmul-512] [--trials 96] [--seeds 3] [--cores 1|all]

Rows accumulate in bench/results/ansor_vs_random.{json,md} (one row per operator, trials, cores).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np

from tunecore import experiments
from tunecore.experiments import best_candidates, command_line, environment, remove_sqlite, write_results

TOP_K = 4


def tune(op: str, target: str, search: str, cost_model: str, trials: int, seed: int, work: str) -> tuple[str, float]:
    from tunecore.api import TuneConfig, tune

    store = os.path.join(work, f"{op}-{search}-{trials}-{seed}.db")
    remove_sqlite(store)
    started = time.perf_counter()
    tune(TuneConfig(f"op:{op}", trials=trials, target=target, search=search, cost_model=cost_model,
                    store=f"sqlite:{store}", seed=seed))
    return store, time.perf_counter() - started


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--ops", default="t2d-0,matmul-512")
    parser.add_argument("--trials", type=int, default=96)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--cores", default="1", help="num-cores of the target, or 'all'")
    args = parser.parse_args()

    from tunecore.experiments import remeasure_together
    from tunecore.targets import host_target, physical_cores
    from tunecore.testing import tiny_task
    from tunecore.tvmjson import target_from_json, target_to_json

    cores = physical_cores() if args.cores == "all" else int(args.cores)
    target_json = json.dumps({**json.loads(target_to_json(host_target())), "num-cores": cores})
    work = tempfile.mkdtemp(prefix="tunecore-bench-ansor-vs-random-")
    path = os.path.join(args.out, "ansor_vs_random.json")
    report = json.load(open(path)) if os.path.exists(path) else {"benchmark": "ansor_vs_random", "rows": {}}
    for op in args.ops.split(","):
        task = None
        seeds = []
        for seed in range(args.seeds):
            runs = {}
            for search, cost_model in (("random", "none"), ("ansor", "xgb")):
                print(f"{op} seed {seed}: {search} ...", file=sys.stderr, flush=True)
                runs[search] = tune(op, target_json, search, cost_model, args.trials, seed, work)
            task = task or tiny_task(op, target_from_json(target_json))
            programs = {search: best_candidates(store_path, task, TOP_K) for search, (store_path, _) in runs.items()}
            latencies = remeasure_together(task, programs)
            seeds.append({"seed": seed, **{f"{s}_top_s": latencies[s] for s in runs},
                          **{f"{s}_wall_s": runs[s][1] for s in runs}})
            r, a = np.array(latencies["random"]), np.array(latencies["ansor"])
            print(f"  best ansor/random {a[0] / r[0]:.3f}, top-{TOP_K} mean {a.mean() / r.mean():.3f}", file=sys.stderr)
        report["rows"][f"{op} {args.trials} {cores}"] = {
            "op": op, "trials": args.trials, "cores": cores, "seeds": seeds,
            "best_ratio": [s["ansor_top_s"][0] / s["random_top_s"][0] for s in seeds],
            "mean_ratio": [float(np.mean(s["ansor_top_s"]) / np.mean(s["random_top_s"])) for s in seeds],
            "command": command_line("ansor_vs_random.py"),
        }
    report["environment"] = environment()
    write_results(args.out, "ansor_vs_random", report, markdown(report))


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        "# ansor+xgb vs random search at the same budget", "",
        f"CPU: {env['cpu']} ({env['cores']} cores), TVM {env['versions']['apache-tvm']}. The 4 best programs of each "
        "run re-measured together (median of 8 passes in random order). Ratios < 1: ansor's programs are faster.", "",
        "| operator | trials | kernel threads | random best ms (per seed) | ansor best ms (per seed) "
        "| best ratio (per seed) | top-4 mean ratio (per seed) | random / ansor wall s (per seed) | command |",
        "|---|---:|---:|---|---|---|---|---|---|",
    ]
    for row in report["rows"].values():
        seeds = row["seeds"]
        random_best = " / ".join(f"{s['random_top_s'][0] * 1e3:.3f}" for s in seeds)
        ansor_best = " / ".join(f"{s['ansor_top_s'][0] * 1e3:.3f}" for s in seeds)
        walls = " / ".join(f"{s['random_wall_s']:.0f}-{s['ansor_wall_s']:.0f}" for s in seeds)
        best_ratio = " / ".join(f"{x:.2f}" for x in row["best_ratio"])
        mean_ratio = " / ".join(f"{x:.2f}" for x in row["mean_ratio"])
        lines.append(f"| {row['op']} | {row['trials']} | {row['cores']} | {random_best} | {ansor_best} | {best_ratio} "
                     f"| {mean_ratio} | {walls} | `{row['command']}` |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
