"""What checking every candidate's outputs costs, and how many wrong programs each search produces.

Two parts, each `tunecore run` as its own process, one after the other (nothing else running):

  cost      zoo:resnet-18, ansor + xgb, --trials 300, with the measurer's default check (`all`) and with
            `-O measurer.check=none`, alternating, --passes of each: tuning wall time, measure phase.
  searches  a store with zoo:mobilenet-v2's tasks tuned (ansor + xgb, --donor-trials), copied for each search;
            then zoo:resnet-18 with that search for --trials 64 and `tunecore compile`: wrong outputs the
            check caught (records failed with "wrong output"), other failures, and whether the build matches.

    python bench/correctness.py [--part cost,searches] [--passes 2] [--trials 300] [--search-trials 64]

Writes bench/results/correctness.{json,md}.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile

from tunecore import experiments
from tunecore.experiments import command_line, environment, pass_orders, ratio_bounds, run_tunecore, write_results

SEARCHES = {"random": "none", "ansor": "xgb", "transfer": "cdmpp", "tlm": "none"}


def cost(args, directory: str) -> dict:
    variants = {"check all (default)": [], "check none": ["-O", "measurer.check=none"]}
    runs: dict[str, list] = {name: [] for name in variants}
    for order in pass_orders(list(variants), args.passes, seed=0):
        for name in order:
            print(f"cost: {name} ...", file=sys.stderr, flush=True)
            r = run_tunecore("zoo:resnet-18", args.trials, args.seed, search="ansor", cost_model="xgb",
                             store=f"sqlite:{os.path.join(directory, 'cost.db')}", extra_args=variants[name])
            runs[name].append({k: r[k] for k in ("wall_s", "elapsed_s", "measured", "errors", "phase_s",
                                                 "estimated_latency_ms")})
            print(f"  {r['wall_s']:.1f} s, estimate {r['estimated_latency_ms']} ms", file=sys.stderr)
    return runs


def per_candidate(args, directory: str) -> dict:
    """The same programs (``--programs`` of each of zoo:resnet-18's tasks) measured by a measurer that checks all
    and one that checks none, alternating: seconds per candidate, and what making the references cost."""
    import time

    from tunecore.measure.local import LocalMeasurer
    from tunecore.targets import resolve_target
    from tunecore.testing import sample_candidates
    from tunecore.workloads import extract_tasks, load_workload

    target = resolve_target("llvm")
    tasks = extract_tasks(load_workload("zoo:resnet-18"), target)
    batches = [(task, sample_candidates(task, args.programs, seed=1)) for task in tasks]
    measurers = {"check all (default)": LocalMeasurer(target), "check none": LocalMeasurer(target, check="none")}
    out: dict = {"candidates": sum(len(c) for _, c in batches), "tasks": len(tasks)}
    try:
        for name, measurer in measurers.items():  # first pass: the references (and the workers' warm-up)
            started = time.perf_counter()
            for task, candidates in batches:
                measurer.measure(task, candidates)
            out.setdefault("first_pass_s", {})[name] = time.perf_counter() - started
        for order in pass_orders(list(measurers), args.passes + 1, seed=1):
            for name in order:
                started = time.perf_counter()
                wrong = sum(r.error is not None for task, candidates in batches
                            for r in measurers[name].measure(task, candidates))
                out.setdefault("passes_s", {}).setdefault(name, []).append(time.perf_counter() - started)
                out.setdefault("failed", {}).setdefault(name, []).append(wrong)
                print(f"measure: {name} {out['passes_s'][name][-1]:.1f} s", file=sys.stderr, flush=True)
    finally:
        for measurer in measurers.values():
            measurer.close()
    return out


def wrong_outputs(store_file: str, run_id: int) -> tuple[int, int]:
    """(records failed with wrong outputs, other failures) of one run in a SQLite store."""
    with sqlite3.connect(store_file) as db:
        wrong = db.execute("SELECT COUNT(*) FROM records WHERE run_id = ? AND error LIKE 'wrong output%'",
                           (run_id,)).fetchone()[0]
        failed = db.execute("SELECT COUNT(*) FROM records WHERE run_id = ? AND error IS NOT NULL",
                            (run_id,)).fetchone()[0]
    return wrong, failed - wrong


def searches(args, directory: str) -> dict:
    donors = os.path.join(directory, "donors.db")
    print("searches: mobilenet-v2 donors ...", file=sys.stderr, flush=True)
    run_tunecore("zoo:mobilenet-v2", args.donor_trials, args.seed, search="ansor", cost_model="xgb",
                 store=f"sqlite:{donors}")
    out = {}
    for search, cost_model in SEARCHES.items():
        print(f"searches: {search} + {cost_model} ...", file=sys.stderr, flush=True)
        store = os.path.join(directory, f"{search}.db")
        shutil.copy(donors, store)
        r = run_tunecore("zoo:resnet-18", args.search_trials, args.seed, search=search, cost_model=cost_model,
                         store=f"sqlite:{store}", resume=True)
        with sqlite3.connect(store) as db:
            run_id = db.execute("SELECT MAX(run_id) FROM runs").fetchone()[0]
        wrong, failed = wrong_outputs(store, run_id)
        compiled = subprocess.run([sys.executable, "-m", "tunecore.cli", "compile", "--model", "zoo:resnet-18",
                                   "--store", store, "--json"], capture_output=True, text=True)
        report = json.loads(compiled.stdout) if compiled.stdout.strip() else {"error": compiled.stderr.strip()[-300:]}
        out[f"{search} + {cost_model}"] = {
            "measured": r["measured"], "wrong_outputs": wrong, "other_failures": failed, "wall_s": r["wall_s"],
            "measure_s": (r["phase_s"] or {}).get("measure"), "outputs_match": report.get("outputs_match"),
            "max_relative_error": report.get("max_relative_error"), "speedup": report.get("speedup"),
            "latency_ms": report.get("latency_ms"), "untuned_latency_ms": report.get("untuned_latency_ms"),
            "wrong_records": report.get("wrong_records"), "compile_error": report.get("error"),
        }
        print(f"  {out[f'{search} + {cost_model}']}", file=sys.stderr)
    return out


def runs_of(report: dict) -> list[str]:
    return [part for part in ("searches", "measure", "cost") if part in report]


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--part", default="cost,measure,searches")
    parser.add_argument("--programs", type=int, default=4, help="measure: programs of each task")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--donor-trials", type=int, default=200)
    parser.add_argument("--search-trials", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    parts = args.part.split(",")
    earlier = os.path.join(args.out, "correctness.json")
    report = {}
    if os.path.exists(earlier):  # a run of some parts keeps the others' results
        with open(earlier) as f:
            report = json.load(f)
    report.update({"benchmark": "correctness", "environment": environment(), "trials": args.trials,
                   "passes": args.passes, "donor_trials": args.donor_trials, "search_trials": args.search_trials,
                   "programs": args.programs, "seed": args.seed})
    commands = report.setdefault("commands", {})
    for part in runs_of(report):  # results written before commands were kept per part
        commands.setdefault(part, report.get("command", ""))
    report["command"] = command_line("correctness.py")  # this run's (each part's own is in "commands")
    runs = {"searches": searches, "measure": per_candidate, "cost": cost}
    with tempfile.TemporaryDirectory(prefix="tunecore-bench-") as directory:
        for part in (p for p in runs if p in parts):
            report[part] = runs[part](args, directory)
            commands[part] = command_line("correctness.py")
    write_results(args.out, "correctness", report, markdown(report))


def markdown(report: dict) -> str:
    lines = ["# Checking outputs: what it costs, what it catches", "", experiments.environment_line(report), "",
             "Commands: " + "; ".join(f"{part}: `{command}`" for part, command in report.get("commands", {}).items()),
             ""]
    if "measure" in report:
        m = report["measure"]
        lines += [f"## Per candidate: the same {m['candidates']} programs (up to {report['programs']} of each of "
                  f"zoo:resnet-18's {m['tasks']} tasks), measured by both measurers, alternating", "",
                  "| variant | first pass s (references made) | later passes s (min-max) | per candidate ms | failed |",
                  "|---|---:|---:|---:|---:|"]
        for name, passes in m["passes_s"].items():
            lines.append(f"| {name} | {m['first_pass_s'][name]:.1f} | {min(passes):.1f}-{max(passes):.1f} | "
                         f"{min(passes) / m['candidates'] * 1e3:.0f}-{max(passes) / m['candidates'] * 1e3:.0f} | "
                         f"{'/'.join(map(str, m['failed'][name]))} |")
        checked, unchecked = m["passes_s"].values()
        low, high = (bound - 1 for bound in ratio_bounds(checked, unchecked))
        lines += ["", f"Measuring with the check relative to without: {low * 100:+.1f}% to {high * 100:+.1f}% (worst "
                      "pairing of passes each way).", ""]
    if "cost" in report:
        passes = len(next(iter(report["cost"].values())))
        lines += [f"## Cost: zoo:resnet-18, ansor + xgb, {report['trials']} trials, {passes} passes each "
                  "(alternating)", "",
                  "| variant | wall s (min-max) | measure phase s (min-max) | failed | estimate ms (min-max) |",
                  "|---|---:|---:|---:|---:|"]

        def spread(values: list[float | None], digits: int = 1) -> str:
            if any(v is None for v in values):  # an estimate while a task has no successful record
                return "-"
            return f"{min(values):.{digits}f}-{max(values):.{digits}f}"

        for name, runs in report["cost"].items():
            lines.append(f"| {name} | {spread([r['wall_s'] for r in runs])} | "
                         f"{spread([r['phase_s']['measure'] for r in runs])} | "
                         f"{'/'.join(str(r['errors']) for r in runs)} | "
                         f"{spread([r['estimated_latency_ms'] for r in runs], 2)} |")
        (checked, unchecked) = report["cost"].values()
        low, high = (bound - 1 for bound in ratio_bounds([r["wall_s"] for r in checked],
                                                         [r["wall_s"] for r in unchecked]))
        lines += ["", f"Wall time with the check relative to without: {low * 100:+.1f}% to {high * 100:+.1f}% "
                      "(worst pairing of passes each way).", ""]
    if "searches" in report:
        lines += [f"## Each search on zoo:resnet-18 ({report['search_trials']} trials) after zoo:mobilenet-v2 donors "
                  f"({report['donor_trials']} trials of ansor + xgb) in its store; then `tunecore compile`", "",
                  "| search + cost model | measured | wrong outputs caught | other failures | wall s | "
                  "compiled outputs match | max rel. error | tuned ms | untuned ms |",
                  "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
        for name, r in report["searches"].items():
            error = r["max_relative_error"]
            match = r["outputs_match"] if r["compile_error"] is None else r["compile_error"]
            lines.append(f"| {name} | {r['measured']} | {r['wrong_outputs']} | {r['other_failures']} | "
                         f"{r['wall_s']:.1f} | {match} | {'-' if error is None else f'{error:.1g}'} | "
                         f"{r['latency_ms'] or 0:.1f} | {r['untuned_latency_ms'] or 0:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
