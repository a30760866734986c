"""The data that flows through the tuning loop and the four roles a plugin can fill.

Roles (each an abstract base class below): SearchPolicy, CostModel, RecordStore, Measurer.
A component class names itself with the class attribute ``name``; the registry owns those names.

TVM is imported lazily so that ``tunecore plugins`` and ``--help`` stay fast.
"""

from __future__ import annotations

import abc
import dataclasses
import statistics
import time
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Collection, Sequence

if TYPE_CHECKING:
    import numpy as np
    import tvm

    from tunecore.space import DesignSpace


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
        from tunecore.targets import target_from_json

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
        """The schedule (tvm.s_tir.Schedule); replays the stored trace on first use (RuntimeError if it does not apply)."""
        if self._sch is None:
            from tunecore.space import replay_trace_json

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
            from tunecore.space import trace_to_json

            self._trace_json = trace_to_json(self._sch.trace)
        return self._trace_json

    @property
    def key(self) -> str:
        if self._key is None:
            from tunecore.space import schedule_key

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

    @property
    def latency(self) -> float | None:
        """Median of the repeated measurements in seconds; None when the candidate failed."""
        if self.error is not None or not self.run_secs:
            return None
        return float(statistics.median(self.run_secs))


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

    def result(self) -> MeasureResult:
        return MeasureResult(self.run_secs, self.error, self.build_secs, dict(self.profile))


def check_options(**checks: tuple[object, bool, str]) -> None:
    """Refuse bad option values (e.g. ``-O search.population=abc``) in a component's constructor, before any work.

    Each check is ``name=(value, acceptable, what it must be)``; TypeError is what tunecore turns
    into a one-line usage error.
    """
    for name, (value, acceptable, requirement) in checks.items():
        if not acceptable:
            raise TypeError(f"{name} must be {requirement}, not {value!r}")


