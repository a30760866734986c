"""Datasets: collect, resume, remeasure on another device, the file format, splits and the yardstick."""

import json
import os
import shutil

import numpy as np
import pytest

from tunecore import experiments, hookimpl
from tunecore.builtin.random_search import RandomSearch
from tunecore.data import MeasureResult
from tunecore.dataset.evaluate import evaluate, ranking_metrics
from tunecore.dataset.protocol import is_usable
from tunecore.dataset.split import split, train_and_test, with_fine_tuning
from tunecore.dataset.table import Dataset, DatasetTask, Measurement
from tunecore.errors import UsageError
from tunecore.plugins import new_plugin_manager
from tunecore.registry import Registry
from tunecore.roles import CostModel, Measurer
from tunecore.testing.cli import assert_one_line_exit_2, cli_json, run_cli
from tunecore.testing.helpers import write_tiny_onnx

OTHER_DEVICE = '{"kind":"llvm","mcpu":"x86-64-v2","num-cores":1}'
BUILTIN = ["--search", "random", "--cost-model", "none"]  # the core's tests use built-in components only
METRICS = ("spearman", "pairwise_accuracy", "recall@1", "recall@5", "recall@32", "top1_score", "top5_score",
           "train_s", "predict_programs_per_s")


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """Two workloads, 8 programs per task on this machine, the same programs remeasured on another device."""
    path = tmp_path_factory.mktemp("dataset") / "d.parquet"
    first = run_cli("dataset", "collect", "--model", "op:matmul-64,op:matmul-96x64x80", "--per-task", "8",
                    "--out", str(path), *BUILTIN, "--json")
    first = cli_json(first)
    info = cli_json(run_cli("dataset", "info", str(path), "--json"))
    again = cli_json(run_cli("dataset", "collect", "--model", "op:matmul-64,op:matmul-96x64x80", "--per-task", "8",
                             "--out", str(path), *BUILTIN, "--json"))
    remeasured = cli_json(run_cli("dataset", "remeasure", str(path), "--target", OTHER_DEVICE, "--json"))
    return path, first, info, again, remeasured


def test_collect_measures_per_task_with_device_identity(collected):
    path, first, info, _, _ = collected
    dataset = Dataset.load(str(path))
    # every task gets 8 usable programs: a program whose timings stayed noisy is kept, flagged, and replaced
    assert first["devices"][0]["measured"] == info["rows"] >= 16 and info["tasks"] == 2  # before the remeasure
    assert {w: v["rows"] for w, v in info["workloads"].items()}.keys() == {"op:matmul-64", "op:matmul-96x64x80"}
    primary = first["devices"][0]["device_id"]  # not rows[0]: the file orders rows by task, then device id
    assert all(sum(map(is_usable, dataset.rows_of(key, primary))) == 8 for key in dataset.tasks)
    assert dataset.devices[primary]["cpu"] and dataset.devices[primary]["cores"] >= 1
    target_of = {r.device_id: r.target for r in dataset.rows}  # each device measured with one target
    assert info["devices"][primary]["targets"] == [target_of[primary]] and len(target_of) == 2
    with pytest.raises(UsageError, match="2 targets; expected a dataset measured with one"):  # remeasured: 2
        experiments.dataset_target(str(path))
    by = {r.collected_by for r in dataset.rows}
    assert by == {"random"} and all(r.trace and r.program_key for r in dataset.rows)


def test_collect_takes_labels_by_the_protocol_on_one_thread_by_default(collected):
    from tunecore.dataset import protocol

    path, first, info, _, _ = collected
    dataset = Dataset.load(str(path))
    primary = first["devices"][0]["device_id"]
    assert dataset.devices[primary]["cores"] == 1
    rows = [r for r in dataset.rows if r.device_id == primary and r.latency is not None]
    assert rows and all(len(r.run_secs) >= 5 for r in rows)  # no screening: every program timed 5 times
    assert all(r.profile[protocol.ATTEMPTS] in (1, 2) and r.profile[protocol.FOREIGN_LOAD] >= 0 for r in rows)
    assert all((r.spread > 0.02) == (r.profile[protocol.ATTEMPTS] == 2) for r in rows
               if protocol.NOISY not in r.profile and r.profile[protocol.ATTEMPTS] == 1)
    assert info["devices"][primary]["clean"] == sum(protocol.is_clean(r) for r in rows)
    assert len(dataset.collections) == 3 and {c["command"] for c in dataset.collections} == {"collect", "remeasure"}
    assert_one_line_exit_2(run_cli("dataset", "collect", "--model", "op:matmul-64", "--per-task", "1", "--out",
                                   str(path), "--max-spread", "-1"), "argument --max-spread: expected a number >= 0")


