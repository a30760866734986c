"""The yardstick (``tunecore costmodel eval``): every cost model trained and tested the same way.

Each model is constructed by name from the registry (third-party ones included), ``reset`` (so that
weights it ships cannot have seen the test side) and taught the training side through
``CostModel.update_all``, each result carrying the device it ran on: first the measurements on the
devices that are not tested, then those on the tested devices (a cross-device split's fine-tuning
data). It is then asked to ``predict`` the test side one (task, device) group at a time, with
``model.device`` set to the device the group was measured on. Ranking is judged within a group, on
the programs that ran (failures are training data, not test data):

- ``spearman``: rank correlation of score and speed, mean over groups;
- ``pairwise_accuracy``: share of pairs with different latencies the scores order right (a tie counts half);
- ``recall@k``: share of the k fastest programs among the k best-scored, mean over groups;
- ``top1_score``/``top5_score``: TenSet's score, sum over groups of weight x best latency over sum of
  weight x (best latency among the k best-scored), weight = calls per inference of the tested workloads;
- for models that predict latency (``predicts_latency``): ``mape`` and ``rmse_ms`` of the predicted seconds;
- ``train_s`` and ``predict_programs_per_s``: the model's own time. The programs are replayed into schedules and
  their per-store features extracted before any clock starts, once for every model (``features_s``): the
  models share one cache of them (``tunecore.features.shared_features``).

- ``mape_task_normalised``: the MAPE left once each group's predictions are rescaled by the one factor that
  fits that group best: the error in placing programs within their task, with each task's level forgiven.

Beside the models, every report has two reference rows (``references``):

- the **per-task constant floor**: for each tested group the one latency with the lowest MAPE, chosen knowing
  the group's labels. It ranks nothing (its ties are broken at random), and no model that predicts one latency
  per task does better on MAPE: a model at or above it has learned nothing about programs within a task;
- the **noise ceiling**: the tested programs' second, independent labels (``label.second``, taken by ``tunecore
  dataset remeasure --second-labels`` in another run) scored as if they were a prediction of the first: no
  model can be expected to agree with the labels better than the machine agrees with itself. It covers the
  tested programs that have a second label (``programs``); none without them.

A model that is an ensemble (``CostModel.members``) has each member's metrics too (``members``): what
averaging gains over one of them, measured on the same training.

With ``group_size`` N, each tested (task, device) group is cut into disjoint groups of exactly N programs
(chosen by seed; groups smaller than N are left out), so that recall@k means the same in every row (chance
k / N: 0.25 for recall@32 in groups of 128, as the ncu paper's).
"""

from __future__ import annotations

import collections
import time
from typing import Any, Mapping, Sequence

import numpy as np

from tunecore.dataset.protocol import SECOND_LABEL
from tunecore.dataset.split import Split
from tunecore.dataset.table import Dataset, Measurement
from tunecore.errors import UsageError

TOP_K = (1, 5, 32)


