"""Profile metrics as cost-model features: the oracle study and the two-stage `ncu` model beside xgb.

    python bench/ncu.py [--dataset datasets/cpu-programs-v2.parquet] [--split workload:zoo:resnet-18,zoo:bert-tiny]
                        [--group-size 128] [--name ncu]
    python bench/ncu.py --dataset datasets/gpu-h100.parquet --split task:fused_matmul4_add2_add3 --name ncu-h100

Needs rows with CPU profiles (`tunecore ncu profile`; datasets/README.md says which rows the shipped dataset
has). Everything goes through `tunecore costmodel eval`'s own code (tunecore.dataset.evaluate), on the device
whose rows were profiled, testing only profiled programs (the oracle needs their metrics), on two protocols:
the held-out networks of ``--split`` ranked in groups of ``--group-size`` programs of a task (the study's 128:
recall@32's chance is 0.25), and CDMPP's (every 5th program of a task by latency tested, timings within 1%,
tasks with >= 48 programs; whole tasks ranked). On each:

- (a) the study: `ncu` with `oracle` (the measured callgrind + llvm-mca metrics of the very programs it
  ranks are its features) vs `xgb` on MetaSchedule's static per-store features;
- (b) the two-stage `ncu` (metrics predicted from static features, latency from predicted metrics), and
  with `static=true` (stage B also sees the static features), and that with `objective=rank` (stage B orders
  each task's programs instead of predicting their latency), vs `xgb`;

each twice: trained on the profiled training rows only (everyone sees the same programs), and on every
measured training row (stage A still learns only from profiled ones; how the model would be used). Also
stage A's R^2 per metric on the held-out networks' tasks, what a profile costs, and every table's floor (a
per-task constant) and ceiling (second labels). Writes bench/results/<name>.{json,md} (default ncu; the second
command: the H100's Nsight Compute profiles, one BERT-base task held out, the only one with a whole 128-program
group profiled so far).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from tunecore import experiments
from tunecore.dataset.evaluate import evaluate, measured_groups
from tunecore.dataset.split import CDMPP_PROTOCOL, Split, ranking_group_size, split
from tunecore.dataset.table import Dataset
from tunecore.experiments import command_line, environment, split_tables, write_results

COLUMNS = ("recall@32", "recall@5", "spearman", "pairwise_accuracy", "top1_score", "top5_score", "train_s")
MODELS = {  # label -> (registered name, options)
    "xgb": ("xgb", {}),
    "ncu oracle (measured metrics)": ("ncu", {"oracle": None}),  # the dataset path is filled in
    "ncu two-stage": ("ncu", {}),
    "ncu two-stage + static": ("ncu", {"static": True}),
    "ncu two-stage + static, ranking stage B": ("ncu", {"static": True, "objective": "rank"}),
}


def profiled(row) -> bool:
    """A CPU profile (callgrind + llvm-mca) or a GPU one (Nsight Compute)."""
    return ("cpu.instructions" in row.profile and "cpu.failed" not in row.profile) or \
        ("ncu.smsp__inst_executed.sum" in row.profile and "ncu.failed" not in row.profile)


def run_models(dataset: Dataset, parts: Split, path: str, seed: int, group_size: int | None) -> dict:
    """Every model of ``MODELS`` on one split, the oracle given the dataset's path."""
    models = {label: (name, {k: (path if k == "oracle" else v) for k, v in options.items()})
              for label, (name, options) in MODELS.items()}
    return evaluate(dataset, parts, models, seed=seed, group_size=group_size)


def chance_recall(parts: Split, k: int) -> float:
    sizes: dict[tuple, int] = {}
    for row in parts.test:
        sizes[row.task_key, row.device_id] = sizes.get((row.task_key, row.device_id), 0) + 1
    return float(np.mean([min(k, n) / n for n in sizes.values() if n >= 2]))


def stage_a_r2(dataset: Dataset, parts: Split, seed: int) -> dict[str, float]:
    """R^2 of stage A's predicted log(metric per FLOP) on the held-out tasks' profiled programs."""
    from tunecore_ncu_costmodel.model import NcuModel

    model = NcuModel(seed=seed)
    model.update_all([(t, c, r) for t, c, r, _ in measured_groups(dataset, parts.train)])
    predicted, measured = [], []
    for task, candidates, results, device in measured_groups(dataset, parts.test):
        model.device = device
        predicted.append(model.predicted_metrics(task, candidates))
        measured.append(model.metric_matrix([(r.profile, np.log(max(task.flops, 1.0))) for r in results]))
    p, m = np.concatenate(predicted), np.concatenate(measured)
    out = {}
    for j, name in enumerate(model.metric_names):
        ok = ~np.isnan(m[:, j]) & ~np.isnan(p[:, j])
        residual = np.sum((m[ok, j] - p[ok, j]) ** 2)
        total = np.sum((m[ok, j] - m[ok, j].mean()) ** 2)
        out[name] = round(float(1 - residual / total), 3) if total > 0 else None
    return out


