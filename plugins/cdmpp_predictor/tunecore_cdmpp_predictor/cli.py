"""``tunecore cdmpp train|adapt``: train CDMPP on a dataset; adapt it to a new device with a few measured tasks.

``train`` is resumable: its state is kept beside the output (``OUT.ckpt``, tunecore's CHECKPOINT) while it
trains, so that the same command, stopped (Ctrl-C, ``kill``), continues where it stopped."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from tunecore.cli import Parser, add_devices, add_filters, add_seed, count, number, render
from tunecore.interfaces import UsageError


def add_commands(register: Any) -> None:
    cdmpp = register("cdmpp", cmd_cdmpp, help="train the CDMPP latency predictor, adapt it to a new device")
    sub = cdmpp.add_subparsers(dest="cdmpp_command", required=True, parser_class=Parser)

    train = sub.add_parser("train", help="train on a dataset (or the training side of a split)")
    train.add_argument("--dataset", "-d", required=True, help="dataset file (.parquet)")
    train.add_argument("--split", default=None, help="train on its training side, report on its test side "
                                                     "(as for `costmodel eval`)")
    add_devices(train, "train only on measurements on")
    add_filters(train)
    train.add_argument("--epochs", type=count(1), default=150,
                       help="passes over the training data (default 150: bench/results/cdmpp_data.md)")
    train.add_argument("--rank-weight", type=number(0, 100), default=0.0,
                       help="weight of a ranking term within tasks in the loss (default 0: MSE and MAPE only)")
    train.add_argument("--ensemble", type=count(1), default=1,
                       help="networks to train, each from its own initial weights and batch order, whose predictions "
                            "are averaged (default 1; K takes K times as long)")
    add_seed(train, "the network's initial weights and the order of batches")
    train.add_argument("--out", "-o", required=True, help="weights file to write (.pt)")
    train.add_argument("--json", action="store_true")

    adapt = sub.add_parser("adapt", help="measure KMeans-chosen tasks on a new device and fine-tune for it")
    adapt.add_argument("--target", "-t", required=True, help="the new device's target")
    adapt.add_argument("--dataset", "-d", required=True,
                       help="dataset whose programs are measured on the new device (the measurements are added to it)")
    adapt.add_argument("--weights", default="shipped", help="model to adapt: 'shipped' or a weights file")
    adapt.add_argument("--tasks", type=count(1), default=10, help="tasks to measure (KMeans clusters; default 10)")
    adapt.add_argument("--per-task", type=count(1), default=16, help="programs to measure per task (default 16)")
    adapt.add_argument("--steps", type=count(1), default=300, help="fine-tuning steps (default 300)")
    adapt.add_argument("--rank-weight", type=number(0, 100), default=None,
                       help="weight of the ranking term within tasks (default: what the weights were trained with)")
    adapt.add_argument("--measurer", default="local")
    adapt.add_argument("--option", "-O", action="append", metavar="ROLE.KEY=VALUE",
                       help="measurer option, e.g. -O measurer.repeat=5")
    add_seed(adapt, "the choice of tasks and programs and of the fine-tuning batches")
    adapt.add_argument("--out", "-o", required=True, help="adapted weights file to write (.pt)")
    adapt.add_argument("--json", action="store_true")


def cmd_cdmpp(args: argparse.Namespace) -> int:
    return {"train": _train, "adapt": _adapt}[args.cdmpp_command](args)


def _train(args: argparse.Namespace) -> int:
    from tunecore.dataset import Dataset, held_out_metrics, measured_groups, train_and_test
    from tunecore.interfaces import CHECKPOINT
    from tunecore_cdmpp_predictor.costmodel import CDMPPModel

    dataset = Dataset.load(args.dataset)
    parts = train_and_test(dataset, args.split, args.seed, args.devices, args.max_spread, args.min_programs)
    train_rows, test_rows = parts.train, [r for r in parts.test if r.latency is not None]
    model = CDMPPModel(weights="none", epochs=args.epochs, rank_weight=args.rank_weight, ensemble=args.ensemble,
                       seed=args.seed)
    started = time.perf_counter()
    train = measured_groups(dataset, train_rows)
    _features(model, train, "features")
    settings = {k: getattr(args, k) for k in ("split", "devices", "max_spread", "min_programs", "epochs", "seed",
                                              "ensemble")}
    model.keep_checkpoint(args.out + CHECKPOINT, settings)
    with render.tracker(transient=args.json) as on_progress:
        report = model.learn([(t, c, r) for t, c, r, _ in train], on_progress=on_progress)
    if not report["programs"]:
        filters = " or none passed --max-spread/--min-programs" if args.max_spread or args.min_programs else ""
        raise UsageError(f"{args.dataset}: no programs to train on (none ran, or on devices cdmpp cannot describe"
                         f"{filters})")
    workloads = sorted({w for r in train_rows for w in dataset.tasks[r.task_key].workloads})
    model.predictor.trained_on = {"dataset": args.dataset, "split": args.split, "programs": report["programs"],
                                  "devices": report["devices"], "workloads": workloads, "epochs": args.epochs,
                                  "rank_weight": args.rank_weight, "ensemble": args.ensemble,
                                  "max_spread": args.max_spread,
                                  "min_programs": args.min_programs}
    model.save(args.out)
    out: dict[str, Any] = {"out": args.out, "programs": report["programs"], "devices": report["devices"],
                           "loss": round(report["loss"], 4), "train_s": round(time.perf_counter() - started, 1)}
    if test_rows:
        test = measured_groups(dataset, test_rows)
        _features(model, test, "test features")
        out["test"] = {"programs": sum(len(g[1]) for g in test), **held_out_metrics(
            model, test, [parts.weights.get(t.workload_hash, 1) for t, *_ in test], args.seed)}
    render.fields(out, args.json)
    return 0


def _adapt(args: argparse.Namespace) -> int:
    from tunecore.cli import parse_options
    from tunecore.dataset import Dataset, measured_groups, remeasure
    from tunecore.targets import device_descriptor, resolve_target
    from tunecore_cdmpp_predictor.adapt import first_programs_per_task, select_tasks
    from tunecore_cdmpp_predictor.costmodel import CDMPPModel

    model = CDMPPModel(weights=args.weights, rank_weight=args.rank_weight, seed=args.seed)
    if not model.predictor.trained:
        raise UsageError(f"--weights {args.weights}: no trained weights to adapt")
    target = resolve_target(args.target)
    model.device = device_descriptor(target)  # a device cdmpp cannot describe fails here, before measuring
    dataset = Dataset.load(args.dataset)
    started = time.perf_counter()
    # a few programs of each task describe it; any device's measurement will do, programs are device-free
    sample = [r for r in dataset.rows if r.latency is not None and json.loads(r.target)["kind"] == target.kind.name]
    if not sample:
        raise UsageError(f"{args.dataset}: no measured {target.kind.name} programs to choose tasks from")
    groups = measured_groups(dataset, first_programs_per_task(sample, 16))
    _features(model, groups, "features")
    by_task = {task.workload_hash: [a for a in model.asts(task, candidates) if a is not None]
               for task, candidates, _, _ in groups}
    chosen = select_tasks(by_task, args.tasks, args.seed)
    options = parse_options(args.option, [args.measurer])
    with render.tracker(transient=args.json) as on_progress:
        measured = remeasure(args.dataset, args.target, per_task=args.per_task, task_keys=set(chosen),
                             measurer_name=args.measurer, options=options, seed=args.seed, on_progress=on_progress)
    dataset = Dataset.load(args.dataset)
    new = measured_groups(dataset, [r for key in chosen for r in dataset.rows_of(key, measured["device_id"])])
    report = model.learn([(t, c, r) for t, c, r, _ in new], steps=args.steps)
    model.predictor.trained_on.setdefault("adapted", {})[measured["device_id"]] = {
        "tasks": [dataset.tasks[k].name for k in chosen], "programs": report["programs"]}
    model.save(args.out)
    render.fields({"out": args.out, "device_id": measured["device_id"], "device": measured["device"],
                  "tasks": [dataset.tasks[k].name for k in chosen], "measured": measured["measured"],
                  "failed": measured["failed"], "programs": report["programs"], "loss": round(report["loss"], 4),
                  "elapsed_s": round(time.perf_counter() - started, 1)}, args.json)
    return 0


def _features(model: Any, groups: list, what: str) -> None:
    """Extract the compact ASTs of every program (cached in the model), with a progress bar."""
    with render.progress(transient=True) as display:
        bar = display.add_task(what, total=sum(len(g[1]) for g in groups))
        for task, candidates, _, _ in groups:
            model.asts(task, candidates)
            display.advance(bar, len(candidates))

