"""TVM objects as JSON and back, and the identity of a program: what records and tasks are made of.

A leaf module: it imports nothing from tunecore, so every other module can use it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tvm


def to_plain(obj: Any) -> Any:
    """TVM's JSON-able objects (arrays, maps, IntImm...) as plain Python values."""
    import tvm

    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, tvm.tirx.IntImm):
        return int(obj.value)
    if isinstance(obj, tvm.tirx.FloatImm):
        return float(obj.value)
    if hasattr(obj, "items"):
        return {str(k): to_plain(v) for k, v in obj.items()}
    return [to_plain(x) for x in obj]


def to_plain_json(obj: Any) -> str:
    return json.dumps(to_plain(obj), separators=(",", ":"))


def trace_to_json(trace: Any) -> str:
    """A trace with its decisions and postprocessors, as MetaSchedule's JSON databases write it."""
    return to_plain_json(trace.as_json(remove_postproc=False))


def new_schedule(mod: tvm.IRModule, seed: int = -1) -> Any:
    from tvm.s_tir.schedule import Schedule

    return Schedule(mod, seed=seed if seed > 0 else None, debug_mask=0, error_render_level="detail")


def replay_trace_json(mod: tvm.IRModule, trace_json: str) -> Any:
    """The schedule a stored trace produces on ``mod`` (raises RuntimeError if it does not apply)."""
    from tvm.s_tir.schedule import Trace

    sch = new_schedule(mod)
    Trace.apply_json_to_schedule(json.loads(trace_json), sch)
    return sch


def schedule_key(sch: Any) -> str:
    """Identity of the program a schedule produced: equal programs, equal keys."""
    import tvm_ffi

    return format(tvm_ffi.structural_hash(sch.mod), "016x")


def target_to_json(target: Any) -> str:
    """Canonical JSON of a target: equal targets give equal strings."""
    return json.dumps(to_plain(target.export()), sort_keys=True)


def target_from_json(text: str) -> Any:
    import tvm

    return tvm.target.Target(json.loads(text))
