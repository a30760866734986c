"""Transfer-Tuning's experiment (Gibson & Cano, PACT'22) at this machine's scale.

1. Donors: each donor model is tuned with `tunecore run --search ansor --cost-model xgb` into one
   shared store (the pool: no donor is assigned to any target).
2. Per target model (none of them a donor):
   (b) `tunecore run --search transfer --cost-model C` on a copy of the pool, for each C in --cost-models;
   (c) `tunecore run --search ansor --cost-model xgb` from an empty store at a much larger budget:
       the "maximum speedup";
   (d) from (c)'s store: the tuning seconds ansor needed until its estimated latency (sum over tasks
       of weight x best kernel latency) was as low as transfer's. A task ansor has not measured yet
       counts at its untuned latency (from transfer's measurement of the unscheduled program), so
       ansor's curve starts at its first trial, not only once every task has a record.
   Then the target is built untuned (a), with (b)'s and with (c)'s records and all builds are timed
   together in alternating passes (`common.time_together`).
3. % of maximum speedup = speedup(b) / speedup(c), speedups over untuned end to end (TT's definition:
   1.0 means transfer is as fast as full tuning). Search-time ratio = (d) / (b)'s tuning seconds.

    python bench/transfer.py [--donors zoo:resnet-50,zoo:mobilenet-v2,zoo:bert-tiny] [--donor-trials 1000]
        [--targets zoo:resnet-18,zoo:bert-base] [--transfer-trials 200] [--full-trials 800] [--cost-models none,xgb]

Resumable: every tuning run is kept in --work and not repeated. Writes bench/results/transfer.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
from common import command_line, environment, write_results  # noqa: E402

from tunecore.bench import copy_sqlite, curve  # noqa: E402

# Transfer-Tuning (PACT'22), its abstract and section 6: share of Ansor's maximum speedup reached, and how
# many times more search time Ansor needed to reach Transfer-Tuning's speedup.
PAPER = {"server CPU (Xeon E5-2620)": {"average_pct": 49, "max_pct": 88, "search_time_ratio": 6.5},
         "edge CPU (Cortex-A53)": {"search_time_ratio": 10.8}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--donors", default="zoo:resnet-50,zoo:mobilenet-v2,zoo:bert-tiny")
    parser.add_argument("--donor-trials", type=int, default=1000)
    parser.add_argument("--targets", default="zoo:resnet-18,zoo:bert-base")
    parser.add_argument("--transfer-trials", type=int, default=200)
    parser.add_argument("--full-trials", type=int, default=800)
    parser.add_argument("--cost-models", default="none,xgb", help="cost models for transfer, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "tunecore-bench-transfer"))
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    donors, targets = args.donors.split(","), args.targets.split(",")
    if set(donors) & set(targets):
        parser.error(f"--targets must not be donors: {', '.join(sorted(set(donors) & set(targets)))}")
    if min(args.donor_trials, args.transfer_trials, args.full_trials) < 1:
        parser.error("trial budgets must be >= 1")

    os.makedirs(args.work, exist_ok=True)
    done = os.path.join(args.work, "runs.json")
    pool = os.path.join(args.work, f"donors-{args.donor_trials}-{args.seed}.db")

    def tune_donors() -> dict:  # one pool, filled from empty: each run adds its model to the same store
        common.remove_sqlite(pool)
        return {model: common.run_tunecore(model, args.donor_trials, args.seed, search="ansor", cost_model="xgb", store=pool)
                for model in donors}

    donor_runs = common.cached_run(done, f"donors {','.join(donors)} ansor xgb {args.donor_trials} {args.seed}", tune_donors)

    results = {}
    for model in targets:
        slug = model.replace(":", "-")
        runs, stores = {}, {}
        for cost_model in args.cost_models.split(","):
            name = f"transfer+{cost_model}"
            stores[name] = os.path.join(args.work, f"{slug}-{name}.db")

            def transfer(store=stores[name], cost_model=cost_model):
                common.remove_sqlite(store)
                copy_sqlite(pool, store)
                return common.run_tunecore(model, args.transfer_trials, args.seed, search="transfer",
                                           cost_model=cost_model, store=store)

            runs[name] = common.cached_run(done, f"{model} {name} {args.transfer_trials} {args.seed} pool {args.donors} {args.donor_trials}",
                                           transfer)
        stores["ansor+xgb"] = os.path.join(args.work, f"{slug}-ansor-xgb-{args.full_trials}.db")
        runs["ansor+xgb"] = common.cached_run(done, f"{model} ansor+xgb {args.full_trials} {args.seed}", lambda: common.run_tunecore(
            model, args.full_trials, args.seed, search="ansor", cost_model="xgb", store=f"sqlite:{stores['ansor+xgb']}"))
        ansor_curve = curve(stores["ansor+xgb"], model=model, search="ansor",
                            start_s=_untuned_latencies(next(s for n, s in stores.items() if n.startswith("transfer"))))
        for name, run in runs.items():
            run["ansor_seconds_to_match"] = _seconds_to_reach(ansor_curve, run["estimated_latency_ms"])
        print(f"building and timing {model} ...", file=sys.stderr, flush=True)
        builds = common.time_together(model, stores, args.passes)
        tasks = {name: run.pop("tasks") for name, run in runs.items()}
        results[model] = {"runs": runs, "builds": builds, "ansor_curve": ansor_curve,
                          "transfer_tasks": {name: t for name, t in tasks.items() if name.startswith("transfer")}}

    report = {"benchmark": "transfer", "donors": donor_runs, "targets": results, "paper": PAPER,
              "settings": {k: getattr(args, k) for k in ("donor_trials", "transfer_trials", "full_trials", "cost_models", "seed", "passes")},
              "environment": environment(), "command": command_line("transfer.py")}
    for run in donor_runs.values():
        run.pop("tasks", None)
    write_results(args.out, "transfer", report, markdown(report))


def _untuned_latencies(store_file: str) -> dict[str, float]:
    """Task id -> latency of its unscheduled program, as transfer measured it."""
    from tunecore.store.sqlite import SqliteStore

    store = SqliteStore(store_file)
    try:
        return {t.task_id: r.latency for t in store.get_tasks() for r in store.records(t.task_id)
                if r.origin == "untuned" and r.latency is not None}
    finally:
        store.close()


def _seconds_to_reach(curve: dict, estimate_ms: float | None) -> float | None:
    """Tuning seconds after which the curve's estimate is at most ``estimate_ms``; None if it never gets there."""
    if estimate_ms is None:
        return None
    for seconds, best_s in zip(curve["seconds"], curve["best_s"]):
        if best_s * 1e3 <= estimate_ms:
            return seconds
    return None


