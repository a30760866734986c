"""Never a wrong program: the measurer checks candidates' outputs, `records check` and `compile` find wrong records."""

import json
import re
import sqlite3

import numpy as np
import pytest

from tunecore.check import mismatch, relative_error, tolerance
from tunecore.data import Candidate, MeasureResult, Record
from tunecore.measure.local import LocalMeasurer
from tunecore.registry import Registry
from tunecore.store.sqlite import SqliteStore
from tunecore.testing import WrongProgramSearch, sample_candidates, wrong_candidates
from tunecore.testing.cli import assert_one_line_exit_2, cli_json, run_cli
from tunecore.tuner import Tuner


def test_tolerances_by_dtype_and_non_finite_values():
    expected = np.array([1.0, -2.0, 4.0], dtype="float32")
    assert relative_error(expected + 1e-6, expected) < tolerance("float32")
    error, reason = mismatch([expected * 1.01], [expected])
    assert reason == "wrong output: max relative error 0.01 (float32 tolerance 0.001)"
    assert mismatch([expected.astype("float16") * 1.004], [expected.astype("float16")])[1] is None  # 1e-2 for fp16
    ints = np.array([3, 4], dtype="int64")
    assert mismatch([ints], [ints])[1] is None and mismatch([ints + 1], [ints])[1] is not None  # integers: equal
    nan = np.array([np.nan, 1.0], dtype="float32")
    assert relative_error(nan.copy(), nan) == 0.0  # NaN where NaN is expected is no error
    assert relative_error(np.array([0.5, 1.0], dtype="float32"), nan) == float("inf")
    two = np.array([2.0, 1.0], dtype="float32")
    assert relative_error(np.array([np.inf, 1.0], dtype="float32"), two) == float("inf")


def _store_with(task, records, path):
    store = SqliteStore(str(path))
    store.put_tasks([task])
    store.commit(records)
    return store


def test_wrong_programs_are_recorded_as_failures_and_never_the_best(matmul_task, tmp_path):
    """A search proposing wrong programs between correct ones: each wrong one is a failed record saying why, every
    success was checked, and the best is a program that computes the task."""
    store = _store_with(matmul_task, [], tmp_path / "s.db")
    measurer = LocalMeasurer(matmul_task.target)
    none = Registry.shared().get("cost_model", "none")()
    try:
        search = WrongProgramSearch(cost_model=none, store=store, seed=1)
        Tuner(search=search, cost_model=none, store=store, measurer=measurer).tune([matmul_task], 12, {"model": "t"})
    finally:
        measurer.close()
    records = store.records(matmul_task.task_id)
    wrong = [r for r in records if r.origin == "wrong"]
    assert len(wrong) >= 3 and all(r.error.startswith("wrong output: max relative error") for r in wrong)
    assert all(r.run_secs for r in wrong)  # timed before the check: the failure keeps its timings
    good = [r for r in records if r.error is None]
    assert good and all(r.profile["check.max_relative_error"] <= 1e-3 for r in good)
    assert store.best(matmul_task.task_id)[0].origin != "wrong"


@pytest.mark.parametrize("check", ["best", "none"])
def test_which_candidates_are_checked_is_an_option(matmul_task, check):
    good = sample_candidates(matmul_task, 6, seed=2)
    wrong = wrong_candidates(matmul_task, 1, seed=3)
    measurer = LocalMeasurer(matmul_task.target, check=check, check_sample=100)
    try:
        first = measurer.measure(matmul_task, good)
        (last,) = measurer.measure(matmul_task, wrong)
    finally:
        measurer.close()
    checked = ["check.max_relative_error" in r.profile for r in first]
    if check == "none":  # nothing is checked: a wrong program measures as a success
        assert not any(checked) and last.error is None
        return
    # best: the first candidate, and each one faster than all before it
    best, expected = float("inf"), []
    for r in first:
        expected.append(r.latency < best)
        best = min(best, r.latency)
    assert checked == expected
    assert last.error is None or last.error.startswith("wrong output")  # checked only if it was a new best


def _wrong_store(task, path):
    """A store as tunecore left them before it checked outputs: a wrong program stored as the task's best (no check
    entry in its profile), a slower correct one behind it."""
    wrong = wrong_candidates(task, 1)[0]
    good = sample_candidates(task, 1, seed=4)[0]
    return _store_with(task, [Record.from_result(wrong, MeasureResult([1e-6]), trial=0),
                              Record.from_result(good, MeasureResult([1e-3]), trial=1)], path), wrong, good


