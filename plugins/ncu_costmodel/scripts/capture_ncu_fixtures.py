"""How tests/fixtures/real_h100_*.csv were made: real ncu output of three TVM-scheduled CUDA kernels.

    python plugins/ncu_costmodel/scripts/capture_ncu_fixtures.py generate DIR   # here, with TVM: the sources
    bash DIR/capture.sh OUT                                                      # on a GPU machine: ncu's CSVs
    python plugins/ncu_costmodel/scripts/capture_ncu_fixtures.py fixtures OUT    # here: into tests/fixtures

The GPU machine needs nvcc and ncu, not TVM: ``generate`` writes TVM's CUDA source (kernels.cu) and a driver
(main.cu) that allocates the buffers, launches each kernel twice with the grid and block TVM chose, and checks
a few matmul outputs against the CPU. The kernels (tvm 0.27.0.post1, target cuda sm_90):

- ``matmul_kernel``: 256x256x256 fp32 matmul, dlight's GPU Matmul rule; grid (8, 4, 1), block (8, 16, 1);
- ``row_sum_kernel``: sum over the rows of a 1024x1024 fp32 matrix, dlight's GPU Reduction rule; grid 1024,
  block 1024;
- ``conv2d_kernel``: NHWC conv2d 1x14x14x256 -> 256, 3x3, pad 1, one MetaSchedule sample (rand_state 7; the
  first of re-sampled seeds that passes the CUDA postprocessors) of the design space: grid 16, block 196,
  cp.async software pipelining.

Captured on an NVIDIA H100 80GB HBM3 (132 SMs), driver 580.159.04, CUDA 13.0 (nvcc V13.0.88),
Nsight Compute 2025.3.1.0 (build 36398880). All of STUDY_METRICS were accepted; the study's four
``sass__inst_executed_*`` names were too, but gave "n/a" (details) or no column (raw), hence their
replacements in ncu_csv.STUDY_METRICS.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(os.path.dirname(HERE), "tests", "fixtures")

# counts beside the study's metrics: FLOP instructions (for checking against the workloads) and DRAM totals
EXTRA_METRICS = ("smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
                 "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",
                 "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum", "dram__bytes.sum.per_second",
                 "sm__cycles_elapsed.avg", "dram__bytes.sum")

CAPTURE_SH = r"""#!/bin/bash
# On the GPU machine: versions, build, run, then ncu in each layout the parser reads; all into $1.
cd "$(dirname "$0")"
OUT=${1:-/tmp/capture}; mkdir -p $OUT
{ nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv;
  nvcc --version; ncu --version; } > $OUT/versions.txt 2>&1