def test_second_labels_give_the_noise_ceiling(collected, tmp_path):
    from tunecore.dataset import protocol

    copy = str(tmp_path / "copy.parquet")
    shutil.copy(collected[0], copy)
    second = cli_json(run_cli("dataset", "remeasure", copy, "--target", OTHER_DEVICE, "--second-labels", "--json"))
    dataset = Dataset.load(copy)
    rows = [r for r in dataset.rows if r.device_id == second["device_id"] and r.latency is not None]
    assert second["measured"] == len(rows) and all(protocol.SECOND_LABEL in r.profile for r in rows)
    assert cli_json(run_cli("dataset", "remeasure", copy, "--target", OTHER_DEVICE, "--second-labels",
                            "--json"))["measured"] == 0
    result = cli_json(run_cli("costmodel", "eval", "--dataset", copy, "--cost-model", "none", "--split", "cdmpp:2",
                              "--devices", second["device_id"], "--json"))
    ceiling = result["references"]["second labels (ceiling)"]
    # the value, not a bound on it: how far two timings of one program differ is this machine's noise
    tested = [r for key in dataset.tasks
              for rank, r in enumerate(sorted((r for r in rows if r.task_key == key), key=lambda r: r.latency))
              if rank % 2 == 1]
    errors = [abs(r.profile[protocol.SECOND_LABEL] - r.latency) / r.latency for r in tested]
    assert ceiling["programs"] == result["test"]["measurements"] == len(tested)
    assert ceiling["mape"] == pytest.approx(sum(errors) / len(errors), abs=1e-4)
    assert_one_line_exit_2(run_cli("dataset", "remeasure", copy, "--second-labels", "--again-before", "0"),
                           "--second-labels")


def test_collect_again_measures_nothing(collected):
    _, _, info, again, _ = collected
    assert again["devices"][0]["measured"] == 0
    assert again["info"]["rows"] == info["rows"]


def test_remeasure_adds_the_same_programs_on_another_device(collected):
    path, _, info, _, remeasured = collected
    dataset = Dataset.load(str(path))
    assert len(dataset.devices) == 2 and remeasured["measured"] == info["measured"]
    other = remeasured["device_id"]
    assert dataset.devices[other]["mcpu"] == "x86-64-v2" and dataset.devices[other]["cores"] == 1
    programs = {}
    for row in dataset.rows:
        programs.setdefault(row.device_id, set()).add((row.task_key, row.program_key))
    primary = next(d for d in programs if d != other)
    assert programs[other] == {(r.task_key, r.program_key) for r in dataset.rows
                               if r.device_id == primary and r.latency is not None}
    again = cli_json(run_cli("dataset", "remeasure", str(path), "--target", OTHER_DEVICE, "--json"))
    assert again["measured"] == 0


def test_remeasure_again_before_a_time_replaces_a_devices_labels_and_resumes(collected, tmp_path):
    path, _, _, _, remeasured = collected
    copy = str(tmp_path / "copy.parquet")
    shutil.copy(path, copy)
    rows_before = len(Dataset.load(copy).rows)
    cutoff = str(max(r.measured_at for r in Dataset.load(copy).rows) + 0.001)
    renewed = cli_json(run_cli("dataset", "remeasure", copy, "--target", OTHER_DEVICE, "--again-before", cutoff,
                               "--json"))
    assert renewed["measured"] == remeasured["measured"] and renewed["device_id"] == remeasured["device_id"]
    dataset = Dataset.load(copy)
    assert len(dataset.rows) == rows_before
    assert all(r.measured_at > float(cutoff) for r in dataset.rows if r.device_id == renewed["device_id"])
    assert all(r.measured_at < float(cutoff) for r in dataset.rows if r.device_id != renewed["device_id"])
    resumed = cli_json(run_cli("dataset", "remeasure", copy, "--target", OTHER_DEVICE, "--again-before", cutoff,
                               "--json"))
    assert resumed["measured"] == 0
    result = run_cli("dataset", "remeasure", copy, "--target", OTHER_DEVICE, "--again-before", "yesterday")
    assert result.returncode == 2 and "not a time: 'yesterday'" in result.stderr


