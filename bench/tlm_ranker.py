"""What tlm's programs and its ranker are worth on held-out networks: the model's own programs, measured, split into
what the model writes (the best of its programs against the dataset's best) and what the ranker picks among them.

    python bench/tlm_ranker.py --tlm-programs FILE --ranker LABEL=XGB_FILE [--ranker ...]
                               [--dataset datasets/cpu-programs-v2.parquet]
                               [--held-out zoo:resnet-18,zoo:mobilenet-v2,zoo:bert-tiny] [--group-size 16]
                               [--name tlm_ranker]

``--tlm-programs``: a dataset of programs tlm wrote for the held-out networks' tasks, measured by the label protocol
(``tunecore dataset collect --model N --search tlm --cost-model none --random-fraction 0 --per-task 32
-O search.rewrite=0``): what a run with ``--search tlm`` proposes in its first round, before any ranker. With ``-O
search.oversample=16`` a run writes 16 programs per one it measures and an xgb file picks which (the tlm README's
command), so each ``--ranker`` (an xgb file of ``tunecore costmodel train`` on a split holding out ``--held-out``,
as a run loads it) is judged here on those programs:

- **the programs**: per held-out network, the sum over its tasks of calls x the fastest tlm program, against the
  same sum with the fastest program the dataset holds for the task (random samples and ansor's guided ones) on the
  same device, and the median tlm program against the median random one;
- **the ranker**, through the yardstick's metrics (``tunecore.dataset.evaluate``): top-1 score (the best of a group
  over the one picked, calls-weighted over groups), recall@k, Spearman, in groups of ``--group-size`` tlm programs
  beside a random pick, and the same on the dataset's own held-out programs, where rankers have been judged so far;
- **a run's first round, simulated**: per task, ``--group-size`` candidates drawn from the measured tlm programs
  and the dataset's uniform samples of the task (a share E of them uniform: ``-O search.explore=E``), the ranker's
  pick measured; per network, the picks' calls-weighted latency over the dataset's best.
Writes bench/results/<name>.json and .md.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

import numpy as np

from tunecore import experiments
from tunecore.dataset.evaluate import fixed_size_groups, held_out_metrics, measured_groups, ranking_metrics
from tunecore.dataset.split import split
from tunecore.dataset.table import Dataset
from tunecore.experiments import (
    command_line,
    dataset_record,
    environment,
    environment_line,
    labelled_paths,
    write_results,
)
from tunecore.features import shared_features

HELD_OUT = "zoo:resnet-18,zoo:mobilenet-v2,zoo:bert-tiny"
COLUMNS = ("groups_ranked", "spearman", "recall@1", "recall@5", "top1_score", "top5_score")
RANDOM_DRAWS = 20
EXPLORE_SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
POOL_DRAWS = 200


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--tlm-programs", required=True, help="tlm's measured programs of the held-out tasks")
    parser.add_argument("--ranker", action="append", default=[], metavar="LABEL=FILE",
                        help="an xgb file written by `tunecore costmodel train` on a split that holds out --held-out "
                             "(repeatable)")
    parser.add_argument("--dataset", default="datasets/cpu-programs-v2.parquet")
    parser.add_argument("--held-out", default=HELD_OUT, help="the held-out workloads, comma-separated")
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="tlm_ranker")
    args = parser.parse_args()
    rankers = labelled_paths(parser, "--ranker", args.ranker, "ranker")
    from tunecore.errors import UsageError

    models = {}
    for label, path in rankers.items():  # a missing or damaged file fails here, before any work
        try:
            models[label] = xgb_from_file(args.seed, path)
        except UsageError as error:
            parser.error(f"--ranker {label}={path}: {error}")

    try:
        dataset, tlm = Dataset.load(args.dataset), Dataset.load(args.tlm_programs)
    except UsageError as error:
        parser.error(str(error))
    devices = sorted({r.device_id for r in tlm.rows if r.latency is not None})
    if len(devices) != 1 or devices[0] not in dataset.devices:
        parser.error(f"--tlm-programs {args.tlm_programs}: expected the measured programs of one device the dataset "
                     f"has, not {devices}")
    device = devices[0]
    parts = split(dataset, f"workload:{args.held_out}", args.seed)
    tested = {key for key, weight in parts.weights.items() if weight}
    held_tlm = [r for r in tlm.rows if r.task_key in tested]
    if not any(r.latency is not None for r in held_tlm):
        parser.error(f"--tlm-programs {args.tlm_programs}: no measured program of a task of {args.held_out}")

    tlm_groups = measured_groups(tlm, [r for r in held_tlm if r.latency is not None])
    tests = {
        f"tlm's programs, groups of {args.group_size}": fixed_size_groups(tlm_groups, args.group_size, args.seed),
        f"the dataset's programs, groups of {args.group_size}": fixed_size_groups(
            measured_groups(dataset, [r for r in parts.test if r.latency is not None and r.device_id == device]),
            args.group_size, args.seed),
    }
    weights = {name: [parts.weights[t.workload_hash] for t, *_ in groups] for name, groups in tests.items()}
    ranking: dict[str, dict] = {name: {} for name in tests}
    pools = first_round_pools(dataset, tlm_groups, device)
    first_round: dict[str, dict] = {}
    with shared_features(sum(len(g[1]) for groups in tests.values() for g in groups) + len(dataset.rows)):
        for label, model in models.items():
            try:
                for name, groups in tests.items():
                    metrics = held_out_metrics(model, groups, weights[name], args.seed)
                    metrics.pop("predict_programs_per_s")  # the features are cached after the first ranker: not a rate
                    ranking[name][label] = metrics
                    print(f"{label} on {name}: {ranking[name][label]}", flush=True)
                first_round[label] = simulate_first_round(model, pools, args.held_out.split(","), args.group_size,
                                                          args.seed)
                print(f"{label}, first round: {first_round[label]}", flush=True)
            finally:
                model.close()
    for name, groups in tests.items():
        ranking[name]["random pick"] = random_pick(groups, weights[name], args.seed)

    report = {"command": command_line("tlm_ranker.py"), "environment": environment(),
              "dataset": dataset_record(args.dataset, dataset.info(), device=device),
              "tlm_programs": {"path": args.tlm_programs, "measured": sum(r.latency is not None for r in held_tlm),
                               "failed": sum(r.latency is None for r in held_tlm),
                               "tasks": len({r.task_key for r in held_tlm})},
              "rankers": rankers,
              "held_out": args.held_out, "group_size": args.group_size,
              "programs": program_quality(dataset, pools, args.held_out.split(",")),
              "ranking": ranking, "first_round": first_round}
    write_results(args.out, args.name, report, markdown(report))


def xgb_from_file(seed: int, weights: str):
    """xgb as a run starts from ``-O xgb.weights=FILE``."""
    from tunecore.api import _construct
    from tunecore.registry import Registry

    return _construct(Registry.shared(), "cost_model", "xgb", seed=seed, weights=weights)


@dataclasses.dataclass
class Pool:
    """A held-out task's measured programs on the device: tlm's and the dataset's uniform samples."""

    task: Any
    calls: dict[str, int]  # calls per inference of each workload
    tlm: list  # candidates
    uniform: list
    tlm_latency: np.ndarray
    uniform_latency: np.ndarray
    best: float  # the fastest program the dataset holds


