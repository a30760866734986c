"""ONNX models as workloads, through TVM's Relax ONNX frontend.

Exporters write shapes as computations: torch's exporter turns ``x.view(b, g, c // g, h, w)`` into
Shape → Gather → Div → Unsqueeze → Concat → Reshape. TVM's frontend evaluates some of these chains and turns
the rest into tensors of unknown shape, which fail later ("emit_te now only supports Tensor that has ShapeExpr
shape"). Once the inputs' shapes are bound every such chain is static, so before TVM sees the graph the onnx
package's own tools fold them: shape inference gives every value's shape, and its reference evaluator computes
each node whose inputs are all known. Both ship with ``onnx`` (already a dependency) and implement every
standard op of every opset, which a second library (onnx-simplifier, onnxruntime's optimizer) would add as a
dependency without doing more for this purpose.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from tunecore.errors import UsageError, first_line

# Folding computes shapes, not weights: a node is folded only while its inputs and outputs stay this small.
# TVM's FoldConstant handles arithmetic on weights after import, and a huge ConstantOfShape stays lazy.
_FOLD_ELEMENTS = 1 << 16
_NEVER_FOLD = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli",
               "If", "Loop", "Scan"}
_BATCH_NAMES = re.compile(r"(?i)^(n|b|bs|batch.*|.*_batch|.*batch_size)$")


def load_onnx(path: str, input_shapes: dict[str, tuple[int, ...]] | None = None) -> Any:
    """Relax IRModule of an ONNX file, with static input shapes and every shape computation folded.

    Symbolic input dimensions come from ``input_shapes``, else 1 where they look like a batch; any problem
    with the file is a UsageError naming the file.
    """
    import onnx

    try:
        model = onnx.load(path)
        onnx.checker.check_model(model)
    except Exception as error:
        raise UsageError(f"--model {path}: not a valid ONNX model ({first_line(error, 300)})") from None
    shapes = bind_input_shapes(model, input_shapes or {}, path)
    try:
        model = fold_static_shapes(model, shapes)
    except Exception as error:  # a value the file declares one way and holds another
        raise UsageError(f"--model {path}: cannot evaluate its shape computations ({first_line(error, 300)})") from None
    missing = unsupported_ops(model)
    if missing:
        raise UsageError(f"--model {path}: TVM's ONNX frontend has no converter for {', '.join(missing)}")
    from tvm.relax.frontend.onnx import from_onnx

    try:
        mod = from_onnx(model, shape_dict=shapes, keep_params_in_input=False)
    except Exception as error:
        raise UsageError(f"--model {path}: TVM's ONNX frontend cannot import it ({first_line(error, 300)})") from None
    from tvm import relax

    return relax.transform.DecomposeOpsForInference()(mod)


def onnxruntime_reference(path: str) -> Any:
    """A function running the file in onnxruntime on numpy inputs (in the graph's input order), or None when
    onnxruntime is not installed (the ``models`` extra)."""
    import importlib.util

    if importlib.util.find_spec("onnxruntime") is None:
        return None
    session = None

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        import onnxruntime

        nonlocal session
        if session is None:
            session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [value.name for value in session.get_inputs()]
        return [np.asarray(out) for out in session.run(None, dict(zip(names, arrays)))]

    return run


def model_inputs(model: Any) -> list[Any]:
    """The graph inputs a caller feeds (initializers listed as inputs are weights)."""
    initializers = {init.name for init in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]


def bind_input_shapes(model: Any, given: dict[str, tuple[int, ...]], label: str) -> dict[str, list[int]]:
    """Every input's static shape: the given one (checked against the declared rank and fixed dimensions),
    else the declared one with batch-like symbolic dimensions set to 1."""
    inputs = model_inputs(model)
    names = [value.name for value in inputs]
    for name in given:
        if name not in names:
            raise UsageError(f"--input-shape {name}: {label} has no input '{name}' (inputs: {', '.join(names)})")
    shapes = {}
    for value in inputs:
        declared = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                    for d in value.type.tensor_type.shape.dim]
        shown = "x".join(str(d) for d in declared) or "a scalar"
        if value.name in given:
            shape = list(given[value.name])
            if len(shape) != len(declared):
                raise UsageError(f"--input-shape {value.name}={'x'.join(map(str, shape))}: '{value.name}' has rank "
                                 f"{len(declared)} ({shown}), not {len(shape)}")
            for axis, (dim, want) in enumerate(zip(declared, shape)):
                if isinstance(dim, int) and dim != want:
                    raise UsageError(f"--input-shape {value.name}={'x'.join(map(str, shape))}: dimension {axis} of "
                                     f"'{value.name}' is fixed at {dim} ({shown})")
        else:
            shape = []
            for axis, dim in enumerate(declared):
                if isinstance(dim, int):
                    shape.append(dim)
                elif axis == 0 or _BATCH_NAMES.match(dim):
                    shape.append(1)
                else:
                    raise UsageError(f"--model {label}: input '{value.name}' ({shown}) has a dimension '{dim}' of no "
                                     f"known size; give it, e.g. --input-shape {value.name}="
                                     + "x".join(str(d) if isinstance(d, int) else "1" if a == 0 else "128"
                                                for a, d in enumerate(declared)))
        shapes[value.name] = shape
    return shapes


def fold_static_shapes(model: Any, shapes: dict[str, list[int]]) -> Any:
    """``model``, changed in place: its inputs' shapes fixed and every small computation on known values
    (shape chains: Shape, Gather, Concat, arithmetic, Range, ...) replaced by the constant it computes."""
    for value in model.graph.input:
        if value.name in shapes:
            for dim, size in zip(value.type.tensor_type.shape.dim, shapes[value.name]):
                dim.Clear()
                dim.dim_value = size
    # A Reshape to a computed shape has a known output shape only once that computation is folded, and the
    # next view's Shape reads it: fold, infer again, until nothing changes.
    while _fold_once(model):
        pass
    return model


def _fold_once(model: Any) -> bool:
    from onnx import numpy_helper, shape_inference

    del model.graph.value_info[:]
    try:
        model.graph.CopyFrom(shape_inference.infer_shapes(model, data_prop=True).graph)
    except Exception:  # over 2 GB, or an op shape inference does not know: fold with the shapes it has
        pass
    graph = model.graph
    static = {value.name: tuple(d.dim_value for d in value.type.tensor_type.shape.dim)
              for value in [*graph.input, *graph.value_info, *graph.output]
              if value.type.tensor_type.HasField("shape")
              and all(d.HasField("dim_value") for d in value.type.tensor_type.shape.dim)}
    initializers = {init.name: init for init in graph.initializer}
    known: dict[str, np.ndarray] = {}

    def value_of(name: str) -> np.ndarray | None:
        if name not in known and name in initializers and _elements(initializers[name].dims) <= _FOLD_ELEMENTS:
            known[name] = numpy_helper.to_array(initializers[name])
        return known.get(name)

    opsets = {opset.domain or "": opset.version for opset in model.opset_import}
    kept, folded = [], []
    for node in graph.node:
        outputs = _fold(node, value_of, static, opsets)
        if outputs is None:
            kept.append(node)
            continue
        known.update(outputs)
        folded += outputs
    if not folded:
        return False
    used = _names_read(kept) | {value.name for value in graph.output}
    new_constants = [numpy_helper.from_array(known[name], name) for name in folded if name in used]
    del graph.node[:]
    graph.node.extend(kept)
    still_used = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(still_used + new_constants)
    return True


def _fold(node: Any, value_of: Any, static: dict[str, tuple], opsets: dict[str, int]) -> dict | None:
    """The outputs of ``node`` when they can be known before running the model, else None."""
    if node.domain not in ("", "ai.onnx") or node.op_type in _NEVER_FOLD:
        return None
    if node.op_type in ("Shape", "Size"):
        source = value_of(node.input[0])
        shape = tuple(source.shape) if source is not None else static.get(node.input[0])
        if shape is None:
            return None
        if node.op_type == "Size":
            return {node.output[0]: np.array(int(np.prod(shape)), dtype=np.int64)}
        attrs = {a.name: a.i for a in node.attribute}
        start, end = attrs.get("start", 0), attrs.get("end", len(shape))
        return {node.output[0]: np.array(shape[start:end], dtype=np.int64)}
    inputs = {}
    for name in node.input:
        if not name:
            continue
        value = value_of(name)
        if value is None:
            return None
        inputs[name] = value
    if any(attr.type in (attr.GRAPH, attr.GRAPHS) for attr in node.attribute):
        return None
    from onnx.reference import ReferenceEvaluator

    try:
        results = ReferenceEvaluator(node, opsets={"": opsets.get("", 21)}).run(None, inputs)
    except Exception:  # an op the reference evaluator lacks at this opset: TVM gets the node as it is
        return None
    if any(np.asarray(r).size > _FOLD_ELEMENTS for r in results):
        return None
    return {name: np.asarray(r) for name, r in zip(node.output, results) if name}


def _names_read(nodes: Any) -> set[str]:
    """Every value the nodes read, inside If/Loop bodies too (they read outer values by name)."""
    names: set[str] = set()
    for node in nodes:
        names.update(node.input)
        for attr in node.attribute:
            for graph in [attr.g] if attr.type == attr.GRAPH else list(attr.graphs):
                names |= _names_read(graph.node)
    return names


def _elements(dims: Any) -> int:
    return int(np.prod(list(dims))) if len(dims) else 1


def unsupported_ops(model: Any) -> list[str]:
    """Op types in the graph (and its subgraphs) that TVM's ONNX frontend has no converter for."""
    from tvm.relax.frontend.onnx import onnx_frontend

    convert_map = onnx_frontend._get_convert_map()  # the list the frontend itself checks against
    types: set[str] = set()

    def collect(nodes: Any) -> None:
        for node in nodes:
            types.add(node.op_type)
            for attr in node.attribute:
                for graph in [attr.g] if attr.type == attr.GRAPH else list(attr.graphs):
                    collect(graph.node)

    collect(model.graph.node)
    return sorted(t for t in types if t not in convert_map and t not in ("Constant", "If"))
