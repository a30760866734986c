"""Which of two search configurations finds faster programs at the same trial budget, per seed?

A configuration is `search:cost-model` (`ansor:xgb`, `random:none`, `ansor:cdmpp`, ...). For each
operator and seed, both tune the operator with the defaults a user gets from `tunecore run` (each its
own store), one after the other; then the 4 best programs of both runs are re-measured together, in
random order over several passes (`tunecore.experiments.remeasure_together`), because this machine's
speed drifts between runs. Reported: best and top-4 mean latency of each, their ratio
(contender / baseline: below 1, the contender's programs are faster), and tuning wall time.

`--cores` sets the target's `num-cores` (kernels use that many threads); `all` is the host default.
On this 2-core VM, timings of kernels using both cores swing by 25% and more, which also misleads
a search during tuning; single-core timings are steady to a few %. `--mcpu` sets the target's `mcpu`
(the host's by default): `--cost-model ncu` counts instructions with valgrind, which cannot run AVX-512, so
on an AVX-512 host its pairs are run for an AVX2 CPU of the same line (`--mcpu znver3` on Zen 4 and 5).

    python bench/search_pairs.py [--baseline random:none] [--contender ansor:xgb] [--ops t2d-0,matmul-512]
        [--trials 96] [--seeds 3] [--cores 1|all] [--mcpu znver3]

Rows accumulate in bench/results/search_pairs.{json,md} (one row per pair, operator, trials, cores).
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


def tune(op: str, target: str, config: str, trials: int, seed: int, work: str) -> tuple[str, float]:
    from tunecore.api import TuneConfig, tune

    search, cost_model = config.split(":")
    store = os.path.join(work, f"{op}-{search}-{cost_model}-{trials}-{seed}.db")
    remove_sqlite(store)
    started = time.perf_counter()
    tune(TuneConfig(f"op:{op}", trials=trials, target=target, search=search, cost_model=cost_model,
                    store=f"sqlite:{store}", seed=seed))
    return store, time.perf_counter() - started


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--baseline", default="random:none", help="search:cost-model")
    parser.add_argument("--contender", default="ansor:xgb", help="search:cost-model")
    parser.add_argument("--ops", default="t2d-0,matmul-512")
    parser.add_argument("--trials", type=int, default=96)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--cores", default="1", help="num-cores of the target, or 'all'")
    parser.add_argument("--mcpu", help="mcpu of the target (the host's by default)")
    args = parser.parse_args()
    pair = (args.baseline, args.contender)
    if any(len(config.split(":")) != 2 for config in pair) or args.baseline == args.contender:
        parser.error("--baseline and --contender are two different search:cost-model pairs")

    from tunecore.experiments import remeasure_passes
    from tunecore.targets import host_target, physical_cores
    from tunecore.testing import tiny_task
    from tunecore.tvmjson import target_from_json, target_to_json

    cores = physical_cores() if args.cores == "all" else int(args.cores)
    target = {**json.loads(target_to_json(host_target())), "num-cores": cores}
    if args.mcpu:
        target["mcpu"] = args.mcpu
    target_json, mcpu = json.dumps(target), target["mcpu"]
    work = tempfile.mkdtemp(prefix="tunecore-bench-search-pairs-")
    path = os.path.join(args.out, "search_pairs.json")
    report = json.load(open(path)) if os.path.exists(path) else {"benchmark": "search_pairs", "rows": {}}
    report["environment"] = environment()
    for op in args.ops.split(","):
        task = None
        seeds = []
        for seed in range(args.seeds):
            runs = {}
            for config in pair:
                print(f"{op} seed {seed}: {config} ...", file=sys.stderr, flush=True)
                runs[config] = tune(op, target_json, config, args.trials, seed, work)
            task = task or tiny_task(op, target_from_json(target_json))
            programs = {config: best_candidates(store, task, TOP_K) for config, (store, _) in runs.items()}
            passes = remeasure_passes(task, programs)
            latencies = {config: sorted(float(np.median(s)) for s in group) for config, group in passes.items()}
            per_pass = np.min(passes[args.contender], axis=0) / np.min(passes[args.baseline], axis=0)
            seeds.append({"seed": seed, "top_s": latencies, "wall_s": {c: wall for c, (_, wall) in runs.items()},
                          "best_ratio_passes": [float(per_pass.min()), float(per_pass.max())]})
            b, c = np.array(latencies[args.baseline]), np.array(latencies[args.contender])
            print(f"  best {args.contender}/{args.baseline} {c[0] / b[0]:.3f}, "
                  f"top-{TOP_K} mean {c.mean() / b.mean():.3f}", file=sys.stderr)
        host_mcpu = report["environment"]["device"]["mcpu"]
        # a pair built for another CPU than the host's is a row of its own, not a re-run of that CPU's row
        on_host = "" if host_mcpu == mcpu else f" on {host_mcpu}"
        report["rows"][f"{args.contender} vs {args.baseline} {op} {args.trials} {cores} {mcpu}{on_host}"] = {
            "baseline": args.baseline, "contender": args.contender,
            "op": op, "trials": args.trials, "cores": cores, "seeds": seeds,
            "best_ratio": [s["top_s"][args.contender][0] / s["top_s"][args.baseline][0] for s in seeds],
            "mean_ratio": [float(np.mean(s["top_s"][args.contender]) / np.mean(s["top_s"][args.baseline]))
                           for s in seeds],
            "command": command_line("search_pairs.py"), "mcpu": mcpu,
            "host_mcpu": host_mcpu,
        }
    write_results(args.out, "search_pairs", report, markdown(report))


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        "# Two searches at the same budget", "",
        f"Last run: {env['cpu']} ({env['cores']} cores), TVM {env['versions']['apache-tvm']}. "
        "The 4 best programs of each run re-measured together (median of 8 passes in random order). "
        "Ratios are contender / baseline: below 1, the contender's programs are faster. Best ratio over passes: "
        "the best program's ratio within each pass, min-max over the passes. CPU: the target's mcpu, and the host's "
        "where they differ. Verdict: faster (slower) when "
        "that range is below (above) 1 on every seed, else level; rows run before the range was kept have none.",
        "",
        *[line for note in report.get("notes", []) for line in (note, "")],
        "| contender | baseline | operator | trials | CPU | kernel threads | baseline best ms (per seed) "
        "| contender best ms (per seed) | best ratio (per seed) | best ratio over passes (per seed) "
        "| top-4 mean ratio (per seed) | baseline / contender wall s (per seed) | verdict | command |",
        "|---|---|---|---:|---|---:|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"].values():
        seeds, baseline, contender = row["seeds"], row["baseline"], row["contender"]
        baseline_best = " / ".join(f"{s['top_s'][baseline][0] * 1e3:.3f}" for s in seeds)
        contender_best = " / ".join(f"{s['top_s'][contender][0] * 1e3:.3f}" for s in seeds)
        walls = " / ".join(f"{s['wall_s'][baseline]:.0f}-{s['wall_s'][contender]:.0f}" for s in seeds)
        best_ratio = " / ".join(f"{x:.2f}" for x in row["best_ratio"])
        mean_ratio = " / ".join(f"{x:.2f}" for x in row["mean_ratio"])
        ranges = [s.get("best_ratio_passes") for s in seeds]
        over_passes = " / ".join(f"{r[0]:.2f}-{r[1]:.2f}" for r in ranges) if all(ranges) else "-"
        verdict = "-" if not all(ranges) else "faster" if all(r[1] < 1 for r in ranges) else \
            "slower" if all(r[0] > 1 for r in ranges) else "level"
        label = f"{contender} ({row['note']})" if row.get("note") else contender
        host = row.get("host_mcpu", row["mcpu"])
        cpu = row["mcpu"] if host == row["mcpu"] else f"{row['mcpu']} on {host}"
        lines.append(f"| {label} | {baseline} | {row['op']} | {row['trials']} | {cpu} | {row['cores']} "
                     f"| {baseline_best} | {contender_best} | {best_ratio} | {over_passes} | {mean_ratio} | {walls} "
                     f"| {verdict} | `{row['command']}` |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