def first_round_pools(dataset: Dataset, tlm_groups: list, device: str) -> list[Pool]:
    """A ``Pool`` per held-out task with both tlm programs and uniform samples."""
    pools = []
    for task, candidates, results, _ in tlm_groups:
        rows = [r for r in dataset.rows_of(task.workload_hash, device) if r.latency is not None]
        random = [r for r in rows if r.collected_by == "random"]
        if not random:
            continue
        pools.append(Pool(task, dataset.tasks[task.workload_hash].workloads, candidates,
                          measured_groups(dataset, random)[0][1], np.array([r.latency for r in results]),
                          np.array([r.latency for r in random]), min(r.latency for r in rows)))
    return pools


def simulate_first_round(model, pools: list[Pool], workloads: list[str], size: int, seed: int) -> dict:
    """What a run's first round measures per task with ``-O search.explore=E``: ``size`` candidates, E of them
    uniform samples and the rest tlm's, and the ranker's pick among them (``oversample`` = ``size``, one measured),
    over ``POOL_DRAWS`` draws of the candidates from the measured ones. Per workload and E: the calls-weighted sum of
    the picked programs' mean latency over that of the task's fastest program in the dataset, and the same with the
    fastest of each pool picked (a perfect ranker)."""
    rng = np.random.default_rng(seed)
    scores = [np.asarray(model.predict(pool.task, pool.tlm + pool.uniform), dtype=float) for pool in pools]
    out: dict[str, dict] = {}
    for workload in workloads:
        rows = {}
        for share in EXPLORE_SHARES:
            sums = {"picked": 0.0, "pool_best": 0.0, "dataset_best": 0.0}
            tasks = 0
            for pool, score_of in zip(pools, scores):
                calls, n_tlm = pool.calls.get(workload, 0), len(pool.tlm)
                n_uniform = round(size * share)
                if not calls or size - n_uniform > n_tlm or n_uniform > len(pool.uniform):
                    continue
                tasks += 1
                picked, pool_best = [], []
                for _ in range(POOL_DRAWS):
                    a = rng.choice(n_tlm, size - n_uniform, replace=False)
                    b = rng.choice(len(pool.uniform), n_uniform, replace=False)
                    latency = np.concatenate([pool.tlm_latency[a], pool.uniform_latency[b]])
                    score = np.concatenate([score_of[a], score_of[n_tlm + b]]) + rng.random(size) * 1e-12
                    picked.append(latency[np.argmax(score)])
                    pool_best.append(latency.min())
                sums["picked"] += calls * float(np.mean(picked))
                sums["pool_best"] += calls * float(np.mean(pool_best))
                sums["dataset_best"] += calls * pool.best
            rows[f"{share:g}"] = {"tasks": tasks, "picked_over_best": round(sums["picked"] / sums["dataset_best"], 4),
                                  "pool_best_over_best": round(sums["pool_best"] / sums["dataset_best"], 4)}
        out[workload] = rows
    return out


