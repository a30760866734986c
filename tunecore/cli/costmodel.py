"""``tunecore costmodel eval``: the yardstick every cost model is judged by (see tunecore.dataset.evaluate)."""

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
    evaluate.add_argument("--cost-model", type=names, required=True,
                          help="cost models, comma-separated (e.g. xgb,none)")
    evaluate.add_argument("--split", required=True,
                          help="workload:W1,W2 (cross-model) | device:ID,... (cross-device) | task:FRACTION | "
                               "random:FRACTION | cdmpp:N (CDMPP's: every Nth program of a task by latency)")
    add_devices(evaluate)
    add_filters(evaluate)
    evaluate.add_argument("--group-size", type=count(2), default=None, metavar="N",
                          help="rank in disjoint groups of exactly N programs of a task (e.g. 128: recall@32's chance "
                               "is 0.25); smaller groups are left out")
    add_seed(evaluate, "the split and the cost models")
    evaluate.add_argument("--option", "-O", action="append", metavar="NAME.KEY=VALUE",
                          help="cost model option, e.g. -O xgb.rounds=200")
    evaluate.add_argument("--json", action="store_true")


def cmd_costmodel(args: argparse.Namespace) -> int:
    from tunecore.dataset.evaluate import evaluate
    from tunecore.dataset.split import split
    from tunecore.dataset.table import Dataset
    from tunecore.options import parse_options

    options = parse_options(args.option, args.cost_model)
    dataset = Dataset.load(args.dataset)
    parts = split(dataset, args.split, args.seed, args.devices, max_spread=args.max_spread,
                  min_programs=args.min_programs)
    result = evaluate(dataset, parts, args.cost_model, seed=args.seed, options=options, group_size=args.group_size)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


def print_table(result: dict[str, Any]) -> None:
    from rich.table import Table

    from tunecore.dataset.evaluate import table_rows

    models = table_rows(result)
    columns = list(dict.fromkeys(k for metrics in models.values() for k in metrics))
    table = Table(title=f"split {result['split']}: train {result['train']['measurements']} measurements, "
                        f"test {result['test']['measurements']} programs in {result['test']['groups']} task x device "
                        "groups (groups ranked: those with >= 2 programs that ran)")
    table.add_column("cost model")
    for column in columns:
        table.add_column(column.replace("_", " "), justify="right")
    for name, metrics in models.items():
        table.add_row(name, *(render.cell(metrics.get(c)) for c in columns))
    render.console().print(table)
