"""`tunecore compile` builds what the store's best records say, and the result is right (how much faster it runs is
the benches' to say: tests assert no timings)."""

import pathlib

import numpy as np
import pytest
import tvm_ffi

from tunecore.compile import Runnable, best_database, build, random_inputs, scheduled_operator
from tunecore.store.sqlite import SqliteStore
from tunecore.targets import use_target_threads
from tunecore.testing.cli import cli_json as _json
from tunecore.testing.cli import run_cli
from tunecore.testing.helpers import write_tiny_onnx
from tunecore.workloads import extract_tasks, fuse, load_workload


def _tuned_store(tmp_path, model, trials):
    store = str(tmp_path / "t.db")
    summary = _json(run_cli("run", "--model", model, "--trials", str(trials), "--store", store, "--json"))
    assert summary["trials_measured"] == trials and summary["errors"] == 0
    assert all(t["best_latency_s"] for t in summary["tasks"])  # every task got a working program
    return store


def test_compile_of_an_operator_checks_outputs_and_reports_its_speedup(tmp_path):
    store = _tuned_store(tmp_path, "op:matmul-64", 6)
    library = tmp_path / "tuned.so"
    report = _json(run_cli("compile", "--model", "op:matmul-64", "--store", store, "-o", str(library), "--json"))
    assert report["outputs_match"] is True and report["tasks_tuned"] == report["tasks_total"] == 1
    assert report["speedup"] == pytest.approx(report["untuned_latency_ms"] / report["latency_ms"])
    # both builds timed in the same 5 alternating passes; the latency is the median pass, the speedup's range
    # is from the worst pairing of passes to the best
    assert len(report["latency_passes_ms"]) == len(report["untuned_passes_ms"]) == 5
    assert report["latency_ms"] == pytest.approx(float(np.median(report["latency_passes_ms"])))
    assert report["untuned_latency_ms"] == pytest.approx(float(np.median(report["untuned_passes_ms"])))
    low, high = report["speedup_range"]
    assert low <= report["speedup"] <= high
    assert low == pytest.approx(min(report["untuned_passes_ms"]) / max(report["latency_passes_ms"]))
    assert library.stat().st_size > 0


def test_an_operator_is_built_from_its_best_record(tmp_path, target):
    store_file = _tuned_store(tmp_path, "op:matmul-64", 6)
    workload = load_workload("op:matmul-64")
    (task,) = extract_tasks(workload, target)
    store = SqliteStore(store_file)
    try:
        database, covered = best_database(store, [task], target)
        best = store.best(task.task_id)[0]
    finally:
        store.close()
    assert covered == 1
    built = scheduled_operator(workload, target, database)
    assert tvm_ffi.structural_equal(built, best.candidate(task).mod)
    assert not tvm_ffi.structural_equal(built, workload.mod)
    untouched = scheduled_operator(workload, target, best_database(SqliteStore(":memory:"), [task], target)[0])
    assert tvm_ffi.structural_equal(untouched, workload.mod)


