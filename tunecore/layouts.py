"""Data layouts of a network's convolutions: the layout a workload is tuned and compiled in (``--layout``).

- ``nchw``: the model's own layout (what ONNX and PyTorch give), untouched;
- ``nhwc``: every 2-D conv converted to NHWC activations and OHWI weights (Ansor's x86 advice);
- ``nchwc``: convs converted to the blocked layout NCHW{B}c with weights OIHW{B}i{B}o, B the target's vector
  width in fp32 lanes (16 with AVX-512, 8 with AVX2), the layout of onnxruntime's MLAS and oneDNN: a kernel's
  innermost loop is one full vector of output channels. A conv whose channels are not a multiple of B is blocked
  by B / 2 or B / 4 where that divides them (MobileNetV2's 24 channels: NCHW8c with AVX-512), else stays NCHW (the
  stem's 3 input channels), with layout transforms around it.

The conversion runs where legalization does (``fusion_passes``), so task extraction and ``compile`` see the same
kernels; weights are transformed once at compile time (folded when bound as constants, lifted into
``main_transform_params`` when passed as parameters), never per inference. Broadcast operands of lower rank (a
bias of shape (C, 1, 1)) are first given the full rank, so that the add, relu and residual adds after a conv
follow it into the blocked layout instead of converting back and forth around every conv.
"""

from __future__ import annotations

import re
from typing import Any

from tunecore.errors import UsageError

LAYOUTS = ("nchw", "nhwc", "nchwc")
DEFAULT = "nchw"
_BINARY = frozenset({"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum",
                     "relax.minimum", "relax.power"})


def check_layout(layout: str, target: Any = None) -> str:
    """The layout, or a UsageError naming the problem: an unknown layout, or one the target cannot use."""
    if layout not in LAYOUTS:
        raise UsageError(f"--layout {layout}: expected one of {', '.join(LAYOUTS)}")
    if layout == "nchwc" and target is not None and target.kind.name != "llvm":
        raise UsageError(f"--layout nchwc: the blocked layout is for CPUs (llvm targets), not {target.kind.name}")
    return layout


def last_tuned(store: Any, model: str) -> dict[str, Any]:
    """How ``model`` was last tuned, by the runs a record store holds: its layout and whether Winograd kernels
    were candidates ({} if the store holds no run of it)."""
    runs = [run for run in store.runs() if run["info"].get("model") == model]
    return {"layout": runs[-1]["info"].get("layout", DEFAULT),
            "winograd": bool(runs[-1]["info"].get("winograd", False))} if runs else {}


def vector_lanes(target: Any) -> int:
    """fp32 lanes of the target's widest vector: 16 with AVX-512, 8 with AVX2/AVX, else 4."""
    from tvm.target import codegen

    features = codegen.llvm_get_cpu_features(target)
    return 16 if "avx512f" in features else 8 if ("avx2" in features or "avx" in features) else 4


def layout_passes(layout: str, target: Any) -> list:
    """The passes that put a network's convs in ``layout`` (none for ``nchw``); they run before legalization."""
    import tvm
    from tvm import relax

    check_layout(layout, target)
    if layout == "nchw":
        return []
    if layout == "nhwc":
        desired = {"relax.nn.conv2d": ["NHWC", "OHWI"]}
    else:  # weights blocked by output channel only, so that depthwise convs (one input channel) convert too
        lanes = vector_lanes(target)
        desired = {"relax.nn.conv2d": [f"NCHW{lanes}c", f"OIHW{lanes}o"]}
    converted = tvm.transform.Sequential([_full_rank_broadcasts(), relax.transform.ConvertLayout(desired)]
                                         + ([_narrower_blocks(lanes), _composed_transforms()] if layout == "nchwc"
                                            else []))

    @tvm.transform.module_pass(opt_level=0, name="ConvLayout")
    def convert(mod: Any, _context: Any) -> Any:  # a network without a 2-D conv keeps its kernels as they are
        return converted(mod) if _has_conv2d(mod) else mod

    return [convert]


