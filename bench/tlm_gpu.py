"""What tlm writes for a GPU, without one: per weights, how many of the programs it writes pass MetaSchedule's GPU
checks (thread and shared-memory limits), decoding within the sketches' GPU limits and without them (TLM's way),
beside uniform samples of the same design spaces; each column's programs stay behind as a batch for a GPU session to
time (docs/gpu.md).

    python bench/tlm_gpu.py --weights LABEL=FILE [--weights ...] [--models M,...] [--kernels K,...] [--per-task 32]
                            [--uniform-draws 400] [--limits on,off] [--dataset datasets/gpu-h100.parquet]
                            [--name tlm_gpu]
    python bench/tlm_gpu.py --weights ... --models zoo:bert-base --kernels matmul --name tlm_gpu-bert-base

``--weights shipped=shipped`` is the shipped weights (learned on CPU programs). The target is the GPU dataset's (its
rows' target: the H100's). Per weights, every task of --models (by default bench/gpu.py's three operators; the
second command: BERT-base's matmuls, tasks the dataset holds) into one batch, .gpu/b-NAME-LABEL, as `tunecore dataset
export-batch --search tlm -O search.weights=FILE -O search.rewrite=0 [-O search.limits=false]` makes it (columns
LABEL and "LABEL, no limits"): tlm's first batch with nothing measured, the programs the model wrote until
--per-task of them were valid (five rounds at most), then uniform samples for the rest. Valid share: the model's
programs that MetaSchedule's postprocessors accept, of all it wrote.
Uniform: the share of --uniform-draws draws of the task's design space (its sketches in turn) that they accept.
Writes bench/results/<name>.json and .md.
"""

from __future__ import annotations

import os

from tunecore import experiments
from tunecore.experiments import command_line, environment, environment_line, labelled_paths, write_results

OPS = "op:matmul-1024,op:conv2d-resnet50-c2,op:dense-bert"  # bench/gpu.py's