def test_file_round_trip_merge_and_store_round_trip(collected, tmp_path):
    path = collected[0]
    dataset = Dataset.load(str(path))
    copy = tmp_path / "copy.parquet"
    dataset.save(str(copy))
    again = Dataset.load(str(copy))
    assert [vars(r) for r in again.rows] == [vars(r) for r in sorted(dataset.rows, key=_order)]
    assert {k: vars(t) for k, t in again.tasks.items()} == {k: vars(t) for k, t in dataset.tasks.items()}
    merged = tmp_path / "merged.parquet"
    cli_json_text = run_cli("dataset", "merge", str(path), str(copy), "--out", str(merged))
    assert cli_json_text.returncode == 0, cli_json_text.stderr
    assert len(Dataset.load(str(merged)).rows) == len(dataset.rows)

    store = tmp_path / "s.db"
    imported = run_cli("dataset", "import", str(path), "--store", str(store))
    assert imported.returncode == 0 and f"{len(dataset.rows)} new records" in imported.stdout
    exported = tmp_path / "back.parquet"
    assert run_cli("dataset", "export", "--store", str(store), "--out", str(exported)).returncode == 0
    back = Dataset.load(str(exported))
    assert sorted((r.task_key, r.program_key, r.device_id, r.latency) for r in back.rows) == \
        sorted((r.task_key, r.program_key, r.device_id, r.latency) for r in dataset.rows)
    assert back.devices == dataset.devices


def _order(row):
    return row.task_key, row.device_id, row.measured_at


def test_costmodel_eval_prints_every_metric(collected):
    path = collected[0]
    result = cli_json(run_cli("costmodel", "eval", "--dataset", str(path), "--cost-model", "none",
                              "--split", "workload:op:matmul-64", "--json"))
    none = result["models"]["none"]
    for metric in METRICS:
        assert metric in none, metric
    assert "mape" not in none  # `none` ranks; it does not predict seconds
    assert result["test"]["groups"] == 2  # matmul-64 on two devices
    assert none["spearman"] == 0.0  # constant scores carry no order
    floor = result["references"]["per-task constant (floor)"]
    assert floor["spearman"] == 0.0 and 0 <= floor["mape"] < 1
    table = run_cli("costmodel", "eval", "--dataset", str(path), "--cost-model", "none", "--split", "cdmpp:4",
                    env={"COLUMNS": ""})  # piped: the table keeps its natural width, nothing is cut
    assert table.returncode == 0 and "per-task constant (floor)" in table.stdout, table.stderr
    assert all(metric.replace("_", " ") in table.stdout for metric in METRICS) and "…" not in table.stdout
    assert "groups ranked: those with >= 2 programs" in table.stdout
    filtered = cli_json(run_cli("costmodel", "eval", "--dataset", str(path), "--cost-model", "none", "--split",
                                "cdmpp:2", "--max-spread", "1", "--min-programs", "2", "--json"))
    assert filtered["split"] == "cdmpp:2+max-spread:1+min-programs:2"
    assert_one_line_exit_2(run_cli("costmodel", "eval", "--dataset", str(path), "--cost-model", "none", "--split",
                                   "cdmpp:2", "--min-programs", "0"), "argument --min-programs: expected an integer")
    assert_one_line_exit_2(run_cli("costmodel", "eval", "--dataset", str(path), "--cost-model", "none", "--split",
                                   "cdmpp:2", "--group-size", "100"), "group size 100 (--group-size)")
    grouped = cli_json(run_cli("costmodel", "eval", "--dataset", str(path), "--cost-model", "none", "--split",
                               "workload:op:matmul-64", "--group-size", "4", "--json"))
    assert grouped["test"]["group_size"] == 4 and grouped["test"]["measurements"] == 4 * grouped["test"]["groups"]


def test_the_floor_is_the_per_task_constant_with_the_lowest_mape():
    from tunecore.dataset.evaluate import best_constant

    latencies = np.random.default_rng(0).lognormal(0, 1, 41)
    mape = lambda c: np.mean(np.abs(c - latencies) / latencies)  # noqa: E731
    best = best_constant(latencies)
    assert best in latencies and all(mape(best) <= mape(c) + 1e-12 for c in np.linspace(0.01, 20, 4001))
    assert best_constant(np.array([2.0])) == 2.0


def test_seconds_per_flop_is_the_devices_median_over_the_rows_given():
    from tunecore.dataset.evaluate import seconds_per_flop

    dataset = _synthetic()  # every task 1 FLOP, programs of 1-4 ms on each device
    dataset.add(Measurement("A", "failed", "[]", "d1", '{"kind": "llvm"}', None, error="build"))
    assert seconds_per_flop(dataset, dataset.rows, "d1") == 2.5e-3
    assert seconds_per_flop(dataset, [r for r in dataset.rows if r.program_key == "p0"], "d2") == 1e-3
    assert seconds_per_flop(dataset, dataset.rows, "unmeasured") is None


