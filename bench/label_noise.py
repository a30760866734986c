"""How repeatable are a dataset's labels? Second labels of a seeded sample, and the anchors of every collection run.

On this machine's one-thread device (the default of `tunecore dataset collect`), a seeded sample of ``--tasks``
tasks x ``--per-task`` measured programs gets second, independent labels (`tunecore dataset remeasure
--second-labels`: built and timed again in this run, kept in the dataset beside the first, where `costmodel
eval` scores them as its noise ceiling). Programs that already have one are not measured again, so a run that
was stopped resumes. Then, per device of the dataset: rows, clean rows (>= 5 timings within 2%), the spread
of the timings, the machine's load while they were taken, and the error of the second labels against the
first (|second - first| / first: mean = repeat MAPE, median, 90th percentile; the median ratio second / first)
over every program that has both; and every collection run's anchor drift (end against start).

Run it with nothing else on the machine (`touch DATASET.pause` pauses a collection meanwhile).

    python bench/label_noise.py [--dataset datasets/cpu-programs-v2.parquet] [--tasks 40] [--per-task 8]

Writes bench/results/label_noise.{json,md}. The v1 dataset's study (stored labels against a re-measurement,
two-thread and one-thread devices) is bench/results/label_noise-v1.*, made by this script's earlier version.
"""

from __future__ import annotations

import datetime
import time

import numpy as np

from tunecore import experiments
from tunecore.experiments import command_line, environment, write_results


def errors(first: np.ndarray, second: np.ndarray) -> dict[str, float] | None:
    if not len(first):
        return None
    ape = np.abs(second - first) / first
    return {"programs": int(len(first)), "mape": float(ape.mean()), "median_ape": float(np.median(ape)),
            "p90_ape": float(np.quantile(ape, 0.9)), "median_ratio": float(np.median(second / first))}


def take_second_labels(path: str, tasks: int, per_task: int, seed: int) -> dict:
    """Second labels for a seeded sample of this machine's one-thread device's programs."""
    from tunecore.dataset.collect import remeasure
    from tunecore.dataset.protocol import one_thread_target
    from tunecore.dataset.table import Dataset
    from tunecore.targets import device_descriptor, device_id, resolve_target

    dataset = Dataset.load(path)
    here = device_id(device_descriptor(resolve_target(one_thread_target())))
    keys = sorted({r.task_key for r in dataset.rows if r.device_id == here and r.latency is not None})
    if not keys:
        return {"device_id": here, "measured": 0, "note": "this machine's one-thread device is not in the dataset"}
    chosen = np.random.default_rng(seed).choice(keys, size=min(tasks, len(keys)), replace=False)
    return remeasure(path, per_task=per_task, task_keys=set(chosen), seed=seed, anchors=0, second_labels=True)


