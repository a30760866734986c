"""The blocked conv: NCHW{B}c activations, OIHW{B}i{B}o weights (tunecore.layouts' ``nchwc``), and a design space
that reaches the register-tiled kernel onnxruntime's MLAS runs.

The compute reduces over (input-channel block, kh, kw, input channel within the block): four reduction axes,
so a schedule can put the block's B input channels innermost and unroll them. Its block carries the
``schedule_rule`` attribute ``tunecore.conv2d_nchwc``: MetaSchedule's ApplyCustomRule then hands the block to
``sketches`` instead of its multi-level tiling, which samples channel-block splits such as [1, 1, 4, 4] and
rarely reaches full-width vectors with a register tile (../shared/PERFORMANCE.md).

The sketches fix what makes the kernel fast and leave the rest to the search:

- the B output channels of a block innermost, vectorized (one full vector);
- a register tile of FC filter blocks x OW output pixels, unrolled, bounded by the register file (32 vector
  registers with AVX-512, 16 with AVX2): FC x OW accumulators, a broadcast per pixel (the unrolled filter-block
  loop reuses each) and a filter vector; tiles past that spill (on ResNet-18's 3x3 convs the 28-accumulator tiles
  ran 1.3-3.1x the best one, bench/results/register_tiles-r18-3x3-spr.md);
  one sketch per (FC, OW) pair whose factors divide the output;
- two loop orders: the whole reduction inside an output tile, accumulating in registers (``tile``), or the
  input-channel blocks outermost, accumulating into the output in memory as MLAS does (``channels-outer``);
- plus MetaSchedule's own space for the block, so nothing it could find is lost.

In the ``tile`` order the elementwise ops after the conv (bias, residual add, relu) are applied to the tile as it
leaves the registers; left to AutoInline they ran as a pass of their own over the output, which cost the 1x1
convs that widen channels most (MobileNetV2's expansions by 6: 0.41-0.74x onnxruntime's speed with it). Parallel
loops, unrolling limits and where padding is computed stay the search's decisions (ParallelizeVectorizeUnroll,
RandomComputeLocation), as for any other block.
"""

from __future__ import annotations

from typing import Any

RULE = "tunecore.conv2d_nchwc"
BLOCK = "conv2d_NCHWc"
DEPTHWISE_BLOCK = "depthwise_conv2d_NCHWc"
_MAX_FC, _MAX_OW = 8, 14


def conv2d_nchwc(data: Any, weight: Any, strides: Any, padding: Any, dilation: Any, out_dtype: str) -> Any:
    """TE compute of a blocked conv; ``padding`` is (top, left, bottom, right) as relax gives it."""
    from tvm import te

    _, ic_chunks, _, _, ic_block = (int(x) for x in data.shape)
    oc_chunks, _, kernel_h, kernel_w, _, oc_block = (int(x) for x in weight.shape)
    padded, (out_h, out_w), (stride_h, stride_w), (dilation_h, dilation_w) = _padded(
        data, (kernel_h, kernel_w), strides, padding, dilation)
    ico = te.reduce_axis((0, ic_chunks), name="ic_outer")
    kh = te.reduce_axis((0, kernel_h), name="kh")
    kw = te.reduce_axis((0, kernel_w), name="kw")
    ici = te.reduce_axis((0, ic_block), name="ic_inner")
    return te.compute(
        (int(data.shape[0]), oc_chunks, out_h, out_w, oc_block),
        lambda n, oc, y, x, ob: te.sum(
            padded[n, ico, y * stride_h + kh * dilation_h, x * stride_w + kw * dilation_w, ici].astype(out_dtype)
            * weight[oc, ico, kh, kw, ici, ob].astype(out_dtype), axis=[ico, kh, kw, ici]),
        name=BLOCK, attrs={"schedule_rule": RULE})


def depthwise_conv2d_nchwc(data: Any, weight: Any, strides: Any, padding: Any, dilation: Any, out_dtype: str) -> Any:
    """TE compute of a blocked depthwise conv: one filter per channel, weights (C / B, 1, kh, kw, B)."""
    from tvm import te

    _, chunks, height, width, block = (int(x) for x in data.shape)
    _, _, kernel_h, kernel_w, _ = (int(x) for x in weight.shape)
    padded, (out_h, out_w), (stride_h, stride_w), (dilation_h, dilation_w) = _padded(
        data, (kernel_h, kernel_w), strides, padding, dilation)
    kh = te.reduce_axis((0, kernel_h), name="kh")
    kw = te.reduce_axis((0, kernel_w), name="kw")
    return te.compute(
        (int(data.shape[0]), chunks, out_h, out_w, block),
        lambda n, c, y, x, b: te.sum(
            padded[n, c, y * stride_h + kh * dilation_h, x * stride_w + kw * dilation_w, b].astype(out_dtype)
            * weight[c, 0, kh, kw, b].astype(out_dtype), axis=[kh, kw]),
        name=DEPTHWISE_BLOCK)


