"""Workloads (what the user tunes) and their tasks (what the tuner tunes).

``--model`` accepts ``zoo:<name>``, ``op:<name>``, ``corpus:<name>`` (tunecore.workloads.corpus), a path to an
``.onnx`` file, a PyTorch factory
``file.py:function`` (tunecore.workloads.torch_import), or a path to a Relax IRModule saved with
``tvm.ir.save_json`` (``.json``). Networks are legalized and fused exactly as
``tunecore compile`` will build them, one task per fused TIR function.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Callable, Sequence

from tunecore.data import Task, task_id_for
from tunecore.errors import UsageError, first_line


@dataclasses.dataclass
class Workload:
    # normalised spec: "zoo:resnet-18", "op:matmul-512", "corpus:resnext", "onnx:/abs/m.onnx", "torch:/abs/m.py:f",
    # "relax:/abs/m.json"
    name: str
    mod: Any  # Relax IRModule (network) or IRModule with the PrimFunc "main" (single operator)
    is_network: bool
    # what the model's own framework computes for the same inputs (onnxruntime, torch), when it is at hand
    reference: Callable[[list], list] | None = None
    reference_name: str = ""
    layout: str = "nchw"  # the layout its convs are tuned and compiled in (tunecore.layouts)
    winograd: bool = False  # its 3x3 stride-1 convs also get Winograd kernels, kept where faster (tunecore.winograd)
    winograd_convs: frozenset = frozenset()  # the signatures of the convs it is built with by Winograd


def load_workload(spec: str, input_shapes: dict[str, tuple[int, ...]] | None = None,
                  layout: str | None = None, winograd: bool = False) -> Workload:
    """The workload a ``--model`` value names; UsageError with one line if it cannot be loaded.
    ``input_shapes`` (``--input-shape``) binds the inputs of an ONNX file or a PyTorch module; ``layout``
    (``--layout``, tunecore.layouts) is the layout a network's convs are tuned and compiled in; ``winograd``
    (``--winograd``, tunecore.winograd) gives its 3x3 stride-1 convs Winograd kernels as candidates."""
    from tunecore.layouts import DEFAULT, check_layout

    workload = _load(spec, input_shapes)
    workload.layout = check_layout(layout or DEFAULT)
    workload.winograd = winograd
    if not workload.is_network and (workload.layout != DEFAULT or winograd):
        flag = "--winograd" if winograd else f"--layout {workload.layout}"
        raise UsageError(f"{flag}: {spec} is a single operator; it applies to networks")
    from tunecore.winograd import LAYOUTS as WINOGRAD_LAYOUTS

    if winograd and workload.layout not in WINOGRAD_LAYOUTS:
        raise UsageError(f"--winograd: Winograd kernels compute convs in {' or '.join(WINOGRAD_LAYOUTS)}, "
                         f"not {workload.layout}")
    return workload


def _load(spec: str, input_shapes: dict[str, tuple[int, ...]] | None) -> Workload:
    if spec.startswith("corpus:"):
        return _load_corpus(spec, input_shapes)
    torch_spec = re.fullmatch(r"(?:torch:)?(.+\.py)(?::(\w+))?", spec)
    if input_shapes and not (torch_spec or spec.startswith("onnx:") or spec.endswith(".onnx")):
        raise UsageError(f"--input-shape: {spec} has fixed shapes; it applies to ONNX files and PyTorch modules")
    if torch_spec:
        path, factory = torch_spec.groups()
        if not os.path.exists(path):
            raise UsageError(f"--model {spec}: no such file")
        if not factory:
            raise UsageError(f"--model {spec}: name the function that builds the model, e.g. {path}:make_model")
        from tunecore.workloads.torch_import import load_torch

        path = os.path.abspath(path)
        mod, reference = load_torch(path, factory, input_shapes)
        return Workload(f"torch:{path}:{factory}", mod, True, reference, "torch")
    if spec.startswith("zoo:"):
        from tunecore.workloads.zoo import ZOO_NAMES, build_zoo_model

        name = spec[4:]
        if name not in ZOO_NAMES:
            raise UsageError(f"unknown zoo model '{name}'; known: {', '.join(ZOO_NAMES)}")
        return Workload(spec, build_zoo_model(name), True)
    if spec.startswith("op:"):
        from tunecore.workloads.ops import build_op

        return Workload(spec, build_op(spec[3:]), False)
    path = spec.split(":", 1)[1] if spec.startswith(("onnx:", "relax:")) else spec
    if not os.path.exists(path):
        raise UsageError(f"--model {spec}: no such file, and not a zoo:<name>, op:<name> or corpus:<name> workload")
    path = os.path.abspath(path)
    if spec.startswith("relax:") or path.endswith(".json"):
        return Workload(f"relax:{path}", _load_relax_json(path), True)
    from tunecore.workloads.onnx_import import load_onnx, onnxruntime_reference

    reference = onnxruntime_reference(path)
    return Workload(f"onnx:{path}", load_onnx(path, input_shapes), True, reference,
                    "onnxruntime" if reference else "")


def _load_corpus(spec: str, input_shapes: dict[str, tuple[int, ...]] | None) -> Workload:
    """A network of the model corpus (tunecore/workloads/corpus.py) by name, handed over as its users would: the
    ONNX file it exports (written once into the user's cache directory) or its PyTorch factory."""
    import importlib.util

    if not all(importlib.util.find_spec(m) for m in ("torch", "transformers", "onnxruntime")):
        raise UsageError(f"--model {spec}: the model corpus needs torch, transformers and onnxruntime "
                         "(pip install 'tunecore[models]')")
    from tunecore.workloads import corpus

    name = spec.split(":", 1)[1]
    if name not in corpus.BY_NAME:
        raise UsageError(f"unknown corpus model '{name}'; known: {', '.join(corpus.BY_NAME)}")
    import torch

    # per torch version: another exporter may write another graph of the same module
    directory = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tunecore", "corpus",
                             f"torch-{torch.__version__}")
    os.makedirs(directory, exist_ok=True)
    path, shapes = corpus.model_spec(name, directory)
    workload = _load(path, {**parse_input_shapes(shapes), **(input_shapes or {})})
    workload.name = spec  # the same name on every machine (a dataset's tasks name their networks)
    return workload