def evaluate(dataset: Dataset, split: Split, models: Sequence[str] | Mapping[str, tuple[str, dict[str, Any]]], *,
             seed: int = 0, options: dict[str, dict[str, Any]] | None = None, group_size: int | None = None,
             registry: Any = None) -> dict[str, Any]:
    """Metrics per cost model (see the module docstring), with the split's sizes. ``models``: registered names,
    or labels mapped to (name, keyword arguments), so one model can be judged with several option sets; the
    keyword arguments go over ``options`` (``-O``)."""
    from tunecore.api import _construct
    from tunecore.features import shared_features
    from tunecore.options import options_for
    from tunecore.registry import Registry

    registry = registry or Registry.shared()
    entries = dict(models.items()) if isinstance(models, Mapping) else {name: (name, {}) for name in models}
    entries = {label: (name, {**options_for(options, "cost_model", name), **overrides})
               for label, (name, overrides) in entries.items()}
    for name, kwargs in entries.values():  # an unknown name or a bad option fails before any work
        _construct(registry, "cost_model", name, seed=seed, **kwargs).close()
    train = measured_groups(dataset, split.train)
    test = measured_groups(dataset, [r for r in split.test if r.latency is not None])
    if group_size is not None:
        test = fixed_size_groups(test, group_size, seed)
    for _, candidates, _, _ in train + test:
        for c in candidates:
            _ = c.sch  # replay once, outside every model's clock; candidates are shared by the models
    out: dict[str, Any] = {
        "split": split.spec,
        "train": {"measurements": len(split.train), "groups": len(train)},
        "test": {"measurements": sum(len(g[1]) for g in test), "groups": len(test), "group_size": group_size},
        "models": {},
    }
    with shared_features(sum(len(g[1]) for g in train + test)) as features:
        started = time.perf_counter()
        for task, candidates, _, _ in train + test:
            features(task, candidates)
        out["features_s"] = round(time.perf_counter() - started, 1)
        for label, (name, kwargs) in entries.items():
            out["models"][label] = _evaluate_one(registry, name, kwargs, train, test, split, seed)
    out["references"] = {"per-task constant (floor)": constant_floor(test, split, seed),
                         "second labels (ceiling)": noise_ceiling(test, split, seed)}
    return out


def table_rows(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """An ``evaluate`` result's rows: each model, its ensemble's members after it, then the references (one that
    stands on fewer programs than the models, as second labels may, says on how many: its ranks are not theirs)."""
    rows = {}
    for name, metrics in result["models"].items():
        rows[name] = {k: v for k, v in metrics.items() if k != "members"}
        for i, member in enumerate(metrics.get("members", [])):
            rows[f"{name} member {i + 1}"] = member
    tested = result["test"]["measurements"]
    for name, metrics in result.get("references", {}).items():
        fewer = metrics.get("programs", tested) < tested
        rows[f"{name}, {metrics['programs']} of {tested} programs" if fewer else name] = metrics
    return rows


def fixed_size_groups(test: list, size: int, seed: int) -> list:
    """Each measured group cut into disjoint groups of exactly ``size`` programs, chosen by seed."""
    if size < 2:
        raise UsageError(f"group_size {size}: expected an integer >= 2")
    rng = np.random.default_rng(seed)
    out = []
    for task, candidates, results, device in test:
        order = rng.permutation(len(candidates))
        for start in range(0, len(order) - size + 1, size):
            chosen = sorted(order[start:start + size])
            out.append((task, [candidates[i] for i in chosen], [results[i] for i in chosen], device))
    if not out:
        raise UsageError(f"group size {size} (--group-size): no tested task x device group has {size} measured "
                         "programs")
    return out


def weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, cumulative[-1] / 2)])


def best_constant(latencies: np.ndarray) -> float:
    """The constant c with the lowest mean |c - y| / y over latencies y: their median weighted by 1 / y."""
    return weighted_median(latencies, 1 / latencies)


def best_scale(latencies: np.ndarray, predicted: np.ndarray) -> float:
    """The factor c with the lowest mean |c p - y| / y: the median of y / p weighted by p / y."""
    return weighted_median(latencies / predicted, predicted / latencies)


def seconds_per_flop(dataset: Dataset, rows: Sequence[Measurement], device: str) -> float | None:
    """The median seconds per FLOP of ``device``'s measured programs among ``rows``: the one number of the
    FLOPs-constant baseline (weight x FLOPs x it); None when the device has none there."""
    ratios = [r.latency / dataset.tasks[r.task_key].flops for r in rows
              if r.latency is not None and r.device_id == device and dataset.tasks[r.task_key].flops]
    return float(np.median(ratios)) if ratios else None


