"""Functions that run inside the local measurer's worker processes.

Workers live for the whole run: TVM is imported once per worker, and only the target's tensor
intrinsics are registered (not the whole tensor_intrin package that MetaSchedule's builder imports).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

_last_args: tuple[str, Any] | None = None  # runner: the arguments of the last task, reused across its candidates


def init_worker(target_json: str) -> None:
    from tunecore.targets import load_tensor_intrinsics, use_target_threads
    from tunecore.tvmjson import target_from_json

    target = target_from_json(target_json)
    use_target_threads(target)
    load_tensor_intrinsics(target)


def _fill(tensor: Any) -> None:
    """Random floats; zeros for integers, which are often indices (embedding ids, gather positions):
    random ones would point out of bounds and crash the kernel, while zero is valid for any non-empty axis."""
    import numpy as np
    import tvm

    dtype = str(tensor.dtype)
    if dtype.startswith(("int", "uint", "bool")):
        tensor.copyfrom(np.zeros([int(d) for d in tensor.shape], dtype=dtype))
    else:
        tvm.get_global_func("tvm.contrib.random.random_fill_for_measure")(tensor)


def ping() -> int:
    return os.getpid()


def loaded(module: str) -> bool:
    """Whether this worker has imported ``module`` (tests check that torch stays out)."""
    import sys

    return module in sys.modules


def build(mod_json: str, target_json: str, artifact_dir: str) -> tuple[str, float, list]:
    """Compile a scheduled module into a shared library; returns (its path, build seconds, its arguments).

    The arguments are the built function's: a weight that RewriteLayout packed is passed packed, as the
    compiled model passes it (the packing runs once, at compile time, and is not timed).
    """
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build

    from tunecore.tvmjson import target_from_json, to_plain

    start = time.perf_counter()
    mod = tvm.ir.load_json(mod_json)
    library = default_build(mod, target_from_json(target_json), None)
    path = os.path.join(artifact_dir, f"{uuid.uuid4().hex}.so")
    library.export_library(path)
    args = to_plain([a.as_json() for a in ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True)])
    return path, time.perf_counter() - start, args


def run(path: str, target_json: str, args_info: list, evaluator: dict[str, Any],
        screen_above: float | None) -> list[float]:
    """Time a built library on random inputs; returns seconds per repeat.

    The first (cold) call is timed on its own: if it is slower than ``screen_above`` seconds the
    candidate is clearly not competitive and that single timing is returned. Otherwise ``number``
    is chosen from it so that TVM's evaluator needs no calibration runs.
    """
    global _last_args
    import math

    import tvm
    from tvm.s_tir.meta_schedule.runner.config import EvaluatorConfig
    from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common, run_evaluator_common

    kind = json.loads(target_json)["kind"]
    device = tvm.cpu(0) if kind in ("llvm", "c") else tvm.device(kind, 0)
    module = tvm.runtime.load_module(path)
    signature = json.dumps([kind, args_info])
    if _last_args is None or _last_args[0] != signature:
        _last_args = None  # free the old buffers before allocating new ones
        _last_args = (signature, alloc_argument_common(_fill, device, args_info, 1))
    args = _last_args[1]
    function = module[module.entry_name]
    start = time.perf_counter()
    function(*args[0])
    device.sync()
    cold = time.perf_counter() - start
    if screen_above is not None and cold > screen_above:
        return [cold]
    config = dict(evaluator)
    config["number"] = max(config["number"], math.ceil(config["min_repeat_ms"] / 1e3 / max(cold, 1e-7)))
    return [float(s) for s in run_evaluator_common(module, device, EvaluatorConfig(**config), args)]
