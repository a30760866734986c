"""Functions that run inside the local measurer's worker processes (and the timing the RPC runner shares).

Workers live for the whole run: TVM is imported once per worker, and only the target's tensor
intrinsics are registered (not the whole tensor_intrin package that MetaSchedule's builder imports).
"""

from __future__ import annotations

import json
import os
import statistics
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
          cross_compiler: str | None = None) -> tuple[str, float, list, dict | None]:
    """Compile a scheduled module into a library; returns (its path, build seconds, its arguments, packing).

    ``export`` "so": a shared library linked here, by ``cross_compiler`` (e.g. aarch64-linux-gnu-g++) when the
    target is another architecture; "tar": its object files, which the device's RPC server links itself
    (it needs a C compiler).

    The kernel is built as the compiled model runs it: a weight that RewriteLayout packed is passed packed
    (the packing runs once, at compile time, and is not timed), so its arguments are the built function's.
    The packing goes into the library too, as the function ``PACK``: the runner's check packs the task's
    inputs with it (``packing``, see ``split_packing``; None when nothing is packed).
    """
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build

    from tunecore.tvmjson import target_from_json, to_plain

    start = time.perf_counter()
    target = target_from_json(target_json)
    mod = tvm.ir.load_json(mod_json)
    kernel, packing = split_packing(mod)
    if packing is None:
        library = default_build(mod, target, None)
        args = ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True)
    else:
        from tvm.driver import build as tvm_build

        library = tvm_build(kernel, target=target)
        args = ms.arg_info.ArgInfo.from_prim_func(kernel["main"])
    path = os.path.join(artifact_dir, f"{uuid.uuid4().hex}.{export}")
    if cross_compiler and export == "so":
        from tvm.support import cc

        library.export_library(path, fcompile=cc.cross_compiler(cross_compiler))
    else:
        library.export_library(path)  # a .tar name makes a tar of objects
    return path, time.perf_counter() - start, to_plain([a.as_json() for a in args]), packing


PACK = "tunecore_pack"