def summarize(report: dict) -> list[dict]:
    """Per target and transfer variant: speedups, % of maximum speedup, search-time ratio."""
    rows = []
    for model, result in report["targets"].items():
        builds, runs = result["builds"], result["runs"]
        untuned = builds["untuned"]["latency_ms"]
        full = untuned / builds["ansor+xgb"]["latency_ms"]
        for name, run in runs.items():
            if not name.startswith("transfer"):
                continue
            speedup = untuned / builds[name]["latency_ms"]
            match = run["ansor_seconds_to_match"]
            rows.append({"model": model, "variant": name, "speedup": speedup, "max_speedup": full,
                         "pct_of_max": 100 * speedup / full, "transfer_s": run["elapsed_s"], "ansor_match_s": match,
                         "time_ratio": None if match is None else match / run["elapsed_s"]})
    return rows


def markdown(report: dict) -> str:
    env, settings = report["environment"], report["settings"]
    lines = [
        "# Transfer-Tuning: the store as donor pool",
        "",
        f"CPU: {env['cpu']} ({env['cores']} cores), TVM {env['versions']['apache-tvm']}. Command: `{report['command']}`.",
        "",
        f"Donors, tuned by ansor+xgb with {settings['donor_trials']} trials each into one store: "
        + ", ".join(f"{m} ({r['elapsed_s']:.0f} s)" for m, r in report["donors"].items()) + ".",
        f"Per target: `transfer` with {settings['transfer_trials']} trials on a copy of that store; "
        f"ansor+xgb from scratch with {settings['full_trials']} trials = maximum speedup. End-to-end latencies are "
        f"medians of {settings['passes']} alternating passes over all builds of a target in one process.",
        "",
        "| target | build | tuning s | measured (failed) | estimated ms | end-to-end ms | speedup | % of max speedup | ansor s to match | search-time ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = {(r["model"], r["variant"]): r for r in summarize(report)}
    for model, result in report["targets"].items():
        builds = result["builds"]
        untuned = builds["untuned"]["latency_ms"]
        lines.append(f"| {model} | untuned | - | - | - | {untuned:.1f} | 1.00 | - | - | - |")
        for name, run in result["runs"].items():
            b, r = builds[name], rows.get((model, name))
            estimate = "-" if run["estimated_latency_ms"] is None else f"{run['estimated_latency_ms']:.1f}"
            pct = f"{r['pct_of_max']:.0f}%" if r else "100%"
            match = "-" if not r else ("never" if r["ansor_match_s"] is None else f"{r['ansor_match_s']:.0f}")
            ratio = "-" if not r or r["time_ratio"] is None else f"{r['time_ratio']:.1f}×"
            lines.append(f"| {model} | {name} | {run['elapsed_s']:.0f} | {run['measured']} ({run['errors']}) | {estimate} "
                         f"| {b['latency_ms']:.1f} | {untuned / b['latency_ms']:.2f} | {pct} | {match} | {ratio} |")
    by_variant: dict[str, list[dict]] = {}
    for r in rows.values():
        by_variant.setdefault(r["variant"], []).append(r)
    lines += ["", "| transfer variant | average % of max speedup | average search-time ratio | paper (server CPU) |",
              "|---|---:|---:|---|"]
    paper = report["paper"]["server CPU (Xeon E5-2620)"]
    for variant, rs in by_variant.items():
        ratios = [r["time_ratio"] for r in rs if r["time_ratio"] is not None]
        lines.append(f"| {variant} | {sum(r['pct_of_max'] for r in rs) / len(rs):.0f}% "
                     f"| {(f'{sum(ratios) / len(ratios):.1f}×' if ratios else '-')} "
                     f"| {paper['average_pct']}% (up to {paper['max_pct']}%), {paper['search_time_ratio']}× "
                     f"(edge CPU {report['paper']['edge CPU (Cortex-A53)']['search_time_ratio']}×) |")
    lines += ["", "Per task, what transferred (from the `transfer` run's report):", ""]
    for model, result in report["targets"].items():
        for name, tasks in result["transfer_tasks"].items():
            notes: dict[str, int] = {}
            for t in tasks:
                note = re.sub(r" \(\d+ programs\)", "", t["search_report"].get("note", "-"))
                notes[note] = notes.get(note, 0) + 1
            lines.append(f"- {model} {name}: " + "; ".join(f"{n} × {k}" for k, n in notes.items()))
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