def test_records_check_marks_wrong_records_failed(matmul_task, tmp_path):
    path = tmp_path / "old.db"
    store, wrong, good = _wrong_store(matmul_task, path)
    store.close()
    out = cli_json(run_cli("records", "check", "--store", str(path), "--json"))
    (row,) = out
    assert [w["key"] for w in row["wrong"]] == [wrong.key] and row["best"] == good.key
    assert row["best_latency_s"] == pytest.approx(1e-3)  # the stored latency, not the check's timing
    assert row["wrong"][0]["error"].startswith("wrong output: max relative error")
    store = SqliteStore(str(path))
    (failed,) = [r for r in store.records(matmul_task.task_id) if r.key == wrong.key]
    assert failed.latency is None and failed.run_secs == [1e-6] and failed.error.startswith("wrong output")
    assert store.best(matmul_task.task_id)[0].key == good.key
    store.close()
    again = cli_json(run_cli("records", "check", "--store", str(path), "--json"))
    assert again[0]["wrong"] == [] and again[0]["best"] == good.key  # nothing left to find
    assert again[0]["best_latency_s"] == pytest.approx(1e-3)


def test_records_check_bad_input_is_one_line_and_exit_2(tmp_path):
    assert_one_line_exit_2(run_cli("records", "check", "--store", str(tmp_path / "missing.db")), "no such store")
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE things (x)")
    assert_one_line_exit_2(run_cli("records", "check", "--store", str(foreign)), "not a tunecore store")
    store = tmp_path / "s.db"
    cli_json(run_cli("run", "--model", "op:matmul-64", "--trials", "2", "--store", str(store), "--json"))
    assert_one_line_exit_2(run_cli("records", "check", "--store", str(store), "--model", "zoo:resnet-18"),
                           "no tasks of model 'zoo:resnet-18'", "op:matmul-64")


def test_compile_names_the_wrong_record_and_builds_with_the_best_correct_one(matmul_task, tmp_path):
    path = tmp_path / "old.db"
    store, wrong, good = _wrong_store(matmul_task, path)
    store.put_tasks([matmul_task.for_model("op:matmul-64", 1)])
    store.close()
    report = cli_json(run_cli("compile", "--model", "op:matmul-64", "--store", str(path), "--json"))
    assert report["outputs_match"] and report["wrong_records"] == ["matmul-64"] and report["tasks_tuned"] == 1
    assert report["max_relative_error"] <= 1e-3
    human = run_cli("compile", "--model", "op:matmul-64", "--store", str(path))
    line = " ".join(human.stdout.split())  # as the user reads it, wherever a narrow terminal wrapped it
    assert human.returncode == 0 and "outputs match" in line  # the wrong record is a failure by now
    assert re.search(r"\d\.\d\dx \(\d+\.\d\d-\d+\.\d\d\) over 5 alternating passes", line)  # with its range


def test_compile_with_nothing_tuned_says_so_instead_of_a_speedup(tmp_path):
    store = tmp_path / "s.db"
    cli_json(run_cli("run", "--model", "op:matmul-64", "--trials", "2", "--store", str(store), "--json"))
    result = run_cli("compile", "--model", "op:matmul-128", "--store", str(store), "--json")
    report = cli_json(result)
    assert report["tasks_tuned"] == 0 and report["speedup"] is None and report["outputs_match"]
    assert report["speedup_range"] is None and len(report["untuned_passes_ms"]) == 5
    assert "nothing was tuned: no task of op:matmul-128 has a record in the store" in result.stderr
    human = run_cli("compile", "--model", "op:matmul-128", "--store", str(store))
    assert human.returncode == 0 and "alternating passes" not in human.stdout and "untuned" in human.stdout


