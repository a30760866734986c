"""Functions that run inside the local measurer's worker processes (and the timing the RPC runner shares).

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


def make_fill(random_fill: Any) -> Any:
    """A function filling a tensor for a timing run: ``random_fill`` (TVM's random_fill_for_measure, local or a
    remote session's) for floats; zeros for integers, which are often indices (embedding ids, gather
    positions): random ones would point out of bounds and crash the kernel, while zero is valid for any
    non-empty axis."""

    def fill(tensor: Any) -> None:
        import numpy as np

        dtype = str(tensor.dtype)
        if dtype.startswith(("int", "uint", "bool")):
            tensor.copyfrom(np.zeros([int(d) for d in tensor.shape], dtype=dtype))
        else:
            random_fill(tensor)

    return fill


def ping() -> int:
    return os.getpid()


def loaded(module: str) -> bool:
    """Whether this worker has imported ``module`` (tests check that torch stays out)."""
    import sys

    return module in sys.modules


def build(mod_json: str, target_json: str, artifact_dir: str, export: str = "so",
          cross_compiler: str | None = None) -> tuple[str, float, list]:
    """Compile a scheduled module into a library; returns (its path, build seconds, its arguments).

    ``export`` "so": a shared library linked here, by ``cross_compiler`` (e.g. aarch64-linux-gnu-g++) when the
    target is another architecture; "tar": its object files, which the device's RPC server links itself
    (it needs a C compiler).

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
    path = os.path.join(artifact_dir, f"{uuid.uuid4().hex}.{export}")
    if cross_compiler and export == "so":
        from tvm.support import cc

        library.export_library(path, fcompile=cc.cross_compiler(cross_compiler))
    else:
        library.export_library(path)  # a .tar name makes a tar of objects
    args = to_plain([a.as_json() for a in ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True)])
    return path, time.perf_counter() - start, args


def run(path: str, target_json: str, args_info: list, evaluator: dict[str, Any],
        screen_above: float | None) -> list[float]:
    """Time a built library on random inputs; returns seconds per repeat (see ``time_function``)."""
    global _last_args
    import tvm
    from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common

    kind = json.loads(target_json)["kind"]
    device = tvm.cpu(0) if kind in ("llvm", "c") else tvm.device(kind, 0)
    module = tvm.runtime.load_module(path)
    signature = json.dumps([kind, args_info])
    if _last_args is None or _last_args[0] != signature:
        _last_args = None  # free the old buffers before allocating new ones
        fill = make_fill(tvm.get_global_func("tvm.contrib.random.random_fill_for_measure"))
        _last_args = (signature, alloc_argument_common(fill, device, args_info, 1))
    return time_function(module, device, _last_args[1], evaluator, screen_above)


def time_function(module: Any, device: Any, args: list, evaluator: dict[str, Any],
                  screen_above: float | None, call_overhead: float = 0.0) -> list[float]:
    """Seconds per repeat of a loaded module's entry function, here or on an RPC session's device.

    The first call is timed on its own, less ``call_overhead`` (an RPC session's round trips, timed here).
    If it is slower than ``screen_above`` seconds, a second call is timed (the first also pays for loading the
    library: page faults, symbol binding, which makes a kernel of tens of microseconds look several times
    slower); when that is too, the candidate is clearly not competitive and that single timing is returned.
    Otherwise ``number`` is chosen from it so that TVM's evaluator needs no calibration runs.
    """
    import math

    from tvm.s_tir.meta_schedule.runner.config import EvaluatorConfig
    from tvm.s_tir.meta_schedule.runner.utils import run_evaluator_common

    function = module[module.entry_name]

    def call() -> float:
        start = time.perf_counter()
        function(*args[0])
        device.sync()
        return max(time.perf_counter() - start - call_overhead, 1e-7)

    once = call()
    if screen_above is not None and once > screen_above:
        once = min(once, call())
        if once > screen_above:
            return [once]
    config = dict(evaluator)
    config["number"] = max(config["number"], math.ceil(config["min_repeat_ms"] / 1e3 / once))
    return [float(s) for s in run_evaluator_common(module, device, EvaluatorConfig(**config), args)]
