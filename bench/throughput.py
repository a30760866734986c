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

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BUILDER_TIMEOUT_S = 600


def _metaschedule_worker(model: str, trials: int, strategy: str, builder_timeout: float | None, seed: int) -> None:
    """Runs inside a child process: tune with MetaSchedule, print a JSON line with what got measured."""
    from tvm.s_tir import meta_schedule as ms

    from tunecore.targets import resolve_target
    from tunecore.workloads import load_workload

    workload = load_workload(model)
    work_dir = tempfile.mkdtemp(prefix="ms-throughput-")
    builder = "local" if builder_timeout is None else ms.builder.LocalBuilder(timeout_sec=builder_timeout)
    db = ms.tune_tir(workload.mod, resolve_target("llvm"), work_dir, max_trials_global=trials, num_trials_per_iter=64,
                     strategy=strategy, builder=builder, seed=seed)
    secs = [float(min(r.run_secs)) for r in db.get_all_tuning_records()]
    ok = [s for s in secs if s < 1e9]
    print(json.dumps({"measured": len(secs), "ok": len(ok), "best_latency_s": min(ok) if ok else None}))


def run_timed(args: list[str]) -> tuple[float, str]:
    """Run a benchmark child process; returns (wall seconds from start to exit, its stdout)."""
    started = time.perf_counter()
    result = subprocess.run(args, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"benchmark child failed ({result.returncode}): {' '.join(args)}\n{result.stderr[-3000:]}")
    return wall, result.stdout


def last_json_line(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def run_tunecore(model: str, trials: int, seed: int) -> dict:
    wall, out = run_timed([sys.executable, "-m", "tunecore.cli", "run", "--model", model, "--trials", str(trials),
                                "--search", "random", "--measurer", "local", "--store", "memory:", "--seed", str(seed),
                                "--json"])
    summary = json.loads(out)
    best = summary["tasks"][0]["best_latency_s"]
    return {"wall_s": wall, "measured": summary["trials_measured"], "ok": summary["trials_measured"] - summary["errors"],
            "best_latency_s": best}


def run_metaschedule(model: str, trials: int, strategy: str, builder_timeout: float | None, seed: int) -> dict:
    wall, out = run_timed([sys.executable, __file__, "--_metaschedule", model, str(trials), strategy,
                           str(builder_timeout or 0), str(seed)])
    return {"wall_s": wall, **last_json_line(out)}


def environment() -> dict:
    import importlib.metadata

    from tunecore.targets import device_descriptor, resolve_target, target_to_json

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    target = resolve_target("llvm")
    return {
        "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "target": json.loads(target_to_json(target)),
        "device": device_descriptor(target),
        "versions": {d: importlib.metadata.version(d) for d in ("apache-tvm", "apache-tvm-ffi", "tunecore")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="op:matmul-512")
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--with-stock", action="store_true", help="also run tune_tir with its stock 30 s builder timeout")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()

    variants = {"tunecore": lambda: run_tunecore(args.model, args.trials, args.seed)}
    for strategy in ("evolutionary", "replay-trace"):
        variants[f"metaschedule-{strategy}"] = (
            lambda s=strategy: run_metaschedule(args.model, args.trials, s, BUILDER_TIMEOUT_S, args.seed))
    if args.with_stock:
        variants["metaschedule-stock"] = lambda: run_metaschedule(args.model, args.trials, "evolutionary", None, args.seed)

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
              "metaschedule_builder_timeout_s": BUILDER_TIMEOUT_S, "environment": environment(), "results": results,
              "command": " ".join(["python", "bench/throughput.py", *sys.argv[1:]])}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "throughput.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(args.out, "throughput.md"), "w") as f:
        f.write(markdown(report))
    print(markdown(report))


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        f"# Throughput: {report['model']}, {report['trials']} trials",
        "",
        f"CPU: {env['cpu']} ({env['cores']} cores), target `{json.dumps(env['target'])}`, "
        f"TVM {env['versions']['apache-tvm']}. Command: `{report['command']}`.",
        "",
        "| variant | wall s | measured | succeeded | succeeded / min | tunecore is × faster | best latency ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in report["results"].items():
        speedup = "-" if r["tunecore_speedup"] is None else f"{r['tunecore_speedup']:.1f}"
        best = "-" if r["best_latency_s"] is None else f"{r['best_latency_s'] * 1e3:.3f}"
        lines.append(f"| {name} | {r['wall_s']:.1f} | {r['measured']} | {r['ok']} | {r['ok_per_min']:.1f} | {speedup} | {best} |")
    lines += ["", "Wall time is the whole process, from start to exit. MetaSchedule variants other than `stock` use "
              f"`LocalBuilder(timeout_sec={report['metaschedule_builder_timeout_s']})` so that builds can finish.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--_metaschedule":
        model, trials, strategy, timeout, seed = sys.argv[2:7]
        _metaschedule_worker(model, int(trials), strategy, float(timeout) or None, int(seed))
    else:
        main()