def narrower_block(call: Any, lanes: int) -> int:
    """The block of an NCHW conv whose channels are not a multiple of ``lanes``: ``lanes`` / 2 or / 4 (at least 4)
    where that divides its input and output channels (MobileNetV2's 24: 8 with AVX-512), else 0 (the stem's 3)."""
    attrs = call.attrs
    if (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout), int(attrs.groups)) != (
            "NCHW", "OIHW", "NCHW", 1):
        return 0
    channels_in, channels_out = int(call.args[0].ty.shape[1]), int(call.args[1].ty.shape[0])
    for block in (lanes // 2, lanes // 4):
        if block >= 4 and channels_in % block == 0 and channels_out % block == 0:
            return block
    return 0


def _narrower_blocks(lanes: int) -> Any:
    """A pass blocking the convs ConvertLayout left in NCHW by a narrower block (``narrower_block``), between
    layout transforms: relax's ConvertLayout cannot mix blocks (NCHW16c beside NCHW8c fails in TVM 0.27's layout
    inference), so these convs are converted after it, each on its own; ``_composed_transforms`` then makes
    NCHW16c -> NCHW -> NCHW8c one transform."""
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    from tunecore.blocked_conv import conv_out_dtype

    @mutator
    class Narrower(PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if getattr(call.op, "name", None) != "relax.nn.conv2d":
                return call
            block = narrower_block(call, lanes)
            if not block:
                return call
            attrs = call.attrs
            data = self.builder_.emit(relax.op.layout_transform(
                call.args[0], lambda n, c, h, w: (n, c // block, h, w, c % block)))
            weight = self.builder_.emit(relax.op.layout_transform(
                call.args[1], lambda o, i, h, w: (o // block, i, h, w, o % block)))
            conv = self.builder_.emit(relax.op.nn.conv2d(
                data, weight, attrs.strides, attrs.padding, attrs.dilation, 1, f"NCHW{block}c", f"OIHW{block}o",
                f"NCHW{block}c", conv_out_dtype(call)))
            return relax.op.layout_transform(conv, lambda n, c, h, w, b: (n, c * block + b, h, w))

    return _every_function(Narrower, "NarrowerBlocks")


def _composed_transforms() -> Any:
    """A pass replacing a layout transform of a layout transform by one transform of the first one's input (none
    when they cancel out): NCHW16c -> NCHW -> NCHW8c reads the blocked tensor once. The intermediate stays only
    where something else uses it."""
    import math

    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator
    from tvm.sym.analyzer import Analyzer
    from tvm.tirx import IndexMap

    def transform_of(expr: Any) -> Any:
        return expr if (isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == "relax.layout_transform"
                        and expr.attrs.pad_value is None) else None

    @mutator
    class Composer(PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            outer = transform_of(call)
            inner = None
            if outer is not None and isinstance(call.args[0], relax.Var):
                inner = transform_of(self.lookup_binding(call.args[0]))
            if inner is None:
                return call
            source = inner.args[0]
            sizes = [_static_shape(x) for x in (source, call.args[0], call)]
            if None in sizes or math.prod(sizes[0]) != math.prod(sizes[1]):  # symbolic, or the inner one pads
                return call
            first, second = inner.attrs.index_map, outer.attrs.index_map
            composed = IndexMap.from_func(lambda *i: second.map_indices(first.map_indices(list(i))),
                                          ndim=len(sizes[0]), index_dtype="int64")
            analyzer = Analyzer()  # an identity only within the indices' ranges: (c * 8 + b) // 8 is c for b < 8
            for index, extent in zip(composed.initial_indices, sizes[0]):
                analyzer.bind(index, tvm.ir.Range(tvm.tirx.const(0, "int64"), tvm.tirx.const(extent, "int64")))
            if sizes[2] == sizes[0] and all(analyzer.can_prove_equal(final, initial) for final, initial
                                            in zip(composed.final_indices, composed.initial_indices)):
                return source
            return relax.op.layout_transform(source, composed)

    return _every_function(Composer, "ComposedTransforms")


def _static_shape(expr: Any) -> list[int] | None:
    """A tensor's shape as ints; None when a dimension is symbolic or the shape unknown."""
    try:
        return [int(d) for d in expr.ty.shape]
    except (TypeError, AttributeError):
        return None


def _every_function(mutator_class: Any, name: str) -> Any:
    """A module pass applying a relax mutator (constructed with the module) to each of its Relax functions, then
    dropping what no longer has a use."""
    import tvm
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name=name)
    def every_function(mod: Any, _context: Any) -> Any:
        out = mod.clone()
        for gv, func in mod.functions.items():
            if isinstance(func, relax.Function):
                out[gv] = mutator_class(mod).visit_expr(func)
        return relax.transform.DeadCodeElimination()(out)

    return every_function


def _has_conv2d(mod: Any) -> bool:
    from tvm import relax

    found = []

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == "relax.nn.conv2d":
            found.append(expr)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return bool(found)


def legalize_conv2d(bb: Any, call: Any) -> Any:
    """relax.nn.conv2d to TE: the blocked layout to tunecore's blocked convs (tunecore.blocked_conv; relax's own
    legalization refuses 5-D layouts), every other layout as relax does it.

    A blocked conv's weights (OIHW{B}o) are blocked by input channel too (OIHW{B}i{B}o, the order its kernel
    reads them) by a transform of the weights alone, which the build runs once. A grouped conv that is not
    depthwise is computed in NCHW between transforms.
    """
    from tvm import relax, topi
    from tvm.relax.transform.legalize_ops.nn import _nn_conv2d

    from tunecore.blocked_conv import BLOCK, DEPTHWISE_BLOCK, conv2d_nchwc, conv_out_dtype, depthwise_conv2d_nchwc

    attrs = call.attrs
    blocked = re.fullmatch(r"NCHW(\d+)c", str(attrs.data_layout))
    if not blocked or str(attrs.out_layout) != str(attrs.data_layout):
        return _nn_conv2d(bb, call)  # relax's (ConvertLayout makes no blocked conv with another output layout)
    lanes, groups = int(blocked.group(1)), int(attrs.groups)
    data, weight = call.args
    out_dtype = conv_out_dtype(call)
    channels = int(data.ty.shape[1]) * lanes
    kernel_layout = str(attrs.kernel_layout)
    if groups == 1:
        weight = bb.emit_te(topi.layout_transform, weight, kernel_layout, f"OIHW{lanes}i{lanes}o")
        return bb.call_te(conv2d_nchwc, data, weight, attrs.strides, attrs.padding, attrs.dilation, out_dtype,
                          primfunc_name_hint=BLOCK)
    if groups == channels and int(weight.ty.shape[0]) * lanes == channels:  # depthwise, one filter per channel
        return bb.call_te(depthwise_conv2d_nchwc, data, weight, attrs.strides, attrs.padding, attrs.dilation,
                          out_dtype, primfunc_name_hint=DEPTHWISE_BLOCK)
    plain = bb.emit_te(topi.layout_transform, data, str(attrs.data_layout), "NCHW")
    plain_weight = bb.emit_te(topi.layout_transform, weight, kernel_layout, "OIHW")
    out = bb.emit(_nn_conv2d(bb, relax.op.nn.conv2d(plain, plain_weight, attrs.strides, attrs.padding,
                                                     attrs.dilation, groups, out_dtype=out_dtype)))
    return bb.call_te(topi.layout_transform, out, "NCHW", str(attrs.data_layout))


def legalize_map(winograd: frozenset[str] = frozenset()) -> dict[str, Any]:
    """LegalizeOps' customizations: what ``fusion_passes`` legalizes differently from relax. ``winograd``: the
    signatures of the convs computed by Winograd (tunecore.winograd; ``winograd.ALL``: every one it can)."""
    from tunecore import winograd as wino

    def conv2d(bb: Any, call: Any) -> Any:
        if winograd and wino.eligible(call) and (wino.ALL in winograd or wino.call_signature(call) in winograd):
            return wino.legalize(bb, call)
        return legalize_conv2d(bb, call)

    return {"relax.nn.conv2d": conv2d}


def _full_rank_broadcasts() -> Any:
    """A pass giving the lower-rank operand of an elementwise binary op the other's rank (a (C, 1, 1) bias
    becomes (1, C, 1, 1)), and spelling clip (relu6) as maximum and minimum, so that ConvertLayout can carry
    these ops into a conv's layout."""
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class FullRank(PyExprMutator):
        def __init__(self, mod: Any) -> None:
            super().__init__(mod)
            self.module = mod

        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if getattr(call.op, "name", None) == "relax.call_tir":
                replaced = _as_relax_op(self.module, call)
                return call if replaced is None else replaced
            if getattr(call.op, "name", None) == "relax.clip":  # no layout inference: as maximum and minimum
                x, low, high = call.args
                dtype = str(x.ty.dtype)
                low = self.builder_.emit(relax.op.maximum(x, relax.const(float(low.value), dtype)))
                return relax.op.minimum(low, relax.const(float(high.value), dtype))
            if getattr(call.op, "name", None) not in _BINARY or len(call.args) != 2:
                return call
            a, b = call.args
            ranks = [getattr(x.ty, "ndim", -1) for x in (a, b)]
            if min(ranks) <= 0 or ranks[0] == ranks[1]:
                return call
            full = max(ranks)

            def widened(x: Any, rank: int) -> Any:
                return x if rank == full else self.builder_.emit(
                    relax.op.reshape(x, [1] * (full - rank) + list(x.ty.shape)))

            a, b = widened(a, ranks[0]), widened(b, ranks[1])
            return relax.Call(call.op, [a, b], call.attrs, call.ty_args)

    return _every_function(FullRank, "FullRankBroadcasts")


def _as_relax_op(mod: Any, call: Any) -> Any:
    """A call_tir of an elementwise maximum or minimum with a scalar tensor (how relax's ONNX importer writes
    Clip) as the relax op, which ConvertLayout can carry into a conv's layout; None for any other call."""
    import tvm_ffi
    from tvm import relax, te, topi

    callee, args = call.args[0], call.args[1]
    if not isinstance(args, relax.Tuple) or len(args.fields) != 2 or not isinstance(callee, relax.GlobalVar):
        return None
    x, bound = args.fields
    if getattr(bound.ty, "ndim", -1) != 0 or getattr(x.ty, "ndim", -1) <= 0 or x.ty.shape is None:
        return None
    for compute, op in ((topi.maximum, relax.op.maximum), (topi.minimum, relax.op.minimum)):
        a = te.placeholder(list(x.ty.shape), str(x.ty.dtype), "a")
        b = te.placeholder((), str(bound.ty.dtype), "b")
        expected = te.create_prim_func([a, b, compute(a, b)]).without_attr("global_symbol")
        if tvm_ffi.structural_equal(mod[callee], expected):
            return op(x, bound)
    return None
