"""Transfer-Tuning's experiment (Gibson & Cano, PACT'22) at this machine's scale.

1. Donors: each donor model is tuned with `tunecore run --search ansor --cost-model xgb` into one
   shared store (the pool: no donor is assigned to any target).
2. Per target model (none of them a donor):
   (a) every task's unscheduled program is measured on its own: its latency before tuning;
   (b) `tunecore run --search transfer --cost-model C` on a copy of the pool, for each C in --cost-models;
   (c) `tunecore run --search ansor --cost-model xgb` from an empty store with --full-trials, then the
       same run resumed on a copy of that store up to --converged-trials: the "maximum speedup" at
       both budgets (the curve's last quarter says how converged the larger one is);
   (d) from the curve of (c)'s run from scratch: the tuning seconds (and trials) ansor needed until its
       estimated latency (sum over tasks of weight x best kernel latency; a task not measured yet counts
       at (a)'s latency) was as low as transfer's.
   Then the target is built untuned, with (b)'s and with (c)'s records, and all builds are timed
   together in alternating passes, every build the same way (`tunecore.experiments.time_builds_together`).
3. % of maximum speedup = speedup(b) / speedup(c), speedups over untuned (TT's definition: 100% means
   transfer is as fast as full tuning), end to end and from the kernel estimates. Kernels of the target
   that a donor run tuned itself (same kernel in two models: "shared") cost transfer nothing, so the
   estimate-based % and the time to match are also given over the other kernels alone.

    python bench/transfer.py [--donors zoo:resnet-50,zoo:mobilenet-v2,zoo:bert-tiny] [--donor-trials 1000]
        [--targets zoo:resnet-18,zoo:bert-base] [--transfer-trials 200] [--full-trials 800]
        [--converged-trials 2000] [--cost-models none,xgb]

Resumable: every tuning run is kept in --work and not repeated. Writes bench/results/transfer.{json,md}.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

from tunecore import experiments
from tunecore.experiments import command_line, environment, write_results
from tunecore.experiments.matrix import copy_sqlite, curve

# Transfer-Tuning (PACT'22), its abstract and section 6: share of Ansor's maximum speedup reached, and how
# many times more search time Ansor needed to reach Transfer-Tuning's speedup.
PAPER = {"server CPU (Xeon E5-2620)": {"average_pct": 49, "max_pct": 88, "search_time_ratio": 6.5},
         "edge CPU (Cortex-A53)": {"search_time_ratio": 10.8}}


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--donors", default="zoo:resnet-50,zoo:mobilenet-v2,zoo:bert-tiny")
    parser.add_argument("--donor-trials", type=int, default=1000)
    parser.add_argument("--targets", default="zoo:resnet-18,zoo:bert-base")
    parser.add_argument("--transfer-trials", type=int, default=200)
    parser.add_argument("--full-trials", type=int, default=800)
    parser.add_argument("--converged-trials", type=int, default=2000)
    parser.add_argument("--cost-models", default="none,xgb", help="cost models for transfer, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "tunecore-bench-transfer"))
    args = parser.parse_args()
    donors, targets = args.donors.split(","), args.targets.split(",")
    if set(donors) & set(targets):
        parser.error(f"--targets must not be donors: {', '.join(sorted(set(donors) & set(targets)))}")
    if min(args.donor_trials, args.transfer_trials, args.full_trials) < 1:
        parser.error("trial budgets must be >= 1")
    if args.converged_trials <= args.full_trials:
        parser.error("--converged-trials must be larger than --full-trials")

    os.makedirs(args.work, exist_ok=True)
    done = os.path.join(args.work, "runs.json")
    pool = os.path.join(args.work, f"donors-{args.donor_trials}-{args.seed}.db")

    def tune_donors() -> dict:  # one pool, filled from empty: each run adds its model to the same store
        experiments.remove_sqlite(pool)
        return {model: experiments.run_tunecore(model, args.donor_trials, args.seed, search="ansor", cost_model="xgb",
                                           store=pool)
                for model in donors}

    donor_runs = experiments.cached_run(done, f"donors {','.join(donors)} ansor xgb {args.donor_trials} {args.seed}",
                                   tune_donors)

    results = {}
    for model in targets:
        slug = model.replace(":", "-")
        untuned = experiments.cached_run(done, f"{model} untuned tasks", lambda: _untuned_latencies(model))
        shared = _tuned_in(pool, untuned)
        runs, stores = {}, {}
        for cost_model in args.cost_models.split(","):
            name = f"transfer+{cost_model}"
            stores[name] = os.path.join(args.work, f"{slug}-{name}.db")

            def transfer(store=stores[name], cost_model=cost_model):
                experiments.remove_sqlite(store)
                copy_sqlite(pool, store)
                return experiments.run_tunecore(model, args.transfer_trials, args.seed, search="transfer",
                                           cost_model=cost_model, store=store)

            runs[name] = experiments.cached_run(done, f"{model} {name} {args.transfer_trials} {args.seed} "
                                                 f"pool {args.donors} {args.donor_trials}",
                                           transfer)
        full, converged = f"ansor+xgb {args.full_trials}", f"ansor+xgb {args.converged_trials}"
        stores[full] = os.path.join(args.work, f"{slug}-ansor-xgb-{args.full_trials}.db")
        stores[converged] = os.path.join(args.work, f"{slug}-ansor-xgb-{args.full_trials}-{args.converged_trials}.db")
        runs[full] = experiments.cached_run(
            done, f"{model} ansor+xgb {args.full_trials} {args.seed}", lambda: experiments.run_tunecore(
                model, args.full_trials, args.seed, search="ansor", cost_model="xgb", store=f"sqlite:{stores[full]}"))

        def resume_ansor() -> dict:  # the same run, given more trials: it continues from the smaller budget's store
            experiments.remove_sqlite(stores[converged])
            copy_sqlite(stores[full], stores[converged])
            return experiments.run_tunecore(model, args.converged_trials, args.seed, search="ansor", cost_model="xgb",
                                       store=stores[converged])

        runs[converged] = experiments.cached_run(
            done, f"{model} ansor+xgb {args.full_trials}->{args.converged_trials} {args.seed}", resume_ansor)
        # time to match from the run from scratch: the resumed run has a copy of its records, not its own start
        ansor_curve = curve(stores[full], model=model, search="ansor", start_s=untuned)
        unshared = [t for t in untuned if t not in shared]
        unshared_curve = curve(stores[full], model=model, search="ansor", start_s=untuned, task_ids=unshared)
        kernels = {name: _best_latencies(store, untuned) for name, store in stores.items()}
        print(f"building and timing {model} ...", file=sys.stderr, flush=True)
        builds = experiments.time_builds_together(model, stores, args.passes)
        results[model] = {"runs": runs, "builds": builds, "ansor_curve": ansor_curve,
                          "ansor_curve_unshared": unshared_curve,
                          "converged_curve": curve(stores[converged], model=model, search="ansor", start_s=untuned),
                          "untuned_kernels_s": untuned, "shared_tasks": sorted(shared), "best_kernels_s": kernels,
                          "tasks": {t["task_id"]: {k: t[k] for k in ("name", "weight", "flops")}
                                    for t in runs[full]["tasks"]},
                          "transfer_tasks": {name: run["tasks"] for name, run in runs.items()
                                             if name.startswith("transfer")}}
        for run in runs.values():
            run.pop("tasks", None)

    report = {"benchmark": "transfer", "donors": donor_runs, "targets": results, "paper": PAPER,
              "settings": {k: getattr(args, k) for k in ("donor_trials", "transfer_trials", "full_trials",
                                                         "converged_trials", "cost_models", "seed", "passes")},
              "environment": environment(), "command": command_line("transfer.py")}
    for run in donor_runs.values():
        run.pop("tasks", None)
    write_results(args.out, "transfer", report, markdown(report))


def _untuned_latencies(model: str) -> dict[str, float]:
    """Task id -> latency of the task's unscheduled program, each measured on its own by the local measurer."""
    from tunecore.interfaces import Candidate
    from tunecore.measure.local import LocalMeasurer
    from tunecore.targets import resolve_target
    from tunecore.tvmjson import new_schedule
    from tunecore.workloads import extract_tasks, load_workload

    target = resolve_target("llvm")
    measurer = LocalMeasurer(target, run_timeout=600, build_timeout=600, screen=0, repeat=1)
    try:
        latencies = {}
        for task in extract_tasks(load_workload(model), target):
            (result,) = measurer.measure(task,
                                         [Candidate.from_schedule(task, new_schedule(task.mod), origin="untuned")])
            if result.error:
                raise SystemExit(f"{model} {task.name}: the unscheduled program failed: {result.error}")
            latencies[task.task_id] = result.latency
        return latencies
    finally:
        measurer.close()


