"""The cdmpp_predictor plugin: compact ASTs of real tasks, the weights file, training, per-device fine-tuning,
the commands, and `cdmpp` as the cost model of a run."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from tunecore_cdmpp_predictor.costmodel import CDMPPModel
from tunecore_cdmpp_predictor.features import CompactASTs, leaf_positions
from tunecore_cdmpp_predictor.model import Predictor

from tunecore.data import MeasureResult
from tunecore.dataset.evaluate import measured_groups
from tunecore.dataset.table import Dataset
from tunecore.features import device_features
from tunecore.interfaces import UsageError
from tunecore.testing import CostModelConformance, sample_candidates
from tunecore.testing.cli import assert_one_line_exit_2, cli_json, run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SHIPPED = os.path.join(ROOT, "datasets", "cpu-programs.parquet")


class TestCdmppIsACostModel(CostModelConformance):
    name = "cdmpp"
    options = {"weights": "none"}


@pytest.fixture(scope="module")
def shipped() -> Dataset:
    return Dataset.load(SHIPPED)


@pytest.fixture(scope="module")
def slice_path(shipped, tmp_path_factory) -> str:
    """8 programs per task of resnet-18 and bert-tiny on two devices, as a dataset file."""
    devices = list(shipped.info()["devices"])[:2]
    keys = [k for k, t in shipped.tasks.items() if {"zoo:resnet-18", "zoo:bert-tiny"} & set(t.workloads)]
    part = Dataset()
    for key in keys:
        part.add_task(shipped.tasks[key])
        programs = {r.program_key for r in shipped.rows_of(key, devices[1])[:8]}
        for device in devices:
            part.add_device(shipped.devices[device])
            for row in shipped.rows_of(key, device):
                if row.program_key in programs:
                    part.add(row)
    path = str(tmp_path_factory.mktemp("cdmpp") / "slice.parquet")
    part.save(path)
    return path


def _groups(dataset: Dataset, device: str, workload: str, n: int = 8) -> list:
    rows = [r for k, t in dataset.tasks.items() if workload in t.workloads for r in dataset.rows_of(k, device)[:n]]
    return measured_groups(dataset, [r for r in rows if r.latency is not None])


def _bert_tiny_programs(dataset: Dataset) -> tuple[list, np.ndarray, np.ndarray]:
    """4 programs per bert-tiny task on the primary device: compact ASTs, device features, latencies."""
    primary = next(iter(dataset.info()["devices"]))
    programs, latencies = [], []
    for task, candidates, results, _ in _groups(dataset, primary, "zoo:bert-tiny", 4):
        for ast, r in zip(CompactASTs(threads=2)(task, candidates), results):
            programs.append(ast)
            latencies.append(r.latency)
    devices = np.repeat(device_features(dataset.devices[primary])[None, :], len(programs), axis=0)
    return programs, devices, np.array(latencies)


def test_compact_asts_of_real_tasks_have_one_position_per_store_row_and_are_deterministic(shipped):
    """Every program of resnet-18's and bert-tiny's tasks (4 each): the tree walk finds as many leaves as
    PerStoreFeature has rows, each at its own place in the serialized tree; the same twice over."""
    primary = next(iter(shipped.info()["devices"]))
    groups = _groups(shipped, primary, "zoo:resnet-18", 4) + _groups(shipped, primary, "zoo:bert-tiny", 4)
    asts = CompactASTs(threads=2)
    leaf_counts = set()
    for task, candidates, _, _ in groups:
        for candidate, ast in zip(candidates, asts(task, candidates)):
            assert ast is not None and ast.aligned, task.name
            assert ast.features.shape == (len(ast.positions), 164)
            assert len(set(ast.positions.tolist())) == len(ast.positions) and ast.positions.min() >= 1
            np.testing.assert_array_equal(leaf_positions(candidate.sch.mod), ast.positions)
            leaf_counts.add(len(ast.positions))
    assert len(leaf_counts) >= 3, leaf_counts  # one model, many leaf counts
    again = CompactASTs(threads=2)
    task, candidates, _, _ = groups[0]
    for a, b in zip(asts(task, candidates), again(task, candidates)):
        np.testing.assert_array_equal(a.features, b.features)
        np.testing.assert_array_equal(a.positions, b.positions)


def test_device_features_tell_isa_levels_and_core_counts_apart(shipped):
    vectors = [device_features(d) for d in shipped.devices.values()]
    assert all(v.shape == vectors[0].shape and np.all(np.isfinite(v)) for v in vectors)
    assert len({v.tobytes() for v in vectors}) == len(vectors)
    with pytest.raises(ValueError, match="lacks sm_count"):
        device_features({"kind": "cuda", "arch": "sm_80", "clock_mhz": 1400})
    with pytest.raises(ValueError, match="target kind 'opencl'"):
        device_features({"kind": "opencl"})


def test_training_on_a_slice_lowers_the_loss(shipped):
    primary = next(iter(shipped.info()["devices"]))
    groups = _groups(shipped, primary, "zoo:resnet-18")
    asts = CompactASTs(threads=2)
    programs, latencies = [], []
    for task, candidates, results, _ in groups:
        for ast, r in zip(asts(task, candidates), results):
            programs.append(ast)
            latencies.append(r.latency)
    devices = np.repeat(device_features(shipped.devices[primary])[None, :], len(programs), axis=0)
    losses: list[float] = []
    Predictor(seed=0).fit(programs, devices, np.array(latencies), steps=200, batch_size=64,
                          on_step=lambda step, loss: losses.append(loss))
    assert np.mean(losses[-10:]) < 0.6 * np.mean(losses[:10]), (losses[:10], losses[-10:])


def test_training_stopped_resumes_from_its_checkpoint(shipped, tmp_path):
    programs, devices, latencies = _bert_tiny_programs(shipped)
    checkpoint, settings = str(tmp_path / "m.pt.ckpt"), {"command": "a test"}
    steps: list[int] = []
    losses: list[float] = []

    def stop_at(last: int):
        def on_step(step: int, loss: float) -> None:
            steps.append(step)
            losses.append(loss)
            if step == last:
                raise KeyboardInterrupt
        return on_step

    def fit(predictor: Predictor, total: int, last: int = -1, **options) -> None:
        predictor.fit(programs, devices, latencies, steps=total, batch_size=16, checkpoint=checkpoint,
                      settings=settings, on_step=stop_at(last), **options)

    with pytest.raises(KeyboardInterrupt):
        fit(Predictor(seed=0), 600, last=400)
    assert json.loads(torch.load(checkpoint, weights_only=True)["metadata"])["step"] == 250
    first_losses = losses[:10]
    steps.clear()
    losses.clear()
    resumed = Predictor(seed=0)
    fit(resumed, 600)
    assert steps == list(range(250, 600))  # the same command continues at the checkpoint, with its weights
    # its loss goes on from where it stopped (0.33 before, 0.35 after, 0.82 at the start, when written)
    assert np.mean(losses[:20]) < 0.5 * np.mean(first_losses)
    steps.clear()
    with pytest.raises(KeyboardInterrupt):  # another number of steps, or other options, start over
        fit(Predictor(seed=0), 600, last=0, lr=5e-4)
    assert steps == [0]
    os.remove(checkpoint)
    whole = Predictor(seed=0)
    fit(whole, 600)
    # stopped and resumed, the same weights as a run that was never stopped
    assert all(torch.equal(a, b) for a, b in zip(resumed.net.state_dict().values(), whole.net.state_dict().values()))


def test_an_ensemble_averages_its_members_resumes_and_round_trips(shipped, slice_path, tmp_path, monkeypatch):
    from tunecore_cdmpp_predictor import model as model_module

    monkeypatch.setattr(model_module, "CHECKPOINT_EVERY", 15)
    primary = next(iter(shipped.info()["devices"]))
    programs, devices, latencies = _bert_tiny_programs(shipped)
    checkpoint = str(tmp_path / "m.pt.ckpt")
    steps: list[int] = []

    def fit(predictor: Predictor, saving: bool = True, last: int = -1) -> Predictor:
        def on_step(step: int, loss: float) -> None:
            steps.append(step)
            if step == last:
                raise KeyboardInterrupt

        predictor.fit(programs, devices, latencies, steps=40, batch_size=16, on_step=on_step,
                      checkpoint=checkpoint if saving else None, settings={"command": "a test"})
        return predictor

    def same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
        return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))

    whole = fit(Predictor(seed=0, members=2), saving=False)
    assert steps == list(range(80))  # each member's 40 steps, one member after the other
    assert same(whole.nets[0], fit(Predictor(seed=0), saving=False).net)  # the first member is the single model
    assert not same(whole.nets[0], whole.nets[1])
    # stopped within the second member (its checkpoint at step 60) and at the first member's end (step 40)
    for last, checkpointed in ((70, 60), (42, 40)):
        if os.path.exists(checkpoint):
            os.remove(checkpoint)
        with pytest.raises(KeyboardInterrupt):
            fit(Predictor(seed=0, members=2), last=last)
        steps.clear()
        resumed = fit(Predictor(seed=0, members=2))
        assert steps == list(range(checkpointed, 80))
        assert same(resumed.nets[0], whole.nets[0]) and same(resumed.nets[1], whole.nets[1])

    # the ensemble predicts the mean of its members' outputs: between the two members' seconds
    ensemble, alone = whole.predict(programs, devices), [whole.predict(programs, devices, member=i) for i in (0, 1)]
    assert np.all(ensemble >= np.minimum(*alone) * (1 - 1e-5)) and np.all(ensemble <= np.maximum(*alone) * (1 + 1e-5))
    assert np.max(np.abs(np.log(alone[0] / alone[1]))) > 1e-3
    path = str(tmp_path / "ensemble.pt")
    whole.save(path)
    loaded = CDMPPModel(weights=path)
    assert len(loaded.predictor.nets) == 2
    np.testing.assert_allclose(loaded.predictor.predict(programs, devices), ensemble, rtol=1e-5)
    views = loaded.members()
    assert len(views) == 2 and CDMPPModel(weights="none").members() == []
    loaded.device = views[1].device = shipped.devices[primary]
    task, candidates, _, _ = _groups(shipped, primary, "zoo:bert-tiny", 4)[0]
    n = len(candidates)
    np.testing.assert_allclose(views[1].predict_latency(task, candidates), alone[1][:n], rtol=1e-5)
    np.testing.assert_allclose(loaded.predict_latency(task, candidates), ensemble[:n], rtol=1e-5)
    saved = torch.load(path, weights_only=True)
    metadata = json.loads(saved["metadata"])
    for members in (0, 1000, "2"):
        bad = str(tmp_path / f"members-{members}.pt")
        torch.save({**saved, "metadata": json.dumps({**metadata, "members": members})}, bad)
        with pytest.raises(UsageError, match="'members' is"):
            Predictor.load(bad)

    # `costmodel eval` (and bench/cdmpp.py) report each member beside the ensemble
    from tunecore.dataset.evaluate import evaluate
    from tunecore.dataset.split import split
    from tunecore.experiments import split_tables

    part = Dataset.load(slice_path)
    result = evaluate(part, split(part, "workload:zoo:bert-tiny", devices=[next(iter(part.info()["devices"]))]),
                      ["cdmpp"], options={"cdmpp": {"ensemble": 2, "epochs": 1, "batch_size": 8}})
    members = result["models"]["cdmpp"]["members"]
    assert len(members) == 2 and all(m["mape"] > 0 and m["groups_ranked"] > 0 for m in members)
    table = "\n".join(split_tables({"bert-tiny": result}, ["mape"]))
    assert "| cdmpp member 1 |" in table and "| cdmpp member 2 |" in table
    for count in (0, 33, True):
        with pytest.raises(TypeError, match="ensemble must be an integer from 1 to 32"):
            CDMPPModel(weights="none", ensemble=count)


def test_weights_round_trip_without_pickle_and_refuse_other_files(shipped, tmp_path):
    primary = next(iter(shipped.info()["devices"]))
    groups = _groups(shipped, primary, "zoo:bert-tiny", 6)
    model = CDMPPModel(weights="none", epochs=2)
    model.update_all([(t, c, r) for t, c, r, _ in groups])
    model.device = shipped.devices[primary]
    path = str(tmp_path / "model.pt")
    model.save(path)
    saved = torch.load(path, weights_only=True)  # the restricted loader: tensors, strings and numbers only
    assert json.loads(saved["metadata"])["format"] == "tunecore-cdmpp"
    loaded = CDMPPModel(weights=path)
    loaded.device = model.device
    task, candidates, _, _ = groups[0]
    np.testing.assert_allclose(loaded.predict_latency(task, candidates), model.predict_latency(task, candidates),
                               rtol=1e-5)

    other_version = str(tmp_path / "v9.pt")
    torch.save({"metadata": json.dumps({"format": "tunecore-cdmpp", "version": 9}), "state_dict": {}}, other_version)
    not_a_model = str(tmp_path / "other.pt")
    with open(not_a_model, "w") as f:
        json.dump({"format": "tunecore-xgb"}, f)
    for bad, message in ((other_version, "version 9"), (not_a_model, "not a tunecore cdmpp model file"),
                         (str(tmp_path / "missing.pt"), "no such file")):
        with pytest.raises(UsageError, match=message):
            Predictor.load(bad)
        assert_one_line_exit_2(
            run_cli("predict", "--model", "op:matmul-64", "--store", "memory:", "-O", f"cdmpp.weights={bad}"), message)


def test_fine_tuning_on_a_second_device_changes_its_predictions_only(shipped):
    first, second = list(shipped.info()["devices"])[:2]
    model = CDMPPModel(weights="none")
    steps: list[int] = []
    model.learn([(t, c, r) for t, c, r, _ in _groups(shipped, first, "zoo:resnet-18")], steps=120,
                on_progress=lambda p: steps.append(p.done - 1))
    assert steps == list(range(120))  # the steps asked for, also when training from scratch
    task, candidates, _, _ = _groups(shipped, first, "zoo:bert-tiny")[0]

    def predictions() -> tuple[np.ndarray, np.ndarray]:
        out = []
        for device in (first, second):
            model.device = shipped.devices[device]
            out.append(model.predict_latency(task, candidates))
        return out[0], out[1]

    before = predictions()
    report = model.learn([(t, c, r) for t, c, r, _ in _groups(shipped, second, "zoo:resnet-18")], steps=30)
    after = predictions()
    assert report["trained"] == "adapters" and set(report["devices"]) == {second}
    np.testing.assert_array_equal(after[0], before[0])
    assert np.max(np.abs(np.log(after[1] / before[1]))) > 1e-3


def test_costmodel_train_stopped_resumes_from_its_checkpoint(slice_path, tmp_path, monkeypatch, capsys):
    from tunecore_cdmpp_predictor import model as model_module

    from tunecore.cli import main

    monkeypatch.setattr(model_module, "CHECKPOINT_EVERY", 50)
    save = model_module.save_checkpoint
    saved_at: list[int] = []

    def saving(path: str, kind: str, settings: dict, step: int, state: dict, stop_at: int = -1) -> None:
        save(path, kind, settings, step, state)
        saved_at.append(step)
        if step == stop_at:
            raise KeyboardInterrupt  # Ctrl-C just after a checkpoint was written

    def train(out: str) -> int:  # 200 steps (cdmpp's least)
        return main(["costmodel", "train", "-d", slice_path, "--cost-model", "cdmpp", "--split",
                     "workload:zoo:bert-tiny", "-O", "cdmpp.weights=none", "-O", "cdmpp.epochs=1", "-o", out, "--json"])

    stopped, whole = str(tmp_path / "stopped.pt"), str(tmp_path / "whole.pt")
    monkeypatch.setattr(model_module, "save_checkpoint", lambda *a: saving(*a, stop_at=100))
    assert train(stopped) == 130
    assert f"training's state at step 100 is kept in {stopped}.ckpt" in capsys.readouterr().err
    assert not os.path.exists(stopped)
    monkeypatch.setattr(model_module, "save_checkpoint", saving)
    saved_at.clear()
    assert train(stopped) == 0
    assert saved_at == [150]  # the same command went on from step 100
    assert not os.path.exists(stopped + ".ckpt")  # and removed the checkpoint once the weights were written
    saved_at.clear()
    assert train(whole) == 0
    assert saved_at == [50, 100, 150]
    # stopped and resumed, the same weights as a command that was never stopped
    resumed, uninterrupted = (torch.load(f, weights_only=True)["state_dict"] for f in (stopped, whole))
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)


def test_train_command_reports_held_out_error_and_predict_uses_its_weights(slice_path, tmp_path):
    import collections

    from tunecore.dataset.evaluate import held_out_metrics
    from tunecore.dataset.split import split

    weights = str(tmp_path / "m.pt")
    with open(weights + ".ckpt", "w") as f:  # another run's leftover: not a checkpoint it can resume
        f.write("not a checkpoint")
    report = cli_json(run_cli("cdmpp", "train", "--dataset", slice_path, "--split", "workload:zoo:bert-tiny",
                              "--epochs", "3", "--rank-weight", "0.5", "-o", weights, "--json"))
    # what the slice holds: bert-tiny's tasks are held out, every other task's measurements are trained on
    dataset = Dataset.load(slice_path)
    held = {key for key, task in dataset.tasks.items() if "zoo:bert-tiny" in task.workloads}
    train_rows = [r for r in dataset.rows if r.task_key not in held and r.latency is not None]
    test_rows = [r for r in dataset.rows if r.task_key in held and r.latency is not None]
    per_device = dict(collections.Counter(r.device_id for r in train_rows))
    assert held and train_rows and test_rows and len(per_device) == 2
    assert report["programs"] == len(train_rows) and report["devices"] == per_device
    assert report["test"]["programs"] == len(test_rows)
    assert 0 < report["loss"] < 10 and report["train_s"] > 0

    # the file loads, and records what it was trained on
    trained_on = json.loads(torch.load(weights, weights_only=True)["metadata"])["trained_on"]
    workloads = sorted({w for r in train_rows for w in dataset.tasks[r.task_key].workloads})
    assert "zoo:resnet-18" in workloads and "zoo:bert-tiny" not in workloads
    assert trained_on == {"dataset": slice_path, "split": "workload:zoo:bert-tiny", "programs": len(train_rows),
                          "devices": per_device, "workloads": workloads, "epochs": 3, "rank_weight": 0.5,
                          "ensemble": 1, "max_spread": None, "min_programs": None}
    assert not os.path.exists(weights + ".ckpt")  # the checkpoint goes once the weights are written
    model = CDMPPModel(weights=weights)
    assert model.predictor.trained and model.predictor.trained_on == trained_on
    # fine-tuning it (online, or adapting it to a device) keeps the loss it was trained with, unless told
    assert model.rank_weight == 0.5 and CDMPPModel(weights=weights, rank_weight=0.0).rank_weight == 0.0
    forgetting = CDMPPModel(weights=weights)
    forgetting.reset()  # the yardstick trains from nothing: with the default loss, not the forgotten file's
    assert forgetting.rank_weight == 0.0

    # the reported metrics: numbers in their ranges, over the held-out groups of the slice, and what the loaded
    # file's predictions on those programs give
    test = report["test"]
    groups = collections.Counter((r.task_key, r.device_id) for r in test_rows)
    assert test["groups_ranked"] == sum(n >= 2 for n in groups.values()) > 0
    assert -1 <= test["spearman"] <= 1 and 0 <= test["pairwise_accuracy"] <= 1
    assert 0 < test["top1_score"] <= test["top5_score"] <= 1
    assert test["mape"] > 0 and test["rmse_ms"] > 0
    parts = split(dataset, "workload:zoo:bert-tiny")
    held_out = measured_groups(dataset, test_rows)
    again = held_out_metrics(model, held_out, [parts.weights.get(t.workload_hash, 1) for t, *_ in held_out], 0)
    for name, value in test.items():
        if name not in ("programs", "predict_programs_per_s"):
            assert again[name] == pytest.approx(value, abs=2e-4), name
    predicted = cli_json(run_cli("predict", "--model", "op:matmul-64", "--store", "memory:", "-O",
                                 f"cdmpp.weights={weights}", "--json"))
    assert predicted["tasks"][0]["schedule"] == "default" and predicted["predicted_ms"] > 0

    # adapting to a device the slice does not have: 2 KMeans-chosen tasks x 3 programs measured, added to the file
    adapted = str(tmp_path / "adapted.pt")
    new_device = '{"kind": "llvm", "mcpu": "x86-64", "num-cores": 1}'
    report = cli_json(run_cli("cdmpp", "adapt", "--target", new_device, "--dataset", slice_path, "--weights", weights,
                              "--tasks", "2", "--per-task", "3", "--steps", "20", "-o", adapted, "--json"))
    assert len(report["tasks"]) == 2 and report["measured"] == 6 and report["programs"] >= 5
    assert report["device_id"] in Dataset.load(slice_path).devices
    assert report["device_id"] in json.loads(torch.load(adapted, weights_only=True)["metadata"])["adapters"]
    # predictions for a device the weights never learned from say so (stderr, and in the JSON); adapted, they do not
    before = run_cli("predict", "--model", "op:matmul-64", "--store", "memory:", "--target", new_device,
                     "-O", f"cdmpp.weights={weights}")
    assert before.returncode == 0 and "note: cdmpp never learned from this device" in before.stderr
    after = cli_json(run_cli("predict", "--model", "op:matmul-64", "--store", "memory:", "--target", new_device,
                             "-O", f"cdmpp.weights={adapted}", "--json"))
    assert after["device_note"] is None

    assert_one_line_exit_2(run_cli("cdmpp", "train", "--dataset", slice_path, "--split", "workload:zoo:nothing",
                                   "-o", weights), "zoo:nothing")
    assert_one_line_exit_2(run_cli("cdmpp", "train", "--dataset", str(tmp_path / "none.parquet"), "-o", weights),
                           "none.parquet")
    # the papers' filters: no task of the slice has 9 programs on a device
    assert_one_line_exit_2(run_cli("cdmpp", "train", "--dataset", slice_path, "--min-programs", "9", "-o", weights),
                           "no programs to train on")
    import pyarrow.parquet as pq

    no_latencies = str(tmp_path / "no-latencies.parquet")
    pq.write_table(pq.read_table(slice_path).drop_columns(["run_secs"]), no_latencies)
    assert_one_line_exit_2(run_cli("cdmpp", "train", "--dataset", no_latencies, "-o", weights),
                           "without its columns run_secs")


def test_a_device_without_features_and_a_ranking_only_model_are_usage_errors():
    assert_one_line_exit_2(run_cli("predict", "--model", "op:matmul-64", "--store", "memory:", "--target",
                                   '{"kind": "cuda", "arch": "sm_80"}'), "cdmpp", "lacks")
    assert_one_line_exit_2(run_cli("predict", "--model", "op:matmul-64", "--store", "memory:", "--cost-model", "none"),
                           "does not predict latency")


@pytest.mark.parametrize("search", ["ansor", "transfer"])
def test_cdmpp_guides_a_run(search, tmp_path):
    store = str(tmp_path / "t.db")
    options = ["-O", "ansor.population=32", "-O", "ansor.iterations=1"] if search == "ansor" else []
    summary = cli_json(run_cli("run", "--model", "op:matmul-64", "--search", search, "--cost-model", "cdmpp",
                               "--trials", "16", "--store", store, *options, "--json"))
    assert summary["tasks"][0]["best_latency_s"] is not None


@pytest.mark.parametrize("rank_weight", [0.0, 1.0])
def test_scores_are_finite_for_programs_it_never_saw_and_rank_those_it_learned(matmul_task, rank_weight):
    """One measured round of 32 programs (``tiled_latency``: latencies that follow the tiling, no noise) trains an
    untrained model from scratch (200 steps): it then ranks and predicts those programs, which it ranked at random
    before, and scores 8 programs it never saw with finite numbers that tell them apart; with the ranking term
    in the loss too."""
    from scipy.stats import spearmanr

    from tunecore.testing import tiled_latency

    candidates = sample_candidates(matmul_task, 40)
    seen, unseen = candidates[:32], candidates[32:]
    latencies = np.array([tiled_latency(c) for c in seen])
    assert len(set(latencies)) > 16  # something to rank
    model = CDMPPModel(weights="none", epochs=2, rank_weight=rank_weight)
    untrained = spearmanr(model.predict(matmul_task, seen), -latencies).statistic  # a random order
    model.update(matmul_task, seen, [MeasureResult(run_secs=[latency]) for latency in latencies])
    assert model.predictor.trained
    scores = model.predict(matmul_task, seen)
    trained = spearmanr(scores, -latencies).statistic
    assert trained > 0.8 and trained > untrained + 0.5, (trained, untrained)
    predicted = model.predict_latency(matmul_task, seen)
    np.testing.assert_allclose(scores, -np.log(predicted))  # higher score: faster
    assert np.mean(np.abs(predicted - latencies) / latencies) < 0.3

    scores = model.predict(matmul_task, unseen)
    assert scores.shape == (8,) and np.all(np.isfinite(scores))
    assert len(set(scores.tolist())) == 8, scores  # each program its own score
    np.testing.assert_allclose(scores, -np.log(model.predict_latency(matmul_task, unseen)))


def test_measurement_workers_do_not_import_torch_and_other_children_still_can(monkeypatch, target):
    """torch is installed with this plugin, and TVM's FFI would import it in every build and run worker."""
    import subprocess
    import sys

    from tunecore.measure import worker
    from tunecore.measure.local import _WarmPool
    from tunecore.tvmjson import target_to_json

    monkeypatch.setenv("PYTHONPATH", "")
    pool = _WarmPool(1, 60, target_to_json(target))  # it calls keep_torch_out() first
    try:
        assert pool.submit(worker.loaded, "tvm").result() and not pool.submit(worker.loaded, "torch").result()
    finally:
        pool.close()
    probe = [sys.executable, "-c", "import sys, tvm, torch; print(torch.__version__, torch.tensor([2.0]).sum().item())"]
    assert subprocess.run(probe, capture_output=True, text=True).stdout.split() == [torch.__version__, "2.0"]