def _padded(data: Any, kernel: tuple[int, int], strides: Any, padding: Any, dilation: Any) -> tuple:
    """The padded blocked input, the output's height and width, strides and dilation as ints."""
    from tvm import topi

    _, _, height, width, _ = (int(x) for x in data.shape)
    stride = tuple(int(x) for x in strides)
    dilations = tuple(int(x) for x in dilation)
    top, left, bottom, right = (int(x) for x in padding)
    out_h = (height + top + bottom - dilations[0] * (kernel[0] - 1) - 1) // stride[0] + 1
    out_w = (width + left + right - dilations[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    padded = topi.nn.pad(data, [0, 0, top, left, 0], [0, 0, bottom, right, 0]) if top + left + bottom + right \
        else data
    return padded, (out_h, out_w), stride, dilations


def register_rule() -> None:
    """Make ``sketches`` the rule ApplyCustomRule finds for the blocked conv on CPUs (once per process)."""
    import tvm_ffi

    name = f"s_tir.meta_schedule.cpu.{RULE}"
    if tvm_ffi.get_global_func(name, allow_missing=True) is None:
        tvm_ffi.register_global_func(name, sketches)


def register_tiles(lanes: int, oc_chunks: int, out_w: int) -> list[tuple[int, int]]:
    """(FC, OW) register tiles: FC filter blocks x OW output pixels that divide the output and whose FC x OW
    accumulators, OW broadcasts and a filter vector fit the vector registers."""
    registers = 32 if lanes >= 16 else 16
    return [(fc, ow) for fc in _divisors(oc_chunks) if fc <= _MAX_FC for ow in _divisors(out_w)
            if ow <= _MAX_OW and fc * ow >= 4 and fc * ow + ow + 1 <= registers]


def sketches(sch: Any, block: Any) -> list:
    """The register-tiled sketches of a blocked conv block, and MetaSchedule's own (see the module docstring)."""
    n, oc, y, x, ob, ico, kh, kw, ici = sch.get_loops(block)[-9:]
    extents = [int(sch.get(loop).extent) for loop in (oc, x, ob)]
    out = []
    for fc, ow in register_tiles(extents[2], extents[0], extents[1]):
        for order in ("tile", "channels-outer"):
            out.append(_sketch(sch.copy(), block, fc, ow, order))
    default = sch.copy()
    default.unannotate(block, "schedule_rule")  # the other rules (multi-level tiling) take it from here
    return [*out, default]


def _sketch(sch: Any, block: Any, fc: int, ow: int, order: str) -> Any:
    n, oc, y, x, ob, ico, kh, kw, ici = sch.get_loops(block)[-9:]
    oc_outer, oc_inner = sch.split(oc, [None, fc])
    x_outer, x_inner = sch.split(x, [None, ow])
    if order == "tile":
        sch.reorder(n, oc_outer, y, x_outer, ico, kh, kw, ici, oc_inner, x_inner, ob)
        accumulator = sch.cache_write(block, 0, "local")  # FC x OW x B values, kept in registers
        sch.reverse_compute_at(accumulator, x_outer)
        _fuse_epilogue(sch, accumulator)
        sch.vectorize(sch.get_loops(accumulator)[-1])
    else:
        sch.reorder(n, oc_outer, ico, y, x_outer, kh, kw, ici, oc_inner, x_inner, ob)
    for loop in (ici, oc_inner, x_inner):
        sch.unroll(loop)
    sch.vectorize(ob)
    return sch


def _fuse_epilogue(sch: Any, accumulator: Any) -> None:
    """Apply the elementwise ops after the conv (bias, residual add, relu) to the register tile as it is stored,
    instead of in a pass of their own over the whole output, which a 1x1 conv that widens its channels pays in
    full (MobileNetV2's expansions)."""
    from tvm.s_tir.schedule import ScheduleError

    while len(consumers := sch.get_consumers(accumulator)) == 1:
        try:
            sch.reverse_compute_inline(consumers[0])
        except ScheduleError:  # not elementwise, or read elsewhere too: it stays where the search puts it
            return


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def conv_out_dtype(call: Any) -> str:
    """A relax conv's output dtype: its attribute, or the input's when that is unset."""
    out_dtype = str(call.attrs.out_dtype)
    return str(call.args[0].ty.dtype) if out_dtype in ("", "None", "void") else out_dtype