nvcc -O3 -arch=sm_90 -o bin main.cu > $OUT/nvcc.txt 2>&1 || exit 1
./bin > $OUT/run.txt 2>&1 || exit 1
M=$(cat metrics.txt)
# the profiler's own call (profilers.NcuProfiler): raw page, base units
ncu --csv --page raw --print-units base --metrics "$M" ./bin > $OUT/raw_base.csv 2> $OUT/raw_base.err
# the default details page: default set, auto units, rule rows
ncu --csv --page details ./bin > $OUT/details_default.csv 2> $OUT/details_default.err
# raw page, auto units
ncu --csv --page raw --print-units auto --metrics "$M" ./bin > $OUT/raw_auto.csv 2> $OUT/raw_auto.err
# details page of the asked metrics alone ("Command line profiler metrics", no rule columns)
ncu --csv --page details --metrics "$M" ./bin > $OUT/details_metrics.csv 2> $OUT/details_metrics.err
grep -h "==ERROR==\|==WARNING==" $OUT/*.err $OUT/*.csv
"""


def generate(folder: str) -> None:
    import numpy as np
    import tvm
    from tunecore_ncu_costmodel.ncu_csv import STUDY_METRICS
    from tvm import te
    from tvm.s_tir import dlight as dl
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.testing import te_workload
    from tvm.s_tir.schedule import Schedule, Trace

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90", "max_shared_memory_per_block": 49152,
                                "max_threads_per_block": 1024, "thread_warp_size": 32})

    def matmul():
        A = te.placeholder((256, 256), "float32", name="A")
        B = te.placeholder((256, 256), "float32", name="B")
        k = te.reduce_axis((0, 256), "k")
        C = te.compute((256, 256), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
        with target:
            return dl.ApplyDefaultSchedule(dl.gpu.Matmul())(tvm.IRModule({"main": te.create_prim_func([A, B, C])}))

    def row_sum():
        X = te.placeholder((1024, 1024), "float32", name="X")
        k = te.reduce_axis((0, 1024), "k")
        Y = te.compute((1024,), lambda i: te.sum(X[i, k], axis=k), name="Y")
        with target:
            return dl.ApplyDefaultSchedule(dl.gpu.Reduction())(tvm.IRModule({"main": te.create_prim_func([X, Y])}))

    def conv2d():
        mod = tvm.IRModule({"main": te.create_prim_func(te_workload.conv2d_nhwc(1, 14, 14, 256, 256, 3, 1, 1))})
        ctx = ms.TuneContext(mod, target=target, space_generator="post-order-apply",
                             search_strategy="replay-trace", rand_state=7, num_threads=1)
        spaces = ctx.generate_design_space()
        for seed in range(1, 200):  # re-sample the space's decisions until the postprocessors accept one
            sch = Schedule(mod, seed=seed)
            try:
                Trace(spaces[seed % len(spaces)].trace.insts, {}).apply_to_schedule(sch, remove_postproc=True)
            except Exception:  # noqa: BLE001 -- an invalid sample
                continue
            if all(p.apply(sch) for p in ctx.space_generator.postprocs):
                return sch.mod
        raise RuntimeError("no valid conv2d schedule")

    funcs = {"matmul": matmul()["main"], "row_sum": row_sum()["main"], "conv2d": conv2d()["main"]}
    mod = tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in funcs.items()})
    source = tvm.compile(mod, target).mod.imports[0].inspect_source("cuda")
    assert "extern __shared__" not in source, "dynamic shared memory: the driver does not pass it"
    os.makedirs(folder, exist_ok=True)
    kernels = []
    for name, func in funcs.items():
        match = re.search(r'extern "C" __global__ void __launch_bounds__\((\d+)\) ' + name + r"_kernel\(([^)]*)\)",
                          source)
        params = [p.strip().split()[-1] for p in match.group(2).split(",")]
        sizes = {buf.name + "_ptr": int(np.prod([int(x) for x in buf.shape])) for buf in func.params}
        dims = {}  # static thread extents, off the scheduled TIR
        for extent, tag in re.findall(r'T\.thread_binding\((\d+), thread="((?:blockIdx|threadIdx)\.[xyz])"',
                                      func.script()):
            dims[tag] = int(extent)
        grid = [dims.get(f"blockIdx.{a}", 1) for a in "xyz"]
        block = [dims.get(f"threadIdx.{a}", 1) for a in "xyz"]
        assert int(np.prod(block)) == int(match.group(1)), (name, block)
        kernels.append((f"{name}_kernel", params, sizes, grid, block))
    lines = ["#include <cstdio>", "#include <cstdlib>", "#include <vector>", '#include "kernels.cu"', "",
             "#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { "
             'printf("%s: %s\\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)', "",
             "static float* buffer(size_t n, int seed) {", "  std::vector<float> host(n);",
             "  for (size_t i = 0; i < n; ++i) host[i] = (float)((i * 7 + seed) % 13) / 13.0f;",
             "  float* d; CHECK(cudaMalloc(&d, n * sizeof(float)));",
             "  CHECK(cudaMemcpy(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice)); return d;", "}", "",
             "int main() {"]
    for name, params, sizes, grid, block in kernels:
        for i, p in enumerate(params):
            lines.append(f"  float* {name}_{p} = buffer({sizes[p]}, {i});")
        args = ", ".join(f"{name}_{p}" for p in params)
        lines += ["  for (int r = 0; r < 2; ++r) {",
                  f"    {name}<<<dim3({grid[0]}, {grid[1]}, {grid[2]}), dim3({block[0]}, {block[1]}, {block[2]})>>>"
                  f"({args});", "    CHECK(cudaGetLastError());", "  }", "  CHECK(cudaDeviceSynchronize());"]
    a, b, c = (f"matmul_kernel_{p}" for p in kernels[0][1])
    lines += ["  {", "    std::vector<float> A(256 * 256), B(256 * 256), C(256 * 256);",
              f"    CHECK(cudaMemcpy(A.data(), {a}, A.size() * 4, cudaMemcpyDeviceToHost));",
              f"    CHECK(cudaMemcpy(B.data(), {b}, B.size() * 4, cudaMemcpyDeviceToHost));",
              f"    CHECK(cudaMemcpy(C.data(), {c}, C.size() * 4, cudaMemcpyDeviceToHost));",
              "    double worst = 0;",
              "    for (int i = 0; i < 256; i += 37) for (int j = 0; j < 256; j += 41) {",
              "      double s = 0; for (int k = 0; k < 256; ++k) s += A[i * 256 + k] * B[k * 256 + j];",
              "      double d = s - C[i * 256 + j]; if (d < 0) d = -d; if (d > worst) worst = d;", "    }",
              '    printf("matmul check: max abs error %g\\n", worst);', "  }",
              '  printf("done\\n");', "  return 0;", "}"]
    files = {"kernels.cu": source, "main.cu": "\n".join(lines) + "\n", "capture.sh": CAPTURE_SH,
             "metrics.txt": ",".join(STUDY_METRICS + EXTRA_METRICS),
             "kernels.json": json.dumps(kernels, indent=1)}
    for name, text in files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)


def fixtures(capture: str) -> None:
    """The captured CSVs as fixtures; the details page of the asked metrics cut to one launch of each kernel."""
    for source, target in (("raw_base.csv", "real_h100_raw.csv"), ("raw_auto.csv", "real_h100_raw_auto.csv"),
                           ("details_default.csv", "real_h100_details.csv")):
        shutil.copyfile(os.path.join(capture, source), os.path.join(FIXTURES, target))
    with open(os.path.join(capture, "details_metrics.csv")) as f:
        kept = [line for line in f if not line.startswith('"') or line.startswith(('"ID"', '"0"', '"2"', '"4"'))]
    with open(os.path.join(FIXTURES, "real_h100_details_metrics.csv"), "w") as f:
        f.writelines(kept)


if __name__ == "__main__":
    {"generate": generate, "fixtures": fixtures}[sys.argv[1]](sys.argv[2])
