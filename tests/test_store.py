"""MetaSchedule JSONDatabase interoperability, checked with TVM's own JSONDatabase."""

import pytest

from tunecore.store.metaschedule import export_metaschedule, import_metaschedule
from tunecore.store.sqlite import MemoryStore
from tunecore.testing import InstantMeasurer
from tunecore.tuner import Tuner


@pytest.fixture
def tuned_store(matmul_task, target):
    from tunecore.builtin.none_model import NoneModel
    from tunecore.builtin.random_search import RandomSearch

    store = MemoryStore()
    model = NoneModel()
    Tuner(search=RandomSearch(cost_model=model, store=store), cost_model=model, store=store,
          measurer=InstantMeasurer(target)).tune([matmul_task.for_model("op:matmul-64", 1)], 6)
    return store


def test_export_is_read_by_metaschedule(tuned_store, matmul_task, tmp_path):
    from tvm.s_tir import meta_schedule as ms

    assert export_metaschedule(tuned_store, str(tmp_path), [matmul_task]) == 6
    db = ms.database.JSONDatabase(work_dir=str(tmp_path))
    assert len(db) == 6
    best = db.query_tuning_record(matmul_task.mod, matmul_task.target, "main")
    assert float(best.run_secs[0]) == pytest.approx(tuned_store.best(matmul_task.task_id)[0].run_secs[0])


def test_metaschedule_database_imports_with_failures(matmul_task, target, tmp_path):
    from tvm.s_tir import meta_schedule as ms

    from tunecore.space import DesignSpace

    db = ms.database.JSONDatabase(work_dir=str(tmp_path))
    workload = db.commit_workload(matmul_task.mod)
    space = DesignSpace(matmul_task, seed=5)
    args = [ms.arg_info.ArgInfo.from_json(a) for a in matmul_task.args]
    latencies = [[2e-5], [1e-5], [1e10]]
    for run_secs in latencies:
        sch = space.sample()
        db.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, run_secs, target, args))
    store = MemoryStore()
    assert import_metaschedule(store, str(tmp_path)) == (1, 3)
    (task,) = store.get_tasks()
    assert task.task_id == matmul_task.task_id  # same kernel, same target: same identity
    records = store.records(task.task_id)
    ok = sorted(r.latency for r in records if r.latency is not None)  # MetaSchedule returns them by latency
    assert ok == [pytest.approx(1e-5), pytest.approx(2e-5)]
    (failed,) = [r for r in records if r.latency is None]
    assert failed.error and store.best(task.task_id)[0].latency == pytest.approx(1e-5)


def test_round_trip_keeps_programs_and_latencies(tuned_store, matmul_task, tmp_path):
    export_metaschedule(tuned_store, str(tmp_path), [matmul_task])
    again = MemoryStore()
    import_metaschedule(again, str(tmp_path))
    original = {r.key: r.latency for r in tuned_store.records(matmul_task.task_id)}
    assert {r.key: r.latency for r in again.records(matmul_task.task_id)} == pytest.approx(original)
