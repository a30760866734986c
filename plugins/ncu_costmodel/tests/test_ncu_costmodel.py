"""The ncu_costmodel plugin: ncu's CSV layouts (real ncu 2025.3 output of TVM kernels on an H100, made by
scripts/capture_ncu_fixtures.py, and synthetic fixtures for older versions' units and locales), the CPU
profiler on real kernels (the harness agrees with TVM's runtime, counts are deterministic), missing tools, the
dataset command, and `ncu` as the cost model of a run."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from tunecore_ncu_costmodel import cpu, ncu_csv
from tunecore_ncu_costmodel.model import NcuModel, is_feature_metric

from tunecore.data import MeasureResult
from tunecore.dataset.table import Dataset
from tunecore.testing import CostModelConformance, sample_candidates, tiny_task
from tunecore.testing.cli import assert_one_line_exit_2, cli_json, run_cli

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
SHIPPED = os.path.join(ROOT, "datasets", "cpu-programs.parquet")


class TestNcuIsACostModel(CostModelConformance):
    name = "ncu"


def _fixture(name: str) -> str:
    with open(os.path.join(HERE, "fixtures", name)) as f:
        return f.read()


# --- ncu CSV ---


@pytest.mark.parametrize("layout", ["ncu_details.csv", "ncu_raw.csv"])
def test_both_csv_layouts_give_kernels_keyed_by_id_in_base_units(layout):
    kernels = ncu_csv.parse(_fixture(layout))
    assert [(k.id, k.kernel) for k in kernels] == [("0", "default_function_kernel"), ("1", "default_function_kernel_1")]
    first, second = kernels[0].metrics, kernels[1].metrics
    assert first["dram__bytes_read.sum"] == pytest.approx(1024.5e3)  # "1,024.50" Kbyte
    assert first["gpu__time_duration.sum"] == pytest.approx(12.58e-6)  # usecond
    assert first["dram__bytes.sum.per_second"] == pytest.approx(81.44e9)  # Gbyte/second
    assert first["launch__grid_size"] == 96
    assert first["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"] == 1_215_000  # thousands separators
    assert second["dram__bytes_read.sum"] == pytest.approx(2.5e6)
    assert second["gpu__time_duration.sum"] == pytest.approx(1.25e-3)
    assert "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum" not in second  # missing, not zero
    assert "sass__inst_executed_shared_loads" not in second  # "n/a"


def test_details_page_skips_rule_rows_and_the_programs_output():
    kernels = ncu_csv.parse(_fixture("ncu_details.csv"))
    assert "" not in kernels[0].metrics and "Duration" in kernels[0].metrics
    assert "sass__inst_executed_shared_loads" not in kernels[0].metrics  # "n/a"


def test_numbers_and_units():
    assert ncu_csv.number("1,215,000.50") == 1215000.5
    assert ncu_csv.number("1.215.000,50") == 1215000.5  # a locale with '.' for thousands
    assert ncu_csv.number("1,024") == 1024 and ncu_csv.number("12,5") == 12.5
    assert ncu_csv.number("n/a") is None and ncu_csv.number("") is None
    assert ncu_csv.to_base(3.0, "msecond") == pytest.approx(3e-3)
    assert ncu_csv.to_base(2.0, "Mbyte/second") == pytest.approx(2e6)
    assert ncu_csv.to_base(2.0, "Kbyte/usecond") == pytest.approx(2e9)
    assert ncu_csv.to_base(41.2, "%") == 41.2
    # ncu 2025.3's spellings: time in "ns" even with --print-units base, "s" in rates, per-block sizes
    assert ncu_csv.to_base(19264, "ns") == pytest.approx(19.264e-6)
    assert ncu_csv.to_base(19.392, "us") == pytest.approx(19.392e-6)
    assert ncu_csv.to_base(27.485149, "Gbyte/s") == pytest.approx(27.485149e9)
    assert ncu_csv.to_base(7.936, "Kbyte/block") == pytest.approx(7936)
    assert ncu_csv.to_base(64, "register/thread") == 64 and ncu_csv.to_base(132, "SM") == 132


def test_one_candidate_sums_its_kernels_and_the_label_never_becomes_a_feature():
    metrics = ncu_csv.candidate_metrics(ncu_csv.parse(_fixture("ncu_raw.csv")))
    assert metrics["ncu.dram__bytes_read.sum"] == pytest.approx(1024.5e3 + 2.5e6)
    assert metrics["ncu.launch__grid_size"] == 96 and metrics["ncu.kernels"] == 2
    features = {k for k in metrics if is_feature_metric(k)}
    assert "ncu.dram__bytes_read.sum" in features and "ncu.launch__grid_size" in features
    assert not features & {"ncu.gpu__time_duration.sum", "ncu.dram__bytes.sum.per_second", "ncu.kernels"}


# --- real ncu output (Nsight Compute 2025.3.1, H100, driver 580.159.04) of three TVM kernels, each launched
# twice: a 256^3 fp32 matmul (dlight), a 1024x1024 row sum (dlight), a 3x3 conv2d 14x14x256->256 (MetaSchedule)

REAL_LAUNCHES = [("0", "matmul_kernel"), ("1", "matmul_kernel"), ("2", "row_sum_kernel"), ("3", "row_sum_kernel"),
                 ("4", "conv2d_kernel"), ("5", "conv2d_kernel")]
FFMA = "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"
FADD = "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum"
# TVM's launch configuration of each kernel: (grid size, block size)
REAL_LAUNCH = {"matmul_kernel": (32, 128), "row_sum_kernel": (1024, 1024), "conv2d_kernel": (16, 196)}


def test_real_raw_page_in_base_units_gives_every_study_metric_of_every_launch():
    """What the profiler reads (ncu --csv --page raw --print-units base --metrics STUDY_METRICS,...)."""
    kernels = ncu_csv.parse(_fixture("real_h100_raw.csv"))
    assert [(k.id, k.kernel) for k in kernels] == REAL_LAUNCHES
    for k in kernels:
        assert all(name in k.metrics for name in ncu_csv.STUDY_METRICS), k.kernel
        assert all(np.isfinite(v) for v in k.metrics.values())
        assert (k.metrics["launch__grid_size"], k.metrics["launch__block_size"]) == REAL_LAUNCH[k.kernel]
        assert k.metrics["device__attribute_multiprocessor_count"] == 132
        assert "device__attribute_display_name" not in k.metrics  # "NVIDIA H100 80GB HBM3": not a number
        assert 1e-6 < k.metrics["gpu__time_duration.sum"] < 1e-3  # "ns" -> seconds
        # bytes / seconds == the rate ncu gives in byte/s: both in base units
        assert k.metrics["dram__bytes.sum"] / k.metrics["gpu__time_duration.sum"] == pytest.approx(
            k.metrics["dram__bytes.sum.per_second"], rel=1e-3)
    matmul, _, row_sum, _, conv2d, _ = (k.metrics for k in kernels)
    # one FFMA per multiply-add, no padding work: M*N*K, and N*H*W*CO*KH*KW*CI
    assert matmul[FFMA] == 256 ** 3 and matmul[FADD] == 0
    assert conv2d[FFMA] == 14 * 14 * 256 * 3 * 3 * 256
    # the row sum's adds: 10 per thread (a serial add, then shuffles) and 32 per block, 1024 blocks of 1024
    assert row_sum[FFMA] == 0 and row_sum[FADD] == 1024 * (10 * 1024 + 32)
    assert matmul["gpu__time_duration.sum"] == pytest.approx(19.264e-6)  # "19,264" ns
    assert matmul["launch__shared_mem_per_block"] == 7936  # 6,912 static + 1,024 the driver reserves
    # A and B come from DRAM once (2 x 256 KiB); C stays in the 50 MiB L2
    assert 2 * 256 * 256 * 4 <= matmul["dram__bytes_read.sum"] < 1.1 * 2 * 256 * 256 * 4
    assert matmul["dram__bytes_write.sum"] == 0
    assert row_sum["dram__bytes_read.sum"] >= 1024 * 1024 * 4
    assert conv2d["smsp__sass_inst_executed_op_shared_ld.sum"] > 0 and matmul["smsp__inst_executed.sum"] == 657792


def test_real_raw_page_in_auto_units_agrees_with_base_units():
    """--print-units auto: us, Kbyte, Mbyte, Gbyte/s, Kbyte/block, printed with 6 decimals and no separators."""
    base = ncu_csv.parse(_fixture("real_h100_raw.csv"))
    auto = ncu_csv.parse(_fixture("real_h100_raw_auto.csv"))
    assert [(k.id, k.kernel) for k in auto] == REAL_LAUNCHES
    for b, a in zip(base, auto):
        for name in ("launch__grid_size", "launch__shared_mem_per_block", FFMA, FADD, "smsp__inst_executed.sum",
                     "device__attribute_l2_cache_size"):
            assert a.metrics[name] == pytest.approx(b.metrics[name], rel=1e-6), name
        # timed in another run of the program: the same within the noise
        assert a.metrics["gpu__time_duration.sum"] == pytest.approx(b.metrics["gpu__time_duration.sum"], rel=0.2)
        assert a.metrics["dram__bytes_read.sum"] == pytest.approx(b.metrics["dram__bytes_read.sum"], rel=0.05)
    assert auto[0].metrics["dram__bytes_read.sum"] == 532992  # "0.532992" Mbyte
    assert auto[0].metrics["gpu__time_duration.sum"] == pytest.approx(19.136e-6)  # "19.136000" us


def test_real_details_page_keeps_metric_rows_shorter_than_the_header_and_skips_rule_rows():
    """The default set: metric rows end after "Metric Value" (16 fields against a 20-column header)."""
    kernels = ncu_csv.parse(_fixture("real_h100_details.csv"))
    assert [(k.id, k.kernel) for k in kernels] == REAL_LAUNCHES
    for k in kernels:
        assert len(k.metrics) == 47 and "" not in k.metrics
        assert (k.metrics["Grid Size"], k.metrics["Block Size"]) == REAL_LAUNCH[k.kernel]
        assert 1e-6 < k.metrics["Duration"] < 1e-3
        assert 1e9 < k.metrics["DRAM Frequency"] < 1e10  # "hz"
    matmul = kernels[0].metrics
    assert matmul["Duration"] == pytest.approx(19.072e-6)  # "19,072" ns
    assert matmul["Registers Per Thread"] == 64 and matmul["Static Shared Memory Per Block"] == 6912


def test_real_details_page_of_the_asked_metrics_matches_the_raw_page():
    """--page details --metrics: the "Command line profiler metrics" section, no rule columns; cut to one
    launch of each kernel."""
    kernels = ncu_csv.parse(_fixture("real_h100_details_metrics.csv"))
    assert [(k.id, k.kernel) for k in kernels] == REAL_LAUNCHES[::2]
    raw = ncu_csv.parse(_fixture("real_h100_raw.csv"))[::2]
    for k, r in zip(kernels, raw):
        assert set(ncu_csv.STUDY_METRICS) <= set(k.metrics)
        assert k.metrics[FFMA] == r.metrics[FFMA] and k.metrics["launch__block_size"] == r.metrics["launch__block_size"]


def test_one_candidate_of_real_launches_leaves_out_ncus_bookkeeping():
    kernels = ncu_csv.parse(_fixture("real_h100_raw.csv"))
    assert "profiler__replayer_passes" in kernels[0].metrics
    metrics = ncu_csv.candidate_metrics(kernels[:2])  # the matmul's two launches
    assert not any(k.startswith("ncu.profiler__") for k in metrics)
    assert metrics["ncu.kernels"] == 2 and metrics[f"ncu.{FFMA}"] == 2 * 256 ** 3
    assert metrics["ncu.launch__grid_size"] == 32 and metrics["ncu.device__attribute_multiprocessor_count"] == 132
    features = {k for k in metrics if is_feature_metric(k)}
    assert f"ncu.{FFMA}" in features and "ncu.dram__bytes_read.sum" in features
    assert not features & {"ncu.gpu__time_duration.sum", "ncu.dram__bytes.sum.per_second", "ncu.sm__cycles_elapsed.avg"}


def test_text_without_a_csv_header_is_refused():
    with pytest.raises(ValueError, match="no ncu CSV header"):
        ncu_csv.parse("==PROF== ERR_NVGPUCTRPERM: no permission to access the GPU performance counters\n")


# --- the CPU profiler ---


def _build(directory, mcpu: str):
    """A real program of a 64x64x64 matmul for this host's cores and ``mcpu``, built the way the local
    measurer builds it."""
    import tvm

    from tunecore.measure import worker
    from tunecore.targets import host_target, resolve_target

    cores = int(host_target().attrs["num-cores"])
    task = tiny_task("matmul-64", resolve_target(json.dumps({"kind": "llvm", "mcpu": mcpu, "num-cores": cores})))
    candidate = sample_candidates(task, 1, seed=3)[0]
    worker.init_worker(task.target_json)
    path, _, _, _ = worker.build(tvm.ir.save_json(candidate.mod), task.target_json, str(directory))
    return task, path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """For AVX2 (x86-64-v3), which valgrind runs: every metric (the host's own CPU may emit AVX-512)."""
    return _build(tmp_path_factory.mktemp("ncu"), "x86-64-v3")


def test_avx512_code_gets_llvm_mca_metrics_only_even_for_a_cpu_llvm_mca_does_not_know(tmp_path):
    task, path = _build(tmp_path, "znver4")  # not in Debian 12's llvm-mca (LLVM 14): a generic x86-64-v4
    profile = cpu.profile_library(path, task.args, threads=1, mcpu="znver4")
    assert profile["cpu.avx512"] == 1.0 and profile["mca.loop_cycles"] > 0 and profile["mca.ipc"] > 0
    assert not set(cpu.CALLGRIND_METRICS) & set(profile)  # missing, not zero


def test_harness_computes_what_tvms_runtime_computes(built):
    """Pins the kernel ABI of TVM 0.27 that the harness fills in (arguments, parallel launch, workspaces)."""
    import subprocess

    import tvm

    task, path = built
    specs = cpu.tensor_specs(task.args)
    cores, _ = cpu.target_facts(task.target_json)
    out = subprocess.run([cpu.harness(), path, "main", str(cores), "outputs", *specs], capture_output=True,
                         check=True).stdout
    arrays, offset = [], 0
    for _, dtype, shape in task.args:
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        arrays.append(np.frombuffer(out[offset:offset + size], dtype=dtype).reshape(shape))
        offset += size
    assert offset == len(out)
    module = tvm.runtime.load_module(path)
    inputs = [tvm.runtime.tensor(a.copy()) for a in arrays[:-1]] + [tvm.runtime.tensor(np.zeros_like(arrays[-1]))]
    module["main"](*inputs)
    np.testing.assert_allclose(arrays[-1], inputs[-1].numpy(), rtol=1e-5)
    np.testing.assert_allclose(arrays[-1], arrays[0] @ arrays[1], rtol=1e-4)


def test_cpu_profile_of_a_real_kernel_is_deterministic_and_plausible(built):
    task, path = built
    cores, mcpu = cpu.target_facts(task.target_json)
    first = cpu.profile_library(path, task.args, threads=cores, mcpu=mcpu)
    second = cpu.profile_library(path, task.args, threads=cores, mcpu=mcpu)
    counts = [k for k in cpu.CALLGRIND_METRICS]
    assert {k: first[k] for k in counts} == {k: second[k] for k in counts}
    assert "cpu.warm" not in first and first["cpu.profile_secs"] > 0
    # one core's share of 2 x 64^3 FLOPs, vectorized 8 wide at most, with a load per FMA at most
    share = task.flops / cores
    assert share / 16 / 4 < first["cpu.instructions"] < 4 * share
    assert 0 < first["cpu.loads"] < first["cpu.instructions"] * 2
    assert first["cpu.l1_misses"] <= first["cpu.loads"] + first["cpu.stores"]
    assert first["cpu.l2_misses"] <= first["cpu.l1_misses"] + first["cpu.icache_misses"]
    assert first["mca.loop_cycles"] > 0 and first["mca.ipc"] > 0


def test_the_simulated_caches_are_the_devices_and_smaller_ones_miss_more(built, monkeypatch):
    """A profile for another machine's device simulates that device's L1/L2 sizes (counts are simulated, so
    they are what its own machine gives); a cache too small for the 48 KiB working set misses more."""
    import tunecore.targets

    task, path = built
    cores, mcpu = cpu.target_facts(task.target_json)
    with monkeypatch.context() as patch:  # the ways are this machine's: an 8-way one, then a 12-way L1 (Zen 5)
        patch.setattr(tunecore.targets, "data_caches", lambda: {1: (32768, 8, 64), 2: (524288, 8, 64)})
        cpu.cache_geometry.cache_clear()
        assert cpu.cache_geometry(32768, 524288)["L2"][0] == 524288
        assert cpu.cache_geometry(49152, 1310720)["L1"][0] == 32768  # 96 sets of 8 x 64 B: rounded to 64 sets
        patch.setattr(tunecore.targets, "data_caches", lambda: {1: (49152, 12, 64), 2: (1048576, 16, 64)})
        cpu.cache_geometry.cache_clear()
        assert cpu.cache_geometry(49152, 1310720)["L1"] == (49152, 12, 64)  # 64 sets of 12 x 64 B
    cpu.cache_geometry.cache_clear()  # this machine's again
    small = cpu.profile_library(path, task.args, threads=cores, mcpu=mcpu, caches=cpu.cache_geometry(4096, 16384))
    large = cpu.profile_library(path, task.args, threads=cores, mcpu=mcpu, caches=cpu.cache_geometry(65536, 1 << 20))
    assert small["cpu.instructions"] == large["cpu.instructions"]
    assert small["cpu.l1_misses"] > large["cpu.l1_misses"] and small["cpu.l2_misses"] >= large["cpu.l2_misses"]


def test_hot_loop_is_the_innermost_loop_with_the_most_floating_point_work():
    code = [(0x10, "mov", "%rax,%rbx"),
            (0x14, "vaddps", "%ymm0,%ymm1,%ymm1"),  # outer loop 0x10..0x40
            (0x18, "vfmadd231ps", "(%rax),%ymm2,%ymm3"),  # inner loop A 0x18..0x20: 16 FLOPs
            (0x20, "jne", "18 <f+0x8>"),
            (0x24, "vmulss", "%xmm0,%xmm1,%xmm1"),  # inner loop B 0x24..0x2c: 1 FLOP
            (0x2c, "jne", "24 <f+0x14>"),
            (0x40, "jne", "10 <f>")]
    assert cpu.hot_loop(code) == [("vfmadd231ps", "(%rax),%ymm2,%ymm3"), ("jne", "18 <f+0x8>")]
    assert cpu.hot_loop(code[:2]) is None
    assert cpu.uses_avx512([(0, "vfmadd231ps", "%zmm0,%zmm1,%zmm2")])
    # EVEX on xmm/ymm: registers 16-31 and embedded broadcasts (valgrind stops at them too)
    assert cpu.uses_avx512([(0, "vxorps", "%xmm16,%xmm16,%xmm16")])
    assert cpu.uses_avx512([(0, "vfmadd231ps", "(%rax){1to8},%ymm1,%ymm2")])
    assert not cpu.uses_avx512(code) and not cpu.uses_avx512([(0, "vxorps", "%xmm1,%xmm15,%xmm15")])


def test_a_missing_tool_names_the_package_to_install(monkeypatch, tmp_path):
    original = shutil.which
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "valgrind" else original(tool))
    from tunecore.errors import UsageError

    with pytest.raises(UsageError, match="apt-get install valgrind"):
        cpu.check_tools()
    # the command, in a process whose PATH lacks valgrind
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("llvm-mca", "objdump", "cc"):
        os.symlink(original(tool), bin_dir / tool)
    result = run_cli("ncu", "profile", "--dataset", SHIPPED, "--limit", "1", env={"PATH": str(bin_dir)})
    assert_one_line_exit_2(result, "valgrind", "apt-get install valgrind")
    # a run whose cost model needs the profiler: refused before anything is measured
    result = run_cli("run", "--model", "op:matmul-64", "--cost-model", "ncu", "--trials", "4", "--store",
                     str(tmp_path / "x.db"), env={"PATH": str(bin_dir)})
    assert_one_line_exit_2(result, "apt-get install valgrind")