def split_packing(mod: Any) -> tuple[Any, dict | None]:
    """The kernel with its weight packing (RewriteLayout's preprocessing blocks) split out, by the pass that
    ``tunecore compile`` splits them with: (an IRModule of "main", the kernel taking packed weights, and
    ``PACK``, the packing; {"inputs": positions of the task's arguments it packs, "outputs": positions of
    the kernel's arguments its outputs are}), or (``mod``, None) when nothing is packed or the pass refuses."""
    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    func = mod["main"]
    types = [relax.TensorType([int(d) for d in a.shape], str(a.dtype))
             for a in ms.arg_info.ArgInfo.from_prim_func(func)]
    # The last argument as the output: packed weights are inputs, and which others are outputs does not matter
    params = [relax.Var(f"arg{i}", t) for i, t in enumerate(types[:-1])]
    builder = relax.BlockBuilder()
    with builder.function("main", params):
        kernel = builder.add_func(func, "kernel")
        builder.emit_func_output(builder.emit(relax.call_tir(kernel, params, types[-1])))
    try:
        split = relax.transform.SplitLayoutRewritePreproc()(builder.get())
    except Exception:  # e.g. a kernel without a compute block: nothing to split
        return mod, None
    functions = {gv.name_hint: f for gv, f in split.functions.items()}
    if "kernel_weight_prepack" not in functions:
        return mod, None
    positions = {p.name: i for i, p in enumerate(params)}
    calls, items = {}, {}
    for block in functions["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and isinstance(value.args[0], tvm.ir.GlobalVar):
                calls[value.args[0].name_hint] = (binding.var.name, [a.name for a in value.args[1].fields])
            elif isinstance(value, relax.TupleGetItem):
                items[binding.var.name] = int(value.index)
    packed_var, packs = calls["kernel_weight_prepack"]
    items[packed_var] = 0  # a packing of one weight returns it, not a tuple
    outputs = {items[name]: i for i, name in enumerate(calls["kernel_prepacked"][1]) if name in items}
    packing = {"inputs": [positions[name] for name in packs], "outputs": [outputs[k] for k in range(len(outputs))]}
    kernel_module = tvm.IRModule({
        "main": functions["kernel_prepacked"].with_attr("global_symbol", "main"),
        PACK: functions["kernel_weight_prepack"].with_attr("global_symbol", PACK),
    })
    return kernel_module, packing


def run(path: str, target_json: str, args_info: list, evaluator: dict[str, Any], screen_above: float | None,
        check: dict[str, Any] | None = None) -> tuple[list[float], tuple[float, str | None] | None]:
    """Time a built library; returns (seconds per repeat (see ``time_function``), the check's verdict).

    Without ``check`` the inputs are random and the verdict is None. With it (see ``LocalRunner``) the inputs
    are the task's seeded ones (packed by the library's ``PACK`` where the kernel takes packed weights), and
    after timing, the outputs are compared with the reference file's: the verdict is (max relative error,
    None or why they are wrong); None when ``check["below"]`` is set and the candidate did not beat it.
    """
    global _last_args
    import tvm

    kind = json.loads(target_json)["kind"]
    device = _device(target_json)
    module = tvm.runtime.load_module(path)
    if check is not None:
        inputs, reference = _reference(check)
        args = checked_arguments(module, device, inputs, args_info, check["packing"])
        secs = time_function(module, device, [args], evaluator, screen_above)
        if check["below"] is not None and statistics.median(secs) >= check["below"]:
            return secs, None
        return secs, compare_outputs(args, reference)
    from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common

    signature = json.dumps([kind, args_info])
    if _last_args is None or _last_args[0] != signature:
        _last_args = None  # free the old buffers before allocating new ones
        fill = make_fill(tvm.get_global_func("tvm.contrib.random.random_fill_for_measure"))
        _last_args = (signature, alloc_argument_common(fill, device, args_info, 1))
    return time_function(module, device, _last_args[1], evaluator, screen_above), None


def _device(target_json: str) -> Any:
    """This machine's device of the target's kind."""
    import tvm

    kind = json.loads(target_json)["kind"]
    return tvm.cpu(0) if kind in ("llvm", "c") else tvm.device(kind, 0)


_last_reference: tuple[str, list, dict] | None = None  # runner: (reference file, inputs, outputs) of the last task


def _reference(check: dict[str, Any]) -> tuple[list, dict[int, Any]]:
    """The task's seeded inputs and its reference outputs (a file ``LocalRunner`` wrote), kept for the next call."""
    global _last_reference
    import numpy as np

    from tunecore.check import task_inputs

    if _last_reference is None or _last_reference[0] != check["reference"]:
        _last_reference = None
        with np.load(check["reference"], allow_pickle=False) as saved:
            outputs = {int(name.split("_")[1]): saved[name] for name in saved.files}
        _last_reference = (check["reference"], task_inputs(check["task_args"], check["weights"]), outputs)
    return _last_reference[1], _last_reference[2]


def checked_arguments(module: Any, device: Any, inputs: list, args_info: list, packing: dict | None) -> list:
    """Fresh device tensors of the task's inputs for the kernel (so nothing an earlier candidate wrote is left
    in an output), packed weights made from the task's by the library's ``PACK``; here or on an RPC device."""
    import tvm

    if len(args_info) != len(inputs):
        raise ValueError(f"the kernel takes {len(args_info)} arguments, its task {len(inputs)}")
    packed = dict.fromkeys((packing or {}).get("outputs", []))
    for i, info in enumerate(args_info):
        if i not in packed and (list(info[2]) != list(inputs[i].shape) or info[1] != str(inputs[i].dtype)):
            raise ValueError(f"the kernel's argument {i} is {info[1]}{list(info[2])}, the task's "
                             f"{inputs[i].dtype}{list(inputs[i].shape)}, and nothing packs it")
    args = [tvm.runtime.empty(args_info[i][2], args_info[i][1], device) if i in packed
            else tvm.runtime.tensor(x, device) for i, x in enumerate(inputs)]
    if packed:
        module[PACK](*[args[i] if i not in packed else tvm.runtime.tensor(inputs[i], device)
                       for i in packing["inputs"]], *[args[i] for i in packing["outputs"]])
    return args


def save_reference(path: str, target_json: str, task_args: list, weights: list[int], outputs: list[int],
                   out_path: str) -> None:
    """Write the outputs of a task's unscheduled program (built at ``path``) on its seeded inputs to ``out_path``
    (.npz, one ``output_<position>`` array each)."""
    import numpy as np
    import tvm

    from tunecore.check import task_inputs

    found = reference_outputs(tvm.runtime.load_module(path), _device(target_json), task_inputs(task_args, weights),
                              outputs)
    np.savez(out_path, **{f"output_{i}": array for i, array in found.items()})


def reference_outputs(module: Any, device: Any, inputs: list, outputs: list[int]) -> dict[int, Any]:
    """The outputs (at positions ``outputs``) of one call of a task's unscheduled program on its seeded inputs."""
    import tvm

    args = [tvm.runtime.tensor(x, device) for x in inputs]
    module[module.entry_name](*args)
    device.sync()
    return {i: args[i].numpy() for i in outputs}


def compare_outputs(args: list, reference: dict[int, Any]) -> tuple[float, str | None]:
    """(max relative error, None or why the outputs are wrong) of a kernel's arguments after a call."""
    from tunecore.check import mismatch

    positions = sorted(reference)
    return mismatch([args[i].numpy() for i in positions], [reference[i] for i in positions])


def time_function(module: Any, device: Any, args: list, evaluator: dict[str, Any],
                  screen_above: float | None, call_overhead: float = 0.0) -> list[float]:
    """Seconds per repeat of a loaded module's entry function, here or on an RPC session's device.

    The first call is timed on its own, less ``call_overhead`` (an RPC session's round trips, timed here).
    If it is slower than ``screen_above`` seconds, a second call is timed on the device (the first also pays for
    loading the library: page faults, symbol binding, which makes a kernel of tens of microseconds look several
    times slower); when that is too, the candidate is clearly not competitive and that single timing is returned.
    Otherwise ``number`` is chosen from it so that TVM's evaluator needs no calibration runs; with
    ``enable_cpu_cache_flush`` every timing is one call after a flush of all but the first argument.
    """
    import math

    from tvm.s_tir.meta_schedule.runner.config import EvaluatorConfig
    from tvm.s_tir.meta_schedule.runner.utils import run_evaluator_common

    function = module[module.entry_name]

    def call() -> float:
        start = time.perf_counter()
        function(*args[0])
        device.sync()
        elapsed = time.perf_counter() - start
        # The overhead is timed apart from the call, so for a kernel shorter than the network's jitter the difference
        # can be ~0 and ``number`` below a million calls (20 s: a timed-out result). A quarter of the whole call is
        # the least believed, so a repeat takes at most ~4x min_repeat_ms.
        return max(elapsed - call_overhead, elapsed / 4, 1e-7)

    once = call()
    if screen_above is not None and once > screen_above:
        # Timed by the device itself: over RPC a call timed here carries the network's jitter, which for a kernel of
        # tens of microseconds is larger than the kernel, and would screen out a candidate as fast as the best.
        warm = dict(evaluator, number=1, repeat=1, min_repeat_ms=0)
        once = min(once, run_evaluator_common(module, device, EvaluatorConfig(**warm), args[:1])[0])
        if once > screen_above:
            return [once]
    config = dict(evaluator)
    if config.get("enable_cpu_cache_flush"):
        # TVM flushes once per repeat, and min_repeat_ms adds warm calls to it: each timing is one call right after
        # a flush (as Ansor's runner does), the cold weights a kernel sees inside a model too large for the cache.
        config.update(number=1, min_repeat_ms=0)
    else:
        config["number"] = max(config["number"], math.ceil(config["min_repeat_ms"] / 1e3 / once))
    return [float(s) for s in run_evaluator_common(module, device, EvaluatorConfig(**config), args)]