def random_pick(groups: list, weights: list[float], seed: int) -> dict:
    """A ranker that picks at random: the mean of its metrics over ``RANDOM_DRAWS`` draws."""
    rng = np.random.default_rng(seed)
    latencies = [np.array([r.latency for r in results]) for _, _, results, _ in groups]
    draws = [ranking_metrics(latencies, [rng.random(len(x)) for x in latencies], weights, rng)
             for _ in range(RANDOM_DRAWS)]
    return {k: draws[0][k] if k == "groups_ranked" else round(float(np.mean([d[k] for d in draws])), 4)
            for k in draws[0]}


def program_quality(dataset: Dataset, pools: list[Pool], workloads: list[str]) -> dict:
    """Per held-out workload: calls-weighted sums over its tasks (those with a ``Pool``) of the fastest tlm program,
    of the fastest program the dataset holds and of its fastest uniform sample, and the median over tasks of the
    task's median tlm program over its median uniform sample."""
    out = {}
    for workload in workloads:
        mine = [pool for pool in pools if pool.calls.get(workload)]
        sums = {"tlm": sum(p.calls[workload] * p.tlm_latency.min() for p in mine),
                "dataset": sum(p.calls[workload] * p.best for p in mine),
                "random": sum(p.calls[workload] * p.uniform_latency.min() for p in mine)}
        pooled = {p.task.workload_hash for p in mine}
        out[workload] = {
            "tasks": len(mine),
            "missing": [t.name for key, t in dataset.tasks.items() if t.workloads.get(workload) and key not in pooled],
            "tlm_programs_per_task": round(float(np.median([len(p.tlm) for p in mine] or [0])), 1),
            "best_ms": {k: round(v * 1e3, 4) for k, v in sums.items()},
            "best_tlm_over_dataset": round(sums["tlm"] / sums["dataset"], 4) if sums["dataset"] else None,
            "best_tlm_over_random": round(sums["tlm"] / sums["random"], 4) if sums["random"] else None,
            "median_tlm_over_random": round(float(np.median([statistics.median(p.tlm_latency)
                                                              / statistics.median(p.uniform_latency)
                                                              for p in mine])), 4) if mine else None,
        }
    return out


