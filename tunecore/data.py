"""The data that flows through the tuning loop: tasks, candidates, measurements and stored records.

TVM is imported lazily so that ``tunecore plugins`` and ``--help`` stay fast.
"""

from __future__ import annotations

import dataclasses
import hashlib
import statistics
import time
from functools import cached_property
from typing import TYPE_CHECKING, Any, Collection, Sequence

from tunecore.tvmjson import replay_trace_json, schedule_key, target_from_json, trace_to_json

if TYPE_CHECKING:
    import tvm


def task_id_for(workload_hash: str, target_json: str) -> str:
    """A task's id: its kernel on its target, the same for every run on every machine."""
    return hashlib.sha256(f"{workload_hash}|{target_json}".encode()).hexdigest()[:20]


@dataclasses.dataclass(eq=False)
class Task:
    """One tuning task: a fused TIR function of a workload, on one target.

    ``task_id`` is derived from the function's structural hash and the target, so the same kernel
    tuned by any run on any machine with the same target gets the same id.
    """

    task_id: str
    name: str  # the fused function's name, e.g. "fused_conv2d_add_relu"
    kernel_class: str  # the fused operator sequence, e.g. "conv2d_add_relu"
    workload_hash: str  # tvm structural hash of ``mod``, as MetaSchedule's databases key it
    target_json: str  # canonical JSON of the target
    mod_json: str  # tvm.ir.save_json of the IRModule holding the PrimFunc "main"
    flops: float  # of one call
    args: list  # MetaSchedule ArgInfo JSON: [["TENSOR", dtype, shape], ...]
    weight: int = 1  # calls per inference of ``model``
    model: str = ""  # the workload this task was extracted from

    @cached_property
    def mod(self) -> tvm.IRModule:
        import tvm

        return tvm.ir.load_json(self.mod_json)

    @cached_property
    def target(self) -> tvm.target.Target:
        return target_from_json(self.target_json)

    @property
    def target_kind(self) -> str:
        import json

        return json.loads(self.target_json)["kind"]

    def for_model(self, model: str, weight: int) -> Task:
        """The same kernel as it occurs in another model (the store keeps one row per kernel)."""
        return dataclasses.replace(self, model=model, weight=weight)


class Candidate:
    """A schedule of a task, proposed for measurement.

    ``trace_json`` (the full trace with decisions and postprocessors, in MetaSchedule's JSON form)
    is what is stored; ``mod`` (the scheduled module) is what is built. ``key`` identifies the
    program: two candidates with the same key are the same program and are measured once.
    A candidate made from a schedule computes these only when asked, so searches can score many
    candidates cheaply; one made from a stored trace replays it only when asked.
    """

    def __init__(self, task: Task, trace_json: str | None = None, key: str | None = None, origin: str = "",
                 sch: Any = None):
        if trace_json is None and sch is None:
            raise ValueError("a candidate needs a trace or a schedule")
        self.task = task
        self.origin = origin  # what produced it: "random", "evolve", "transfer:<donor task id>", ...
        self._trace_json = trace_json
        self._key = key
        self._sch = sch

    @classmethod
    def from_schedule(cls, task: Task, sch: Any, origin: str = "") -> Candidate:
        return cls(task, origin=origin, sch=sch)

    @property
    def sch(self) -> Any:
        """The schedule (tvm.s_tir.Schedule).

        Replays the stored trace on first use (RuntimeError if it does not apply).
        """
        if self._sch is None:
            self._sch = replay_trace_json(self.task.mod, self._trace_json)
        return self._sch

    @property
    def mod(self) -> tvm.IRModule:
        return self.sch.mod

    @property
    def trace(self) -> Any:
        return self.sch.trace

    @property
    def trace_json(self) -> str:
        if self._trace_json is None:
            self._trace_json = trace_to_json(self._sch.trace)
        return self._trace_json

    @property
    def key(self) -> str:
        if self._key is None:
            self._key = schedule_key(self.sch)
        return self._key

    def __repr__(self) -> str:
        return f"Candidate(task={self.task.name!r}, key={self._key!r}, origin={self.origin!r})"


def distinct(candidates: Sequence[Candidate], exclude: Collection[str] = ()) -> list[Candidate]:
    """The candidates with distinct keys (first occurrence kept), leaving out keys in ``exclude``."""
    seen = set(exclude)
    out = []
    for c in candidates:
        if c.key not in seen:
            seen.add(c.key)
            out.append(c)
    return out


@dataclasses.dataclass
class MeasureResult:
    """What a measurer learned about one candidate. A failure is a result with ``error`` set."""

    run_secs: list[float] | None = None
    error: str | None = None
    build_secs: float = 0.0
    profile: dict[str, float] = dataclasses.field(default_factory=dict)
    measure_secs: float = 0.0  # wall time the measurer spent on this candidate's batch, divided by its size
    device: dict[str, Any] | None = None  # what it was measured on (Measurer.device()); None: unknown

    @property
    def latency(self) -> float | None:
        """Median of the repeated measurements in seconds; None when the candidate failed."""
        if self.error is not None or not self.run_secs:
            return None
        return float(statistics.median(self.run_secs))


def spread(run_secs: Sequence[float] | None) -> float | None:
    """std / mean of a program's timings; None without two of them (a dataset label's noise)."""
    if not run_secs or len(run_secs) < 2:
        return None
    return float(statistics.pstdev(run_secs) / statistics.fmean(run_secs))


@dataclasses.dataclass
class Record:
    """A stored measurement: one candidate of one task, with its result and when it was taken."""

    task_id: str
    key: str
    trace_json: str
    run_secs: list[float] | None = None
    error: str | None = None
    build_secs: float = 0.0
    profile: dict[str, float] = dataclasses.field(default_factory=dict)
    origin: str = ""
    trial: int = 0  # index of this measurement within the run's budget, counting resumed runs on
    measured_at: float = dataclasses.field(default_factory=time.time)  # unix time
    run_id: int | None = None
    device_id: str | None = None  # the device it was measured on (RecordStore.devices); None: unknown

    @property
    def latency(self) -> float | None:
        return MeasureResult(self.run_secs, self.error).latency

    @classmethod
    def from_result(cls, candidate: Candidate, result: MeasureResult, **fields: Any) -> Record:
        return cls(
            task_id=candidate.task.task_id,
            key=candidate.key,
            trace_json=candidate.trace_json,
            run_secs=result.run_secs,
            error=result.error,
            build_secs=result.build_secs,
            profile=dict(result.profile),
            origin=candidate.origin,
            **fields,
        )

    def candidate(self, task: Task) -> Candidate:
        return Candidate(task, self.trace_json, self.key, self.origin)

    def result(self, device: dict[str, Any] | None = None) -> MeasureResult:
        """The measurement as a result; ``device``: the description of ``device_id`` (RecordStore.devices)."""
        return MeasureResult(self.run_secs, self.error, self.build_secs, dict(self.profile), device=device)
