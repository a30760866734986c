"""Winograd F(4x4, 3x3) for a network's 3x3 stride-1 convs, as a candidate beside the direct conv (``--winograd``).

With ``--winograd`` a network's tasks include, for each such conv (one group), both its direct kernel and
its Winograd kernel (TOPI's stages, whose data-pack and inverse blocks have CPU schedule rules in TVM);
the search tunes both. ``tunecore compile`` then keeps Winograd for a conv only where its tuned kernels are
faster than the direct ones (the best records' latencies, which passed the output checks when measured), and
builds the rest direct. The filter transform is a computation on the weights alone, run once at compile time.
In the blocked layout (``--layout nchwc``) the Winograd kernel reads and writes blocked activations itself, so a
conv computed by Winograd needs no layout transforms around it among blocked convs.

On CPUs ``tunecore run --winograd`` times every kernel cold (a cache flush before each call): the transformed
filter is 4x the filter, and timed warm a Winograd kernel won where inside the network, its weights coming from
memory, it took twice its warm time and lost (bench/results/e2e_gap-spr-resnet18-winograd-warm.md). Where a conv
has both kernels, the task scheduler counts only the faster side (tunecore.schedulers.network_parts).

A conv is named by its ``signature`` (input and output shapes and the filter count), which both of its kernels'
arguments show: convs of one signature take one decision.
"""

from __future__ import annotations

import json
import re
from typing import Any

TILE = 4  # F(4x4, 3x3): 6x6 input tiles
ALPHA = TILE + 3 - 1
ALL = "*"  # in a set of signatures: every conv Winograd can compute
LAYOUTS = ("nchw", "nchwc")  # the layouts (tunecore.layouts) whose convs ``eligible`` accepts


def eligible(call: Any) -> bool:
    """A relax conv2d Winograd can compute: NCHW/OIHW/NCHW or blocked (NCHW{B}c/OIHW{B'}o/NCHW{B'}c), one group,
    3x3, stride 1, dilation 1."""
    attrs = call.attrs
    weight = [int(x) for x in call.args[1].ty.shape]
    blocks = _block(str(attrs.data_layout)), _block(str(attrs.out_layout))
    plain = blocks == (1, 1) and str(attrs.kernel_layout) == "OIHW"
    blocked = 1 not in blocks and None not in blocks and str(attrs.kernel_layout) == f"OIHW{blocks[1]}o"
    return ((plain or blocked) and int(attrs.groups) == 1 and weight[2:4] == [3, 3]
            and [int(x) for x in attrs.strides] == [1, 1] and [int(x) for x in attrs.dilation] == [1, 1])


def _block(layout: str) -> int | None:
    """The channel block of an activation layout: 1 for NCHW, B for NCHW{B}c, None for any other."""
    if layout == "NCHW":
        return 1
    match = re.fullmatch(r"NCHW(\d+)c", layout)
    return int(match.group(1)) if match else None


def _plain(shape: Any) -> list[int]:
    """An activation's shape in NCHW: (N, C / B, H, W, B) is (N, C, H, W)."""
    shape = [int(x) for x in shape]
    return [shape[0], shape[1] * shape[4], *shape[2:4]] if len(shape) == 5 else shape


def signature(data_shape: Any, out_shape: Any) -> str:
    """What names a conv for the decision: its input and output shapes, in NCHW whatever its layout."""
    return json.dumps([_plain(data_shape), _plain(out_shape)])


def call_signature(call: Any) -> str:
    return signature(call.args[0].ty.shape, call.ty.shape)