def noise_ceiling(test: list, split: Split, seed: int) -> dict[str, Any]:
    """The metrics of the tested programs' second labels as a prediction of their first, on the programs that
    have one."""
    firsts, seconds, weights = [], [], []
    for task, _, results, _ in test:
        pairs = [(r.latency, r.profile[SECOND_LABEL]) for r in results if SECOND_LABEL in r.profile]
        if pairs:
            firsts.append(np.array([a for a, _ in pairs]))
            seconds.append(np.array([b for _, b in pairs]))
            weights.append(split.weights.get(task.workload_hash, 1))
    if not firsts:
        return {"programs": 0}
    return {**guess_metrics(firsts, seconds, weights, seed), "programs": int(sum(map(len, firsts)))}


def constant_floor(test: list, split: Split, seed: int) -> dict[str, Any]:
    """The metrics of predicting each tested group's ``best_constant`` for all of its programs."""
    latencies = [np.array([r.latency for r in results]) for _, _, results, _ in test]
    return guess_metrics(latencies, [np.full(len(group), best_constant(group)) for group in latencies],
                         [split.weights.get(t.workload_hash, 1) for t, *_ in test], seed)


def guess_metrics(latencies: list[np.ndarray], guesses: list[np.ndarray], weights: list[float],
                  seed: int) -> dict[str, Any]:
    """Ranking and latency metrics of predicted seconds (per group, as ``latencies``) that are not a model's."""
    return {**ranking_metrics(latencies, [-g for g in guesses], weights, np.random.default_rng(seed)),
            **latency_metrics(latencies, guesses)}


def _evaluate_one(registry: Any, name: str, kwargs: dict[str, Any], train: list, test: list, split: Split,
                  seed: int) -> dict[str, Any]:
    from tunecore.api import _construct

    model = _construct(registry, "cost_model", name, seed=seed, **kwargs)
    try:
        train_s = teach(model, train, [device for *_, device in test])
        weights = [split.weights.get(t.workload_hash, 1) for t, *_ in test]
        metrics = held_out_metrics(model, test, weights, seed)
        # without a member's programs per second: it reuses the features the ensemble's prediction computed
        members = [{k: v for k, v in held_out_metrics(member, test, weights, seed).items()
                    if k != "predict_programs_per_s"} for member in model.members()]
        if members:
            metrics["members"] = members
    finally:
        model.close()
    return {**metrics, "train_s": round(train_s, 3)}


def teach(model: Any, train: list, test_devices: list[dict[str, Any]]) -> float:
    """Reset ``model`` (shipped weights may have seen the test side) and train it on measured groups
    (``measured_groups``): the other devices' first, then those of ``test_devices`` (a cross-device split's
    fine-tuning data). ``model.device`` is left at the first tested device. Seconds it took."""
    model.reset()
    started = time.perf_counter()
    # every result says which device it ran on; ``device`` is the one the model will be asked about
    model.device = test_devices[0] if test_devices else None
    tested = {repr(device) for device in test_devices}
    for on_test_devices in (False, True):
        batches = [(t, c, r) for t, c, r, device in train if (repr(device) in tested) == on_test_devices]
        if batches:
            model.update_all(batches)
    return time.perf_counter() - started


def held_out_metrics(model: Any, test: list, weights: list[float], seed: int) -> dict[str, Any]:
    """A trained model's ranking metrics on measured groups (``measured_groups``), latency metrics too
    for a model that predicts latency, and how many programs per second it scores."""
    scores, predicted_s, predict_s = [], [], 0.0
    for task, candidates, _, device in test:
        model.device = device
        started = time.perf_counter()
        scores.append(np.asarray(model.predict(task, candidates), dtype=float))
        if model.predicts_latency:
            predicted_s.append(np.asarray(model.predict_latency(task, candidates), dtype=float))
        predict_s += time.perf_counter() - started
    latencies = [np.array([r.latency for r in results]) for _, _, results, _ in test]
    metrics = ranking_metrics(latencies, scores, weights, np.random.default_rng(seed))
    if model.predicts_latency:
        metrics.update(latency_metrics(latencies, predicted_s))
    n_test = sum(map(len, latencies))
    metrics["predict_programs_per_s"] = round(n_test / predict_s, 1) if predict_s > 0 else None
    return metrics


