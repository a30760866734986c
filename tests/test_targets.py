import json
import os
import re
import subprocess
import sys

import pytest

from tunecore.errors import UsageError
from tunecore.targets import device_descriptor, host_mcpu, resolve_target
from tunecore.tvmjson import target_from_json, target_to_json


def _flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def test_llvm_is_this_host_with_its_vector_isa():
    from tvm.target import codegen

    target = resolve_target("llvm")
    assert target.kind.name == "llvm" and target.attrs["mcpu"] == host_mcpu() != "generic"
    features = codegen.llvm_get_cpu_features(target)
    flags = _flags()
    for flag in ("avx2", "fma", "avx512f"):
        assert (flag in flags) == (flag in features), flag


def test_json_round_trip_is_canonical():
    target = resolve_target("llvm")
    text = target_to_json(target)
    assert target_to_json(target_from_json(text)) == text
    assert json.loads(text)["kind"] == "llvm"


def test_json_targets_and_cuda_without_gpu():
    """A JSON target keeps its mcpu; `cuda` resolves without a GPU (sm_50 limits, or the GPU's when there is one)
    and a program of its design space compiles to CUDA source with a kernel: TVM generates the code with neither a
    GPU nor nvcc (the module holds the source; only running it needs a GPU)."""
    import tvm

    from tunecore.testing import sample_candidates, tiny_task

    assert resolve_target('{"kind": "llvm", "mcpu": "haswell", "num-cores": 4}').attrs["mcpu"] == "haswell"
    target = resolve_target("cuda")
    assert target.kind.name == "cuda" and str(target.attrs["arch"]).startswith("sm_")
    task = tiny_task("matmul-64", target)
    (candidate,) = sample_candidates(task, 1)  # thread-bound by the GPU rules of MetaSchedule's design space
    executable = tvm.compile(candidate.sch.mod, target=target)
    (device_module,) = [m for m in executable.mod.imports if m.kind == "cuda"]
    source = device_module.inspect_source()
    assert re.search(r'extern "C" __global__ void (__launch_bounds__\(\d+\) )?\w+\(float\* __restrict__ A', source), \
        source[-2000:]
    assert "threadIdx.x" in source and "blockIdx.x" in source


@pytest.mark.parametrize("spec", ["{bad", "[1, 2]", '{"kind": "nosuch"}', '{"kind": "llvm", "mcpu": "bogus"}',
                                  "llvm -mcpu=znver1"])
def test_bad_targets_are_usage_errors(spec):
    with pytest.raises(UsageError):
        resolve_target(spec)


def test_device_descriptor_of_the_host():
    from tunecore.targets import physical_cores

    desc = device_descriptor(resolve_target("llvm"))
    flags = _flags()
    assert desc["cores"] == physical_cores()
    assert desc["vector_bits"] == (512 if "avx512f" in flags else 256 if "avx" in flags else 128)
    assert desc.get("l1_bytes", 0) > 0 and desc.get("l2_bytes", 0) > 0


def test_kernels_run_on_as_many_threads_as_the_target_has_cores():
    # TVM alone halves the CPU count on x86 (it assumes hyper-threading): on this 2-core machine
    # without it, every parallel kernel ran on one core.
    code = (
        "import tvm; from tunecore.targets import use_target_threads; "
        "import os; t = tvm.target.Target({'kind': 'llvm', 'num-cores': os.cpu_count()}); "
        "print(use_target_threads(t), tvm.get_global_func('runtime.NumThreads')())"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "TUNECORE_SET_TVM_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(os.cpu_count())] * 2


def test_a_targets_tensor_intrinsics_register_and_inspect_is_left_as_it_was():
    """The import is made fast by answering inspect.getmodule for frames of no file (tunecore.targets); the
    intrinsics are TVM's all the same, and inspect is restored."""
    import inspect

    from tvm.s_tir import TensorIntrin

    from tunecore.targets import load_tensor_intrinsics

    walk = inspect.getmodule
    load_tensor_intrinsics(resolve_target('{"kind": "cuda", "arch": "sm_90"}'))
    assert inspect.getmodule is walk
    assert TensorIntrin.get("mma_ldmatrix_f16_a", allow_missing=True) is not None
