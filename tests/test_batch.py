"""Candidates built here, timed where only TVM's runtime is (tunecore.measure.batch), and GPU code paths that run
without a GPU: a network's untuned CUDA build, a CUDA task's reference on the host CPU, sampling a GPU space."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tunecore.testing.cli import assert_one_line_exit_2, cli_json, run_cli

H100 = json.dumps({"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 1024,
                   "max_shared_memory_per_block": 49152, "thread_warp_size": 32, "registers_per_block": 65536})


def run_batch_runtime_only(directory):
    """``python -m tunecore.measure.batch DIR`` as on a machine without TVM's compiler."""
    done = subprocess.run([sys.executable, "-m", "tunecore.measure.batch", str(directory)], capture_output=True,
                          text=True, env=dict(os.environ, TVM_USE_RUNTIME_LIB="1"), timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def clean_retimings(results):
    """How many of a results.json's timings are clean by the label protocol's spread bound."""
    from tunecore.data import spread
    from tunecore.dataset.protocol import MAX_SPREAD

    spreads = [spread(r["run_secs"]) for r in results.values()]
    return sum(s is not None and s <= MAX_SPREAD for s in spreads)


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    directory = tmp_path_factory.mktemp("batch") / "b"
    out = cli_json(run_cli("dataset", "export-batch", "--model", "op:matmul-64", "--target", "llvm", "--per-task", "5",
                           "--out", str(directory), "--json"))
    assert out["programs"] == out["built"] == 5
    return directory


def test_a_batch_is_timed_with_the_runtime_alone_checked_and_imported_as_rows(batch, tmp_path):
    summary = run_batch_runtime_only(batch)
    assert summary == {"device": summary["device"], "programs": 5, "failed": 0, "cubins": None}
    timed = json.load(open(batch / "results.json"))
    results = timed["results"]
    assert all(len(r["run_secs"]) == 5 and r["max_relative_error"] < 1e-5 for r in results.values())
    # kernels on as many threads as the target has cores (TVM's runtime alone would take half the CPUs on x86)
    assert timed["threads"] == json.load(open(batch / "manifest.json"))["target"]["num-cores"]
    assert run_batch_runtime_only(batch)["programs"] == 5  # resumes: nothing timed twice
    dataset = tmp_path / "d.parquet"
    out = cli_json(run_cli("dataset", "import-batch", str(batch), "--out", str(dataset), "--json"))
    assert out["added"] == 5 and out["failed"] == 0
    from tunecore.dataset import Dataset
    from tunecore.targets import device_descriptor, device_id
    from tunecore.tvmjson import target_from_json

    # the rows' device is the one a run measured here names (the runtime alone reads the CPU without LLVM)
    manifest_target = json.load(open(batch / "manifest.json"))["target"]
    assert out["device_id"] == device_id(device_descriptor(target_from_json(json.dumps(manifest_target))))

    rows = Dataset.load(str(dataset)).rows
    assert len(rows) == 5 and all(r.latency and "check.max_relative_error" in r.profile for r in rows)
    # the host's load while each program was timed (its own compile workers counted), kept with the row
    assert all(r.profile["label.foreign_load"] == results[i]["host_load"] >= 0 for r, i in zip(rows, results))
    again = cli_json(run_cli("dataset", "import-batch", str(batch), "--out", str(dataset), "--json"))
    assert again["added"] == again["second_labels"] == 0  # the same timings again are no repeat
    # the batch timed once more: the programs keep their rows, the new timings become their second labels
    os.remove(batch / "results.json")
    run_batch_runtime_only(batch)
    retimed = json.load(open(batch / "results.json"))["results"]
    again = cli_json(run_cli("dataset", "import-batch", str(batch), "--out", str(dataset), "--json"))
    assert again["added"] == 0 and again["second_labels"] == clean_retimings(retimed)
    labelled = [r for r in Dataset.load(str(dataset)).rows if "label.second" in r.profile]
    assert len(labelled) == again["second_labels"]


def test_a_gpu_is_the_same_device_to_the_batch_runner_as_to_a_run(monkeypatch):
    """The runtime-only runner names the arch its batch was compiled for, as device_descriptor does: an arch-less
    description would be another device id for the same GPU (import-batch added it after the fact)."""
    import tvm

    from tunecore.measure.batch import this_device
    from tunecore.targets import device_descriptor, device_id, resolve_target

    class LentH100:  # what TVM's runtime reports of the device
        exist, device_name, multi_processor_count, max_clock_rate = True, "NVIDIA H100 80GB HBM3", 132, 1980000
        total_global_memory, max_shared_memory_per_block, warp_size = 85e9, 49152, 32

    for gpu in (LentH100(), tvm.cuda()):  # this machine's tvm.cuda() does not exist: no GPU fields on either side
        monkeypatch.setattr(tvm, "cuda", lambda gpu=gpu: gpu)
        run = device_descriptor(resolve_target(H100))
        assert this_device(json.loads(H100), gpu) == run and run["arch"] == "sm_90"
        assert device_id(run) == device_id(this_device(json.loads(H100), gpu))
    assert run.keys() == {"kind", "arch"} and "gpu" in this_device(json.loads(H100), LentH100())


def test_a_round_from_a_store_builds_only_programs_not_measured_before(batch, tmp_path):
    """The next batch of a search in rounds: its store holds the first batch's records (timed, imported into a
    dataset, then into the store), and none of those programs is built again."""
    run_batch_runtime_only(batch)
    dataset, store = tmp_path / "d.parquet", tmp_path / "s.db"
    cli_json(run_cli("dataset", "import-batch", str(batch), "--out", str(dataset), "--json"))
    assert run_cli("dataset", "import", str(dataset), "--store", f"sqlite:{store}").returncode == 0
    out = cli_json(run_cli("dataset", "export-batch", "--model", "op:matmul-64", "--target", "llvm", "--per-task",
                           "5", "--store", f"sqlite:{store}", "--out", str(tmp_path / "next"), "--json"))
    assert out["measured_before"] == 5 and out["built"] == 5
    keys = [{p["key"] for p in json.load(open(d / "manifest.json"))["programs"]} for d in (batch, tmp_path / "next")]
    assert len(keys[1]) == 5 and not keys[0] & keys[1]
    # --trials: programs in all, split as a run's scheduler would (one task here: all of them; see test_tuner's plan)
    out = cli_json(run_cli("dataset", "export-batch", "--model", "op:matmul-64", "--target", "llvm", "--trials", "3",
                           "--store", f"sqlite:{store}", "--out", str(tmp_path / "planned"), "--json"))
    assert out["built"] == 3 and list(out["split"].values()) == [3]


def test_a_datasets_own_programs_timed_again_in_a_batch_get_their_second_labels(tmp_path):
    """--second-labels-of: the noise ceiling for a device without TVM's compiler (the H100's ncu study)."""
    from tunecore.dataset import Dataset

    first, dataset = tmp_path / "first", tmp_path / "d.parquet"
    common = ["--model", "op:matmul-64", "--target", "llvm", "--json"]
    cli_json(run_cli("dataset", "export-batch", *common, "--per-task", "4", "--out", str(first)))
    run_batch_runtime_only(first)
    assert cli_json(run_cli("dataset", "import-batch", str(first), "--out", str(dataset), "--json"))["added"] == 4
    again = tmp_path / "again"
    out = cli_json(run_cli("dataset", "export-batch", *common, "--per-task", "3", "--tasks", "matmul-64",
                           "--second-labels-of", str(dataset), "--out", str(again)))
    assert out["built"] == 3
    rows = {r.program_key: r for r in Dataset.load(str(dataset)).rows}
    rebuilt = json.load(open(again / "manifest.json"))["programs"]
    assert all(rows[p["key"]].trace == p["trace"] for p in rebuilt)  # the dataset's programs, not new ones
    run_batch_runtime_only(again)
    # one timing made noisy and one steady, so that both cases are met however quiet or busy this machine is
    results_path = again / "results.json"
    results = json.load(open(results_path))
    noisy, steady = [r for r in results["results"].values() if r["run_secs"] and len(r["run_secs"]) > 1][:2]
    noisy["run_secs"] = [t * (1 + i % 2) for i, t in enumerate(noisy["run_secs"])]
    steady["run_secs"] = [min(steady["run_secs"])] * len(steady["run_secs"])
    results_path.write_text(json.dumps(results))
    clean = clean_retimings(results["results"])
    assert 1 <= clean <= 2
    imported = cli_json(run_cli("dataset", "import-batch", str(again), "--out", str(dataset), "--json"))
    assert imported["added"] == 0 and imported["second_labels"] == clean
    # made again: the same 3 programs are chosen, and those that got their label are left out
    out = cli_json(run_cli("dataset", "export-batch", *common, "--per-task", "3", "--second-labels-of", str(dataset),
                           "--out", str(tmp_path / "rest")))
    assert out["built"] == 3 - clean
    assert_one_line_exit_2(run_cli("dataset", "export-batch", *common, "--per-task", "3", "--tasks", "nosuch",
                                   "--out", str(tmp_path / "o")), "--tasks: no task named nosuch in op:matmul-64")
    assert_one_line_exit_2(run_cli("dataset", "export-batch", *common, "--per-task", "3", "--from-device", "x",
                                   "--out", str(tmp_path / "o")), "--from-device: the device whose programs")
    assert_one_line_exit_2(run_cli("dataset", "export-batch", *common, "--trials", "3", "--second-labels-of",
                                   str(dataset), "--out", str(tmp_path / "o")),
                           "not with --trials, --search or --store")
    assert_one_line_exit_2(run_cli("dataset", "export-batch", *common, "--per-task", "3", "--second-labels-of",
                                   str(dataset), "--from-device", "nosuch", "--out", str(tmp_path / "o")),
                           "device nosuch: not one of the dataset's devices")
    assert_one_line_exit_2(run_cli("dataset", "export-batch", "--model", "op:matmul-96x64x80", "--target", "llvm",
                                   "--per-task", "3", "--second-labels-of", str(dataset), "--out",
                                   str(tmp_path / "o")), "no program of these tasks to build again")


def test_a_program_whose_outputs_differ_from_the_reference_is_a_failed_result(batch, tmp_path):
    import shutil

    wrong = tmp_path / "wrong"
    shutil.copytree(batch, wrong)
    for name in ("results.json",):
        if (wrong / name).exists():
            os.remove(wrong / name)
    (reference,) = [f for f in os.listdir(wrong) if f.startswith("reference-")]
    with np.load(wrong / reference) as saved:
        arrays = {k: saved[k] + 1.0 for k in saved.files}
    np.savez(wrong / reference, **arrays)
    assert run_batch_runtime_only(wrong)["failed"] == 5
    results = json.load(open(wrong / "results.json"))["results"].values()
    assert all(r["error"].startswith("wrong output") for r in results)


def test_batch_commands_refuse_bad_input(tmp_path, batch):
    assert_one_line_exit_2(run_cli("dataset", "import-batch", str(tmp_path), "--out", str(tmp_path / "d.parquet")),
                           "not a batch directory")
    assert_one_line_exit_2(run_cli("dataset", "export-batch", "--model", "op:matmul-64", "--target", "llvm",
                                   "--per-task", "1", "--out", str(batch)), "a batch is there already")
    assert_one_line_exit_2(run_cli("dataset", "export-batch", "--model", "op:matmul-64", "--target", "llvm",
                                   "--per-task", "1", "-O", "search.x=1", "--out", str(tmp_path / "o")),
                           "random samples take neither")
    assert_one_line_exit_2(run_cli("dataset", "export-batch", "--model", "op:matmul-64", "--target", "llvm",
                                   "--per-task", "1", "--cost-model", "xgb", "--out", str(tmp_path / "o")),
                           "random samples take neither")
    assert_one_line_exit_2(run_cli("dataset", "export-batch", "--model", "op:matmul-64", "--target", "llvm",
                                   "--per-task", "1", "--search", "nosuch", "--out", str(tmp_path / "o")),
                           "--search nosuch: not installed")
    assert_one_line_exit_2(run_cli("dataset", "export-batch", "--model", "op:matmul-64", "--target", "llvm",
                                   "--per-task", "1", "--store", str(tmp_path / "none.db"), "--out",
                                   str(tmp_path / "o")), "no such store")
    assert_one_line_exit_2(run_cli("dataset", "export-batch", "--model", "op:matmul-64", "--target", "llvm",
                                   "--per-task", "1", "--scheduler", "round-robin", "--out", str(tmp_path / "o")),
                           "--scheduler: splits --trials")
    fresh = tmp_path / "untimed"
    cli_json(run_cli("dataset", "export-batch", "--model", "op:matmul-64", "--target", "llvm", "--per-task", "1",
                     "--out", str(fresh), "--json"))
    assert_one_line_exit_2(run_cli("dataset", "import-batch", str(fresh), "--out", str(tmp_path / "d.parquet")),
                           "no results yet")
    done = subprocess.run([sys.executable, "-m", "tunecore.measure.batch", str(tmp_path)], capture_output=True,
                          text=True)
    assert done.returncode == 2 and "not a batch directory" in done.stderr


def test_a_cuda_batch_built_without_a_gpu_names_its_kernels(tmp_path):
    """Built here for an H100 (no GPU): each library carries its CUDA source, whose kernels match ncu's launches."""
    out = cli_json(run_cli("dataset", "export-batch", "--model", "op:matmul-512", "--target", H100, "--per-task", "3",
                           "--out", str(tmp_path / "b"), "--json"))
    assert out["built"] == 3
    manifest = json.load(open(tmp_path / "b" / "manifest.json"))
    assert all(p["kernels"] and p["kernels"][0] == "main_kernel" for p in manifest["programs"])
    assert manifest["target"]["arch"] == "sm_90"
    # the source read back from a library is whole: what the runtime will hand its compile callback
    from tunecore.measure.batch import compile_cuda, cuda_source

    source = cuda_source(str(tmp_path / "b" / manifest["programs"][0]["library"]))
    assert 'extern "C" __global__' in source and source.rstrip().endswith("}")
    if __import__("shutil").which("nvcc"):
        assert compile_cuda(source, "sm_90")[:4] == b"\x7fELF"
    (task,) = manifest["tasks"].values()
    assert task["reference"] and os.path.exists(tmp_path / "b" / task["reference"])


def test_an_untuned_network_builds_for_a_gpu_with_default_gpu_schedules():
    """Kernels without a record get dlight's schedules (relax.build's own CUDA pipeline gives them), not the
    one-thread-per-block binding TVM falls back to; a CPU target gets none."""
    from tvm.s_tir import meta_schedule as ms

    from tunecore.compile import _default_gpu_schedules, build
    from tunecore.targets import host_target, resolve_target
    from tunecore.workloads import load_workload

    assert _default_gpu_schedules(host_target()) == []
    (passes,) = _default_gpu_schedules(resolve_target(H100))
    assert "ApplyDefaultSchedule" in str(passes.info)
    executable = build(load_workload("zoo:bert-tiny"), resolve_target(H100), ms.database.MemoryDatabase())
    kinds = {m.kind for library in executable.mod.imports for m in [library, *library.imports]}
    assert "cuda" in kinds


def test_a_gpu_tasks_reference_is_computed_on_the_host_cpu():
    """The local runner builds and runs a GPU task's unscheduled program on the host CPU for its reference."""
    from tunecore.measure.local import LocalRunner
    from tunecore.targets import resolve_target
    from tunecore.testing import tiny_task

    target = resolve_target(H100)
    task = tiny_task("matmul-64", target)
    runner = LocalRunner(target)
    try:
        assert runner.reference_on_host and json.loads(runner.reference_target_json)["kind"] == "llvm"
        runner.set_reference(task, None)
        reference = runner.reference(task)
        assert reference is not None
        with np.load(reference["reference"]) as saved:
            (output,) = [saved[k] for k in saved.files]
        from tunecore.check import relative_error, task_inputs

        a, b, _ = task_inputs(task.args, reference["weights"])
        # relative to the largest output, as the check measures: an element near zero is a sum that cancelled, and
        # float32 rounding in another summation order (numpy's on a Zen 5) moves it by more than 1e-5 of itself
        assert relative_error(output, a @ b) < 1e-5
    finally:
        runner.close()


def test_sampling_a_gpu_space_is_not_stopped_by_its_many_invalid_samples():
    """On a GPU most samples of a conv fail the postprocessors; 64 in a row used to end the sampling at ~7."""
    from tunecore.space import DesignSpace
    from tunecore.targets import resolve_target
    from tunecore.workloads import extract_tasks, load_workload

    (task,) = extract_tasks(load_workload("op:conv2d-resnet50-c2"), resolve_target(H100))
    assert len(DesignSpace(task, seed=0).sample_new(16, (), "random")) == 16


@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
def test_without_the_compiler_the_batch_runner_compiles_a_librarys_cuda_source_itself(tmp_path):
    """On the H100 the runtime alone could not load libraries built without a GPU (they carry CUDA source, and TVM's
    compile callback asks the missing compiler for the target): the batch runner's own callback hands the runtime
    a cubin, compiled once and kept in the batch (a second load, or the profiler's run, compiles nothing)."""
    kernel = 'extern "C" __global__ void main_kernel(float* a) { a[threadIdx.x] = 1.0f; }'
    code = "\n".join([
        "import sys, tvm, tvm_ffi",
        "from tunecore.measure.batch import Cubins, use_cubins",
        "assert tvm.base._RUNTIME_ONLY",
        "cubins = Cubins(sys.argv[2], 'sm_90')",
        "use_cubins(cubins)",
        "compile = tvm_ffi.get_global_func('tvm_callback_cuda_compile')",
        "out = [bytes(compile(sys.argv[1])) for _ in range(2)]",
        "print(out[0] == out[1], cubins.counts['on_load'], cubins.counts['cached'], out[0][:4].hex())",
    ])
    done = subprocess.run([sys.executable, "-c", code, kernel, str(tmp_path)], capture_output=True, text=True,
                          env=dict(os.environ, TVM_USE_RUNTIME_LIB="1"), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "1", "1", "7f454c46"]  # an ELF: the cubin, compiled once
    assert len(list((tmp_path / "cubins").glob("*.sm_90.cubin"))) == 1


def test_a_batch_timed_on_the_h100_imports_as_rows_of_the_h100(tmp_path):
    """A real batch's results from the lent H100 (2026-11-27, TVM's runtime alone; three programs of a BERT-base
    matmul and one that failed to build, libraries left out): rows on the device of datasets/gpu-h100.parquet,
    each with its host-CPU check, and the build failure as a failed row."""
    import shutil

    from tunecore.dataset import Dataset

    batch = tmp_path / "b"
    shutil.copytree(pathlib.Path(__file__).parent / "data" / "h100-batch", batch)
    out = cli_json(run_cli("dataset", "import-batch", str(batch), "--out", str(tmp_path / "d.parquet"), "--json"))
    shipped = Dataset.load(str(pathlib.Path(__file__).parent.parent / "datasets" / "gpu-h100.parquet"))
    assert out["added"] == 4 and out["failed"] == 1 and out["device_id"] in shipped.devices
    rows = Dataset.load(str(tmp_path / "d.parquet")).rows
    ran = [r for r in rows if r.error is None]
    assert len(ran) == 3 and all(r.profile["check.max_relative_error"] <= 1e-6 and len(r.run_secs) == 5 for r in ran)
    assert [r.error for r in rows if r.error] and all(r.error.startswith("build:") for r in rows if r.error)


def test_profiles_written_after_the_timings_were_imported_join_the_rows(tmp_path):
    """A batch profiled (`tunecore ncu profile-batch`) after its timings were imported: importing it again adds
    the profiles to the existing rows, once (the metrics are a real H100 profile of a BERT-base matmul program,
    2026-11-27, put on one of the fixture's programs)."""
    import shutil

    from tunecore.dataset import Dataset

    batch, dataset = tmp_path / "b", str(tmp_path / "d.parquet")
    shutil.copytree(pathlib.Path(__file__).parent / "data" / "h100-batch", batch)
    assert cli_json(run_cli("dataset", "import-batch", str(batch), "--out", dataset, "--json"))["added"] == 4
    profile = {"ncu.dram__bytes_read.sum": 11442432.0, "ncu.gpu__time_duration.sum": 0.01616448,
               "ncu.launch__grid_size": 8.0, "ncu.launch__registers_per_thread": 56.0}
    program = "7946593417425279110-9ca04b387f137081"
    (batch / "profiles.json").write_text(json.dumps({program: profile}))
    out = cli_json(run_cli("dataset", "import-batch", str(batch), "--out", dataset, "--json"))
    assert out["added"] == 0 and out["profiles_added"] == 1 and out["second_labels"] == 0
    profiled = [r for r in Dataset.load(dataset).rows if "ncu.launch__grid_size" in r.profile]
    assert len(profiled) == 1 and {k: profiled[0].profile[k] for k in profile} == profile
    assert cli_json(run_cli("dataset", "import-batch", str(batch), "--out", dataset, "--json"))["profiles_added"] == 0