# --- the dataset command ---


def _host_avx2() -> tuple[str, dict, str]:
    """This machine's device for an AVX2 target (code valgrind runs on any AVX2 host): id, description, target."""
    from tunecore.targets import device_descriptor, device_id, resolve_target
    from tunecore.tvmjson import target_to_json

    target = resolve_target(json.dumps({"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 1}))
    descriptor = device_descriptor(target)
    return device_id(descriptor), descriptor, target_to_json(target)


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory) -> str:
    """6 programs of each of two bert-tiny tasks of the shipped dataset, as if measured on this machine (its
    device for an AVX2 target, whatever CPU runs the tests), as a dataset file; and one row of another machine's
    device (the shipped dataset's may be this machine's: it was collected on a Zen 3)."""
    import dataclasses

    shipped = Dataset.load(SHIPPED)
    here, descriptor, target_json = _host_avx2()
    source = next(d for d, info in sorted(shipped.devices.items(), key=lambda item: item[1]["mcpu"] != "x86-64-v3"))
    part = Dataset()
    part.add_device(descriptor)
    elsewhere = part.add_device({**descriptor, "cpu": "another CPU", "family_model": "0/0", "l2_bytes": 1 << 20})
    keys = sorted(k for k, t in shipped.tasks.items()
                  if "zoo:bert-tiny" in t.workloads and len(shipped.rows_of(k, source)) >= 16)[:2]
    for key in keys:
        part.add_task(shipped.tasks[key])
        rows = [r for r in shipped.rows_of(key, source) if r.latency and r.latency < 5e-3]
        for row in rows[:6]:
            part.add(dataclasses.replace(row, device_id=here, target=target_json, profile={}))
        part.add(dataclasses.replace(rows[6], device_id=elsewhere, target=target_json, profile={}))
    path = str(tmp_path_factory.mktemp("profile") / "small.parquet")
    part.save(path)
    return path


def test_profile_command_adds_metrics_to_rows_and_resumes(small_dataset):
    started = run_cli("ncu", "profile", "--dataset", small_dataset, "--limit", "3", "--json")
    first = cli_json(started)
    assert first["profiled"] + first["failed"] == 3 and first["rows_with_profile"] == 3
    assert "profiling: 3/3" in started.stderr  # a log file (nohup ... &) says where the job stands
    second = cli_json(run_cli("ncu", "profile", "--dataset", small_dataset, "--limit", "100", "--per-task", "4",
                              "--json"))
    assert second["rows_with_profile"] == 8  # 4 per task: the 3 before counted, none profiled twice
    rows = [r for r in Dataset.load(small_dataset).rows if "cpu.instructions" in r.profile]
    assert len(rows) >= 7 and all(r.profile["cpu.instructions"] > 0 and "mca.ipc" in r.profile for r in rows)
    # another machine's device is profiled only when named; a profile an earlier version made warm is made again
    here = _host_avx2()[0]
    data = Dataset.load(small_dataset)
    stale = next(r for r in data.rows if "cpu.instructions" in r.profile)
    stale.profile = {"cpu.warm": 1.0, "cpu.instructions": 1.0}
    data.save(small_dataset)
    elsewhere = next(r.device_id for r in data.rows if r.device_id != here)
    third = cli_json(run_cli("ncu", "profile", "--dataset", small_dataset, "--limit", "100", "--devices",
                             f"{here},{elsewhere}", "--json"))
    assert third["profiled"] + third["failed"] == 7 and third["rows_with_profile"] == 14
    data = Dataset.load(small_dataset)
    assert all(r.profile["cpu.instructions"] > 1 and "cpu.warm" not in r.profile
               for r in data.rows if "cpu.failed" not in r.profile)
    assert sum("cpu.instructions" in r.profile for r in data.rows if r.device_id == elsewhere) >= 1
    # a failed row is tried again only when asked (after a fix of the tools)
    failed = next(r for r in data.rows if r.device_id == here and "cpu.instructions" in r.profile)
    failed.profile = {"cpu.failed": 1.0}
    data.save(small_dataset)
    assert cli_json(run_cli("ncu", "profile", "--dataset", small_dataset, "--limit", "100", "--json"))["total"] == 0
    retried = cli_json(run_cli("ncu", "profile", "--dataset", small_dataset, "--limit", "100", "--retry-failed",
                               "--json"))
    assert retried["profiled"] == 1, retried
    assert next(r for r in Dataset.load(small_dataset).rows if r.program_key == failed.program_key
                and r.device_id == here).profile["cpu.instructions"] > 0


def test_avx512_programs_get_their_twins_callgrind_counts(tmp_path):
    """`ncu profile` of rows built for an AVX-512 CPU: llvm-mca reads their own code, callgrind runs the same
    schedules built for the nearest CPU of the line without AVX-512 (znver3 for znver4 and znver5)."""
    import dataclasses

    from tunecore.targets import device_descriptor, resolve_target
    from tunecore.tvmjson import target_to_json

    assert json.loads(cpu.twin_target('{"kind": "llvm", "mcpu": "znver5"}'))["mcpu"] == "znver3"
    assert json.loads(cpu.twin_target('{"kind": "llvm", "mcpu": "icelake-server"}'))["mcpu"] == "x86-64-v3"
    target = resolve_target(json.dumps({"kind": "llvm", "mcpu": "znver4", "num-cores": 1}))
    shipped = Dataset.load(SHIPPED)
    part = Dataset()
    here = part.add_device(device_descriptor(target))
    for key, task in sorted(shipped.tasks.items()):
        if "zoo:bert-tiny" in task.workloads and "matmul" in task.kernel_class and len(part.tasks) < 2:
            part.add_task(task)
            for row in [r for r in shipped.rows if r.task_key == key and r.latency and r.latency < 5e-3][:2]:
                part.add(dataclasses.replace(row, device_id=here, target=target_to_json(target), profile={}))
    path = str(tmp_path / "avx512.parquet")
    part.save(path)
    report = cli_json(run_cli("ncu", "profile", "--dataset", path, "--limit", "4", "--json"))
    assert report["profiled"] == 4, report
    rows = Dataset.load(path).rows
    # every program of the AVX-512 device counted by its twin, whether its own code is AVX-512 or not
    assert all(r.profile["cpu.twin"] == 1.0 and r.profile["cpu.instructions"] > 0 and r.profile["mca.ipc"] > 0
               for r in rows)
    assert any(r.profile.get("cpu.avx512") == 1.0 for r in rows)
    # a row counted by its own code (an earlier version, code without AVX-512) is made again, by its twin
    data = Dataset.load(path)
    data.rows[0].profile = {"cpu.instructions": 1.0, "mca.ipc": 1.0}
    data.save(path)
    again = cli_json(run_cli("ncu", "profile", "--dataset", path, "--limit", "4", "--json"))
    assert again["profiled"] == 1 and Dataset.load(path).rows[0].profile["cpu.twin"] == 1.0, again
    # a program whose twin did not build cannot be counted like its task's others: it fails
    with pytest.raises(RuntimeError, match="twin"):
        cpu.profile_library(_build(tmp_path, "x86-64-v3")[1], [], threads=1, mcpu="znver4", twin="")
    assert json.loads(cpu.twin_target('{"kind": "llvm", "mcpu": "x86-64", "mattr": ["+avx512f", "+fma"]}'))[
        "mattr"] == ["+fma", "-avx512f"]
    # what the disassembly alone misses: EVEX code on xmm/ymm registers 0-15 (AVX-512VL), seen in the bytes
    assert not cpu.evex_encoded(_build(tmp_path, "x86-64-v3")[1])
    objdump = ("  401000:\tc5 fc 10 00          \tvmovups (%rax),%ymm0\n"
               "  401004:\t62 f3 75 28 25 c2 96 \tvpternlogd $0x96,%ymm2,%ymm1,%ymm0\n")
    assert cpu.has_evex_line(objdump) and not cpu.has_evex_line(objdump.splitlines()[0])
    continuation = "  401000:\t48 8b 84 24 00 01 00 \tmov 0x100(%rsp),%rax\n  401007:\t62 \n"
    assert not cpu.has_evex_line(continuation)


def test_avx2_masked_stores_are_counted(tmp_path):
    """A conv of resnet-18 from dataset v2 whose twin (znver3) code stores its tile edges with vmaskmovps in long
    unrolled blocks: valgrind 3.19 aborted translating them with cache simulation on (2% of v2's Zen 5 rows)."""
    import tvm

    from tunecore.interfaces import Candidate, LocalBuilder, target_from_json

    data = Dataset.load(os.path.join(ROOT, "datasets", "cpu-programs-v2.parquet"))
    row = next(r for r in data.rows if r.program_key == "18693407c3d23b65")
    task = data.tasks[row.task_key]
    twin = cpu.twin_target(row.target)
    builder = LocalBuilder(target_from_json(twin))
    try:
        (artifact,) = builder.build([tvm.ir.save_json(Candidate(task.for_target(row.target), row.trace).mod)])
        assert any(mnemonic == "vmaskmovps" for _, mnemonic, _ in cpu.disassemble(artifact.path))
        counts = cpu.callgrind(artifact.path, "main", 1, artifact.arguments(task), caches=cpu.cache_geometry(),
                               timeout=120)
    finally:
        builder.close()
    # the whole conv on one core (3x3, 64 -> 128 channels, 28x28 out), 8 FLOPs a lane, 8 lanes, a load per FMA at most
    assert counts["cpu.instructions"] > task.flops / 16 / 4 and counts["cpu.stores"] > 0


def test_profile_command_refuses_bad_input(small_dataset, tmp_path):
    assert_one_line_exit_2(run_cli("ncu", "profile", "--dataset", str(tmp_path / "none.parquet"), "--limit", "1"),
                           "no such file")
    assert_one_line_exit_2(run_cli("ncu", "profile", "--dataset", small_dataset, "--limit", "0"), "--limit")
    assert_one_line_exit_2(run_cli("ncu", "profile", "--dataset", small_dataset, "--limit", "1",
                                   "--workloads", "zoo:nope"), "zoo:nope")


# --- the cost model ---


def test_two_stages_learn_metrics_and_latency_from_profiled_programs():
    """Stage A is trained on the profiled programs; stage B then predicts latency from stage A's predictions."""
    from tunecore.testing.helpers import tiled_latency

    task = tiny_task("matmul-64")
    programs = sample_candidates(task, 192, seed=5)
    model = NcuModel(min_profiles=8)
    results = []
    for i, c in enumerate(programs):
        latency = tiled_latency(c)
        # made-up counts that follow the latency, on every other program: what a profiler would add
        profile = {"cpu.instructions": 1e6 * latency / 1e-5, "cpu.l1_misses": 2e4 * latency / 1e-5,
                   "cpu.profile_secs": 1.0} if i % 8 else {}
        results.append(MeasureResult(run_secs=[latency], profile=profile))
    model.update(task, programs[:128], results[:128])
    assert model.stage_b_metrics and set(model.stage_a) == {"cpu.instructions", "cpu.l1_misses"}
    unseen = programs[128:]
    predicted = model.predict_latency(task, unseen)
    assert np.all(np.isfinite(predicted)) and np.all(predicted > 0)
    truth = np.array([tiled_latency(c) for c in unseen])
    assert np.corrcoef(np.log(predicted), np.log(truth))[0, 1] > 0.3


def test_stage_b_can_rank_within_tasks_instead_of_predicting_seconds(tmp_path):
    """objective=rank: stage B orders each task's programs (pairwise ranking); it gives no seconds, and keeps its
    objective in its file."""
    from scipy import stats

    from tunecore.testing.helpers import tiled_latency

    tasks = [tiny_task("matmul-64"), tiny_task("matmul-128")]
    model = NcuModel(min_profiles=8, objective="rank")
    assert not model.predicts_latency and NcuModel().predicts_latency
    held = []
    for seed, task in enumerate(tasks):
        programs = sample_candidates(task, 160, seed=seed)
        results = [MeasureResult(run_secs=[tiled_latency(c)], profile={
            "cpu.instructions": 1e6 * tiled_latency(c) / 1e-5, "cpu.profile_secs": 1.0} if i % 4 else {})
            for i, c in enumerate(programs)]
        model.update(task, programs[:120], results[:120])
        held.append((task, programs[120:]))
    for task, unseen in held:
        truth = np.array([tiled_latency(c) for c in unseen])
        assert stats.spearmanr(model.predict(task, unseen), -truth).statistic > 0.3
    with pytest.raises(NotImplementedError):
        model.predict_latency(*held[0])
    path = str(tmp_path / "ncu.json")
    model.save(path)
    loaded = NcuModel()
    loaded.load(path)
    assert loaded.objective == "rank" and not loaded.predicts_latency
    np.testing.assert_allclose(loaded.predict(*held[0]), model.predict(*held[0]))


def test_oracle_reads_the_metrics_of_the_programs_it_ranks(tmp_path):
    task = tiny_task("matmul-64")
    programs = sample_candidates(task, 40, seed=6)
    rng = np.random.default_rng(0)
    latencies = rng.uniform(1e-5, 1e-3, len(programs))
    from tunecore.targets import device_descriptor

    dataset = Dataset()
    dataset.add_task(task)
    device = dataset.add_device(device_descriptor(task.target))
    from tunecore.dataset.table import Measurement

    for c, latency in zip(programs, latencies):
        dataset.add(Measurement(task.workload_hash, c.key, c.trace_json, device, task.target_json, [latency],
                                profile={"cpu.instructions": 1e9 * latency, "cpu.profile_secs": 5.0}))
    path = str(tmp_path / "oracle.parquet")
    dataset.save(path)
    model = NcuModel(oracle=path, min_profiles=4, min_data=4, rounds=50)
    model.update(task, programs[:30], [MeasureResult(run_secs=[x]) for x in latencies[:30]])
    order = np.argsort(-model.predict(task, programs[30:]))
    assert list(order[:3]) == list(np.argsort(latencies[30:])[:3])  # the metric says it all


def test_a_run_with_ncu_profiles_candidates_and_records_carry_the_metrics(tmp_path):
    store = str(tmp_path / "run.db")
    out = cli_json(run_cli("run", "--model", "op:matmul-128", "--search", "ansor", "--cost-model", "ncu",
                           "--trials", "24", "--store", store, "--json"))
    assert out["trials_measured"] == 24
    from tunecore.store.sqlite import SqliteStore

    opened = SqliteStore(store)
    records = [r for t in opened.get_tasks() for r in opened.records(t.task_id)]
    profiled = [r for r in records if "cpu.profile_secs" in r.profile]
    assert 3 <= len(profiled) < len(records)  # a sample: every new best and every 8th candidate
    # this host's code runs under valgrind unless it uses AVX-512
    for r in profiled:
        assert "mca.loop_cycles" in r.profile and (r.profile.get("cpu.instructions", 0) > 0 or r.profile["cpu.avx512"])


def test_ncu_model_options_are_checked():
    from tunecore.errors import UsageError

    with pytest.raises((UsageError, ValueError, TypeError)):
        NcuModel(folds=1)
    with pytest.raises(TypeError, match="objective must be latency or rank"):
        NcuModel(objective="mape")
    assert json.loads(json.dumps(NcuModel().profilers(tiny_task().target))) == ["cpu"]
