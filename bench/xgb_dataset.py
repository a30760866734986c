"""xgb trained on the dataset: its defaults, sized for the few hundred programs of a run, against longer boosting
with smaller steps, on held-out networks (the ranker tlm's `oversample` and a pretrained ansor+xgb rely on).

    python bench/xgb_dataset.py [--dataset datasets/cpu-programs-v2.parquet] [--group-size 128]
                                [--options "rounds=1000,eta=0.05,max_depth=6" ...] [--name xgb_dataset]

Per split (two sets of networks held out, on the dataset's primary device, as `bench/costmodel_eval.py`'s
cross-model split): xgb with its defaults and with each ``--options`` set, trained on the same measurements through
the yardstick's own `teach` and scored by its `held_out_metrics` in groups of ``--group-size`` programs, beside the
per-task constant floor and the noise ceiling. The programs' features are extracted once and shared by every model
(training and scoring are deterministic for a seed, so sharing changes no number, only the time).
Writes bench/results/<name>.json and .md.
"""

from __future__ import annotations

from tunecore import experiments
from tunecore.dataset.evaluate import (
    constant_floor,
    fixed_size_groups,
    held_out_metrics,
    measured_groups,
    noise_ceiling,
    teach,
)
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
    extractor = None
    results = {}
    for spec in SPLITS:
        parts = split(dataset, spec, args.seed, devices=[primary])
        train = measured_groups(dataset, parts.train)
        test = fixed_size_groups(measured_groups(dataset, [r for r in parts.test if r.latency is not None]),
                                 args.group_size, args.seed)
        weights = [parts.weights.get(t.workload_hash, 1) for t, *_ in test]
        models = {}
        for label, options in option_sets.items():
            model = _construct(registry, "cost_model", "xgb", seed=args.seed, **options)
            extractor = model.extractor = extractor or model.extractor
            extractor.cache_size = max(extractor.cache_size, len(dataset.rows))
            try:
                train_s = teach(model, train, [device for *_, device in test])
                models[f"xgb {label}"] = {**held_out_metrics(model, test, weights, args.seed),
                                          "train_s": round(train_s, 3)}
            finally:
                model.close()
            print(f"{spec}: xgb {label}: {models[f'xgb {label}']}", flush=True)
        results["held out: " + spec.partition(":")[2].replace(",", ", ")] = {
            "split": spec, "train": {"measurements": len(parts.train), "groups": len(train)},
            "test": {"measurements": sum(len(g[1]) for g in test), "groups": len(test), "group_size": args.group_size},
            "models": models,
            "references": {"per-task constant (floor)": constant_floor(test, parts, args.seed),
                           "second labels (ceiling)": noise_ceiling(test, parts, args.seed)}}
    report = {"command": command_line("xgb_dataset.py"), "environment": environment(),
              "dataset": dataset_record(args.dataset, info, primary=primary), "option_sets": option_sets,
              "results": results}
    write_results(args.out, args.name, report, markdown(report))


def markdown(report: dict) -> str:
    data = report["dataset"]
    lines = ["# xgb trained on the dataset: its defaults against longer boosting with smaller steps", "",
             f"{dataset_line(data)}; trained and tested on the primary device {data['devices'][data['primary']]}.",
             environment_line(report), "",
             "`defaults`: rounds=100, eta=0.2, max_depth=8 (sized for a run's online retraining). `train_s` of the "
             "first row includes extracting every program's features, which the other rows share.", ""]
    lines += split_tables(report["results"], COLUMNS)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
