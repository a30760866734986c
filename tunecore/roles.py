"""The four roles a plugin can fill, as abstract base classes: SearchPolicy, CostModel, RecordStore, Measurer;
and the parts a measurer is made of: Builder, Runner, Profiler.

A component class names itself with the class attribute ``name``; the registry owns those names.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

from tunecore.data import Candidate, MeasureResult, Record, Task
from tunecore.options import reject_unknown_options

if TYPE_CHECKING:
    import numpy as np
    import tvm

    from tunecore.space import DesignSpace


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
    ``uses_cost_model``: False for a policy that proposes without asking its cost model (random search), so that
    a run pairing it with one says the model is trained for nothing, and a bench matrix runs it once.
    """

    uses_cost_model = True

    def __init__(self, *, cost_model: CostModel, store: RecordStore, seed: int = 0, **options: Any):
        reject_unknown_options("search", self.name, options)
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
    # True for a model whose ``predict_latency`` says how many seconds a candidate takes (``tunecore
    # costmodel eval`` then also reports its error in seconds); a ranking-only model leaves it False.
    predicts_latency: ClassVar[bool] = False

    def __init__(self, *, seed: int = 0, **options: Any):
        reject_unknown_options("cost model", self.name, options)
        self.seed = seed
        # The device the run measures on (Measurer.device()), set by the tuner before the first
        # ``update``: ``predict`` ranks candidates for it. Each result given to ``update`` carries the
        # device it was measured on in ``result.device`` (records from the store: other machines too).
        self.device: dict[str, Any] | None = None

    @abc.abstractmethod
    def update(self, task: Task, candidates: Sequence[Candidate], results: Sequence[MeasureResult]) -> None:
        """Learn from measured candidates; failed ones have ``result.error`` set."""

    def update_all(self, batches: Sequence[tuple[Task, Sequence[Candidate], Sequence[MeasureResult]]]) -> None:
        """Learn from many tasks' measurements at once (a warm start, a dataset). By default ``update``
        per batch; a model that retrains on everything after each ``update`` should train once here."""
        for task, candidates, results in batches:
            self.update(task, candidates, results)

    def reset(self) -> None:
        """Forget everything learned before, weights shipped with the model included. ``tunecore costmodel
        eval`` calls it before training, so that no model is judged on programs it has already seen."""

    @abc.abstractmethod
    def predict(self, task: Task, candidates: Sequence[Candidate]) -> np.ndarray:
        """One float per candidate, higher = predicted faster. Only the order within a call matters."""

    def profilers(self, target: tvm.target.Target) -> list[str]:
        """Profilers whose metrics (``result.profile``) ``update`` learns from: a run adds them to its measurer's
        ``profilers`` option. None by default."""
        return []

    def predict_latency(self, task: Task, candidates: Sequence[Candidate]) -> np.ndarray:
        """Predicted seconds per candidate on ``self.device``; only for models with ``predicts_latency``."""
        raise NotImplementedError(f"cost model '{self.name}' ranks candidates but does not predict latency")

    def members(self) -> list[CostModel]:
        """An ensemble's members, each predicting alone from what the ensemble learned (``tunecore costmodel
        eval`` reports each beside the ensemble); [] for a model that is not an ensemble."""
        return []

    def device_note(self, device: dict[str, Any]) -> str | None:
        """What a user should know before trusting predictions for ``device`` (a device descriptor), e.g. that
        the model never learned from it; None: nothing. ``tunecore predict`` prints it."""
        return None

    def keep_checkpoint(self, path: str, settings: dict[str, Any]) -> None:
        """Keep the state of training from scratch in ``path`` while it trains, and start from the state found
        there when it was written with the same ``settings`` (``tunecore costmodel train``: the same command run
        again continues after Ctrl-C); ``save`` removes it, the training being over. By default none is kept:
        the model trains from the start each time."""

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

    def mark_failed(self, task_id: str, key: str, error: str, profile: dict[str, float] | None = None) -> None:
        """A stored success turned out to be wrong (``tunecore records check``): it becomes a failure with
        ``error``, its timings kept, ``profile`` entries added; never again a best or a donor."""
        raise NotImplementedError(f"record store '{self.name}' cannot mark records as failed")

    @abc.abstractmethod
    def counts(self, task_ids: Sequence[str]) -> dict[str, int]:
        """Number of records (failures included) per task id."""

    def failure_counts(self, task_ids: Sequence[str]) -> dict[str, int]:
        """Number of failed records per task id. This default loads every record; a store that can count in
        place should (``records list`` asks it of every task)."""
        return {t: sum(r.error is not None for r in self.records(t)) for t in task_ids}

    def tasks_by_kernel_class(self, kernel_class: str, target_kind: str | None = None) -> list[Task]:
        """Every stored task of a kernel class (any model), optionally only for one target kind.

        This default filters ``get_tasks()``; a store with an index on kernel classes answers faster.
        """
        return [t for t in self.get_tasks()
                if t.kernel_class == kernel_class and (target_kind is None or t.target_kind == target_kind)]

    def claim(self, task_id: str, keys: Sequence[str], run_id: int) -> set[str]:
        """The candidates (by key) run ``run_id`` may measure now: a store shared by concurrent jobs leaves out
        those another job has claimed or stored, so that nothing is measured twice. By default: all of them."""
        return set(keys)

    @abc.abstractmethod
    def start_run(self, info: dict[str, Any], started_at: float | None = None) -> int:
        """Record that a run started (its settings) at ``started_at`` (None: now; an import gives the original
        time); returns the run id stamped on its records.

        ``info["device"]``, when present, is the measurer's ``device()``: the store keeps it once per
        device and stamps its id (``tunecore.targets.device_id``) on the run and on the run's records.
        """

    @abc.abstractmethod
    def finish_run(self, run_id: int, summary: dict[str, Any], finished_at: float | None = None) -> None:
        """Record how a run ended (at ``finished_at``; None: now)."""

    @abc.abstractmethod
    def runs(self) -> list[dict[str, Any]]:
        """Every run: id, started_at, finished_at, info, summary, device_id."""

    def devices(self) -> dict[str, dict[str, Any]]:
        """Every device a run measured on: device id -> description. A store that keeps none returns {}."""
        return {}


