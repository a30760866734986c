"""How repeatable are a dataset's labels on this machine? Stored latency against now, and now against now.

For each device of the dataset that this machine is (the device id of the row's target here equals the
row's), a seeded sample of ``--tasks`` tasks x ``--per-task`` measured programs is measured twice now,
back to back, by the local measurer with its defaults (those `tunecore dataset collect` used). Per
device: the error |a - b| / b of the stored latency against the second measurement (mean = MAPE,
median, 90th percentile) and the median stored / now ratio, beside the same between the two
measurements of now. The second is the floor of any latency predictor's MAPE on this machine; the
first says how far the stored labels are from what a quiet machine measures.

Run it with nothing else on the machine.

    python bench/label_noise.py [--dataset datasets/cpu-programs.parquet] [--tasks 25] [--per-task 8]

Writes bench/results/label_noise.{json,md}.
"""

from __future__ import annotations

import json
import time

import numpy as np

from tunecore import experiments
from tunecore.experiments import command_line, environment, write_results


def errors(reference: np.ndarray, other: np.ndarray) -> dict[str, float]:
    ape = np.abs(other - reference) / reference
    return {"mape": float(ape.mean()), "median_ape": float(np.median(ape)), "p90_ape": float(np.quantile(ape, 0.9)),
            "median_ratio": float(np.median(other / reference))}


def remeasure_twice(dataset, rows: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stored, first and second latency now, of the programs that ran every time."""
    from tunecore.dataset.evaluate import measured_groups
    from tunecore.measure.local import LocalMeasurer

    groups = measured_groups(dataset, rows)
    measurer = LocalMeasurer(groups[0][0].target)
    triples = []
    try:
        for task, candidates, results, _ in groups:
            first = measurer.measure(task, candidates)
            second = measurer.measure(task, candidates)
            triples += [(r.latency, a.latency, b.latency) for r, a, b in zip(results, first, second)
                        if a.latency is not None and b.latency is not None]
    finally:
        measurer.close()
    stored, first, second = (np.array(column) for column in zip(*triples))
    return stored, first, second


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--dataset", default="datasets/cpu-programs.parquet")
    parser.add_argument("--tasks", type=int, default=25)
    parser.add_argument("--per-task", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from tunecore.dataset.table import Dataset
    from tunecore.targets import device_descriptor, device_id
    from tunecore.tvmjson import target_from_json

    dataset = Dataset.load(args.dataset)
    by_device: dict[str, list] = {}
    for row in dataset.rows:
        if row.latency is not None:
            by_device.setdefault(row.device_id, []).append(row)
    report: dict = {"command": command_line("label_noise.py"), "environment": environment(),
                    "dataset": args.dataset, "devices": {}}
    rng = np.random.default_rng(args.seed)
    for device, rows in sorted(by_device.items()):
        if device_id(device_descriptor(target_from_json(rows[0].target))) != device:
            continue  # another machine: its labels cannot be checked here
        tasks = sorted({r.task_key for r in rows})
        sample = []
        for key in rng.choice(tasks, size=min(args.tasks, len(tasks)), replace=False):
            members = dataset.rows_of(key, device)
            members = [r for r in members if r.latency is not None]
            sample += [members[i] for i in rng.choice(len(members), size=min(args.per_task, len(members)),
                                                      replace=False)]
        started = time.perf_counter()
        stored, first, second = remeasure_twice(dataset, sample)
        report["devices"][device] = {
            "description": dataset.devices[device], "target": json.loads(rows[0].target),
            "programs": len(stored), "tasks": min(args.tasks, len(tasks)),
            "stored_vs_now": errors(second, stored), "now_vs_now": errors(second, first),
            "seconds": round(time.perf_counter() - started, 1)}
        print(device, json.dumps(report["devices"][device]["stored_vs_now"]),
              json.dumps(report["devices"][device]["now_vs_now"]), flush=True)
    write_results(args.out, "label_noise", report, markdown(report))


def markdown(report: dict) -> str:
    lines = ["# How repeatable are the dataset's labels on this machine", "",
             f"{experiments.environment_line(report)} Dataset `{report['dataset']}`. Error = |a - b| / b "
             "with b the second measurement of now; ratio = a / b.", "",
             "| device | target | programs (tasks) | compared | MAPE | median | 90th pct. | median ratio |",
             "|---|---|---:|---|---:|---:|---:|---:|"]
    for device, r in report["devices"].items():
        target = f"{r['target'].get('mcpu')}, num-cores {r['target'].get('num-cores')}"
        for name, label in (("stored_vs_now", "stored vs now"), ("now_vs_now", "now vs now")):
            e = r[name]
            lines.append(f"| {device} | {target} | {r['programs']} ({r['tasks']}) | {label} | {e['mape']:.1%} "
                         f"| {e['median_ape']:.1%} | {e['p90_ape']:.1%} | {e['median_ratio']:.2f} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
