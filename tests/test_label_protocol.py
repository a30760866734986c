"""The label protocol of dataset collection (tunecore.dataset.protocol) and the yardstick's reference rows."""

import types

import numpy as np
import pytest

from tunecore.data import MeasureResult
from tunecore.dataset import protocol
from tunecore.dataset.evaluate import best_scale, fixed_size_groups, latency_metrics, noise_ceiling, table_rows
from tunecore.dataset.split import Split
from tunecore.dataset.table import Dataset, DatasetTask, Measurement
from tunecore.errors import UsageError

STEADY = [1.0, 1.01, 0.99, 1.0, 1.0]
NOISY = [1.0, 1.5, 0.7, 1.0, 1.2]
LLVM = '{"kind": "llvm"}'
D1 = "9115152fa6fa8350"  # device_id of _dataset's device


class _Scripted:
    """A measurer answering each program (a candidate's key, or the candidate itself) with its next scripted
    timings (None: a failure); records the batches it was asked."""

    capacity = 2

    def __init__(self, script):
        self.script = {key: list(answers) for key, answers in script.items()}
        self.calls = []

    def device(self):
        return {"cpu": "scripted"}

    def measure(self, task, candidates):
        keys = [getattr(c, "key", c) for c in candidates]
        self.calls.append(keys)
        answers = [self.script[k].pop(0) for k in keys]
        return [MeasureResult(error="run: failed") if a is None else MeasureResult(run_secs=list(a)) for a in answers]

    def close(self):
        pass


def test_a_noisy_program_is_measured_once_more_and_flagged_if_it_stays_noisy():
    inner = _Scripted({"steady": [STEADY], "settles": [NOISY, STEADY], "stays": [NOISY, NOISY], "fails": [None],
                       "fails later": [NOISY, None]})
    results = protocol.LabelMeasurer(inner, max_spread=0.02).measure(
        None, ["steady", "settles", "stays", "fails", "fails later"])
    assert inner.calls == [["steady", "settles", "stays", "fails", "fails later"], ["settles", "stays", "fails later"]]
    assert [r.profile[protocol.ATTEMPTS] for r in results] == [1, 2, 2, 1, 2]
    assert [protocol.NOISY in r.profile for r in results] == [False, False, True, False, True]
    assert results[1].run_secs == STEADY and results[3].error and results[4].run_secs == NOISY
    assert all(r.profile[protocol.FOREIGN_LOAD] >= 0 for r in results)
    never_again = _Scripted({"stays": [NOISY]})
    assert protocol.LabelMeasurer(never_again, max_spread=0).measure(None, ["stays"])[0].profile[protocol.ATTEMPTS] == 1


def test_no_batch_starts_while_the_pause_file_exists(tmp_path, monkeypatch):
    pause = tmp_path / "d.parquet.pause"
    pause.touch()
    inner = _Scripted({"a": [STEADY]})
    slept = []

    def sleep(seconds):
        assert inner.calls == []  # nothing measured while paused
        slept.append(seconds)
        pause.unlink()

    monkeypatch.setattr(protocol.time, "sleep", sleep)
    protocol.LabelMeasurer(inner, pause_file=str(pause)).measure(None, ["a"])
    assert len(slept) == 1 and inner.calls == [["a"]]


def test_the_protocol_settings_are_defaults_the_user_can_override():
    assert protocol.label_options({}, "local")["measurer"] == {"screen": 0, "repeat": 5, "min_repeat_ms": 20}
    given = protocol.label_options({"measurer": {"repeat": 9}, "local": {"screen": 2}}, "local")
    assert given["measurer"] == {"repeat": 9, "min_repeat_ms": 20} and given["local"] == {"screen": 2}


def test_a_clean_row_ran_five_times_within_the_spread():
    def row(secs, error=None):
        return Measurement("T", "p", "[]", "d", LLVM, secs, error)

    assert protocol.is_clean(row(STEADY))
    assert not protocol.is_clean(row(NOISY))
    assert not protocol.is_clean(row(STEADY[:3]))  # too few timings
    assert not protocol.is_clean(row(STEADY, "run: failed"))
    assert protocol.is_clean(row(NOISY), max_spread=0.5)