def test_the_ranking_term_orders_pairs_within_a_group_only():
    from tunecore_cdmpp_predictor.model import group_batch, rank_loss

    target = torch.tensor([0.0, 1.0, 2.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 1])
    right = rank_loss(torch.tensor([-5.0, 0.0, 5.0, 0.0, 9.0]), target, groups)
    wrong = rank_loss(torch.tensor([5.0, 0.0, -5.0, 0.0, 9.0]), target, groups)
    assert right < 0.01 < np.log(2) < wrong
    # across groups nothing is ordered: the second group alone decides when the first is all ties
    ties = rank_loss(torch.tensor([9.0, -9.0, 0.0, 0.0, 9.0]), torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0]), groups)
    assert ties < 0.01
    z = torch.zeros(3, requires_grad=True)
    alone = rank_loss(z, torch.zeros(3), torch.tensor([0, 1, 2]))
    alone.backward()
    assert float(alone) == 0.0 and z.grad is not None
    names = np.array(["a"] * 40 + ["b"] * 5 + ["c"] * 20)
    members = [np.flatnonzero(names == g) for g in "abc"]
    index = group_batch(members, 32, 16, np.random.default_rng(0))
    assert len(set(index.tolist())) == len(index) and len(set(names[index])) == 2
    assert all((names[index] == g).sum() <= 16 for g in "abc")
    assert len(group_batch(members[:1], 32, 16, np.random.default_rng(0))) == 32  # one group fills the batch