def uniform_valid_share(task, draws: int, seed: int) -> float:
    """The share of ``draws`` uniform draws of the task's design space (its sketches in turn) the postprocessors
    accept."""
    from tunecore.space import DesignSpace

    space = DesignSpace(task, seed=seed)
    postprocs = space.thread_postprocs()
    valid = sum(space.sample(i % len(space.sketches), seed=seed + i, postprocs=postprocs) is not None
                for i in range(draws))
    return valid / draws


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--weights", action="append", default=[], metavar="LABEL=FILE",
                        help="tlm weights (repeatable; FILE 'shipped' for the shipped ones)")
    parser.add_argument("--models", default=OPS)
    parser.add_argument("--kernels", default="", help="only tasks of these operators (as for export-batch)")
    parser.add_argument("--per-task", type=int, default=32)
    parser.add_argument("--uniform-draws", type=int, default=400)
    parser.add_argument("--dataset", default="datasets/gpu-h100.parquet", help="the GPU dataset (its target)")
    parser.add_argument("--work", default=".gpu",
                        help="where the batches go, a folder b-NAME-LABEL each (bench/gpu_pack.sh packs them)")
    parser.add_argument("--limits", default="on,off",
                        help="decode within the GPU limits (on), without them (off), or both in turn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="tlm_gpu")
    args = parser.parse_args()
    files = labelled_paths(parser, "--weights", args.weights, "weights file")
    limits = args.limits.split(",")
    if not limits or set(limits) - {"on", "off"}:
        parser.error(f"--limits {args.limits!r}: expected on, off or on,off")
    columns = {f"{label}{'' if on == 'on' else ', no limits'}": (path, on == "on")
               for label, path in files.items() for on in limits}

    from tunecore.dataset.batch import export_batch
    from tunecore.errors import UsageError
    from tunecore.targets import resolve_target
    from tunecore.workloads import extract_tasks, has_kernel, load_workload

    try:
        target_json = experiments.dataset_target(args.dataset)
    except UsageError as error:
        parser.error(str(error))
    target = resolve_target(target_json)
    models, kernels = args.models.split(","), tuple(filter(None, args.kernels.split(",")))
    report = {"command": command_line("tlm_gpu.py"), "environment": environment(), "target": target_json,
              "weights": files, "columns": list(columns), "per_task": args.per_task,
              "uniform_draws": args.uniform_draws, "tasks": {}}
    directories = {column: os.path.join(args.work, f"b-{args.name}-{column.replace(', no limits', '-nolimits')}")
                   for column in columns}
    for directory in directories.values():
        if os.path.exists(directory):
            parser.error(f"{directory} exists: a batch of an earlier run (time it, or remove it)")
    for model in models:  # by task key: two networks' tasks of one name stay apart
        for task in extract_tasks(load_workload(model), target):
            if (not kernels or has_kernel(task.kernel_class, kernels)) and task.workload_hash not in report["tasks"]:
                report["tasks"][task.workload_hash] = {"name": task.name, "workload": model,
                                                       "uniform_valid_share": uniform_valid_share(
                                                           task, args.uniform_draws, args.seed)}
    for label, (path, limited) in columns.items():
        exported = export_batch(directories[label], models, target, args.per_task, kernels=kernels, seed=args.seed,
                                search="tlm", options={"search": {"weights": path, "rewrite": 0, "limits": limited}})
        for written in exported["written"].values():
            valid = written["generated"] - written["invalid"]
            report["tasks"][written["task_key"]][label] = {**written, "valid": valid,
                                                          "valid_share": valid / max(written["generated"], 1)}
        report.setdefault("batches", {})[label] = {"directory": directories[label], "built": exported["built"]}
        print(label, {row["name"]: round(row[label]["valid_share"], 3) for row in report["tasks"].values()}, flush=True)
    write_results(args.out, args.name, report, markdown(report))


def markdown(report: dict) -> str:
    lines = ["# What tlm writes for a GPU: programs MetaSchedule's GPU checks accept", "",
             environment_line(report), f"Target: `{report['target']}`.", "",
             f"Per task and weights: tlm's first {report['per_task']} programs with nothing measured (no "
             "rewrites), decoded within the sketches' GPU limits (threads per block, shared memory; "
             "`gpu_limits.py`) or, where the column says so, without them; written: what the model wrote until "
             "that many were valid (five rounds at most); valid: those the postprocessors accept; the batch: the "
             "model's valid programs and uniform samples for the rest. "
             f"Uniform: the share of {report['uniform_draws']} draws of the task's design space that are valid.",
             "", "## Per workload: valid programs of all written (uniform: of all drawn)", "",
             "| workload | " + " | ".join(report["columns"]) + " | uniform samples |",
             "|---|" + "---:|" * (len(report["columns"]) + 1)]
    for workload in sorted({row["workload"] for row in report["tasks"].values()}):
        rows = [row for row in report["tasks"].values() if row["workload"] == workload]
        shares = [sum(r[label]["valid"] for r in rows if label in r) /
                  max(sum(r[label]["generated"] for r in rows if label in r), 1) for label in report["columns"]]
        uniform = sum(r["uniform_valid_share"] for r in rows) / len(rows)
        lines.append(f"| {workload} ({len(rows)} tasks) | " + " | ".join(f"{v:.3f}" for v in shares)
                     + f" | {uniform:.3f} |")
    lines += ["", "## Per task", "",
              "| task (workload) | weights | written | valid | valid share | in the batch: tlm's / uniform |",
              "|---|---|---:|---:|---:|---|"]
    for row in report["tasks"].values():
        op = f"{row['name']} ({row['workload']})"
        for label in report["columns"]:
            w = row.get(label)
            if w is None:
                continue
            lines.append(f"| {op} | {label} | {w['generated']} | {w['valid']} | {w['valid_share']:.3f} | "
                         f"{report['per_task'] - w['sampled']} / {w['sampled']} |")
        lines.append(f"| {op} | uniform samples | {report['uniform_draws']} | "
                     f"{round(row['uniform_valid_share'] * report['uniform_draws'])} | "
                     f"{row['uniform_valid_share']:.3f} | - |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