def _dataset(tasks=4, programs=5):
    """Tasks T0.. with programs p0.. of 1, 2, ... ms on device D1, plus one too slow and one failed per task."""
    dataset = Dataset()
    assert dataset.add_device({"cpu": "test", "mcpu": "x", "cores": 1}) == D1
    for t in range(tasks):
        dataset.add_task(DatasetTask(f"T{t}", f"task{t}", "k", 1.0, "{}", [], {"w": 1}))
        for i in range(programs):
            dataset.add(Measurement(f"T{t}", f"p{i}", "[]", D1, LLVM, [1e-3 * (i + 1)] * 5))
        dataset.add(Measurement(f"T{t}", "slow", "[]", D1, LLVM, [1.0] * 5))
        dataset.add(Measurement(f"T{t}", "failed", "[]", D1, LLVM, None, "build: error"))
    return dataset


def test_anchors_are_fixed_programs_taken_in_turn_from_every_task():
    dataset = _dataset()
    anchors = protocol.choose_anchors(dataset, "llvm", count=6, seed=0)
    assert len(anchors) == 6 and {task for task, _ in anchors} == {"T0", "T1", "T2", "T3"}
    assert not {program for _, program in anchors} & {"slow", "failed"}  # outside the latency window, or failed
    assert anchors == protocol.choose_anchors(dataset, "llvm", count=6, seed=0)
    assert protocol.choose_anchors(dataset, "cuda", count=6) == []
    assert len(protocol.choose_anchors(dataset, "llvm", count=100)) == 20  # all there are


def test_drift_compares_the_anchors_that_ran_both_times():
    assert protocol.drift([1.0, 2.0, None, 4.0], [1.1, 2.2, 3.0, None]) == {"ratio": 1.1, "mape": 0.1, "programs": 2}
    assert protocol.drift([], [1.0]) is None


def _latencies_times(factor):
    return {f"p{i}": [[1e-3 * (i + 1) * factor] * 5] for i in range(5)}


def test_a_collection_run_measures_its_anchors_at_start_and_end_and_keeps_the_drift(tmp_path):
    dataset = _dataset(tasks=1)
    script = {k: v + _latencies_times(1.1)[k] for k, v in _latencies_times(1.0).items()}
    run = protocol.CollectionRun(dataset, D1, protocol.LabelMeasurer(_Scripted(script)), LLVM, anchors=4, seed=0,
                                 command="collect")
    assert dataset.anchors and len(run.entry["anchors_start"]) == 4
    assert run.finish({"measured": 0}) == {"anchors": 4, "drift": {"ratio": 1.1, "mape": 0.1, "programs": 4}}
    path = str(tmp_path / "d.parquet")
    dataset.save(path)
    again = Dataset.load(path)
    assert again.anchors == dataset.anchors and again.collections == dataset.collections
    summary = again.info()["devices"][D1]["anchor_drift"]
    assert summary["runs"] == 1 and summary["worst_within_run"]["ratio"] == 1.1
    assert summary["latest_vs_first"]["ratio"] == 1.1
    merged = Dataset()
    merged.merge(again)
    merged.merge(again)
    assert merged.anchors == dataset.anchors and len(merged.collections) == 1


def test_anchors_that_fail_at_a_runs_end_keep_their_error():
    dataset = _dataset(tasks=1)
    script = {k: v + [None] for k, v in _latencies_times(1.0).items()}
    run = protocol.CollectionRun(dataset, D1, protocol.LabelMeasurer(_Scripted(script)), LLVM, anchors=4, seed=0,
                                 command="collect")
    assert run.finish({"measured": 0}) == {"anchors": 0, "drift": None}
    assert dataset.collections[-1]["anchor_errors"] == {"end": {"failed": 4, "first": "run: failed"}}


def test_a_run_on_a_dataset_too_small_for_its_anchors_measures_none():
    dataset = _dataset(tasks=1)
    inner = _Scripted({})
    run = protocol.CollectionRun(dataset, D1, protocol.LabelMeasurer(inner), LLVM, anchors=50, seed=0,
                                 command="collect")
    assert run.finish({}) == {"anchors": 0, "drift": None}
    assert inner.calls == [] and dataset.anchors == [] and dataset.info()["devices"][D1]["anchor_drift"] is None


