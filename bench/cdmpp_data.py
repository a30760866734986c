"""How far dataset v2 takes a latency predictor on CDMPP's protocol: a learning curve over programs per task,
and cdmpp's training length.

    python bench/cdmpp_data.py [--dataset datasets/cpu-programs-v2.parquet] [--fractions 0.125,0.25,0.5,1]
                               [--epochs 30,150] [--seed 0]

On the primary device, CDMPP's protocol (as in bench/cdmpp.py: every 5th program of a task by latency tested,
timings within 1%, tasks with >= 48 programs; whole tasks ranked), every program's compact AST extracted once:

- the curve: a gradient-boosted regressor (xgboost, 600 trees of depth 8; input: the program's per-store features
  summed and maxed, ``program_row``, and log FLOPs; target: log seconds per GFLOP) trained on a fraction of each
  task's training programs, two draws per fraction, tested on the whole test side. How the error falls as
  programs per task double says what more data would buy (TenSet, the paper's data, has about 3,700 programs per
  task);
- cdmpp's network (the plugin's Predictor: its default architecture and loss) trained for each of ``--epochs``
  on all training programs: test and training error (a training error far below the test error: the data, not
  the fit, limits it).

Every row beside the floor (the best constant per task) and the ceiling (second labels) of the same test side.
Writes bench/results/cdmpp_data.{json,md}.
"""

from __future__ import annotations

import time

import numpy as np

from tunecore import experiments
from tunecore.dataset.evaluate import constant_floor, guess_metrics, measured_groups, noise_ceiling
from tunecore.dataset.split import CDMPP_PROTOCOL, split
from tunecore.dataset.table import Dataset
from tunecore.experiments import command_line, dataset_line, dataset_record, environment, write_results

COLUMNS = ("mape", "median_ape", "mape_task_normalised", "spearman", "pairwise_accuracy", "top1_score", "train_s")


def compact_groups(groups: list) -> list:
    """Per measured group: (its latencies, compact ASTs, device features), programs without an AST left out."""
    from tunecore_cdmpp_predictor.features import CompactASTs

    from tunecore.interfaces import device_features

    asts = CompactASTs(threads=2)
    out = []
    for task, candidates, results, device in groups:
        kept = [(a, r.latency) for a, r in zip(asts(task, candidates), results) if a is not None]
        out.append((np.array([latency for _, latency in kept]), [a for a, _ in kept], device_features(device)))
    return out


def metrics(test: list, predicted: list[np.ndarray], seed: int, train_s: float) -> dict:
    latencies = [latency for latency, _, _ in test]
    errors = np.abs(np.concatenate(predicted) - np.concatenate(latencies)) / np.concatenate(latencies)
    return {**guess_metrics(latencies, predicted, [1.0] * len(test), seed),
            "median_ape": round(float(np.median(errors)), 4), "train_s": round(train_s, 1)}


def gflops(programs: list) -> np.ndarray:
    return np.array([max(p.flops, 1e5) * 1e-9 for p in programs])


def boosted_rows(programs: list) -> np.ndarray:
    from tunecore.interfaces import program_row

    return np.stack([np.concatenate([program_row(p.features), [np.log(max(p.flops, 1e5))]]) for p in programs])


def learning_curve(train: list, test: list, fractions: list[float], seed: int) -> list[dict]:
    import xgboost

    x_test = [boosted_rows(programs) for _, programs, _ in test]
    rows = []
    for fraction in fractions:
        for draw in range(2):
            rng = np.random.default_rng([seed, draw, int(fraction * 1000)])
            chosen = [(latencies[keep], [programs[i] for i in keep]) for latencies, programs, _ in train
                      for keep in [rng.permutation(len(programs))[:max(1, round(fraction * len(programs)))]]]
            programs = [p for _, ps in chosen for p in ps]
            latencies = np.concatenate([ls for ls, _ in chosen])
            started = time.perf_counter()
            model = xgboost.XGBRegressor(n_estimators=600, max_depth=8, learning_rate=0.05, subsample=0.8,
                                         colsample_bytree=0.8, n_jobs=2, random_state=draw)
            model.fit(boosted_rows(programs), np.log(latencies / gflops(programs)))
            predicted = [np.exp(model.predict(x)) * gflops(ps) for x, (_, ps, _) in zip(x_test, test)]
            rows.append({"fraction": fraction, "draw": draw, "programs_per_task": round(len(programs) / len(train), 1),
                         **metrics(test, predicted, seed, time.perf_counter() - started)})
            print(f"boosted, {fraction:g} of each task's programs, draw {draw}: mape {rows[-1]['mape']}", flush=True)
    return rows