def _tuned_in(store_file: str, task_ids) -> set[str]:
    """The tasks that have records in a store (a donor run tuned these very kernels)."""
    from tunecore.store.sqlite import SqliteStore

    store = SqliteStore(store_file)
    try:
        return {t for t, n in store.counts(list(task_ids)).items() if n}
    finally:
        store.close()


def _best_latencies(store_file: str, task_ids) -> dict[str, float | None]:
    """Task id -> the fastest record's latency in a store (what a build from it uses)."""
    from tunecore.store.sqlite import SqliteStore

    store = SqliteStore(store_file)
    try:
        return {t: (best[0].latency if (best := store.best(t)) else None) for t in task_ids}
    finally:
        store.close()


def _to_reach(curve: dict, estimate_s: float) -> tuple[int, float] | tuple[None, None]:
    """(trials, tuning seconds) after which the curve's estimate is at most ``estimate_s``; Nones if never."""
    for trials, seconds, best_s in zip(curve["trials"], curve["seconds"], curve["best_s"]):
        if best_s <= estimate_s:
            return trials, seconds
    return None, None


def _estimate(result: dict, build: str, task_ids) -> float:
    """Sum of weight x latency over the tasks: the build's best kernels ("untuned": the unscheduled programs)."""
    latencies = result["untuned_kernels_s"] if build == "untuned" else result["best_kernels_s"][build]
    return sum(result["tasks"][t]["weight"] * (latencies[t] if latencies[t] is not None
                                               else result["untuned_kernels_s"][t])
               for t in task_ids)