def profile_costs(rows: list) -> dict | None:
    """What the CPU profiles cost, as recorded when each was made (None: GPU profiles, which record no time)."""
    rows = [r for r in rows if "cpu.profile_secs" in r.profile]
    if not rows:
        return None
    secs = np.array([r.profile["cpu.profile_secs"] for r in rows])
    ratio = secs / np.array([r.latency for r in rows])
    return {"rows": len(rows), "mean_s": round(float(secs.mean()), 2), "median_s": round(float(np.median(secs)), 2),
            "p90_s": round(float(np.percentile(secs, 90)), 2), "max_s": round(float(secs.max()), 2),
            "median_over_latency": round(float(np.median(ratio)), 1)}


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--dataset", default="datasets/cpu-programs-v2.parquet")
    parser.add_argument("--split", default="workload:zoo:resnet-18,zoo:bert-tiny")
    parser.add_argument("--group-size", type=int, default=128,
                        help="rank the held-out networks' programs in groups of exactly this many programs of a task "
                             "(default 128, the study's; 0: whole tasks)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="ncu", help="results file name (default ncu)")
    args = parser.parse_args()

    dataset = Dataset.load(args.dataset)
    rows = [r for r in dataset.rows if profiled(r)]
    device = max({r.device_id for r in rows}, key=lambda d: sum(r.device_id == d for r in rows))
    held = "held-out networks" if args.split.startswith("workload:") else f"held out by {args.split}"
    protocols = {held: split(dataset, args.split, args.seed, devices=[device]),
                 "CDMPP's protocol": split(dataset, seed=args.seed, devices=[device], **CDMPP_PROTOCOL)}
    results, chance = {}, {}
    for protocol, base in protocols.items():
        test = [r for r in base.test if profiled(r)]
        group_size = ranking_group_size(base.spec, args.group_size)
        settings = {
            "profiled training rows": dataclasses.replace(base, train=[r for r in base.train if profiled(r)],
                                                          test=test),
            "every measured training row": dataclasses.replace(base, test=test),
        }
        chance[protocol] = {f"recall@{k}": round(k / group_size if group_size else
                                                 chance_recall(settings["profiled training rows"], k), 3)
                            for k in (32, 5)}
        for name, parts in settings.items():
            results[f"{protocol}, {name}"] = run_models(dataset, parts, os.path.abspath(args.dataset), args.seed,
                                                        group_size)
    held_out = protocols[held]
    report = {
        "command": command_line("ncu.py"),
        "environment": environment(),
        "dataset": {"path": args.dataset, "device": device,
                    "profiled_rows": sum(r.device_id == device for r in rows), "profiled_rows_all_devices": len(rows),
                    "kind": dataset.devices[device].get("kind", "llvm"), "held_out": held,
                    "failed_profiles": sum(("cpu.failed" in r.profile or "ncu.failed" in r.profile)
                                           for r in dataset.rows if r.device_id == device)},
        "group_size": args.group_size or None,
        "chance": chance,
        "profile_cost": profile_costs([r for r in rows if r.device_id == device]),
        "stage_a_r2": stage_a_r2(dataset, dataclasses.replace(
            held_out, train=[r for r in held_out.train if profiled(r)], test=[r for r in held_out.test if profiled(r)]),
            args.seed),
        "results": results,
    }
    write_results(args.out, args.name, report, markdown(report))


def markdown(report: dict) -> str:
    data, cost = report["dataset"], report["profile_cost"]
    gpu = data.get("kind") == "cuda"
    held = data.get("held_out", "held-out networks")
    lines = [
        f"# Profile metrics as cost-model features on {'an NVIDIA GPU' if gpu else 'this CPU'}",
        "",
        f"Dataset `{data['path']}`: {data['profiled_rows']} programs with "
        + ("Nsight Compute profiles (the study's metrics, one call each, the GPU's clocks as they were)" if gpu else
           "CPU profiles (callgrind + llvm-mca)")
        + f" on device `{data['device']}` ({data['failed_profiles']} could not be profiled; "
        f"{data.get('profiled_rows_all_devices', '?')} on all devices). Every program profiled the same way"
        + ("." if gpu else ": one cold call, the device's caches simulated.")
        + " Test: the profiled programs of the test side's tasks. Chance of recall@32 and recall@5: "
        + "; ".join(f"{protocol} {c['recall@32']} and {c['recall@5']}" for protocol, c in report["chance"].items())
        + (f" ({held} ranked in groups of {report['group_size']} programs of a task, CDMPP's protocol in "
           "whole tasks)." if report.get("group_size") else " (whole tasks)."),
        f"{experiments.environment_line(report)}",
        "",
    ]
    if cost:
        lines += [f"A profile costs {cost['median_s']} s (median; mean {cost['mean_s']} s, p90 {cost['p90_s']} s, max "
                  f"{cost['max_s']} s), {cost['median_over_latency']}x the program's measured latency (median), as "
                  "recorded when each profile was made (datasets/README.md says where and how many at a time).", ""]
    lines += split_tables(report["results"], COLUMNS)
    lines += [f"## Stage A: R^2 of predicted log(metric per FLOP) on the tasks {held}", "",
              "| metric | R^2 |", "|---|---:|"]
    lines += [f"| {name} | {r2} |" for name, r2 in report["stage_a_r2"].items()]
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