def cdmpp_epochs(train: list, test: list, epochs: list[int], seed: int) -> list[dict]:
    import torch
    from tunecore_cdmpp_predictor.model import Predictor

    torch.set_num_threads(2)
    programs = [p for _, ps, _ in train for p in ps]
    latencies = np.concatenate([latencies for latencies, _, _ in train])
    devices = np.concatenate([np.repeat(device[None, :], len(ps), axis=0) for _, ps, device in train])
    groups = np.concatenate([np.full(len(ps), g) for g, (_, ps, _) in enumerate(train)])
    rows = []
    for count in epochs:
        predictor = Predictor(seed=seed)
        batch_size = 256
        started = time.perf_counter()
        predictor.fit(programs, devices, latencies, steps=count * int(np.ceil(len(programs) / batch_size)),
                      batch_size=batch_size, groups=groups, seed=seed)
        train_s = time.perf_counter() - started

        def predict(side: list) -> list[np.ndarray]:
            return [predictor.predict(ps, np.repeat(device[None, :], len(ps), axis=0)) for _, ps, device in side]

        rows.append({"epochs": count, "test": metrics(test, predict(test), seed, train_s),
                     "train": metrics(train, predict(train), seed, train_s)})
        print(f"cdmpp, {count} epochs: test mape {rows[-1]['test']['mape']}, train {rows[-1]['train']['mape']}",
              flush=True)
    return rows


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--dataset", default="datasets/cpu-programs-v2.parquet")
    parser.add_argument("--fractions", default="0.125,0.25,0.5,1")
    parser.add_argument("--epochs", default="30,150")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    dataset = Dataset.load(args.dataset)
    info = dataset.info()
    primary = next(iter(info["devices"]))
    parts = split(dataset, seed=args.seed, devices=[primary], **CDMPP_PROTOCOL)
    train_groups = measured_groups(dataset, [r for r in parts.train if r.latency is not None])
    test_groups = measured_groups(dataset, [r for r in parts.test if r.latency is not None])
    train, test = compact_groups(train_groups), compact_groups(test_groups)
    report = {
        "command": command_line("cdmpp_data.py"),
        "environment": environment(),
        "dataset": dataset_record(args.dataset, info, primary=primary),
        "split": parts.spec,
        "train_programs": sum(len(ps) for _, ps, _ in train), "test_programs": sum(len(ps) for _, ps, _ in test),
        "tasks": len(train),
        "references": {"per-task constant (floor)": constant_floor(test_groups, parts, args.seed),
                       "second labels (ceiling)": noise_ceiling(test_groups, parts, args.seed)},
        "curve": learning_curve(train, test, [float(f) for f in args.fractions.split(",")], args.seed),
        "cdmpp": cdmpp_epochs(train, test, [int(e) for e in args.epochs.split(",")], args.seed),
    }
    write_results(args.out, "cdmpp_data", report, markdown(report))


def markdown(report: dict) -> str:
    from tunecore.cli.render import cell

    data = report["dataset"]

    def row(label: str, values: dict) -> str:
        return f"| {label} | " + " | ".join(cell(values.get(c)) for c in COLUMNS) + " |"

    header = ["| | " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
    references = [row(name, values) for name, values in report["references"].items()]
    lines = [
        "# What dataset v2 allows a latency predictor on CDMPP's protocol",
        "",
        f"{dataset_line(data)}; primary device {data['devices'][data['primary']]}. Split `{report['split']}`: "
        f"{report['train_programs']} training and {report['test_programs']} test programs of {report['tasks']} "
        "tasks (test: every 5th program of a task by latency). Paper: 14.03% MAPE, on TenSet (about 3,700 "
        "programs per task).",
        f"{experiments.environment_line(report)}",
        "",
        "## Learning curve: a boosted regressor on a fraction of each task's training programs",
        "",
        "| fraction (programs per task), draw " + header[0][1:], header[1],
    ]
    lines += [row(f"{r['fraction']:g} ({r['programs_per_task']}), {r['draw']}", r) for r in report["curve"]]
    lines += references
    lines += ["", "## cdmpp's network by training length (all training programs)", "",
              "| epochs, side " + header[0][1:], header[1]]
    for r in report["cdmpp"]:
        lines += [row(f"{r['epochs']}, test", r["test"]), row(f"{r['epochs']}, training", r["train"])]
    lines += references
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