def test_the_normalised_mape_forgives_each_tasks_level_but_not_the_order_within_it():
    latencies = [np.array([1.0, 2.0, 4.0]), np.array([10.0, 30.0])]
    off_by_a_factor = [2 * latencies[0], latencies[1] / 3]
    metrics = latency_metrics(latencies, off_by_a_factor)
    assert metrics["mape"] == pytest.approx((3 * 1.0 + 2 * 2 / 3) / 5, abs=1e-4)
    assert metrics["mape_task_normalised"] == 0.0
    swapped = latency_metrics([latencies[0]], [np.array([4.0, 2.0, 1.0])])
    assert swapped["mape_task_normalised"] > 0.3
    y, p = np.random.default_rng(0).lognormal(0, 1, (2, 31))
    mape = lambda c: np.mean(np.abs(c * p - y) / y)  # noqa: E731
    assert all(mape(best_scale(y, p)) <= mape(c) + 1e-12 for c in np.linspace(0.01, 20, 2001))


def _groups(*sizes, second=None):
    """Measured groups as evaluate's ``measured_groups`` gives them: sizes programs of 1, 2, ... ms each."""
    out = []
    for g, size in enumerate(sizes):
        task = types.SimpleNamespace(workload_hash=f"T{g}")
        results = [MeasureResult(run_secs=[1e-3 * (i + 1)]) for i in range(size)]
        for i, result in enumerate(results):
            if second is not None and i < second:
                result.profile[protocol.SECOND_LABEL] = 1e-3 * (i + 1) * 1.02
        out.append((task, [f"c{g}-{i}" for i in range(size)], results, {"cpu": "x"}))
    return out


def test_the_ceiling_scores_second_labels_as_a_prediction_of_the_first():
    no_split = Split("s", [], [], {})
    ceiling = noise_ceiling(_groups(4, 3, second=2), no_split, seed=0)
    assert ceiling["programs"] == 4 and ceiling["mape"] == pytest.approx(0.02 / 1.0, abs=1e-4)
    assert ceiling["spearman"] == 1.0 and ceiling["mape_task_normalised"] == 0.0
    assert noise_ceiling(_groups(4), no_split, seed=0) == {"programs": 0}
    result = {"test": {"measurements": 12}, "models": {"m": {"spearman": 0.5}},
              "references": {"floor": {"spearman": 0.0}, "ceiling": ceiling}}  # the ceiling on 4 of the 12
    assert list(table_rows(result)) == ["m", "floor", "ceiling, 4 of 12 programs"]


def test_fixed_size_groups_are_disjoint_and_leave_out_smaller_groups():
    groups = fixed_size_groups(_groups(10, 3), 4, seed=0)
    assert [len(candidates) for _, candidates, _, _ in groups] == [4, 4]
    members = [c for _, candidates, _, _ in groups for c in candidates]
    assert len(set(members)) == 8 and all(c.startswith("c0-") for c in members)
    with pytest.raises(UsageError, match="no tested task x device group has 11"):
        fixed_size_groups(_groups(10, 3), 11, seed=0)
    with pytest.raises(UsageError, match="expected an integer >= 2"):
        fixed_size_groups(_groups(10), 1, seed=0)


def test_a_collection_takes_first_the_tasks_no_other_device_holds():
    """A run that stops at its time limit on a new device has covered new kernels before it repeats known ones."""
    from tunecore.dataset.collect import _first_what_no_device_has

    dataset = _dataset(tasks=3, programs=5)  # each task: 7 usable programs on D1 (a failure is a label too)
    new = dataset.add_device({"cpu": "test", "mcpu": "y", "cores": 1})
    dataset.add_task(DatasetTask("T9", "task9", "k", 1.0, "{}", [], {"w": 1}))
    tasks = {key: dataset.tasks[key] for key in ("T0", "T9", "T1", "T2")}
    assert _first_what_no_device_has(dataset, tasks, new, per_task=7) == ["T9", "T0", "T1", "T2"]
    assert _first_what_no_device_has(dataset, tasks, new, per_task=8) == ["T0", "T9", "T1", "T2"]  # none held
    assert _first_what_no_device_has(dataset, tasks, D1, per_task=7) == ["T0", "T9", "T1", "T2"]  # its own