def _converged_share(curve: dict) -> float | None:
    """How much the estimate still fell over the last quarter of the curve's trials (0.01 = 1%)."""
    if not curve["trials"]:
        return None
    last = curve["trials"][-1]
    before = [b for t, b in zip(curve["trials"], curve["best_s"]) if t <= 0.75 * last]
    return 1 - curve["best_s"][-1] / before[-1] if before else None


def summarize(report: dict) -> list[dict]:
    """Per target and transfer variant: speedups, % of maximum speedup (end to end and estimated, with and
    without shared kernels, against both ansor budgets), search-time ratios."""
    settings = report["settings"]
    full, converged = f"ansor+xgb {settings['full_trials']}", f"ansor+xgb {settings['converged_trials']}"
    rows = []
    for model, result in report["targets"].items():
        builds, runs = result["builds"], result["runs"]
        every = list(result["tasks"])
        unshared = [t for t in every if t not in result["shared_tasks"]]

        def speedup(build, tasks=None):
            if tasks is None:  # end to end
                return builds["untuned"]["latency_ms"] / builds[build]["latency_ms"]
            return _estimate(result, "untuned", tasks) / _estimate(result, build, tasks)

        for name, run in runs.items():
            if not name.startswith("transfer"):
                continue
            trials_all, match_all = _to_reach(result["ansor_curve"], _estimate(result, name, every))
            trials_unshared, match_unshared = _to_reach(result["ansor_curve_unshared"],
                                                        _estimate(result, name, unshared))
            rows.append({
                "model": model, "variant": name, "speedup": speedup(name),
                "pct_of_max": {ansor: 100 * speedup(name) / speedup(ansor) for ansor in (full, converged)},
                "pct_of_max_estimated": 100 * speedup(name, every) / speedup(converged, every),
                "pct_of_max_estimated_unshared": 100 * speedup(name, unshared) / speedup(converged, unshared),
                "transfer_s": run["elapsed_s"], "ansor_match_s": match_all, "ansor_match_unshared_s": match_unshared,
                "time_ratio": None if match_all is None else match_all / run["elapsed_s"],
                "time_ratio_unshared": None if match_unshared is None else match_unshared / run["elapsed_s"],
                "transfer_trials": run["measured"], "ansor_match_trials": trials_all,
                "ansor_match_unshared_trials": trials_unshared,
            })
    return rows


def _pct(value: float) -> str:
    return f"{int(value)}%"  # rounded down: never in transfer's favour


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}×"


