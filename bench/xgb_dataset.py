"""xgb trained on the dataset: its defaults, sized for the few hundred programs of a run, against longer boosting
with smaller steps, on held-out networks (the ranker tlm's `oversample` and a pretrained ansor+xgb rely on).

    python bench/xgb_dataset.py [--dataset datasets/cpu-programs-v2.parquet] [--group-size 128]
                                [--options "rounds=1000,eta=0.05,max_depth=6" ...] [--name xgb_dataset]

Per split (two sets of networks held out, on the dataset's primary device, as `bench/costmodel_eval.py`'s
cross-model split): xgb with its defaults and with each ``--options`` set, trained on the same measurements through
the yardstick (`tunecore.dataset.evaluate`, as `tunecore costmodel eval --variant`) in groups of ``--group-size``
programs, beside the per-task constant floor and the noise ceiling. The programs' features are extracted once for
every model, outside its `train_s`.
Writes bench/results/<name>.json and .md.
"""

from __future__ import annotations

from tunecore import experiments
from tunecore.dataset.evaluate import evaluate
from tunecore.dataset.split import split
from tunecore.dataset.table import Dataset
from tunecore.experiments import (
    command_line,
    dataset_line,
    dataset_record,
    environment,
    environment_line,
    split_tables,
    write_results,
)
from tunecore.features import shared_features
from tunecore.options import options_for, parse_options

SPLITS = ("workload:zoo:resnet-18,zoo:mobilenet-v2,zoo:bert-tiny",
          "workload:zoo:resnet-50,corpus:mobilenet-v1,zoo:bert-base,corpus:convnext")
DEFAULT_OPTIONS = ("rounds=1000,eta=0.05", "rounds=1000,eta=0.05,max_depth=6", "rounds=2000,eta=0.025")
COLUMNS = ("spearman", "pairwise_accuracy", "recall@1", "recall@5", "recall@32", "top1_score", "top5_score",
           "train_s")


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--dataset", default="datasets/cpu-programs-v2.parquet")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--options", action="append", default=[], metavar="KEY=VALUE,...",
                        help=f"xgb options beside its defaults (repeatable; default {' and '.join(DEFAULT_OPTIONS)})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="xgb_dataset")
    args = parser.parse_args()
    option_sets = {"defaults": {}}
    for spec in args.options or DEFAULT_OPTIONS:
        pairs = [p for p in spec.split(",") if p]
        if not pairs or any(not p.partition("=")[1] for p in pairs):
            parser.error(f"--options {spec}: KEY=VALUE,KEY=VALUE")
        option_sets[spec] = options_for(parse_options([f"xgb.{p}" for p in pairs], ["xgb"]), "cost_model", "xgb")
    from tunecore.api import _construct
    from tunecore.errors import UsageError
    from tunecore.registry import Registry

    registry = Registry.shared()
    for spec, options in option_sets.items():  # a bad option fails here, before the features are extracted
        try:
            _construct(registry, "cost_model", "xgb", seed=args.seed, **options).close()
        except UsageError as error:
            parser.error(f"--options {spec}: {error}")
    dataset = Dataset.load(args.dataset)
    info = dataset.info()
    primary = next(iter(info["devices"]))
    models = {f"xgb {label}": ("xgb", options) for label, options in option_sets.items()}
    results = {}
    with shared_features(len(dataset.rows)):  # the splits test the same device's programs: extract them once
        for spec in SPLITS:
            parts = split(dataset, spec, args.seed, devices=[primary])
            result = evaluate(dataset, parts, models, seed=args.seed, group_size=args.group_size, registry=registry)
            results["held out: " + spec.partition(":")[2].replace(",", ", ")] = result
            print(f"{spec}: {result['models']}", flush=True)
    report = {"command": command_line("xgb_dataset.py"), "environment": environment(),
              "dataset": dataset_record(args.dataset, info, primary=primary), "option_sets": option_sets,
              "results": results}
    write_results(args.out, args.name, report, markdown(report))


def markdown(report: dict) -> str:
    data = report["dataset"]
    lines = ["# xgb trained on the dataset: its defaults against longer boosting with smaller steps", "",
             f"{dataset_line(data)}; trained and tested on the primary device {data['devices'][data['primary']]}.",
             environment_line(report), "",
             "`defaults`: rounds=100, eta=0.2, max_depth=8 (sized for a run's online retraining). `train_s` leaves "
             "out extracting the programs' features, done once for every row.", ""]
    lines += split_tables(report["results"], COLUMNS)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