class Measurer(Component):
    """Builds and runs candidates on the target. Built by the core as ``cls(target, **options)``.

    ``capacity`` is how many candidates it measures at once; the tuner makes rounds large enough to
    keep that many busy.

    Failures (build errors, crashes, timeouts, wrong results) come back as results with ``error``
    set; ``measure`` raises only when the measurer itself cannot work at all.
    """

    capacity: int = 1

    def __init__(self, target: tvm.target.Target, **options: Any):
        reject_unknown_options("measurer", self.name, options)
        self.target = target

    @abc.abstractmethod
    def measure(self, task: Task, candidates: Sequence[Candidate]) -> list[MeasureResult]:
        """One result per candidate, in the same order."""

    def device(self) -> dict[str, Any]:
        """The device this measurer measures on (``tunecore.targets.device_descriptor``), stored with every run
        and record. Machines with different CPUs (or GPUs), or targets that differ in ``mcpu`` or ``num-cores``,
        are different devices. The default describes this machine; a measurer timing elsewhere (RPC) must
        describe the remote device."""
        from tunecore.targets import device_descriptor

        return device_descriptor(self.target)


@dataclasses.dataclass
class Artifact:
    """A built candidate, where the runner that measures it can load it."""

    path: str  # a shared library, on the machine the builder wrote it to
    build_secs: float = 0.0
    # The built function's arguments (ArgInfo JSON, as Task.args), which differ from the task's where
    # RewriteLayout packed a weight; None: the task's.
    args: list | None = None
    # Where the kernel takes packed weights: {"inputs": positions of the task's arguments the library's packing
    # function (tunecore.measure.worker.PACK) packs, "outputs": positions of the kernel's arguments it fills}
    packing: dict | None = None

    def arguments(self, task: Task) -> list:
        return self.args if self.args is not None else task.args