def parse_input_shapes(values: list[str] | None) -> dict[str, tuple[int, ...]]:
    """``--input-shape NAME=1x3x224x224`` values (repeatable, or comma-separated) as a dict."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in (s.strip() for value in values or [] for s in value.split(",") if s.strip()):
        match = re.fullmatch(r"([^=]+)=(\d+(?:x\d+)*)?", item)
        if not match:
            raise UsageError(f"--input-shape {item}: expected NAME=DIMS, e.g. input=1x3x224x224 (a scalar: NAME=)")
        shapes[match.group(1)] = tuple(int(d) for d in match.group(2).split("x")) if match.group(2) else ()
    return shapes


def expand_models(specs: list[str]) -> list[str]:
    """``--model`` values with sets spelled out: ``zoo:all`` (every zoo network) and ``op:ansor``
    (Ansor's single-operator benchmark set); comma-separated lists are split."""
    out: list[str] = []
    for spec in (s.strip() for value in specs for s in value.split(",") if s.strip()):
        if spec == "zoo:all":
            from tunecore.workloads.zoo import ZOO_NAMES

            out += [f"zoo:{name}" for name in ZOO_NAMES]
        elif spec == "op:ansor":
            from tunecore.workloads.ops import ansor_op_names

            out += [f"op:{name}" for name in ansor_op_names()]
        else:
            out.append(spec)
    return list(dict.fromkeys(out))


def _load_relax_json(path: str) -> Any:
    import tvm
    from tvm import relax

    try:
        with open(path) as f:
            mod = tvm.ir.load_json(f.read())
    except Exception as error:
        raise UsageError(f"--model {path}: not a Relax IRModule saved by tvm.ir.save_json "
                         f"({first_line(error, 200)})") from None
    if not isinstance(mod, tvm.IRModule) or not any(isinstance(f, relax.Function) for f in mod.functions.values()):
        raise UsageError(f"--model {path}: the JSON holds no Relax function")
    return mod


def fusion_passes(target: Any, layout: str = "nchw", winograd: frozenset = frozenset()) -> list:
    """Convert the convs' layout, legalize and fuse, as ``tunecore compile`` builds (tunecore.compile), so
    tuned tasks match what gets compiled. Each kernel's weight buffers are marked layout-free:
    MetaSchedule's RewriteLayout then tiles them in the order the schedule reads them, and the build packs
    them once (Ansor's layout rewrite). erf, exp, tanh and softmax become TVM's polynomial fast_* forms, which
    vectorize: this TVM lowers them to scalar libm calls (erf 80x slower per element on Zen 5, 10.4 against
    0.13 ms per million; exp 10x, tanh 13x), within 3.3e-7 of libm's (errors measured on [-10, 10])."""
    import tvm
    from tvm import relax
    from tvm.relax import pipeline

    from tunecore.layouts import layout_passes, legalize_map

    return [
        *layout_passes(layout, target),
        *pipeline.library_dispatch_passes(target),
        relax.transform.FastMathTransform(),
        relax.transform.LegalizeOps(legalize_map(winograd)),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        tvm.transform.module_pass(_mark_layout_free_weights, opt_level=0, name="MarkLayoutFreeWeights"),
    ]


def _mark_layout_free_weights(mod: Any, _context: Any) -> Any:
    """relax's AttachAttrLayoutFreeBuffers, keeping the kernels' names (the pass adds a "1" to each):
    its attribute is copied onto the same kernel of ``mod``, found by structural equality."""
    import tvm
    import tvm_ffi
    from tvm import relax

    marked = relax.transform.AttachAttrLayoutFreeBuffers()(mod)
    by_hash: dict[int, list] = {}
    for func in marked.functions.values():
        if isinstance(func, tvm.tirx.PrimFunc) and func.attrs and "layout_free_buffers" in func.attrs:
            plain = func.without_attr("layout_free_buffers")
            by_hash.setdefault(tvm_ffi.structural_hash(plain), []).append((plain, func.attrs["layout_free_buffers"]))
    out = mod.clone()
    for gv, func in mod.functions.items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        for plain, buffers in by_hash.get(tvm_ffi.structural_hash(func), []):
            if tvm_ffi.structural_equal(plain, func):
                out[gv] = func.with_attr("layout_free_buffers", buffers)
                break
    return out


def fuse(mod: Any, target: Any, layout: str = "nchw", winograd: frozenset = frozenset()) -> Any:
    import tvm

    with target, tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(fusion_passes(target, layout, winograd))(mod)


def tuning_module(workload: Workload, target: Any, winograd: frozenset | None = None) -> Any:
    """A network's fused module whose TIR functions are its tasks (also what MetaSchedule's own tuning gets), with
    the convs of ``winograd`` (default: the workload's) computed by Winograd."""
    winograd = workload.winograd_convs if winograd is None else winograd
    fused = fuse(workload.mod, target, workload.layout, winograd)
    return fused if workload.layout == "nchw" and not winograd else _without_weight_transforms(fused)


def _without_weight_transforms(mod: Any) -> Any:
    """The module without the kernels that only transform weights (a converted layout's weight transforms):
    the build lifts them into ``main_transform_params``, which runs once, so they are not worth tuning."""
    from tvm import relax

    lifted = relax.transform.LiftTransformParams()(mod)
    for gv in list(lifted.get_global_vars()):
        if gv.name_hint.endswith("transform_params"):
            del lifted[gv]
    return relax.transform.DeadCodeElimination()(lifted)


def extract_tasks(workload: Workload, target: Any) -> list[Task]:
    """One task per distinct fused TIR function, with its weight (occurrences) and FLOPs."""
    from tunecore.targets import load_tensor_intrinsics

    load_tensor_intrinsics(target)
    if not workload.is_network:
        name = workload.name.split(":", 1)[1]
        return [make_task(workload.mod, target, name=name, kernel_class=kernel_class_of(workload.mod),
                          model=workload.name)]
    from tvm.s_tir import meta_schedule as ms

    from tunecore.layouts import check_layout

    check_layout(workload.layout, target)
    from tunecore.winograd import ALL

    try:
        extracted = list(ms.relax_integration.extract_tasks(tuning_module(workload, target), target))
        if workload.winograd:  # the candidates: every conv Winograd can compute, beside its direct kernel
            extracted += ms.relax_integration.extract_tasks(tuning_module(workload, target, frozenset({ALL})), target)
    except Exception as error:  # TVM cannot lower this model: the user's model, the user's problem
        raise UsageError(f"--model {workload.name}: TVM cannot legalize/fuse it: "
                         f"{first_line(error, 300)}") from None
    tasks = [
        make_task(t.dispatched[0], target, name=t.task_name, kernel_class=kernel_class_of(t.dispatched[0], t.task_name),
                  model=workload.name, weight=int(t.weight))
        for t in extracted
    ]
    unique = {t.workload_hash: t for t in tasks if t.args}  # a function with no buffers has nothing to tune
    return list(unique.values())


def make_task(mod: Any, target: Any, *, name: str, kernel_class: str, model: str, weight: int = 1) -> Task:
    import tvm
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    from tunecore.tvmjson import target_to_json

    workload_hash = str(tvm_ffi.structural_hash(mod))
    target_json = target_to_json(target)
    task_id = task_id_for(workload_hash, target_json)
    try:
        flops = float(tvm.s_tir.analysis.estimate_tir_flops(mod))
    except Exception:  # some functions (dynamic shapes, externs) have no static FLOP count
        flops = 0.0
    args = [arg.as_json() for arg in ms.arg_info.ArgInfo.from_prim_func(mod["main"])]
    from tunecore.tvmjson import to_plain

    return Task(
        task_id=task_id,
        name=name,
        kernel_class=kernel_class,
        workload_hash=workload_hash,
        target_json=target_json,
        mod_json=tvm.ir.save_json(mod),
        flops=flops,
        args=to_plain(args),
        weight=weight,
        model=model,
    )


def kernel_class_of(mod: Any, fused_name: str | None = None) -> str:
    """The fused operator sequence of a kernel plus its output rank, e.g. "conv2d_add_relu@4d".

    Kernels of one class with different shapes can reuse each other's schedules (Transfer-Tuning).
    A fused Relax function's name lists its operators (a numeric suffix only makes it unique);
    a single operator is named by its compute blocks.
    """
    from tvm.s_tir import meta_schedule as ms

    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    rank = len(args[-1].shape) if args else 0
    if fused_name:
        ops = "_".join(_strip_suffix(op) for op in re.sub(r"^fused_", "", fused_name).split("_"))
    else:
        ops = "_".join(_compute_block_names(mod)) or "unknown"
    return f"{ops}@{rank}d"


def has_kernel(kernel_class: str, kinds: Sequence[str]) -> bool:
    """Whether a kernel class names one of these operators (``--kernels conv,dense``), in any case: a single
    operator's class comes from its compute blocks' names, e.g. "Conv2dOutput_bias_add@4d"."""
    return any(kind.lower() in kernel_class.lower() for kind in kinds)


def _strip_suffix(op: str) -> str:
    """Relax makes fused names unique with numeric suffixes: "conv2d1" -> "conv2d", "add12" -> "add"."""
    match = re.fullmatch(r"([a-z_]*[123]d)\d*", op)
    return match.group(1) if match else re.sub(r"\d+$", "", op)


def _compute_block_names(mod: Any) -> list[str]:
    from tunecore.tvmjson import new_schedule

    sch = new_schedule(mod)
    names: list[str] = []
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        base = re.sub(r"_?\d+$", "", sch.get(block).name_hint)
        if base not in names and not base.lower().startswith(("pad", "data_pad")):
            names.append(base)
    return names