def ranking_metrics(latencies: list[np.ndarray], scores: list[np.ndarray], weights: list[float],
                    rng: np.random.Generator) -> dict[str, Any]:
    """Ranking quality over groups (arrays of one group's latencies and scores, higher score = faster)."""
    from scipy.stats import spearmanr

    spearman, pairwise, best_sum = [], [], 0.0
    recall: dict[int, list[float]] = {k: [] for k in TOP_K}
    chosen_sum = dict.fromkeys((1, 5), 0.0)
    for latency, score, weight in zip(latencies, scores, weights):
        if len(latency) < 2:
            continue
        # ties in score are broken at random, not by the order of the file
        order = np.lexsort((rng.random(len(score)), -score))
        true_order = np.argsort(latency, kind="stable")
        if np.ptp(score) > 0:
            spearman.append(float(spearmanr(score, -latency).statistic))
        else:
            spearman.append(0.0)
        pairwise.append(_pairwise_accuracy(latency, score))
        for k in TOP_K:
            kk = min(k, len(latency))
            recall[k].append(len(set(order[:kk]) & set(true_order[:kk])) / kk)
        best_sum += weight * latency.min()
        for k in chosen_sum:
            chosen_sum[k] += weight * latency[order[:k]].min()
    return {
        "groups_ranked": len(spearman),
        "spearman": _mean(spearman),
        "pairwise_accuracy": _mean(pairwise),
        **{f"recall@{k}": _mean(v) for k, v in recall.items()},
        **{f"top{k}_score": round(float(best_sum / chosen), 4) if chosen else None for k, chosen in chosen_sum.items()},
    }


def latency_metrics(latencies: list[np.ndarray], predicted: list[np.ndarray]) -> dict[str, Any]:
    true, pred = np.concatenate(latencies), np.concatenate(predicted)
    normalised = None
    if np.all(pred > 0):  # a factor cannot rescale a non-positive prediction
        errors = [np.abs(p * best_scale(y, p) - y) / y for y, p in zip(latencies, predicted)]
        normalised = round(float(np.mean(np.concatenate(errors))), 4)
    return {"mape": round(float(np.mean(np.abs(pred - true) / true)), 4),
            "mape_task_normalised": normalised,
            "rmse_ms": round(float(np.sqrt(np.mean((pred - true) ** 2))) * 1e3, 4)}


def _pairwise_accuracy(latency: np.ndarray, score: np.ndarray) -> float:
    faster = latency[:, None] < latency[None, :]  # i is faster than j
    if not faster.any():
        return 0.5
    right = (score[:, None] > score[None, :]) & faster
    tied = (score[:, None] == score[None, :]) & faster
    return float((right.sum() + 0.5 * tied.sum()) / faster.sum())


def measured_groups(dataset: Dataset, rows: list[Measurement]) -> list[tuple[Any, list, list, dict[str, Any]]]:
    """(task, candidates, results, device description) per (task, device), in a fixed order."""
    from tunecore.data import Candidate, MeasureResult

    grouped: dict[tuple[str, str, str], list[Measurement]] = collections.defaultdict(list)
    for row in rows:
        grouped[row.task_key, row.device_id, row.target].append(row)
    out = []
    for (key, device_id, target), members in sorted(grouped.items()):
        task = dataset.tasks[key].for_target(target)
        device = dataset.devices[device_id]
        out.append((task, [Candidate(task, r.trace, r.program_key, r.origin) for r in members],
                    [MeasureResult(r.run_secs, r.error, r.build_secs, dict(r.profile), device=device) for r in members],
                    device))
    return out


def _mean(values: list[float]) -> float | None:
    return round(float(np.mean(values)), 4) if values else None