class _ConstantLatency(CostModel):
    """Predicts 1 ms for everything: its error in seconds is known exactly."""

    name = "constant-ms"
    learns = False
    predicts_latency = True

    events: list = []  # what the last instance was told, in order

    def reset(self):
        _ConstantLatency.events = ["reset"]

    def update(self, task, candidates, results):
        self.events.append({r.device["mcpu"] for r in results})

    def predict(self, task, candidates):
        return np.zeros(len(candidates))

    def predict_latency(self, task, candidates):
        return np.full(len(candidates), 1e-3)


class _Plugin:
    @hookimpl
    def tunecore_register_cost_models(self, register):
        register(_ConstantLatency)


def test_latency_metrics_for_a_model_that_predicts_seconds(collected):
    dataset = Dataset.load(str(collected[0]))
    pm = new_plugin_manager(autoload=False)
    pm.register(_Plugin())
    the_split = split(dataset, "workload:op:matmul-64")
    result = evaluate(dataset, the_split, ["constant-ms", "none"], registry=Registry(pm))
    true = np.array([r.latency for r in the_split.test if r.latency is not None])
    assert result["models"]["constant-ms"]["mape"] == pytest.approx(np.mean(np.abs(1e-3 - true) / true), abs=1e-4)
    assert result["models"]["constant-ms"]["rmse_ms"] == pytest.approx(np.sqrt(np.mean((1e-3 - true) ** 2)) * 1e3,
                                                                       abs=1e-4)


def test_ranking_metrics_of_perfect_reversed_and_known_orders():
    rng = np.random.default_rng(0)
    latency = [np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])]
    perfect = ranking_metrics(latency, [-latency[0]], [1], rng)
    assert perfect["spearman"] == 1.0 and perfect["pairwise_accuracy"] == 1.0
    assert perfect["recall@1"] == 1.0 and perfect["top1_score"] == 1.0 and perfect["top5_score"] == 1.0
    reversed_ = ranking_metrics(latency, [latency[0]], [1], rng)
    assert reversed_["spearman"] == -1.0 and reversed_["pairwise_accuracy"] == 0.0
    assert reversed_["top1_score"] == pytest.approx(1 / 6, abs=1e-4) and reversed_["top5_score"] == pytest.approx(1 / 2)
    # two tasks, weights 1 and 3: the score is sum(w * best) / sum(w * chosen)
    two = ranking_metrics([np.array([1.0, 2.0]), np.array([1.0, 4.0])], [np.array([0.0, 1.0]), np.array([1.0, 0.0])],
                          [1, 3], rng)
    assert two["top1_score"] == pytest.approx((1 + 3) / (2 + 3), abs=1e-4)
    assert two["recall@1"] == 0.5


def _synthetic():
    """Tasks A (in w1 and w2), B (w1), C (w2) with 4 programs each on devices d1 and d2; no TVM involved."""
    dataset = Dataset()
    for key, workloads in (("A", {"w1": 1, "w2": 2}), ("B", {"w1": 1}), ("C", {"w2": 3})):
        dataset.add_task(DatasetTask(key, f"task{key}", "k", 1.0, "{}", [], workloads))
    for device in ("d1", "d2"):
        dataset.devices[device] = {"cpu": device}
        for key in "ABC":
            for i in range(4):
                dataset.add(Measurement(key, f"p{i}", "[]", device, '{"kind": "llvm"}', [1e-3 * (i + 1)]))
    return dataset


def test_eval_resets_models_and_fine_tunes_on_the_tested_device_last(collected):
    """A cross-device split with fine-tuning data: the model is reset, taught the other device's programs,
    then the tested device's fine-tuning tasks; those tasks are not tested."""

    dataset = Dataset.load(str(collected[0]))
    pm = new_plugin_manager(autoload=False)
    pm.register(_Plugin())
    second = next(d for d, desc in dataset.devices.items() if desc["mcpu"] == "x86-64-v2")  # OTHER_DEVICE
    primary = next(d for d in dataset.devices if d != second)
    tune_on = sorted(dataset.tasks)[:1]
    the_split = with_fine_tuning(split(dataset, f"device:{second}"), tune_on, per_task=3)
    assert the_split.spec.endswith("+finetune:1x3") and not {r.task_key for r in the_split.test} & set(tune_on)
    assert sum(r.device_id == second for r in the_split.train) == 3
    evaluate(dataset, the_split, ["constant-ms"], registry=Registry(pm))
    events = _ConstantLatency.events
    assert events[0] == "reset" and events[-1] == {"x86-64-v2"}
    assert all(e == {dataset.devices[primary]["mcpu"]} for e in events[1:-1]) and len(events) > 2