@pytest.mark.parametrize("model", ["op:matmul-64", "op:matmul-96x64x80"])
def test_operator_outputs_match_numpy(tmp_path, target, model):
    store_file = _tuned_store(tmp_path, model, 4)
    workload = load_workload(model)
    use_target_threads(target)
    store = SqliteStore(store_file)
    try:
        database, covered = best_database(store, extract_tasks(workload, target), target)
    finally:
        store.close()
    assert covered == 1
    a, b, c = random_inputs(workload)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    for executable in (build(workload, target, database),
                       build(workload, target, best_database(SqliteStore(":memory:"), [], target)[0])):
        (got,) = Runnable(executable, workload, target, [a, b, c]).outputs()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_a_network_gets_every_tasks_best_record(tmp_path, target):
    model = tmp_path / "tiny.onnx"
    write_tiny_onnx(str(model))
    store_file = _tuned_store(tmp_path, str(model), 9)
    tasks = _json(run_cli("tasks", "--model", str(model), "--json"))["tasks"]
    assert sorted(t["name"] for t in tasks) == ["fused_conv2d_add_relu", "matmul", "reshape1"]
    report = _json(run_cli("compile", "--model", str(model), "--store", store_file, "--json", "-o", "tuned.so",
                           cwd=tmp_path))
    assert report["outputs_match"] is True and report["tasks_tuned"] == report["tasks_total"] == 3
    assert report["speedup"] == pytest.approx(report["untuned_latency_ms"] / report["latency_ms"])
    # the user guide's example loads and calls what `-o` wrote
    guide = (pathlib.Path(__file__).parents[1] / "docs" / "user-guide.md").read_text()
    example = guide.split("<!-- example: load-compiled -->", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(example.replace('"tuned.so"', repr(str(tmp_path / "tuned.so"))).replace("224, 224", "64, 64"), namespace)
    assert namespace["out"].numpy().shape == (1, 10)

    # What compile_relax does with the database: MetaSchedule's pass puts each task's record in place of
    # its fused function. Every fused function must come out as its task's best record, not as it was.
    import tvm
    from tvm.relax.transform import MetaScheduleApplyDatabase

    workload = load_workload(str(model))
    tasks = extract_tasks(workload, target)
    store = SqliteStore(store_file)
    try:
        database, _ = best_database(store, tasks, target)
        best = [store.best(t.task_id)[0].candidate(t).mod["main"].body for t in tasks]
    finally:
        store.close()
    with target, database:
        applied = MetaScheduleApplyDatabase()(fuse(workload.mod, target))
    bodies = [f.body for f in applied.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(bodies) == len(tasks)
    for task, scheduled in zip(tasks, best):
        assert sum(tvm_ffi.structural_equal(b, scheduled, map_free_vars=True) for b in bodies) == 1, task.name
        assert not any(tvm_ffi.structural_equal(b, task.mod["main"].body, map_free_vars=True)
                       for b in bodies), task.name


def test_random_weights_are_scaled_by_fan_in_so_a_deep_network_stays_well_conditioned():
    """Unscaled uniform(-1, 1) weights saturate mobilenet-v2's relu6 and make its outputs sums that cancel:
    any correct schedule then differed from the untuned build by ~10%, and `compile` refused every tuned build."""
    workload = load_workload("zoo:mobilenet-v2")
    params = list(workload.mod["main"].params)
    inputs = dict(zip((p.name for p in params), random_inputs(workload)))
    assert np.abs(inputs["data"]).max() > 0.9  # the model's input is not a weight
    weight = inputs["features.1.layers.1.conv.weight"]  # 16 x 32 x 1 x 1: fan-in 32
    assert abs(float(weight.std()) - 1 / np.sqrt(32)) < 0.05
    assert np.abs(inputs["features.0.bias"]).max() > 0.9  # biases stay as they were


def test_weights_are_packed_once_when_compiled_not_on_every_call(tmp_path, target):
    """Kernels' weights are layout-free: a schedule may read them packed (RewriteLayout), the measurer passes
    them packed, and the build packs the constants once and calls kernels without their packing block."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tunecore.check import max_relative_error
    from tunecore.data import Candidate, MeasureResult, Record
    from tunecore.measure import worker
    from tunecore.space import DesignSpace
    from tunecore.store.sqlite import MemoryStore
    from tunecore.tvmjson import target_to_json

    model = tmp_path / "tiny.onnx"
    write_tiny_onnx(str(model))
    workload = load_workload(str(model))
    tasks = extract_tasks(workload, target)
    store = MemoryStore()
    store.put_tasks(tasks)
    packed = []
    for task in tasks:
        candidate = Candidate.from_schedule(task, DesignSpace(task, seed=0).sample(seed=1))
        _, _, args, _ = worker.build(tvm.ir.save_json(candidate.mod), target_to_json(target), str(tmp_path))
        if args != task.args:
            packed.append(task.name)
        store.commit([Record.from_result(candidate, MeasureResult(run_secs=[1e-3]))])
    assert sorted(packed) == ["fused_conv2d_add_relu", "matmul"]  # their weights; reshape has none
    database, _ = best_database(store, tasks, target)
    executable = build(workload, target, database)
    assert "fused_conv2d_add_relu_prepacked" in executable.as_text() and "matmul_prepacked" in executable.as_text()
    inputs = random_inputs(workload)
    untuned = Runnable(build(workload, target, ms.database.MemoryDatabase()), workload, target, inputs)
    assert max_relative_error(Runnable(executable, workload, target, inputs).outputs(), untuned.outputs()) < 1e-4


def test_a_network_library_runs_where_only_tvms_runtime_is(tmp_path):
    """The GPU bench builds a network on one machine and runs it on another: exported, loaded back and run by the
    relax VM from the runtime alone (Runnable.network, inputs from their specs) it gives the same outputs."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tunecore.compile import Runnable, build, input_specs, inputs_of, random_inputs
    from tunecore.targets import host_target
    from tunecore.workloads import load_workload

    model = tmp_path / "tiny.onnx"
    write_tiny_onnx(str(model))
    workload, target = load_workload(str(model)), host_target()
    executable = build(workload, target, ms.database.MemoryDatabase())
    executable.export_library(str(tmp_path / "net.so"))
    specs = input_specs(workload)
    assert [x.tolist() for x in inputs_of(specs)] == [x.tolist() for x in random_inputs(workload)]
    loaded = Runnable.network(tvm.runtime.load_module(str(tmp_path / "net.so")), tvm.cpu(0), inputs_of(specs), None)
    (got,), (expected,) = loaded.outputs(), Runnable(executable, workload, target, inputs_of(specs)).outputs()
    assert got.shape == expected.shape and np.array_equal(got, expected)