def is_int(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def is_number(value: object, low: float, high: float = float("inf")) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high


class Component(abc.ABC):
    """Common to all roles. ``target_kinds`` = the TVM target kinds a component supports (None: all)."""

    name: ClassVar[str]
    target_kinds: ClassVar[frozenset[str] | None] = None

    @classmethod
    def unsupported_reason(cls, target: tvm.target.Target) -> str | None:
        """Why this component cannot work with ``target``, or None if it can."""
        kind = target.kind.name
        if cls.target_kinds is not None and kind not in cls.target_kinds:
            return f"supports targets {sorted(cls.target_kinds)}, not '{kind}'"
        return None

    def close(self) -> None:
        """Release processes, files and connections. Called once when the run ends."""


@dataclasses.dataclass
class TaskContext:
    """What a search policy gets to know about one task when it starts on it."""

    task: Task
    space: DesignSpace  # the task's sketches, postprocessors and samplers
    seed: int  # derive every random choice for this task from it
    measured: set[str]  # keys of candidates already in the store; the core skips them anyway
    history: list[Record]  # this task's records already in the store (resume, warm start)


class SearchPolicy(Component):
    """Per task, proposes the next batch of candidates; is told what they measured.

    Built by the core as ``cls(cost_model=..., store=..., seed=..., **options)``.
    The call order per task is ``start_task`` once, then ``propose`` / ``observe`` pairs.
    """

    def __init__(self, *, cost_model: CostModel, store: RecordStore, seed: int = 0, **options: Any):
        if options:
            raise TypeError(f"unknown option(s) for search '{self.name}': {', '.join(sorted(options))}")
        self.cost_model = cost_model
        self.store = store
        self.seed = seed

    @abc.abstractmethod
    def start_task(self, context: TaskContext) -> None:
        """Called once per task before its first ``propose``."""

    @abc.abstractmethod
    def propose(self, task: Task, n: int) -> list[Candidate]:
        """Up to ``n`` candidates not measured before. An empty list means the task is exhausted."""

    def observe(self, task: Task, candidates: Sequence[Candidate], results: Sequence[MeasureResult]) -> None:
        """Called after the candidates of the last ``propose`` were measured and stored."""

    def task_report(self, task: Task) -> dict[str, Any]:
        """What the policy did for ``task``, for the run summary: flat JSON values, e.g. {"donor_task": ...}.

        Called when the run ends, also for tasks it never started. ``tunecore run`` prints the
        keys as columns of a per-task table.
        """
        return {}


class CostModel(Component):
    """Predicts which candidates run fast, learning from measured ones.

    Built by the core as ``cls(seed=..., **options)``. One instance serves every task of a run.
    ``learns`` says whether ``update`` teaches it anything; the conformance suite holds a model
    that says so to ranking programs it has not seen.
    """

    learns: ClassVar[bool] = True

    def __init__(self, *, seed: int = 0, **options: Any):
        if options:
            raise TypeError(f"unknown option(s) for cost model '{self.name}': {', '.join(sorted(options))}")
        self.seed = seed

    @abc.abstractmethod
    def update(self, task: Task, candidates: Sequence[Candidate], results: Sequence[MeasureResult]) -> None:
        """Learn from measured candidates; failed ones have ``result.error`` set."""

    @abc.abstractmethod
    def predict(self, task: Task, candidates: Sequence[Candidate]) -> np.ndarray:
        """One float per candidate, higher = predicted faster. Only the order within a call matters."""

    def save(self, path: str) -> None:
        """Write the model to ``path`` in a format that is safe to load (no pickle)."""
        raise NotImplementedError(f"cost model '{self.name}' cannot be saved")

    def load(self, path: str) -> None:
        """Read a model written by ``save``."""
        raise NotImplementedError(f"cost model '{self.name}' cannot be loaded")


class RecordStore(Component):
    """Durable home of tasks, runs and records. Built by the core as ``cls(location)``.

    ``commit`` must make the records durable before it returns: a crash right after loses nothing.
    """

    @abc.abstractmethod
    def __init__(self, location: str):
        ...

    @abc.abstractmethod
    def put_tasks(self, tasks: Sequence[Task]) -> None:
        """Store tasks (idempotent); remembers which model each came from and with what weight."""

    @abc.abstractmethod
    def get_tasks(self, model: str | None = None, task_ids: Sequence[str] | None = None) -> list[Task]:
        """Tasks of one model (with that model's weights), or by id, or all of them."""

    @abc.abstractmethod
    def commit(self, records: Sequence[Record]) -> None:
        """Append records durably; a record whose (task_id, key) is stored already is ignored."""

    @abc.abstractmethod
    def records(self, task_id: str) -> list[Record]:
        """All records of a task, failures included, in the order they were committed."""

    @abc.abstractmethod
    def best(self, task_id: str, k: int = 1) -> list[Record]:
        """The ``k`` fastest successful records of a task, fastest first."""

    @abc.abstractmethod
    def counts(self, task_ids: Sequence[str]) -> dict[str, int]:
        """Number of records (failures included) per task id."""

    @abc.abstractmethod
    def tasks_by_kernel_class(self, kernel_class: str, target_kind: str | None = None) -> list[Task]:
        """Every stored task of a kernel class (any model), optionally only for one target kind."""

    @abc.abstractmethod
    def start_run(self, info: dict[str, Any]) -> int:
        """Record that a run started (its settings); returns the run id stamped on its records."""

    @abc.abstractmethod
    def finish_run(self, run_id: int, summary: dict[str, Any]) -> None:
        """Record how a run ended."""

    @abc.abstractmethod
    def runs(self) -> list[dict[str, Any]]:
        """Every run: id, started_at, finished_at, info, summary."""


class Measurer(Component):
    """Builds and runs candidates on the target. Built by the core as ``cls(target, **options)``.

    Failures (build errors, crashes, timeouts, wrong results) come back as results with ``error``
    set; ``measure`` raises only when the measurer itself cannot work at all.
    """

    def __init__(self, target: tvm.target.Target, **options: Any):
        if options:
            raise TypeError(f"unknown option(s) for measurer '{self.name}': {', '.join(sorted(options))}")
        self.target = target

    @abc.abstractmethod
    def measure(self, task: Task, candidates: Sequence[Candidate]) -> list[MeasureResult]:
        """One result per candidate, in the same order."""


ROLES: dict[str, type[Component]] = {
    "search": SearchPolicy,
    "cost_model": CostModel,
    "store": RecordStore,
    "measurer": Measurer,
}
ROLE_LABELS = {"search": "search policy", "cost_model": "cost model", "store": "record store", "measurer": "measurer"}