def task_signature(task: Any) -> tuple[str, bool] | None:
    """(the signature of the 3x3 conv in a task, whether the task computes it by Winograd); None for a task with
    no such conv. Read from the task's arguments: the filter (CO, CI, 3, 3) of a direct conv, (CO / B', CI / B, 3,
    3, B, B') of a blocked one, or the transformed filter (6, 6, CI, CO) of a Winograd one, the input (N, CI, H, W)
    or (N, CI / B, H, W, B) and the output, the last argument."""
    shapes = [[int(x) for x in arg[2]] for arg in task.args]
    if len(shapes) < 3:
        return None
    out = _plain(shapes[-1])
    for shape in shapes[:-1]:
        if len(shape) == 4 and shape[2:] == [3, 3]:
            channels, winograd = shape[1], False
        elif len(shape) == 6 and shape[2:4] == [3, 3]:
            channels, winograd = shape[1] * shape[4], False
        elif len(shape) == 4 and shape[:2] == [ALPHA, ALPHA]:
            channels, winograd = shape[2], True
        else:
            continue
        data = next((_plain(s) for s in shapes[:-1] if len(s) in (4, 5) and s is not shape
                     and _plain(s)[1] == channels and s[0] == out[0] and _plain(s)[2:] == out[2:]), None)
        if data is not None and len(out) == 4:
            return signature(data, out), winograd
    return None