def test_a_stored_trace_without_the_postprocessing_marker_replays_as_the_same_program(matmul_task):
    """Traces stored before tunecore marked postprocessing: cut where their sketch ends, so a mutation or a
    replay postprocesses afresh instead of repeating (and then redoing) the old postprocessing."""
    from tvm.s_tir.schedule import Trace

    from tunecore.space import DesignSpace

    space = DesignSpace(matmul_task, seed=0)
    for candidate in sample_candidates(matmul_task, 4, seed=6):
        insts, decisions = json.loads(candidate.trace_json)
        at = next(i for i, inst in enumerate(insts) if inst[0] == "EnterPostproc")
        legacy = json.dumps([insts[:at] + insts[at + 1:], [[i - (i > at), d] for i, d in decisions]])
        trace = Candidate(matmul_task, legacy).trace
        cut = space.sketch_part(trace)
        kinds = [inst.kind.name for inst in cut.insts]
        assert kinds[-1] == "EnterPostproc" and kinds.count("EnterPostproc") == 1 and len(kinds) == at + 1
        assert Candidate.from_schedule(matmul_task, space.apply(Trace(cut.insts, cut.decisions))).key == candidate.key


def test_packed_weights_are_packed_by_the_kernels_own_packing(target):
    """A conv whose weights RewriteLayout packs: the built library carries the packing, and the check packs the
    task's seeded weights with it (a wrong packing would show as a wrong output)."""
    from tunecore.measure import worker
    from tunecore.workloads import extract_tasks, load_workload

    (conv,) = [t for t in extract_tasks(load_workload("zoo:resnet-18"), target) if t.name == "fused_conv2d_add_relu"]
    candidates = sample_candidates(conv, 2, seed=1)
    kernel, packing = worker.split_packing(candidates[0].mod)
    assert 1 in packing["outputs"] and sorted(packing["inputs"]) == sorted(packing["outputs"])  # the weight (bias)
    assert {gv.name_hint for gv in kernel.functions} == {"main", worker.PACK}
    measurer = LocalMeasurer(target)
    try:
        results = measurer.measure(conv, candidates)
    finally:
        measurer.close()
    assert all(r.error is None and r.profile["check.max_relative_error"] < 1e-5 for r in results)


def test_a_bad_check_option_is_one_line_and_exit_2():
    assert_one_line_exit_2(run_cli("run", "--model", "op:matmul-64", "--trials", "1", "--store", "memory:", "-O",
                                   "measurer.check=sometimes"), "check", "all or best or none")


def test_tvms_wrong_packing_of_a_reversed_index_is_an_invalid_program_before_it_is_measured(matmul_task):
    """TVM 0.27's TransformLayout drops the offset of an index read backwards (tunecore.space.packs_a_reversed_index):
    shown on a flip, then on dataset v2's programs of a dcgan transposed conv (its kernel is read flipped): those
    the check found wrong are invalid in the design space, those that computed right outputs stay valid."""
    import os

    import tvm
    from tvm import s_tir, te

    from tunecore.dataset.table import Dataset
    from tunecore.space import DesignSpace, packs_a_reversed_index
    from tunecore.tvmjson import replay_trace_json

    a = te.placeholder((4,), "float32", name="A")
    sch = s_tir.Schedule(te.create_prim_func([a, te.compute((4,), lambda i: a[3 - i], name="B")]))
    sch.transform_layout(sch.get_sblock("B"), ("read", 0), lambda p: [p // 2, p % 2])
    packed, out = tvm.runtime.tensor(np.arange(4, dtype="float32").reshape(2, 2)), tvm.runtime.empty((4,), "float32")
    tvm.tirx.build(sch.mod, target="llvm")["main"](packed, out)
    assert out.numpy().tolist() != [3, 2, 1, 0]  # TVM's bug: when this fails, TVM is fixed and the guard can go
    assert packs_a_reversed_index(sch)
    assert not DesignSpace(matmul_task).reads_backwards

    dataset = Dataset.load(os.path.join(os.path.dirname(os.path.dirname(__file__)), "datasets",
                                        "cpu-programs-v2.parquet"))
    name = "fused_conv2d_transpose2_add2_relu2"
    ((key, dataset_task),) = [(k, t) for k, t in dataset.tasks.items() if t.name == name]
    rows = [r for r in dataset.rows if r.task_key == key]
    wrong = [r for r in rows if r.error and r.error.startswith("wrong output")][:6]
    right = [r for r in rows if r.latency is not None][:6]
    assert len(wrong) == len(right) == 6
    task = dataset_task.for_target(rows[0].target)
    space = DesignSpace(task)
    assert space.reads_backwards  # the guard is checked only where a task reads an index backwards
    valid = [space.apply(replay_trace_json(task.mod, r.trace).trace, seed=1) is not None for r in wrong + right]
    assert valid == [False] * 6 + [True] * 6
