"""The shipped weights are worth shipping: these tests fail when cdmpp-cpu.pt is replaced by an untrained model.

They are judged on what the weights never saw: programs of the networks held out of their training (the
``split`` recorded in the file), from the shipped dataset, on the primary device. Swapping in an untrained
network was checked to fail them (see the note of the issue that added them); bench/shipped_weights.py reports
the same comparisons on the whole held-out side."""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest
from tunecore_cdmpp_predictor.costmodel import CDMPPModel
from tunecore_cdmpp_predictor.model import Predictor

from tunecore.dataset.evaluate import held_out_metrics, latency_metrics, measured_groups, seconds_per_flop
from tunecore.dataset.split import split
from tunecore.dataset.table import Dataset

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DATASET = os.path.join(ROOT, "datasets", "cpu-programs-v2.parquet")


@pytest.fixture(scope="module")
def held_out() -> dict:
    shipped = CDMPPModel(weights="shipped", online=False)
    trained_on = shipped.predictor.trained_on
    spec = trained_on.get("split") or ""
    assert spec.startswith("workload:"), "the shipped weights must hold networks out (cdmpp train --split)"
    held = set(spec.removeprefix("workload:").split(","))
    assert held >= {"zoo:resnet-18", "zoo:mobilenet-v2", "zoo:bert-tiny"} and not held & set(trained_on["workloads"])
    dataset = Dataset.load(DATASET)
    parts = split(dataset, spec)
    primary = collections.Counter(r.device_id for r in dataset.rows).most_common(1)[0][0]
    tasks = sorted({r.task_key for r in parts.test if r.device_id == primary})[::3]
    rows = [r for r in parts.test if r.device_id == primary and r.task_key in tasks and r.latency is not None]
    return {"model": shipped, "groups": measured_groups(dataset, rows),
            "per_flop": seconds_per_flop(dataset, parts.train, primary)}


def untrained_like(shipped: CDMPPModel) -> CDMPPModel:
    """What a swapped-in file of an untrained network would give: random weights, the shipped normalizer."""
    model = CDMPPModel(weights="none", online=False)
    model.predictor = Predictor(shipped.predictor.arch, seed=1)
    model.predictor.normalizer = shipped.predictor.normalizer
    return model


def test_shipped_weights_rank_and_predict_held_out_networks_far_better_than_untrained_and_constants(held_out):
    groups = held_out["groups"]
    assert len(groups) >= 15 and sum(len(g[1]) for g in groups) >= 500
    weights = [1.0] * len(groups)
    shipped = held_out_metrics(held_out["model"], groups, weights, seed=0)
    untrained = held_out_metrics(untrained_like(held_out["model"]), groups, weights, seed=0)
    latencies = [np.array([r.latency for r in results]) for _, _, results, _ in groups]
    flops_constant = latency_metrics(latencies, [np.full(len(lat), held_out["per_flop"] * task.flops)
                                                 for lat, (task, *_) in zip(latencies, groups)])
    # a per-task constant ranks nothing (Spearman 0); an untrained network next to nothing
    assert shipped["spearman"] > 0.25 and shipped["spearman"] > untrained["spearman"] + 0.2, (shipped, untrained)
    assert shipped["pairwise_accuracy"] > untrained["pairwise_accuracy"] + 0.08
    assert shipped["mape"] < 0.5 * untrained["mape"], (shipped["mape"], untrained["mape"])
    assert shipped["mape"] < 0.8 * flops_constant["mape"], (shipped["mape"], flops_constant["mape"])