def markdown(report: dict) -> str:
    from tunecore.cli.render import cell

    data, tlm = report["dataset"], report["tlm_programs"]
    lines = ["# tlm's programs and its ranker on held-out networks", "",
             f"Held out: {report['held_out']}. tlm's programs: `{tlm['path']}`, {tlm['measured']} measured "
             f"({tlm['failed']} failed) of {tlm['tasks']} tasks, on {data['devices'][data['device']]}; the dataset "
             f"`{data['path']}` ({data['measured']} measured programs).", environment_line(report), "",
             "## The programs: the fastest tlm wrote against the fastest the dataset holds (same device)", "",
             "Sums over a network's tasks of calls x the task's fastest program (ms, one thread).", "",
             "| network | tasks | tlm programs per task | fastest tlm | fastest in the dataset | fastest random | "
             "tlm / dataset | tlm / random | median tlm / median random |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for workload, q in report["programs"].items():
        lines.append(f"| {workload} | {q['tasks']} | {cell(q['tlm_programs_per_task'])} | "
                     f"{cell(q['best_ms']['tlm'])} | {cell(q['best_ms']['dataset'])} | "
                     f"{cell(q['best_ms']['random'])} | "
                     f"{cell(q['best_tlm_over_dataset'])} | {cell(q['best_tlm_over_random'])} | "
                     f"{cell(q['median_tlm_over_random'])} |")
    lines.append("")
    for name, rows in report["ranking"].items():
        lines += [f"## The ranker on {name}", "",
                  "| ranker | " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
        for label, m in rows.items():
            lines.append(f"| {label} | " + " | ".join(cell(m.get(c)) for c in COLUMNS) + " |")
        lines.append("")
    shares = [f"{share:g}" for share in EXPLORE_SHARES]
    lines += [f"## A run's first round, simulated: {report['group_size']} candidates per measured one, a share E of "
              "them uniform samples (`-O search.explore=E`)", "",
              f"Per task, {POOL_DRAWS} draws of the candidates from the measured tlm programs and the dataset's "
              "uniform samples; the ranker's pick's latency, calls-weighted over the network's tasks, over the same "
              "sum of each task's fastest program in the dataset (1.0: the dataset's best; lower is faster). In "
              "parentheses: the fastest candidate of each draw (a perfect ranker). Tasks: those with at least "
              f"{report['group_size']} tlm programs and uniform samples in the dataset. A run's ranker also learns "
              "from the run's first measurements, which this leaves out.", "",
              "| ranker | network (tasks) | " + " | ".join(f"E = {e}" for e in shares) + " |",
              "|---|---|" + "---:|" * len(shares)]
    for label, workloads in report["first_round"].items():
        for workload, rows in workloads.items():
            lines.append(f"| {label} | {workload} ({rows[shares[0]]['tasks']}) | " + " | ".join(
                f"{cell(rows[e]['picked_over_best'])} ({cell(rows[e]['pool_best_over_best'])})" for e in shares) + " |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