def test_cross_model_split_keeps_a_shared_kernel_on_the_test_side():
    dataset = _synthetic()
    result = split(dataset, "workload:w2")
    assert {r.task_key for r in result.test} == {"A", "C"}
    assert {r.task_key for r in result.train} == {"B"}
    assert result.weights["A"] == 2 and result.weights["C"] == 3 and result.weights["B"] == 0


def test_device_task_and_random_splits_are_reproducible():
    dataset = _synthetic()
    by_device = split(dataset, "device:d2")
    assert {r.device_id for r in by_device.test} == {"d2"} and {r.device_id for r in by_device.train} == {"d1"}
    tasks = split(dataset, "task:0.34", seed=3)
    assert len({r.task_key for r in tasks.test}) == 1
    assert not {r.task_key for r in tasks.test} & {r.task_key for r in tasks.train}
    assert [vars(r) for r in split(dataset, "random:0.5", seed=1).test] == \
        [vars(r) for r in split(dataset, "random:0.5", seed=1).test]
    only_d1 = split(dataset, "task:0.34", devices=["d1"])
    assert {r.device_id for r in only_d1.train + only_d1.test} == {"d1"}
    named = split(dataset, "task:taskB,taskC")
    assert {r.task_key for r in named.test} == {"B", "C"} and {r.task_key for r in named.train} == {"A"}


def test_without_a_split_every_selected_measurement_is_trained_on():
    dataset = _synthetic()
    by_device = train_and_test(dataset, "device:d2")
    assert [vars(r) for r in by_device.test] == [vars(r) for r in split(dataset, "device:d2").test]
    every = train_and_test(dataset, None, devices=["d1"])
    assert every.test == [] and every.train and {r.device_id for r in every.train} == {"d1"}
    assert len(every.train) == sum(r.device_id == "d1" for r in dataset.rows)


def test_cdmpp_split_tests_every_nth_program_of_each_task_and_device_by_latency():
    dataset = _synthetic()
    dataset.add(Measurement("A", "failed", "[]", "d1", '{"kind": "llvm"}', [], "build error"))
    result = split(dataset, "cdmpp:2")
    # per (task, device) the programs are 1, 2, 3, 4 ms: the 2nd and 4th fastest are tested
    assert sorted((r.task_key, r.device_id, r.program_key) for r in result.test) == \
        [(k, d, p) for k in "ABC" for d in ("d1", "d2") for p in ("p1", "p3")]
    assert len(result.train) == 13 and any(r.program_key == "failed" for r in result.train)


def test_filters_keep_programs_with_steady_timings_and_tasks_with_enough_of_them():
    dataset = _synthetic()
    with pytest.raises(UsageError, match="no program of this dataset has repeated timings"):
        split(dataset, "workload:w2", max_spread=0.02)
    for row in dataset.rows:  # steady timings but for B's p0 and C's p0, p1 on d1
        base = row.run_secs[0]
        noisy = (row.task_key, row.program_key) == ("B", "p0") or \
            (row.task_key == "C" and row.device_id == "d1" and row.program_key in ("p0", "p1"))
        row.run_secs = [base, base * (1.1 if noisy else 1.01), base]
    dataset.add(Measurement("A", "failed", "[]", "d1", '{"kind": "llvm"}', [], "build error"))
    result = split(dataset, "workload:w2", max_spread=0.02, min_programs=3)
    assert result.spec == "workload:w2+max-spread:0.02+min-programs:3"
    # C on d1 keeps 2 steady programs, fewer than 3: the group goes
    assert {(r.task_key, r.device_id) for r in result.test} == {("A", "d1"), ("A", "d2"), ("C", "d2")}
    assert sorted((r.device_id, r.program_key) for r in result.train) == \
        [(d, p) for d in ("d1", "d2") for p in ("p1", "p2", "p3")]  # B without its noisy p0
    assert any(r.program_key == "failed" for r in result.test)  # failures stay (training data when trained on)
    assert len(split(dataset, "workload:w2", max_spread=0.02).test) == 4 + 4 + 1 + 2 + 4


@pytest.mark.parametrize("spec, fragment", [
    ("bogus:1", "expected KIND:VALUES"),
    ("cdmpp:1", "N an integer >= 2"),
    ("cdmpp:five", "N an integer >= 2"),
    ("workload:zoo:nosuch", "workload zoo:nosuch is not in the dataset"),
    ("device:zz", "device zz: not one of"),
    ("task:2", "between 0 and 1"),
    ("task:taskA,nosuch", "task nosuch is not in the dataset"),
    ("workload:w1,w2", "the train side is empty"),
])
def test_bad_splits_are_one_line_errors(spec, fragment):
    with pytest.raises(UsageError, match=fragment.replace("(", r"\(")):
        split(_synthetic(), spec)


