"""PyTorch modules as workloads: ``--model path/to/file.py:factory``, imported with ``torch.export`` and TVM's
Relax frontend for exported programs. torch is imported only here (the ``torch`` extra), never by the core.

The factory is a function of no arguments returning ``(module, example_inputs)``: an ``nn.Module`` and a tensor
or a tuple of tensors. The example inputs fix the shapes; ``--input-shape NAME=DIMS`` replaces one of them
(NAME is the forward argument) with zeros of that shape and the same dtype.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from typing import Any, Callable

import numpy as np

from tunecore.errors import UsageError, error_line


def load_torch(path: str, factory: str, input_shapes: dict[str, tuple[int, ...]] | None = None
               ) -> tuple[Any, Callable[[list[np.ndarray]], list[np.ndarray]]]:
    """The Relax IRModule of the factory's module (weights bound as constants) and a function running the
    torch module itself on numpy inputs, to check a build against."""
    label = f"--model {path}:{factory}"
    try:
        import torch
    except ImportError:
        raise UsageError(f"{label}: PyTorch models need torch (pip install 'tunecore[torch]')") from None
    module, inputs = _call_factory(path, factory, label)
    inputs = _reshaped(module, inputs, input_shapes or {}, label)
    from tvm.relax.frontend.torch import from_exported_program

    try:
        with torch.no_grad():
            exported = torch.export.export(module, tuple(inputs))
            mod = from_exported_program(exported, keep_params_as_input=False, unwrap_unit_return_tuple=True,
                                        custom_convert_map={"cumsum.default": _cumsum})
    except Exception as error:
        raise UsageError(f"{label}: cannot import it ({error_line(error, 300)})") from None
    from tvm import relax

    def reference(arrays: list[np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            out = module(*[torch.from_numpy(np.ascontiguousarray(a)) for a in arrays])
        return [t.numpy() for t in _tensors(out)]

    return relax.transform.DecomposeOpsForInference()(mod), reference


def _cumsum(node: Any, importer: Any) -> Any:
    """torch's cumsum: a bool or narrow integer tensor sums in int64 unless a dtype is given. TVM 0.27's
    converter keeps the input's dtype, and a cumsum of bools (transformers' causal masks) then fails to
    compile (an LLVM add on bools)."""
    from tvm import relax

    x = importer.env[node.args[0]]
    axis = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if "dtype" in node.kwargs:
        dtype = importer._convert_data_type(str(node.kwargs["dtype"]), importer.env)
    elif str(x.ty.dtype) in ("bool", "int8", "int16", "int32", "uint8"):
        dtype = "int64"
    else:
        dtype = None
    if dtype is not None and str(x.ty.dtype) != dtype:
        x = importer.block_builder.emit(relax.op.astype(x, dtype))
    return importer.block_builder.emit(relax.op.cumsum(x, axis, dtype))


def _call_factory(path: str, factory: str, label: str) -> tuple[Any, list]:
    import torch

    name = "tunecore_user_model_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        source = importlib.util.module_from_spec(spec)
        sys.modules[name] = source  # as an import does: dataclasses and pickling look the module up there
        spec.loader.exec_module(source)
    except Exception as error:
        sys.modules.pop(name, None)
        raise UsageError(f"{label}: the file fails to load ({error_line(error, 300)})") from None
    function = getattr(source, factory, None)
    if not callable(function):
        found = [n for n, v in vars(source).items() if inspect.isfunction(v) and v.__module__ == name]
        raise UsageError(f"{label}: the file defines no function '{factory}' (functions: {', '.join(found) or 'none'})")
    try:
        result = function()
    except Exception as error:
        raise UsageError(f"{label}: the factory failed ({error_line(error, 300)})") from None
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module)):
        raise UsageError(f"{label}: the factory must return (nn.Module, example inputs), not {type(result).__name__}")
    module, inputs = result
    inputs = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    if not inputs or not all(isinstance(x, torch.Tensor) for x in inputs):
        raise UsageError(f"{label}: the example inputs must be a tensor or a tuple of tensors")
    return module.eval(), inputs


def _reshaped(module: Any, inputs: list, shapes: dict[str, tuple[int, ...]], label: str) -> list:
    import torch

    names = [p for p in inspect.signature(module.forward).parameters][:len(inputs)]
    for name, shape in shapes.items():
        if name not in names:
            raise UsageError(f"--input-shape {name}: {label} has no input '{name}' (inputs: {', '.join(names)})")
        index = names.index(name)
        old = inputs[index]
        if len(shape) != old.dim():
            raise UsageError(f"--input-shape {name}={'x'.join(map(str, shape))}: '{name}' has rank {old.dim()} "
                             f"({'x'.join(map(str, old.shape))}), not {len(shape)}")
        inputs[index] = torch.zeros(shape, dtype=old.dtype)
    return inputs


def _tensors(value: Any) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if hasattr(value, "to_tuple"):  # transformers' ModelOutput
        value = value.to_tuple()
    return [t for item in value for t in _tensors(item)]

