"""Data layouts of a network's convolutions: the layout a workload is tuned and compiled in (``--layout``).

- ``nchw``: the model's own layout (what ONNX and PyTorch give), untouched;
- ``nhwc``: every 2-D conv converted to NHWC activations and OHWI weights (Ansor's x86 advice);
- ``nchwc``: convs converted to the blocked layout NCHW{B}c with weights OIHW{B}i{B}o, B the target's vector
  width in fp32 lanes (16 with AVX-512, 8 with AVX2), the layout of onnxruntime's MLAS and oneDNN: a kernel's
  innermost loop is one full vector of output channels. A conv whose channels are not a multiple of B is blocked
  on each side by the widest of B, B / 2 and B / 4 that divides them (MobileNetV2's 24 -> 144 channels: NCHW8c in,
  NCHW16c out with AVX-512), an input of fewer than B channels by all of them (the stem's 3: NCHW3c, a register
  tile like any blocked conv's, as MLAS runs it), else stays NCHW, with layout transforms around it; elementwise
  ops and pools between two transforms are moved into the blocked layout, so the transforms cancel.

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
_POOLS = frozenset({"relax.nn.max_pool2d", "relax.nn.avg_pool2d"})
_UNARY = frozenset({"relax.nn.relu", "relax.sigmoid", "relax.tanh", "relax.nn.silu", "relax.nn.gelu", "relax.exp",
                    "relax.negative", "relax.sqrt"})


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
    # ConvertLayout transforms a value once per use (ResNet's max pool, read by a conv and a residual add): common
    # subexpressions first, so that its one transform can move up through the pool; transforms that cancel leave
    # a value bound to another's name, which fusion does not see through: canonical bindings last
    blocked = [_narrower_blocks(lanes), relax.transform.EliminateCommonSubexpr(), _transforms_through_elementwise(),
               _composed_transforms(), relax.transform.CanonicalizeBindings()] if layout == "nchwc" else []
    converted = tvm.transform.Sequential([_full_rank_broadcasts(), relax.transform.ConvertLayout(desired), *blocked])

    @tvm.transform.module_pass(opt_level=0, name="ConvLayout")
    def convert(mod: Any, _context: Any) -> Any:  # a network without a 2-D conv keeps its kernels as they are
        return converted(mod) if _has_conv2d(mod) else mod

    return [convert]


def conv_blocks(call: Any, lanes: int) -> tuple[int, int] | None:
    """The (input, output) channel blocks of a plain NCHW conv that ConvertLayout left unblocked (its channels are
    not all multiples of ``lanes``): for each side the widest of ``lanes``, ``lanes`` / 2 and ``lanes`` / 4 (at least
    4) dividing its channels (MobileNetV2's 24 -> 144: 8 in, 16 out with AVX-512); fewer input channels than
    ``lanes`` that none divides are one block (the stem's 3: NCHW3c in); None where a side has no block."""
    attrs = call.attrs
    if (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout), int(attrs.groups)) != (
            "NCHW", "OIHW", "NCHW", 1):
        return None
    blocks = []
    for side, channels in enumerate((int(call.args[0].ty.shape[1]), int(call.args[1].ty.shape[0]))):
        fitting = [b for b in (lanes, lanes // 2, lanes // 4) if b >= 4 and channels % b == 0]
        if not fitting and side == 0 and channels < lanes:
            fitting = [channels]  # one block of every input channel: the stem's 3 (MLAS blocks it the same way)
        if not fitting:
            return None
        blocks.append(fitting[0])
    return blocks[0], blocks[1]


def _narrower_blocks(lanes: int) -> Any:
    """A pass blocking the convs ConvertLayout left in NCHW (``conv_blocks``), between layout transforms: relax's
    ConvertLayout cannot mix blocks (NCHW16c beside NCHW8c fails in TVM 0.27's layout inference), so these convs
    are converted after it, each on its own; ``_transforms_through_elementwise`` and ``_composed_transforms`` then
    join the transforms around them to their neighbours' (NCHW16c -> NCHW -> NCHW8c is one transform)."""
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    from tunecore.blocked_conv import conv_out_dtype

    @mutator
    class Narrower(PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if getattr(call.op, "name", None) != "relax.nn.conv2d":
                return call
            blocks = conv_blocks(call, lanes)
            if blocks is None:
                return call
            (block_in, block_out), attrs = blocks, call.attrs
            data = self.builder_.emit(relax.op.layout_transform(
                call.args[0], lambda n, c, h, w: (n, c // block_in, h, w, c % block_in)))
            weight = self.builder_.emit(relax.op.layout_transform(
                call.args[1], lambda o, i, h, w: (o // block_out, i, h, w, o % block_out)))
            conv = self.builder_.emit(relax.op.nn.conv2d(
                data, weight, attrs.strides, attrs.padding, attrs.dilation, 1, f"NCHW{block_in}c",
                f"OIHW{block_out}o", f"NCHW{block_out}c", conv_out_dtype(call)))
            return relax.op.layout_transform(conv, lambda n, c, h, w, b: (n, c * block_out + b, h, w))

    return _every_function(Narrower, "NarrowerBlocks")


def _transform_of(expr: Any) -> Any:
    """``expr`` if it is a layout transform without padding, else None."""
    from tvm import relax

    return expr if (isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == "relax.layout_transform"
                    and expr.attrs.pad_value is None) else None


def _transforms_through_elementwise() -> Any:
    """A pass moving a layout transform above the elementwise ops it follows, T(clip(add(x, bias))) ->
    clip(add(T(x), T(bias))), where that adds no transform of an activation: every tensor operand it reaches is
    itself a transform's output (the two then compose, or cancel) or known at compile time (a bias: its transform
    is folded once, like a weight's), and each value it passes has no other use. A conv blocked on its own
    (``_narrower_blocks``) is followed by a transform back to NCHW, its bias and activation in NCHW, and a
    transform into the next conv's block; moved, the transforms cancel and the bias and activation fuse into the
    conv (MobileNetV2's 144-channel expansions: 0.69 of 3.3 ms in transforms and unfused relu6 before)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    elementwise = _BINARY | _UNARY

    @mutator
    class Through(PyExprMutator):
        def __init__(self, mod: Any) -> None:
            super().__init__(mod)
            self.uses: dict[Any, int] = {}
            self.known: set[Any] = set()  # values computable at compile time (weights, biases)

            def count(expr: Any) -> None:
                if isinstance(expr, relax.Var):
                    self.uses[expr] = self.uses.get(expr, 0) + 1

            for func in mod.functions.values():
                if isinstance(func, relax.Function):
                    relax.analysis.post_order_visit(func, count)
                    self.known.update(relax.analysis.computable_at_compile_time(func))

        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if _transform_of(call) is None:
                return call
            moved = self.moved(call.args[0], call.attrs.index_map)
            return call if moved is None else moved

        def moved(self, value: Any, index_map: Any) -> Any:
            """``value``'s elementwise op computed on its operands transformed by ``index_map``; None where that
            would transform an activation that is not a transform's output."""
            if not isinstance(value, relax.Var) or self.uses.get(value) != 1:
                return None
            bound = self.lookup_binding(value)
            if isinstance(bound, relax.Call) and getattr(bound.op, "name", None) in _POOLS:
                return self.pooled(bound, index_map)
            if not isinstance(bound, relax.Call) or getattr(bound.op, "name", None) not in elementwise:
                return None
            shape = _static_shape(value)
            args = []
            for arg in bound.args:
                arg_shape = _static_shape(arg)
                if arg_shape == []:
                    args.append(arg)
                elif arg_shape == shape:
                    arg = self.transformed(arg, index_map)
                    if arg is None:
                        return None
                    args.append(arg)
                elif (isinstance(arg, tvm.ir.expr.Constant) or arg in self.known) and _broadcasts_through(
                        arg_shape, shape, index_map):
                    args.append(self.builder_.emit(relax.op.layout_transform(arg, index_map)))
                else:
                    return None
            return relax.Call(bound.op, args, bound.attrs, bound.ty_args)

        def transformed(self, arg: Any, index_map: Any) -> Any:
            """``arg`` in ``index_map``'s layout: transformed where it is a transform's output (the two then
            compose or cancel) or known at compile time, else its op moved into that layout; None where neither."""
            if isinstance(arg, relax.Var) and (_transform_of(self.lookup_binding(arg)) is not None
                                               or arg in self.known):
                return self.builder_.emit(relax.op.layout_transform(arg, index_map))
            inner = self.moved(arg, index_map)
            return None if inner is None else self.builder_.emit(inner)

        def pooled(self, pool: Any, index_map: Any) -> Any:
            """An NCHW pool computed in the blocked layout that ``index_map`` (a split of the channels alone)
            gives, on its input transformed the same way: ResNet's max pool after the blocked stem. None where
            that would transform an activation that is not a transform's output."""
            attrs, data = pool.attrs, pool.args[0]
            block = _channel_block(index_map, _static_shape(data))
            if block is None or (str(attrs.layout), str(attrs.out_layout)) != ("NCHW", "NCHW"):
                return None
            data = self.transformed(data, index_map)
            if data is None:
                return None
            layout, pool_op = f"NCHW{block}c", getattr(relax.op.nn, pool.op.name.split(".")[-1])
            return pool_op(data, attrs.pool_size, attrs.strides, attrs.padding, attrs.dilation, attrs.ceil_mode,
                           attrs.count_include_pad, layout, layout)

    def _broadcasts_through(small: list[int] | None, full: list[int], index_map: Any) -> bool:
        """Whether an operand of shape ``small`` broadcast against ``full`` is still broadcast correctly after both
        are transformed: each index the map writes reads only dimensions the operand has in full, or only ones
        it has as 1 (a (1, C, 1, 1) bias under a channel split)."""
        if small is None or len(small) != len(full) or index_map.initial_indices is None:
            return False
        if any(s not in (1, f) for s, f in zip(small, full)):
            return False
        broadcast = {index for index, s, f in zip(index_map.initial_indices, small, full) if s != f}
        for final in index_map.final_indices:
            read = set(tvm.tirx.analysis.undefined_vars(final))
            if read & broadcast and read - broadcast:
                return False
        return True

    return _every_function(Through, "TransformsThroughElementwise")


def _channel_block(index_map: Any, shape: list[int] | None) -> int | None:
    """B where ``index_map`` maps an NCHW tensor of ``shape`` to NCHW{B}c, (n, c, h, w) -> (n, c // B, h, w, c % B),
    else None."""
    import tvm

    if shape is None or len(shape) != 4 or index_map.initial_indices is None or len(index_map.final_indices) != 5:
        return None
    n, c, h, w = index_map.initial_indices
    block = int(index_map.map_shape(shape)[-1])
    analyzer = _bounded_analyzer(index_map.initial_indices, shape)
    wanted = (n, tvm.tirx.floordiv(c, block), h, w, tvm.tirx.floormod(c, block))
    return block if all(analyzer.can_prove_equal(got, want) for got, want in zip(index_map.final_indices, wanted)) \
        else None


def _bounded_analyzer(indices: Any, extents: list[int]) -> Any:
    """An arithmetic analyzer that knows each index lies in [0, its extent): index maps are identities only within
    those ranges ((c * 8 + b) // 8 is c for b < 8)."""
    import tvm
    from tvm.sym.analyzer import Analyzer

    analyzer = Analyzer()
    for index, extent in zip(indices, extents):
        analyzer.bind(index, tvm.ir.Range(tvm.tirx.const(0, str(index.ty)), tvm.tirx.const(extent, str(index.ty))))
    return analyzer


def _composed_transforms() -> Any:
    """A pass replacing a layout transform of a layout transform by one transform of the first one's input (none
    when they cancel out): NCHW16c -> NCHW -> NCHW8c reads the blocked tensor once. The intermediate stays only
    where something else uses it."""
    import math

    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator
    from tvm.tirx import IndexMap

    @mutator
    class Composer(PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            outer = _transform_of(call)
            inner = None
            if outer is not None and isinstance(call.args[0], relax.Var):
                inner = _transform_of(self.lookup_binding(call.args[0]))
            if inner is None:
                return call
            source = inner.args[0]
            sizes = [_static_shape(x) for x in (source, call.args[0], call)]
            if None in sizes or math.prod(sizes[0]) != math.prod(sizes[1]):  # symbolic, or the inner one pads
                return call
            first, second = inner.attrs.index_map, outer.attrs.index_map
            composed = IndexMap.from_func(lambda *i: second.map_indices(first.map_indices(list(i))),
                                          ndim=len(sizes[0]), index_dtype="int64")
            analyzer = _bounded_analyzer(composed.initial_indices, sizes[0])
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

    A blocked conv's weights (OIHW{B'}o) are blocked by input channel too (OIHW{B}i{B'}o, the order its kernel
    reads them) by a transform of the weights alone, which the build runs once; B and B' are the input's and the
    output's blocks, equal but where ``_narrower_blocks`` made them differ. A grouped conv that is not
    depthwise is computed in NCHW between transforms.
    """
    from tvm import relax, topi
    from tvm.relax.transform.legalize_ops.nn import _nn_conv2d

    from tunecore.blocked_conv import BLOCK, DEPTHWISE_BLOCK, conv2d_nchwc, conv_out_dtype, depthwise_conv2d_nchwc

    attrs = call.attrs
    blocked, blocked_out = (re.fullmatch(r"NCHW(\d+)c", str(layout)) for layout in (attrs.data_layout,
                                                                                     attrs.out_layout))
    if not blocked or not blocked_out:
        return _nn_conv2d(bb, call)
    lanes, lanes_out, groups = int(blocked.group(1)), int(blocked_out.group(1)), int(attrs.groups)
    data, weight = call.args
    out_dtype = conv_out_dtype(call)
    channels = int(data.ty.shape[1]) * lanes
    kernel_layout = str(attrs.kernel_layout)
    if groups == 1:
        weight = bb.emit_te(topi.layout_transform, weight, kernel_layout, f"OIHW{lanes}i{lanes_out}o")
        return bb.call_te(conv2d_nchwc, data, weight, attrs.strides, attrs.padding, attrs.dilation, out_dtype,
                          primfunc_name_hint=BLOCK)
    if groups == channels and lanes_out == lanes and int(weight.ty.shape[0]) * lanes == channels:  # depthwise
        return bb.call_te(depthwise_conv2d_nchwc, data, weight, attrs.strides, attrs.padding, attrs.dilation,
                          out_dtype, primfunc_name_hint=DEPTHWISE_BLOCK)
    plain = bb.emit_te(topi.layout_transform, data, str(attrs.data_layout), "NCHW")
    plain_weight = bb.emit_te(topi.layout_transform, weight, kernel_layout, "OIHW")
    out = bb.emit(_nn_conv2d(bb, relax.op.nn.conv2d(plain, plain_weight, attrs.strides, attrs.padding,
                                                     attrs.dilation, groups, out_dtype=out_dtype)))
    return bb.call_te(topi.layout_transform, out, "NCHW", str(attrs.out_layout))


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