class Builder(Component):
    """Compiles scheduled modules into artifacts. Built by the measurer as ``cls(target, **options)``.

    ``capacity`` is how many modules it builds at once (workers); ``discard`` frees an artifact once
    it has been run and profiled.
    """

    capacity: int = 1

    def __init__(self, target: tvm.target.Target, **options: Any):
        reject_unknown_options("builder", self.name, options)
        self.target = target

    @abc.abstractmethod
    def build(self, mods_json: Sequence[str]) -> list[Artifact | str]:
        """One artifact per module (``tvm.ir.save_json`` of the scheduled IRModule), in order; for a module that
        failed to build, the reason as one line instead. Raises only when the builder itself cannot work."""

    def ready(self) -> None:
        """Return once it can build (e.g. its workers started); the measurer's clock starts after."""

    def discard(self, artifact: Artifact) -> None:
        """The artifact is no longer needed."""
        import os

        try:
            os.remove(artifact.path)
        except OSError:
            pass


class Profiler(Component):
    """Adds metrics of a built candidate to its result: called by the runner where it runs the candidate,
    after timing it and while the artifact still exists. Built by the measurer as ``cls()``."""

    @abc.abstractmethod
    def profile(self, task: Task, artifact: Artifact, result: MeasureResult) -> dict[str, float]:
        """Metrics to add to ``result.profile``; {} when there is nothing to say (e.g. a failed run)."""


class Runner(Component):
    """Times artifacts on the device. Built by the measurer as ``cls(target, **options)``.

    ``capacity`` is how many candidates it times at once (1 for one device; N for a fleet of N):
    the tuner sizes its rounds by it.
    """

    capacity: int = 1
    runs_profilers: ClassVar[bool] = True  # False: it times elsewhere (RPC), where no profiler of ours runs

    def __init__(self, target: tvm.target.Target, **options: Any):
        reject_unknown_options("runner", self.name, options)
        self.target = target

    def ready(self) -> None:
        """Return once it can run candidates (e.g. its workers or devices are up)."""

    @abc.abstractmethod
    def run(self, task: Task, artifacts: Sequence[Artifact], profilers: Sequence[Profiler]) -> list[MeasureResult]:
        """One result per artifact, in order (``run_secs``, or ``error`` for a crash, a timeout or wrong outputs),
        each profiled by every profiler before the artifact may go away.

        A runner that checks outputs compares those of the candidates it checks with the task's reference
        (``set_reference``) after timing them, on the same seeded inputs: a candidate whose outputs differ
        is a failure, ``"wrong output: max relative error ..."``; each one checked carries
        ``profile["check.max_relative_error"]``."""

    def needs_reference(self, task: Task) -> bool:
        """Whether ``set_reference`` should be called before ``run`` for this task (False: it checks nothing)."""
        return False

    def set_reference(self, task: Task, reference: Artifact | str) -> None:
        """The task's unscheduled program, built (or why it failed to build): the runner keeps its outputs on the
        task's seeded inputs (tunecore.check) to compare candidates with."""

    def device(self) -> dict[str, Any]:
        """The device it times on; see ``Measurer.device``."""
        from tunecore.targets import device_descriptor

        return device_descriptor(self.target)


ROLES: dict[str, type[Component]] = {
    "search": SearchPolicy,
    "cost_model": CostModel,
    "store": RecordStore,
    "measurer": Measurer,
}
ROLE_LABELS = {"search": "search policy", "cost_model": "cost model", "store": "record store", "measurer": "measurer"}
# What a measurer can be assembled from (-O measurer.builder=NAME -O measurer.runner=NAME -O measurer.profilers=[...])
MEASURER_PARTS: dict[str, type[Component]] = {"builder": Builder, "runner": Runner, "profiler": Profiler}

