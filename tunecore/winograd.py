"""Winograd F(4x4, 3x3) for a network's 3x3 stride-1 convs, as a candidate beside the direct conv (``--winograd``).

With ``--winograd`` a network's tasks include, for each such conv (NCHW, one group), both its direct kernel and
its Winograd kernel (TVM's compute, whose data-pack and inverse blocks have CPU schedule rules of their own);
the search tunes both. ``tunecore compile`` then keeps Winograd for a conv only where its tuned kernels are
faster than the direct ones (the best records' latencies, which passed the output checks when measured), and
builds the rest direct. The filter transform is a computation on the weights alone, run once at compile time.

A conv is named by its ``signature`` (input and output shapes and the filter count), which both of its kernels'
arguments show: convs of one signature take one decision.
"""

from __future__ import annotations

import json
from typing import Any

TILE = 4  # F(4x4, 3x3): 6x6 input tiles
ALPHA = TILE + 3 - 1
ALL = "*"  # in a set of signatures: every conv Winograd can compute


def eligible(call: Any) -> bool:
    """A relax conv2d Winograd can compute: NCHW/OIHW, one group, 3x3, stride 1, dilation 1."""
    attrs = call.attrs
    weight = call.args[1].ty
    return (str(attrs.data_layout) == "NCHW" and str(attrs.kernel_layout) == "OIHW"
            and str(attrs.out_layout) == "NCHW" and int(attrs.groups) == 1
            and [int(x) for x in attrs.strides] == [1, 1] and [int(x) for x in attrs.dilation] == [1, 1]
            and [int(weight.shape[i]) for i in (2, 3)] == [3, 3])


def signature(data_shape: Any, out_shape: Any) -> str:
    """What names a conv for the decision: its input and output shapes."""
    return json.dumps([[int(x) for x in data_shape], [int(x) for x in out_shape]])


def call_signature(call: Any) -> str:
    return signature(call.args[0].ty.shape, call.ty.shape)


def task_signature(task: Any) -> tuple[str, bool] | None:
    """(the signature of the 3x3 conv in a task, whether the task computes it by Winograd); None for a task with
    no such conv. Read from the task's arguments: the filter (CO, CI, 3, 3) of a direct conv, or the transformed
    filter (6, 6, CI, CO) of a Winograd one, the input (N, CI, H, W) and the output, the last argument."""
    shapes = [list(arg[2]) for arg in task.args]
    if len(shapes) < 3:
        return None
    out = shapes[-1]
    for shape in shapes[:-1]:
        if len(shape) != 4:
            continue
        if shape[2:] == [3, 3]:
            channels, winograd = shape[1], False
        elif shape[:2] == [ALPHA, ALPHA]:
            channels, winograd = shape[2], True
        else:
            continue
        data = next((s for s in shapes[:-1] if len(s) == 4 and s is not shape and s[1] == channels
                     and s[0] == out[0] and s[2:] == out[2:]), None)
        if data is not None and len(out) == 4:
            return signature(data, out), winograd
    return None


def filter_transform(kernel: Any) -> Any:
    """The filter (CO, CI, 3, 3) as Winograd's (6, 6, CI, CO), the layout TVM's Winograd compute reads.
    (TOPI's own transform gives (6, 6, CO, CI) and fails on this TVM's dtype objects.)"""
    from tvm import te
    from tvm.topi.nn.winograd_util import winograd_transform_matrices

    out_channels, in_channels, size, _ = (int(x) for x in kernel.shape)
    _, _, g = winograd_transform_matrices(TILE, size, str(kernel.dtype))
    kh = te.reduce_axis((0, size), name="r_kh")
    kw = te.reduce_axis((0, size), name="r_kw")
    return te.compute((ALPHA, ALPHA, in_channels, out_channels),
                      lambda eps, nu, ci, co: te.sum(kernel[co, ci, kh, kw] * g[eps, kh] * g[nu, kw], axis=[kh, kw]),
                      name="transform_weight")


def legalize(bb: Any, call: Any) -> Any:
    """A conv2d computed by Winograd: the filter transform (a weight-only computation) and TVM's Winograd conv."""
    from tvm import topi

    from tunecore.blocked_conv import conv_out_dtype

    attrs = call.attrs
    data, weight = call.args
    out_dtype = conv_out_dtype(call)
    packed = bb.emit_te(filter_transform, weight)
    return bb.call_te(topi.nn.conv2d_winograd_nchw_without_weight_transform, data, packed, attrs.strides,
                      attrs.padding, attrs.dilation, out_dtype, primfunc_name_hint="conv2d_winograd")


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
