"""ONNX models as workloads, through TVM's Relax ONNX frontend."""

from __future__ import annotations

from typing import Any

from tunecore.errors import UsageError


def load_onnx(path: str, default_dim: int = 1) -> Any:
    """Relax IRModule of an ONNX file; symbolic input dims (e.g. batch "N") are fixed to ``default_dim``.

    Tuning needs static shapes. Any problem with the file is a UsageError naming the file.
    """
    import onnx

    try:
        model = onnx.load(path)
        onnx.checker.check_model(model)
    except Exception as error:
        raise UsageError(f"--model {path}: not a valid ONNX model ({_first_line(error)})") from None
    initializers = {init.name for init in model.graph.initializer}
    shapes = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        shapes[value.name] = [d.dim_value if d.dim_value > 0 else default_dim for d in dims]
    from tvm.relax.frontend.onnx import from_onnx

    try:
        mod = from_onnx(model, shape_dict=shapes, keep_params_in_input=False)
    except Exception as error:
        raise UsageError(f"--model {path}: TVM's ONNX frontend cannot import it ({_first_line(error)})") from None
    from tvm import relax

    return relax.transform.DecomposeOpsForInference()(mod)


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:300]
