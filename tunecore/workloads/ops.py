"""Single-operator workloads (``op:<name>``): one TIR function each, from MetaSchedule's te_workload set.

Names:
  matmul-N, matmul-MxNxK                 fp32 matmul (C[M,N] = A[M,K] B[K,N])
  <ansor-code>-<i>                       Ansor's single-op benchmark set, lower-case code and config index:
                                         c1d c2d c3d gmm grp dil dep t2d cap nrm sfm cbr tbg (e.g. c2d-2)
  conv2d-resnet50-c2 ...                 named layers of real networks, see NAMED_OPS
"""

from __future__ import annotations

import re
from typing import Any, Callable

from tunecore.errors import UsageError

# Real layers used by the benchmarks: (te_workload function name, arguments)
NAMED_OPS: dict[str, tuple[str, tuple]] = {
    # ResNet-50 conv2_x 3x3: 56x56x64 -> 64, stride 1, pad 1 (NHWC)
    "conv2d-resnet50-c2": ("conv2d_nhwc", (1, 56, 56, 64, 64, 3, 1, 1)),
    # ResNet-50 conv3_x 3x3 stride 2 entry
    "conv2d-resnet50-c3": ("conv2d_nhwc", (1, 56, 56, 128, 128, 3, 2, 1)),
    # MobileNetV2 block 2 depthwise 3x3 on 56x56x144
    "dwconv-mobilenetv2": ("depthwise_conv2d_nhwc", (1, 56, 56, 144, 3, 1, 1)),
    # BERT-base FFN dense: [128, 768] x [768, 3072]
    "dense-bert": ("matmul", (128, 3072, 768)),
    # BERT-base attention scores: 12 heads of [128, 64] x [64, 128]
    "batch-matmul-bert": ("batch_matmul_nkkm", (12, 128, 128, 64)),
}

_ANSOR_CODES = ("C1D", "C2D", "C3D", "GMM", "GRP", "DIL", "DEP", "T2D", "CAP", "NRM", "SFM", "CBR", "TBG")


def op_names() -> list[str]:
    """Every name ``op:`` accepts (matmul sizes are open-ended; a few examples are listed)."""
    return ["matmul-64", "matmul-512", "matmul-1024", "matmul-128x768x3072", *ansor_op_names(), *sorted(NAMED_OPS)]


def ansor_op_names() -> list[str]:
    """Ansor's single-operator benchmark set (``op:ansor``)."""
    from tvm.s_tir.meta_schedule.testing import te_workload

    return [f"{code.lower()}-{i}" for code in _ANSOR_CODES for i in range(len(te_workload.CONFIGS[code][1]))]


def build_op(name: str) -> Any:
    """IRModule with the PrimFunc "main" of the named operator; UsageError for an unknown name."""
    import tvm
    from tvm import te
    from tvm.s_tir.meta_schedule.testing import te_workload

    func: Callable
    match = re.fullmatch(r"matmul-(\d+)(?:x(\d+)x(\d+))?", name)
    if match:
        m = int(match.group(1))
        n, k = (int(match.group(2)), int(match.group(3))) if match.group(2) else (m, m)
        if not (0 < m <= 16384 and 0 < n <= 16384 and 0 < k <= 16384):
            raise UsageError(f"op:{name}: sizes must be between 1 and 16384")
        func, args = te_workload.matmul, (m, n, k)
    elif name in NAMED_OPS:
        func_name, args = NAMED_OPS[name]
        func = getattr(te_workload, func_name)
    else:
        match = re.fullmatch(r"([a-z0-9]+)-(\d+)", name)
        code = match.group(1).upper() if match else ""
        if code not in _ANSOR_CODES or int(match.group(2)) >= len(te_workload.CONFIGS[code][1]):
            raise UsageError(f"unknown operator 'op:{name}'; known: {', '.join(op_names())} "
                             "(and matmul-N or matmul-MxNxK for any sizes from 1 to 16384)")
        func, configs = te_workload.CONFIGS[code]
        args = configs[int(match.group(2))]
    prim_func = te.create_prim_func(func(*args)).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": prim_func})