def filter_transform(kernel: Any) -> Any:
    """The filter (CO, CI, 3, 3), or blocked (CO / B, CI, 3, 3, B), as Winograd's (6, 6, CI, CO), the layout
    ``conv2d`` reads. (TOPI's own transform gives (6, 6, CO, CI) and fails on this TVM's dtype objects.)"""
    from tvm import te
    from tvm.topi.nn.winograd_util import winograd_transform_matrices

    shape = [int(x) for x in kernel.shape]
    block = shape[4] if len(shape) == 5 else 1
    out_channels, in_channels, size = shape[0] * block, shape[1], shape[2]
    _, _, g = winograd_transform_matrices(TILE, size, str(kernel.dtype))
    kh = te.reduce_axis((0, size), name="r_kh")
    kw = te.reduce_axis((0, size), name="r_kw")

    def weight(co: Any, ci: Any) -> Any:
        return kernel[co // block, ci, kh, kw, co % block] if len(shape) == 5 else kernel[co, ci, kh, kw]

    return te.compute((ALPHA, ALPHA, in_channels, out_channels),
                      lambda eps, nu, ci, co: te.sum(weight(co, ci) * g[eps, kh] * g[nu, kw], axis=[kh, kw]),
                      name="transform_weight")


def conv2d(data: Any, packed: Any, padding: Any, out_dtype: str, out_block: int) -> Any:
    """TE compute of an F(4x4, 3x3) conv, stride 1, of plain (N, C, H, W) or blocked (N, C / B, H, W, B) data with
    the transformed filter ``packed`` (6, 6, CI, CO); the output plain (``out_block`` 1) or blocked by
    ``out_block``. TOPI's stages under TOPI's names, so that TVM's Winograd schedule rules take them, with two
    differences: the padded input reads the blocked data itself (no stage unblocking it), and it covers every
    input tile; TOPI's pads by the conv's padding only, and where the output is not a multiple of 4 (ResNet's
    14x14 and 7x7) its last tiles read two rows and columns past the buffer (its measured programs came out
    wrong by 1.6-1.9% where the unblocked input was a stage of its own)."""
    from tvm import te, tirx
    from tvm.topi.nn.winograd_util import winograd_transform_matrices

    shape = [int(x) for x in data.shape]
    block = shape[4] if len(shape) == 5 else 1
    n, channels, height, width = shape[0], shape[1] * block, shape[2], shape[3]
    top, left, bottom, right = (int(x) for x in padding)
    out_h, out_w = height + top + bottom - 2, width + left + right - 2
    tiles_h, tiles_w = (out_h + TILE - 1) // TILE, (out_w + TILE - 1) // TILE
    tiles = n * tiles_h * tiles_w
    out_channels = int(packed.shape[3])
    a, b, _ = winograd_transform_matrices(TILE, 3, out_dtype)

    def value(i: Any, c: Any, y: Any, x: Any) -> Any:
        inside = tirx.all(y >= 0, y < height, x >= 0, x < width)
        y, x = tirx.max(tirx.min(y, height - 1), 0), tirx.max(tirx.min(x, width - 1), 0)  # a read in bounds
        read = data[i, c // block, y, x, c % block] if len(shape) == 5 else data[i, c, y, x]
        return tirx.if_then_else(inside, read, tirx.const(0, data.dtype))

    data_pad = te.compute((n, channels, tiles_h * TILE + 2, tiles_w * TILE + 2),
                          lambda i, c, y, x: value(i, c, y - top, x - left), name="data_pad")
    input_tile = te.compute(
        (channels, tiles, ALPHA, ALPHA),
        lambda c, p, eps, nu: data_pad[p // (tiles_h * tiles_w), c, (p // tiles_w) % tiles_h * TILE + eps,
                                       p % tiles_w * TILE + nu],
        name="input_tile", attrs={"schedule_rule": "None"})
    r_a, r_b = te.reduce_axis((0, ALPHA), "r_a"), te.reduce_axis((0, ALPHA), "r_b")
    data_pack = te.compute(
        (ALPHA, ALPHA, channels, tiles),
        lambda eps, nu, c, p: te.sum(input_tile[c, p, r_a, r_b] * b[r_a, eps] * b[r_b, nu], axis=[r_a, r_b]),
        name="data_pack", attrs={"schedule_rule": "conv2d_nchw_winograd_data_pack"})
    ci = te.reduce_axis((0, channels), name="ci")
    bgemm = te.compute(
        (ALPHA, ALPHA, out_channels, tiles),
        lambda eps, nu, co, p: te.sum(data_pack[eps, nu, ci, p] * packed[eps, nu, ci, co], axis=[ci]),
        name="bgemm", attrs={"layout_free_placeholders": [packed]})
    r_a, r_b = te.reduce_axis((0, ALPHA), "r_a"), te.reduce_axis((0, ALPHA), "r_b")
    inverse = te.compute(
        (out_channels, tiles, TILE, TILE),
        lambda co, p, vh, vw: te.sum(bgemm[r_a, r_b, co, p] * a[r_a, vh] * a[r_b, vw], axis=[r_a, r_b]),
        name="inverse", attrs={"schedule_rule": "conv2d_nchw_winograd_inverse"})

    def out(i: Any, co: Any, y: Any, x: Any) -> Any:
        return inverse[co, i * tiles_h * tiles_w + y // TILE * tiles_w + x // TILE, y % TILE, x % TILE]

    if out_block == 1:
        return te.compute((n, out_channels, out_h, out_w), out, name="conv2d_winograd")
    return te.compute((n, out_channels // out_block, out_h, out_w, out_block),
                      lambda i, c, y, x, cb: out(i, c * out_block + cb, y, x), name="conv2d_winograd")


def legalize(bb: Any, call: Any) -> Any:
    """A conv2d computed by Winograd: the filter transform (a weight-only computation) and the Winograd conv, on
    blocked activations where the conv is blocked."""
    from tunecore.blocked_conv import conv_out_dtype

    attrs = call.attrs
    data, weight = call.args
    packed = bb.emit_te(filter_transform, weight)
    return bb.call_te(conv2d, data, packed, attrs.padding, conv_out_dtype(call), _block(str(attrs.out_layout)),
                      primfunc_name_hint="conv2d_winograd")


def choose(store: Any, tasks: list) -> frozenset[str]:
    """The signatures of the convs whose Winograd kernels measured faster than their direct ones: per signature,
    the sum over its tasks of weight x best latency, Winograd against direct, each side with a record for every
    task it has."""
    sums: dict[str, dict[bool, float | None]] = {}
    for task in tasks:
        named = task_signature(task)
        if named is None:
            continue
        key, winograd = named
        best = store.best(task.task_id, k=1)
        side = sums.setdefault(key, {}).setdefault(winograd, 0.0)
        latency = best[0].latency if best else None
        sums[key][winograd] = None if side is None or latency is None else side + task.weight * latency
    return frozenset(key for key, s in sums.items()
                     if s.get(True) is not None and (s.get(False) is None or s[True] < s[False]))