def device_report(dataset, identity: str) -> dict:
    from tunecore.dataset import protocol

    rows = [r for r in dataset.rows if r.device_id == identity]
    ran = [r for r in rows if r.latency is not None]
    spreads = np.array([r.spread for r in ran if r.spread is not None])
    loads = np.array([r.profile[protocol.FOREIGN_LOAD] for r in ran if protocol.FOREIGN_LOAD in r.profile])
    pairs = [(r.latency, r.profile[protocol.SECOND_LABEL], protocol.is_clean(r)) for r in ran
             if protocol.SECOND_LABEL in r.profile]
    first, second, clean = (np.array(c) for c in zip(*pairs)) if pairs else (np.array([]),) * 3
    clean = clean.astype(bool)
    description = dataset.devices[identity]
    return {
        "description": description, "rows": len(rows), "measured": len(ran),
        "clean": sum(protocol.is_clean(r) for r in ran), "flagged_noisy": sum(protocol.NOISY in r.profile for r in ran),
        "with_repeats": int(len(spreads)),
        "median_spread": float(np.median(spreads)) if len(spreads) else None,
        "p90_spread": float(np.quantile(spreads, 0.9)) if len(spreads) else None,
        "foreign_load": ({"median": float(np.median(loads)), "p90": float(np.quantile(loads, 0.9)),
                          "max": float(loads.max())} if len(loads) else None),
        "second_vs_first": errors(first, second),
        "second_vs_first_clean": errors(first[clean], second[clean]) if len(first) else None,
        "anchor_drift": protocol.anchor_drift(dataset.collections, identity),
    }


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--dataset", default="datasets/cpu-programs-v2.parquet")
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--per-task", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-measure", action="store_true", help="report what the dataset holds, measure nothing")
    args = parser.parse_args()

    from tunecore.dataset.table import Dataset

    started = time.perf_counter()
    taken = None if args.no_measure else take_second_labels(args.dataset, args.tasks, args.per_task, args.seed)
    dataset = Dataset.load(args.dataset)
    report: dict = {"command": command_line("label_noise.py"), "environment": environment(),
                    "dataset": args.dataset, "sample": {"tasks": args.tasks, "per_task": args.per_task,
                                                        "seed": args.seed},
                    "second_labels_taken": taken, "seconds": round(time.perf_counter() - started, 1),
                    "devices": {identity: device_report(dataset, identity) for identity in dataset.devices},
                    "collections": [{k: c.get(k) for k in ("device_id", "command", "started_at", "ended_at", "drift")}
                                    | {"measured": c.get("report", {}).get("measured")}
                                    for c in dataset.collections]}
    write_results(args.out, "label_noise", report, markdown(report))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")


def markdown(report: dict) -> str:
    from tunecore.dataset.table import describe_device

    lines = ["# How repeatable are the dataset's labels", "",
             f"{experiments.environment_line(report)} Dataset `{report['dataset']}`. Clean: >= 5 timings within "
             "2% (std / mean). Repeat error: |second - first| / first of programs with a second, independent "
             "label (taken in another run); ratio: second / first. Foreign load: cores' worth of CPU time other "
             "processes (and the hypervisor) took while a batch was measured.", "",
             "| device | CPU family/model | measured | clean | flagged noisy | median spread | 90th pct. spread "
             "| foreign load median (max) | second labels | repeat MAPE | median | 90th pct. | median ratio "
             "| repeat MAPE, clean rows |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for identity, d in report["devices"].items():
        e, c, load = d["second_vs_first"], d["second_vs_first_clean"], d["foreign_load"]
        lines.append(
            f"| {identity[:8]} {describe_device(d['description'])} | {d['description'].get('family_model', '-')} "
            f"| {d['measured']} | {d['clean']} | {d['flagged_noisy']} | {_pct(d['median_spread'])} "
            f"| {_pct(d['p90_spread'])} | " + (f"{load['median']:.2f} ({load['max']:.2f})" if load else "-")
            + (f" | {e['programs']} | {_pct(e['mape'])} | {_pct(e['median_ape'])} | {_pct(e['p90_ape'])} "
               f"| {e['median_ratio']:.3f}" if e else " | 0 | - | - | - | -")
            + f" | {_pct(c['mape']) if c else '-'} ({c['programs'] if c else 0}) |")
    lines += ["", "## Anchor drift of every collection run", "",
              "The dataset's anchor programs measured at a run's start and end; ratio = median end / start.", "",
              "| device | command | started (UTC) | ended | programs measured | anchors compared | drift ratio "
              "| anchor MAPE |", "|---|---|---|---|---:|---:|---:|---:|"]
    for c in report["collections"]:
        drift = c["drift"]
        lines.append(f"| {c['device_id'][:8]} | {c['command']} | {_when(c['started_at'])} | {_when(c['ended_at'])} "
                     f"| {c['measured'] if c['measured'] is not None else '-'} "
                     + (f"| {drift['programs']} | {drift['ratio']:.3f} | {_pct(drift['mape'])} |" if drift
                        else "| 0 | - | - |"))
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
