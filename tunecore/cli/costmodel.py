"""``tunecore costmodel eval``: the yardstick every cost model is judged by (see tunecore.dataset.evaluate);
``tunecore costmodel train``: a cost model trained on a dataset the same way and saved, to start runs from
(``-O cost_model.weights=FILE``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tunecore.cli import Parser, render
from tunecore.cli.args import add_devices, add_filters, add_seed, count, names


def add_commands(register: Any) -> None:
    costmodel = register("costmodel", cmd_costmodel, help="judge cost models on a dataset")
    sub = costmodel.add_subparsers(dest="costmodel_command", required=True, parser_class=Parser)
    evaluate = sub.add_parser("eval", help="train on one side of a split, report ranking (and latency) metrics on "
                                           "the other")
    evaluate.add_argument("--dataset", "-d", required=True, help="dataset file (.parquet)")
    evaluate.add_argument("--cost-model", type=names, default=[],
                          help="cost models, comma-separated (e.g. xgb,none)")
    evaluate.add_argument("--variant", type=variant, action="append", default=[],
                          metavar="LABEL=NAME.KEY=VALUE,...",
                          help="a cost model with its own options, judged beside the others as row LABEL (repeatable), "
                               "e.g. --variant long=xgb.rounds=2000,xgb.eta=0.025")
    evaluate.add_argument("--split", required=True,
                          help="workload:W1,W2 (cross-model) | device:ID,... (cross-device) | task:FRACTION | "
                               "task:NAME,... | random:FRACTION | cdmpp:N (CDMPP's: every Nth program of a task by "
                               "latency)")
    add_devices(evaluate)
    add_filters(evaluate)
    evaluate.add_argument("--group-size", type=count(2), default=None, metavar="N",
                          help="rank in disjoint groups of exactly N programs of a task (e.g. 128: recall@32's chance "
                               "is 0.25); smaller groups are left out")
    add_seed(evaluate, "the split and the cost models")
    evaluate.add_argument("--option", "-O", action="append", metavar="NAME.KEY=VALUE",
                          help="cost model option, e.g. -O xgb.rounds=200")
    evaluate.add_argument("--json", action="store_true")

    train = sub.add_parser("train", help="train a cost model on a dataset (or the training side of a split) and "
                                         "save it, for -O cost_model.weights=FILE")
    train.add_argument("--dataset", "-d", required=True, help="dataset file (.parquet)")
    train.add_argument("--cost-model", required=True, help="the cost model to train (one that can be saved, e.g. xgb)")
    train.add_argument("--split", default=None, help="train on its training side, report on its test side "
                                                     "(as for `costmodel eval`)")
    add_devices(train, "train only on measurements on")
    add_filters(train)
    add_seed(train, "the split and the cost model")
    train.add_argument("--option", "-O", action="append", metavar="NAME.KEY=VALUE",
                       help="cost model option, e.g. -O xgb.rounds=200")
    train.add_argument("--out", "-o", required=True, help="file to write (the cost model's own format)")
    train.add_argument("--json", action="store_true")


def variant(text: str) -> tuple[str, str, list[str]]:
    """An argparse type: ``LABEL=NAME.KEY=VALUE,...`` -> (label, the one cost model NAME, its NAME.KEY=VALUE pairs)."""
    label, _, rest = text.partition("=")
    pairs = [pair for pair in rest.split(",") if pair]
    models = {pair.partition(".")[0] for pair in pairs}
    if not label or not pairs or len(models) != 1 or not all("=" in pair and "." in pair for pair in pairs):
        raise argparse.ArgumentTypeError(f"expected LABEL=NAME.KEY=VALUE,NAME.KEY=VALUE with one cost model NAME, "
                                         f"not {text!r}")
    return label, models.pop(), pairs


def cmd_costmodel(args: argparse.Namespace) -> int:
    if args.costmodel_command == "train":
        return cmd_train(args)
    from tunecore.dataset.evaluate import evaluate
    from tunecore.dataset.split import split
    from tunecore.dataset.table import Dataset
    from tunecore.errors import UsageError
    from tunecore.options import parse_options

    models = {name: (name, {}) for name in args.cost_model}
    for label, name, pairs in args.variant:
        if label in models:
            raise UsageError(f"--variant {label}=...: the label {label} names another row; give each its own")
        models[label] = (name, parse_options(pairs, [name])[name])
    if not models:
        raise UsageError("costmodel eval: name the cost models to judge (--cost-model, --variant)")
    options = parse_options(args.option, [name for name, _ in models.values()])
    dataset = Dataset.load(args.dataset)
    parts = split(dataset, args.split, args.seed, args.devices, max_spread=args.max_spread,
                  min_programs=args.min_programs)
    result = evaluate(dataset, parts, models, seed=args.seed, options=options, group_size=args.group_size)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    import time

    from tunecore import modelfile
    from tunecore.api import _construct
    from tunecore.dataset.evaluate import held_out_metrics, measured_groups, teach
    from tunecore.dataset.split import train_and_test
    from tunecore.dataset.table import Dataset
    from tunecore.errors import Interrupted, UsageError
    from tunecore.modelfile import CHECKPOINT
    from tunecore.options import options_for, parse_options
    from tunecore.registry import Registry
    from tunecore.roles import CostModel

    registry = Registry.shared()
    cls = registry.get("cost_model", args.cost_model)
    if cls.save is CostModel.save:
        raise UsageError(f"--cost-model {args.cost_model}: this cost model cannot be saved, so it cannot be trained "
                         "ahead of a run")
    options = options_for(parse_options(args.option, [args.cost_model]), "cost_model", args.cost_model)
    dataset = Dataset.load(args.dataset)
    parts = train_and_test(dataset, args.split, args.seed, args.devices, args.max_spread, args.min_programs)
    train_rows = parts.train
    train = measured_groups(dataset, train_rows)
    if not any(r.latency is not None for _, _, results, _ in train for r in results):
        raise UsageError(f"{args.dataset}: no measured program to train on (none ran, or none passed the filters)")
    test = measured_groups(dataset, [r for r in parts.test if r.latency is not None])
    model = _construct(registry, "cost_model", args.cost_model, seed=args.seed, **options)
    checkpoint = args.out + CHECKPOINT
    model.keep_checkpoint(checkpoint, {
        "cost_model": args.cost_model, "dataset": args.dataset, "split": parts.spec, "devices": args.devices,
        "max_spread": args.max_spread, "min_programs": args.min_programs, "seed": args.seed, "options": options})
    started = time.perf_counter()
    try:
        try:
            teach(model, train, [device for *_, device in test])
        except KeyboardInterrupt:
            # a model that keeps no checkpoint (xgb), or one stopped before it wrote its first
            if (modelfile.last_checkpoint or ("",))[0] != checkpoint:
                raise Interrupted(f"no training state of {args.cost_model} is kept: the same command trains it "
                                  "from the start") from None
            raise
        model.save(args.out)
        out: dict[str, Any] = {
            "out": args.out, "cost_model": args.cost_model, "dataset": args.dataset,
            "split": parts.spec or None, "measurements": len(train_rows), "groups": len(train),
            "train_s": round(time.perf_counter() - started, 1)}
        if test:
            weights = [parts.weights.get(t.workload_hash, 1) for t, *_ in test]
            out["test"] = {"programs": sum(len(g[1]) for g in test), "groups": len(test),
                           **held_out_metrics(model, test, weights, args.seed)}
    finally:
        model.close()
    render.fields(out, args.json)
    return 0


def print_table(result: dict[str, Any]) -> None:
    from rich.table import Table

    from tunecore.dataset.evaluate import table_rows

    models = table_rows(result)
    columns = list(dict.fromkeys(k for metrics in models.values() for k in metrics))
    table = Table(title=f"split {result['split']}: train {result['train']['measurements']} measurements, "
                        f"test {result['test']['measurements']} programs in {result['test']['groups']} task x device "
                        "groups (groups ranked: those with >= 2 programs that ran); features extracted once for every "
                        f"model in {result['features_s']} s, outside train s")
    table.add_column("cost model")
    for column in columns:
        table.add_column(column.replace("_", " "), justify="right")
    for name, metrics in models.items():
        table.add_row(name, *(render.cell(metrics.get(c)) for c in columns))
    render.console().print(table)