def test_bad_dataset_files_are_one_line_errors(collected, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    assert_one_line_exit_2(run_cli("dataset", "info", str(tmp_path / "missing.parquet")), "no such dataset file")
    text = tmp_path / "text.parquet"
    text.write_text("hello")
    assert_one_line_exit_2(run_cli("dataset", "info", str(text)), "not a Parquet file")
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": [1]}), other)
    assert_one_line_exit_2(run_cli("dataset", "info", str(other)), "not a tunecore-dataset file")
    future = tmp_path / "future.parquet"
    table = pq.read_table(collected[0])
    pq.write_table(table.replace_schema_metadata({**{k.decode(): v.decode() for k, v in table.schema.metadata.items()},
                                                  "format_version": "99"}), future)
    assert_one_line_exit_2(run_cli("dataset", "info", str(future)), "version 99")
    no_traces = tmp_path / "no-traces.parquet"
    pq.write_table(table.drop_columns(["trace"]), no_traces)
    assert_one_line_exit_2(run_cli("dataset", "info", str(no_traces)), "without its columns trace")
    assert_one_line_exit_2(run_cli("costmodel", "eval", "--dataset", str(collected[0]), "--cost-model", "none",
                                   "--split", "nokind:x"), "expected KIND:VALUES")
    assert_one_line_exit_2(run_cli("costmodel", "eval", "--dataset", str(collected[0]), "--cost-model", "nosuch",
                                   "--split", "random:0.5"), "unknown cost model 'nosuch'")
    for bad in ("long", "long=rounds=2", "two=xgb.rounds=2,none.x=1"):
        assert_one_line_exit_2(run_cli("costmodel", "eval", "--dataset", str(collected[0]), "--variant", bad,
                                       "--split", "random:0.5"), "LABEL=NAME.KEY=VALUE")
    assert_one_line_exit_2(run_cli("costmodel", "eval", "--dataset", str(collected[0]), "--cost-model", "none",
                                   "--variant", "none=none.x=1", "--split", "random:0.5"), "names another row")
    assert_one_line_exit_2(run_cli("costmodel", "eval", "--dataset", str(collected[0]), "--split", "random:0.5"),
                           "name the cost models")
    assert_one_line_exit_2(run_cli("dataset", "collect", "--model", "op:matmul-64", "--per-task", "4",
                                   "--out", str(tmp_path / "d.csv")), "ends in .parquet")
    assert_one_line_exit_2(run_cli("dataset", "collect", "--model", "op:matmul-64", "--per-task", "4",
                                   "--out", str(tmp_path / "d.parquet"), "--search", "nosuch"),
                           "--search nosuch: not installed")
    assert_one_line_exit_2(run_cli("dataset", "remeasure", str(collected[0]), "--target", OTHER_DEVICE,
                                   "--from-device", "nosuch"), "not one of the dataset's devices")


def test_info_json_counts_by_device_workload_and_task(collected):
    info = cli_json(run_cli("dataset", "info", str(collected[0]), "--json"))
    assert info["format_version"] == 1 and len(info["devices"]) == 2
    assert sum(d["rows"] for d in info["devices"].values()) == info["rows"]
    assert sum(sum(t["rows_by_device"].values()) for t in info["by_task"].values()) == info["rows"]
    json.dumps(info)


def test_a_stopped_collection_resumes_where_it_stopped(tmp_path):
    model = tmp_path / "tiny.onnx"
    write_tiny_onnx(str(model))
    path = tmp_path / "d.parquet"
    args = ["dataset", "collect", "--model", str(model), "--per-task", "3", "--out", str(path),
            "--random-fraction", "1", "--json"]
    stopped = cli_json(run_cli(*args, "--max-programs", "4"))
    assert stopped["devices"][0]["measured"] == 4 and stopped["devices"][0]["stopped"] == "max programs 4"
    rest = cli_json(run_cli(*args))
    info = Dataset.load(str(path)).info()
    assert rest["devices"][0]["stopped"] is None
    assert info["tasks"] == 3 and rest["devices"][0]["measured"] + 4 == info["rows"] >= 7  # a reshape has few
    dataset = Dataset.load(str(path))
    device = rest["devices"][0]["device_id"]
    exhausted = dataset.exhausted[device]  # the tasks whose design space holds fewer programs than asked
    assert exhausted and all(len(dataset.rows_of(key, device)) < 3 for key in exhausted)
    assert all(sum(map(is_usable, dataset.rows_of(key, device))) == 3 for key in dataset.tasks if key not in exhausted)
    assert cli_json(run_cli(*args))["devices"][0]["measured"] == 0


def test_collect_kernels_takes_only_the_tasks_of_those_operators(tmp_path):
    model = tmp_path / "tiny.onnx"
    write_tiny_onnx(str(model))  # tasks: matmul, reshape, conv2d_add_relu
    path = tmp_path / "d.parquet"
    args = ["dataset", "collect", "--model", str(model), "--per-task", "2", "--out", str(path),
            "--random-fraction", "1", "--anchors", "0", "--json"]
    assert_one_line_exit_2(run_cli(*args, "--kernels", "conv,"), "argument --kernels: expected a comma-separated")
    report = cli_json(run_cli(*args, "--kernels", "conv,matmul"))
    dataset = Dataset.load(str(path))
    assert sorted(task.kernel_class for task in dataset.tasks.values()) == ["conv2d_add_relu@4d", "matmul@2d"]
    assert report["devices"][0]["measured"] == len(dataset.rows) and sum(map(is_usable, dataset.rows)) == 4


class _HalfNoisy(Measurer):
    """Every other program (in the order first measured) times noisily, every time: the protocol flags it after
    measuring it twice. (By the parity of its key, a machine whose first samples all had even keys saw none.)"""

    name = "half-noisy"

    def __init__(self, target, **options):
        super().__init__(target)
        self.order: dict[str, int] = {}

    def measure(self, task, candidates):
        return [MeasureResult(run_secs=[1e-3, 1.5e-3, 0.7e-3, 1e-3, 1.2e-3]
                              if self.order.setdefault(c.key, len(self.order)) % 2 else [1e-3] * 5)
                for c in candidates]


class _GuidedStandIn(RandomSearch):
    """Uniform samples under another name: a guided search's share of a collection, told apart by ``collected_by``."""

    name = "guided-stand-in"


class _HalfNoisyPlugin:
    @hookimpl
    def tunecore_register_measurers(self, register):
        register(_HalfNoisy)

    @hookimpl
    def tunecore_register_search_policies(self, register):
        register(_GuidedStandIn)


def _half_noisy_registry() -> Registry:
    pm = new_plugin_manager(autoload=False)
    pm.register(_HalfNoisyPlugin())
    return Registry(pm)


def test_collect_replaces_programs_whose_timings_stay_noisy(tmp_path):
    from tunecore.dataset.collect import CollectPlan, collect
    from tunecore.dataset.protocol import NOISY

    path = str(tmp_path / "d.parquet")
    plan = CollectPlan(["op:matmul-64"], per_task=6, random_fraction=1, measurer="half-noisy", anchors=0)
    collect(path, plan, registry=_half_noisy_registry())
    rows = Dataset.load(path).rows
    noisy = [r for r in rows if NOISY in r.profile]
    assert sum(map(is_usable, rows)) == 6 and noisy and len(rows) == 6 + len(noisy)


def test_noisy_programs_are_replaced_by_their_own_kind_so_the_random_guided_mix_holds(tmp_path, monkeypatch):
    """Only random programs are noisy here: the guided search must not fill the places they leave."""
    from tunecore.dataset.collect import CollectPlan, collect

    measure = _HalfNoisy.measure

    def noisy_if_random(self, task, candidates):
        results = measure(self, task, candidates)
        return [r if c.origin == "random" else MeasureResult(run_secs=[1e-3] * 5) for c, r in zip(candidates, results)]

    monkeypatch.setattr(_HalfNoisy, "measure", noisy_if_random)
    path = str(tmp_path / "d.parquet")
    plan = CollectPlan(["op:matmul-64"], per_task=8, search="guided-stand-in", cost_model="none",
                       measurer="half-noisy", anchors=0)
    collect(path, plan, registry=_half_noisy_registry())
    rows = Dataset.load(path).rows
    usable = [r for r in rows if is_usable(r)]
    assert len(rows) > len(usable)  # some of either kind were noisy, and replaced
    assert sorted(r.collected_by for r in usable) == ["guided-stand-in"] * 4 + ["random"] * 4


def test_collect_with_search_random_takes_every_program_at_random(tmp_path):
    from tunecore.dataset.collect import CollectPlan, collect

    path = str(tmp_path / "d.parquet")
    collect(path, CollectPlan(["op:matmul-64"], per_task=6, search="random", cost_model="none", measurer="half-noisy",
                              anchors=0),
            registry=_half_noisy_registry())
    usable = [r for r in Dataset.load(path).rows if is_usable(r)]
    assert [r.collected_by for r in usable] == ["random"] * 6


def test_a_dataset_being_changed_is_not_changed_by_a_second_command(tmp_path):
    """Each writer saves the whole file: a second collect (or profile, import, export) would drop the first's rows."""
    from tunecore.dataset.table import changing

    path = str(tmp_path / "d.parquet")
    args = ("dataset", "collect", "--model", "op:matmul-64", "--per-task", "2", "--random-fraction", "1",
            "--anchors", "0", "--out", path, "--json")
    with changing(path):
        assert_one_line_exit_2(run_cli(*args), "is being changed by another command", f"pid {os.getpid()}")
        assert not os.path.exists(path)
    assert cli_json(run_cli(*args))["devices"][0]["measured"] >= 2  # free again once the holder ends
    assert sorted(os.listdir(tmp_path)) == ["d.parquet", "d.parquet.lock"]


def test_a_stop_file_ends_a_collection_as_its_time_limit_would(tmp_path, monkeypatch):
    """`touch DATASET.stop`: the run stops after its batch, measures its end anchors and keeps its drift."""
    from tunecore.dataset.collect import STOP, CollectPlan, collect

    path = str(tmp_path / "d.parquet")
    open(path + STOP, "w").close()
    os.utime(path + STOP, (0, 0))  # left from an earlier run: it does not stop this one
    first = collect(path, CollectPlan(["op:matmul-64"], per_task=8, random_fraction=1, measurer="half-noisy",
                                      anchors=0), registry=_half_noisy_registry())  # a dataset to take anchors from
    assert first["devices"][0]["stopped"] is None and not os.path.exists(path + STOP)
    measure = _HalfNoisy.measure

    def measure_then_stop(self, task, candidates, calls=[]):  # noqa: B006 (the calls of this test)
        calls.append(1)
        if len(calls) == 2:  # the first batch after the start anchors
            open(path + STOP, "w").close()
        return measure(self, task, candidates)

    monkeypatch.setattr(_HalfNoisy, "measure", measure_then_stop)
    report = collect(path, CollectPlan(["op:matmul-64", "op:matmul-128"], per_task=8, random_fraction=1,
                                       measurer="half-noisy", anchors=4), registry=_half_noisy_registry())
    assert report["devices"][0]["stopped"] == f"{path + STOP} found" and not os.path.exists(path + STOP)
    run = Dataset.load(path).collections[-1]
    assert not run.get("interrupted") and run["drift"]["programs"] == 4


def test_a_stop_file_ends_a_remeasure_after_its_batch_not_its_task(tmp_path, monkeypatch):
    import time

    from tunecore.dataset.collect import STOP, CollectPlan, collect, remeasure

    path = str(tmp_path / "d.parquet")
    collect(path, CollectPlan(["op:matmul-64"], per_task=80, random_fraction=1, measurer="half-noisy", anchors=0),
            registry=_half_noisy_registry())
    programs = len(Dataset.load(path).rows)
    measure = _HalfNoisy.measure

    def measure_then_stop(self, task, candidates):
        open(path + STOP, "w").close()
        return measure(self, task, candidates)

    monkeypatch.setattr(_HalfNoisy, "measure", measure_then_stop)
    report = remeasure(path, again_before=time.time(), measurer_name="half-noisy", anchors=0,
                       registry=_half_noisy_registry())
    assert report["stopped"] == f"{path + STOP} found"
    assert 0 < report["measured"] < programs and report["left"] == programs - report["measured"]


def test_kill_stops_a_collection_cleanly_with_what_it_measured_saved(tmp_path):
    """A background collection (`nohup ... &` ignores SIGINT) is stopped with `kill`: SIGTERM saves and exits 130."""
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "d.parquet"
    process = subprocess.Popen([sys.executable, "-m", "tunecore.cli", "dataset", "collect", "--model", "op:matmul-64",
                                "--per-task", "400", "--random-fraction", "1", "--anchors", "0", "--out", str(path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    for line in process.stderr:  # its first progress line: a round was measured
        if "measuring on" in line:
            break
    time.sleep(2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130 and "interrupted" in stderr, stderr
    dataset = Dataset.load(str(path))
    assert 0 < len(dataset.rows) < 400
    # the run is on record (its start anchors date the rows), without the drift it never measured
    (run,) = dataset.collections
    assert run["command"] == "collect" and run["interrupted"] and run["drift"] is None
    assert run["report"]["stopped"] == "interrupted" and 0 < run["report"]["measured"] <= len(dataset.rows)
