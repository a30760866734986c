"""How close tlm's programs get to the best the dataset holds, per kind of kernel: on the tasks its weights learned
from and on held-out ones, against as many uniform samples of the same task.

    python bench/tlm_reach.py --programs LABEL=FILE [--programs ...] [--dataset datasets/cpu-programs-v2.parquet]
                              [--held-out zoo:resnet-18,zoo:mobilenet-v2,zoo:bert-tiny] [--workloads W,...]
                              [--name tlm_reach]

``--programs``: a dataset of programs tlm wrote and measured by the label protocol on one device the dataset has
(``tunecore dataset collect --search tlm --cost-model none --random-fraction 0 --per-task 32``; the files under
datasets/ that begin with ``tlm-programs``). A task counts as held out when a ``--held-out`` workload holds it (the
weights' ``--exclude`` keeps such kernels out of training even where a training network shares them). Per task: the
fastest tlm program over the fastest program the dataset holds on the device (random samples and ansor's), and the
same for the fastest of as many of the dataset's uniform samples as tlm has programs (mean over 20 draws); per kind
of kernel and split, the geometric mean over tasks and the three furthest tasks; with ``--workloads``, only the tasks
those workloads hold (files that cover more than one network compared on one). Writes bench/results/<name>.json
and .md.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from tunecore import experiments
from tunecore.dataset.table import Dataset
from tunecore.experiments import (
    command_line,
    dataset_line,
    dataset_record,
    environment,
    environment_line,
    labelled_paths,
    write_results,
)

HELD_OUT = "zoo:resnet-18,zoo:mobilenet-v2,zoo:bert-tiny"
DRAWS = 20


def kernel_kind(task) -> str:
    """conv 1x1, depthwise conv, conv kxk (weights O x I/groups x kh x kw), matmul, dense, or other."""
    operators = task.kernel_class.split("@")[0]
    if operators.startswith("conv2d") and len(task.args) > 1 and len(task.args[1][2]) == 4:
        _, per_group, kh, kw = task.args[1][2]
        if per_group == 1 and kh * kw > 1:
            return "conv, depthwise"
        return "conv 1x1" if kh == kw == 1 else "conv kxk"
    first = operators.split("_")[0]
    return first if first in ("matmul", "dense", "batch") else "other"


def reach(dataset: Dataset, programs: Dataset, held_out: set[str], workloads: set[str], seed: int) -> dict:
    """Per split and kind: tasks, geometric means of tlm's and uniform samples' fastest over the dataset's best."""
    rng = np.random.default_rng(seed)
    ratios: dict[tuple[str, str], list] = defaultdict(list)
    by_task: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in programs.rows:
        if row.latency is not None:
            by_task[(row.task_key, row.device_id)].append(row.latency)
    for (key, device), latencies in sorted(by_task.items()):
        task = dataset.tasks.get(key)
        if task is None or workloads and not workloads & set(task.workloads):
            continue
        rows = [r for r in dataset.rows_of(key, device) if r.latency is not None]
        uniform = np.array([r.latency for r in rows if r.collected_by == "random"])
        if len(uniform) < len(latencies):
            continue
        best = min(r.latency for r in rows)
        sampled = np.mean([rng.choice(uniform, len(latencies), replace=False).min() for _ in range(DRAWS)])
        split = "held out" if held_out & set(task.workloads) else "learned from"
        ratios[(split, kernel_kind(task))].append((min(latencies) / best, sampled / best, task.name))
    out: dict = {}
    for (split, kind), rows in sorted(ratios.items()):
        out.setdefault(split, {})[kind] = {
            "tasks": len(rows),
            "tlm_over_best": round(math.exp(np.mean([math.log(r[0]) for r in rows])), 4),
            "uniform_over_best": round(math.exp(np.mean([math.log(r[1]) for r in rows])), 4),
            "furthest": [[name, round(ratio, 3)] for ratio, _, name in sorted(rows)[-3:][::-1]]}
    return out


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--programs", action="append", default=[], metavar="LABEL=FILE",
                        help="tlm's measured programs (repeatable)")
    parser.add_argument("--dataset", default="datasets/cpu-programs-v2.parquet")
    parser.add_argument("--held-out", default=HELD_OUT, help="the held-out workloads, comma-separated")
    parser.add_argument("--workloads", default="", help="only tasks of these workloads, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="tlm_reach")
    args = parser.parse_args()
    files = labelled_paths(parser, "--programs", args.programs, "file")
    from tunecore.errors import UsageError

    try:
        dataset = Dataset.load(args.dataset)
        loaded = {label: Dataset.load(path) for label, path in files.items()}
    except UsageError as error:
        parser.error(str(error))
    report = {"command": command_line("tlm_reach.py"), "environment": environment(),
              "dataset": dataset_record(args.dataset, dataset.info()), "held_out": args.held_out,
              "workloads": args.workloads, "programs": files, "reach": {}}
    for label, programs in loaded.items():
        if not any(r.device_id in dataset.devices and r.latency is not None for r in programs.rows):
            parser.error(f"--programs {label}={files[label]}: no measured program on a device the dataset has")
        report["reach"][label] = reach(dataset, programs, set(args.held_out.split(",")),
                                       set(filter(None, args.workloads.split(","))), args.seed)
    write_results(args.out, args.name, report, markdown(report))


def markdown(report: dict) -> str:
    only = f" Only the tasks of {report['workloads']}." if report["workloads"] else ""
    lines = ["# How close tlm's programs get to the best the dataset holds, per kind of kernel", "",
             environment_line(report), dataset_line(report["dataset"]) + ".", "",
             f"Held out: {report['held_out']}.{only} Per task: tlm's fastest program over the fastest the dataset "
             f"`{report['dataset']['path']}` holds for the task on the same device (1.0: as fast; lower is faster), "
             f"and the fastest of as many uniform samples of the dataset (mean over {DRAWS} draws); geometric mean "
             "over the tasks of a kind. Furthest: the three tasks where tlm's fastest is furthest from the best.", "",
             "| programs | split | kind of kernel | tasks | tlm's fastest / best | uniform's fastest / best "
             "| furthest |",
             "|---|---|---|---:|---:|---:|---|"]
    for label, splits in report["reach"].items():
        for split, kinds in splits.items():
            for kind, r in kinds.items():
                furthest = ", ".join(f"`{name}` {ratio}" for name, ratio in r["furthest"])
                lines.append(f"| {label} | {split} | {kind} | {r['tasks']} | {r['tlm_over_best']:.3f} | "
                             f"{r['uniform_over_best']:.3f} | {furthest} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