def markdown(report: dict) -> str:
    env, settings = report["environment"], report["settings"]
    full, converged = f"ansor+xgb {settings['full_trials']}", f"ansor+xgb {settings['converged_trials']}"
    lines = [
        "# Transfer-Tuning: the store as donor pool",
        "",
        f"CPU: {env['cpu']} ({env['cores']} cores), target `{env['target'].get('mcpu')}`, TVM "
        f"{env['versions']['apache-tvm']}. Command: `{report['command']}`.",
        "",
        f"Donors, tuned by ansor+xgb with {settings['donor_trials']} trials each into one store: "
        + ", ".join(f"{m} ({r['elapsed_s']:.0f} s)" for m, r in report["donors"].items()) + ".",
        f"Per target: `transfer` with {settings['transfer_trials']} trials on a copy of that store; ansor+xgb from "
        f"scratch with {settings['full_trials']} trials, and on a copy of its store resumed up to "
        f"{settings['converged_trials']} (+: the resumed run's own seconds and trials); both are maximum speedups. "
        f"End-to-end latencies: median of {settings['passes']} alternating passes over all builds of a "
        "target in one process, every build timed the same way.",
        "",
        "| target | build | tuning s | measured (failed) | estimated ms | end-to-end ms | speedup |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for model, result in report["targets"].items():
        builds = result["builds"]
        untuned = builds["untuned"]["latency_ms"]
        lines.append(f"| {model} | untuned | - | - | {_estimate(result, 'untuned', result['tasks']) * 1e3:.1f} "
                     f"| {untuned:.1f} | 1.00 |")
        for name, run in result["runs"].items():
            b = builds[name]
            more = "+" if name == converged else ""  # the resumed run: on top of a first run's trials
            lines.append(f"| {model} | {name} | {more}{run['elapsed_s']:.0f} "
                         f"| {more}{run['measured']} ({run['errors']}) "
                         f"| {_estimate(result, name, result['tasks']) * 1e3:.1f} | {b['latency_ms']:.1f} "
                         f"| {untuned / b['latency_ms']:.2f} |")
    lines += ["", "Shared kernels: tasks of the target that a donor run tuned itself (the same kernel in two models).",
              ""]
    for model, result in report["targets"].items():
        flops = {t: v["weight"] * v["flops"] for t, v in result["tasks"].items()}
        shared = result["shared_tasks"]
        names = ", ".join(result["tasks"][t]["name"] for t in shared) or "none"
        lines.append(f"- {model}: {len(shared)} of {len(result['tasks'])} tasks, "
                     f"{_pct(100 * sum(flops[t] for t in shared) / sum(flops.values()))} of its FLOPs ({names}); "
                     f"ansor's estimate still fell by {100 * (_converged_share(result['converged_curve']) or 0):.1f}% "
                     f"over the last quarter of its {settings['converged_trials']} trials.")
    lines += [
        "",
        f"% of maximum speedup = transfer's speedup / ansor's speedup over untuned; end to end against ansor at "
        f"{settings['full_trials']} and {settings['converged_trials']} trials, and from the kernel estimates (against "
        f"{settings['converged_trials']}) with every kernel and without the shared ones. Time to match: tuning seconds "
        f"of ansor's {settings['full_trials']}-trial run until its estimate (a task not measured yet at its "
        "untuned latency) was as low as transfer's, over every kernel and over the unshared ones (ansor's seconds "
        "include the time it spent on shared kernels; its trials count only those on the kernels in question). "
        "Ratio = that / transfer's tuning seconds; trials: ansor's trials to match / transfer's measured trials.",
        "",
        f"| target | transfer | e2e % of max ({settings['full_trials']}) "
        f"| e2e % of max ({settings['converged_trials']}) "
        "| est. % of max | est. % of max, unshared | ansor s to match | ratio | ansor s to match, unshared "
        "| ratio, unshared | ansor trials to match / transfer's | unshared |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    rows = summarize(report)
    for r in rows:
        match = "never" if r["ansor_match_s"] is None else f"{r['ansor_match_s']:.0f}"
        match_unshared = "never" if r["ansor_match_unshared_s"] is None else f"{r['ansor_match_unshared_s']:.0f}"
        lines.append(f"| {r['model']} | {r['variant']} | {_pct(r['pct_of_max'][full])} "
                     f"| {_pct(r['pct_of_max'][converged])} "
                     f"| {_pct(r['pct_of_max_estimated'])} | {_pct(r['pct_of_max_estimated_unshared'])} | {match} "
                     f"| {_ratio(r['time_ratio'])} | {match_unshared} | {_ratio(r['time_ratio_unshared'])} "
                     f"| {r['ansor_match_trials'] or 'never'} / {r['transfer_trials']} "
                     f"| {r['ansor_match_unshared_trials'] or 'never'} / {r['transfer_trials']} |")
    paper = report["paper"]
    lines += ["", f"Paper (server CPU): {paper['server CPU (Xeon E5-2620)']['average_pct']}% of the maximum speedup on "
              f"average (up to {paper['server CPU (Xeon E5-2620)']['max_pct']}%), search-time ratio "
              f"{paper['server CPU (Xeon E5-2620)']['search_time_ratio']}× (edge CPU "
              f"{paper['edge CPU (Cortex-A53)']['search_time_ratio']}×).", "",
              "Per task, what transferred (from the `transfer` run's report):", ""]
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
