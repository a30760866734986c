"""The tuning loop and the task schedulers.

A round: the scheduler picks a task -> the search policy proposes candidates -> the measurer builds
and runs them -> the store commits every result -> the cost model and the policy learn from them.
The budget (``trials``) counts the records earlier runs of the same workload put in the store for
its tasks, so running the same command again with a larger budget measures only the difference, and
an interrupted run resumes where its last committed round ended. Records that runs of other
workloads left on shared kernels (donors for ``transfer``, kernels two models have in common) do
not use up this workload's budget; they are its history all the same.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from typing import Any, Callable, Sequence, TypedDict

import numpy as np

from tunecore.data import Record, Task, distinct
from tunecore.roles import CostModel, Measurer, RecordStore, SearchPolicy, TaskContext

PHASES = ("search", "measure", "store", "learn")
UNMEASURED = 1e10  # seconds; the latency a task without any successful record counts as
_GIVE_UP_AFTER_FAILED_ROUNDS = 3


def derive_seed(*parts: Any) -> int:
    """A 31-bit seed from a base seed and names, stable across processes and machines."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


@dataclasses.dataclass(eq=False)
class TaskState:
    task: Task
    trials: int = 0  # records in the store, failures included
    errors: int = 0
    rounds: int = 0
    best: float = UNMEASURED
    best_history: list[float] = dataclasses.field(default_factory=list)  # best after each round
    failed_rounds: int = 0  # consecutive rounds without a single success, while best is UNMEASURED
    measured: set[str] = dataclasses.field(default_factory=set)
    history: list[Record] = dataclasses.field(default_factory=list)  # stored before this run; dropped once started
    started: bool = False
    done_reason: str | None = None  # why the task gets no more rounds ("exhausted", "all candidates fail")

    def add_round(self, records: Sequence[Record]) -> None:
        self.rounds += 1
        self.trials += len(records)
        for r in records:
            self.measured.add(r.key)
            if r.latency is None:
                self.errors += 1
            else:
                self.best = min(self.best, r.latency)
        self.best_history.append(self.best)
        if self.best >= UNMEASURED and records:
            self.failed_rounds += 1
            if self.failed_rounds >= _GIVE_UP_AFTER_FAILED_ROUNDS:
                self.done_reason = "every candidate failed"


class RoundRobinScheduler:
    """Tasks in turn."""

    name = "round-robin"

    def __init__(self, states: list[TaskState], seed: int = 0):
        self.states = states

    def next(self) -> TaskState | None:
        alive = [s for s in self.states if s.done_reason is None]
        if not alive:
            return None
        return min(alive, key=lambda s: (s.rounds, self.states.index(s)))


class GradientScheduler(RoundRobinScheduler):
    """Ansor's task scheduler (Zheng et al., OSDI'20, section 6).

    Minimises the end-to-end latency estimate f = sum_i w_i * g_i (g_i: best latency of task i).
    After every task had one round, it picks the task whose next round is expected to reduce f
    most, estimating dg_i/dt from the task's recent progress (backward window) and from what a
    similar task of the same kernel class achieves (optimistic forward guess); with probability
    ``eps`` it picks a random task instead.
    """

    name = "gradient"

    def __init__(self, states: list[TaskState], seed: int = 0, alpha: float = 0.2, beta: float = 2.0,
                 backward_window: int = 3, eps: float = 0.05):
        super().__init__(states)
        self.alpha, self.beta, self.window, self.eps = alpha, beta, backward_window, eps
        self.rng = np.random.default_rng(seed)

    def next(self) -> TaskState | None:
        alive = [s for s in self.states if s.done_reason is None]
        if not alive:
            return None
        unstarted = [s for s in alive if s.rounds == 0]
        if unstarted:  # warm-up: one round each
            return unstarted[0]
        if self.rng.random() < self.eps:
            return alive[int(self.rng.integers(len(alive)))]
        gradients = [self._gradient(s) for s in alive]
        if max(gradients) == min(gradients):
            return alive[int(self.rng.integers(len(alive)))]
        return alive[int(np.argmin(gradients))]

    def _gradient(self, s: TaskState) -> float:
        chain = s.task.weight  # df/dg_i for f = sum w_i g_i
        history = s.best_history
        backward = (history[-1] - history[-1 - self.window]) / self.window if len(history) > self.window else 0.0
        optimistic = s.best - s.best / s.rounds
        peers = [p for p in self.states if p.task.kernel_class == s.task.kernel_class and p.best < UNMEASURED]
        if len(peers) > 1 and s.task.flops > 0:
            best_throughput = max(p.task.flops / p.best for p in peers)
            optimistic = min(optimistic, self.beta * s.task.flops / best_throughput)
        forward = optimistic - s.best
        return chain * (self.alpha * backward + (1 - self.alpha) * forward)


SCHEDULERS = {cls.name: cls for cls in (GradientScheduler, RoundRobinScheduler)}


def default_round_size(budget: int, n_tasks: int, capacity: int = 1) -> int:
    """Candidates per round: small enough that the scheduler can move budget between tasks, large
    enough to keep the build pool busy, and up to 32 for each candidate the measurer measures at once
    (``Measurer.capacity``: a fleet of N devices gets rounds N times as large)."""
    return max(4, min(32 * capacity, budget // max(1, 2 * n_tasks)))


@dataclasses.dataclass
class RoundReport:
    """Passed to the progress callback after each round."""

    task: Task
    measured: int  # this run so far
    budget: int  # this run's
    errors: int  # this run so far
    estimated_latency: float | None  # sum of weight * best over tasks, None while a task has no success
    states: list[TaskState]


class Tuner:
    """Runs the rounds for one workload. Components are constructed by the caller (the CLI or a script)."""

    def __init__(
        self,
        *,
        search: SearchPolicy,
        cost_model: CostModel,
        store: RecordStore,
        measurer: Measurer,
        seed: int = 0,
        scheduler: str = "gradient",
        round_size: int | None = None,
        plugin_manager: Any = None,
        on_round: Callable[[RoundReport], None] | None = None,
    ):
        from tunecore.plugins import get_plugin_manager

        self.search, self.cost_model, self.store, self.measurer = search, cost_model, store, measurer
        self.seed = seed
        self.scheduler_name = scheduler
        self.round_size = round_size
        self.hooks = (plugin_manager or get_plugin_manager()).hook
        self.on_round = on_round

    def tune(self, tasks: Sequence[Task], trials: int, run_info: dict[str, Any] | None = None) -> RunSummary:
        """Measure until runs of this workload put ``trials`` records for ``tasks`` in the store
        (or every task is exhausted).

        Returns the run summary (what ``tunecore run --json`` prints).
        """
        started = time.time()
        self.store.put_tasks(tasks)
        states = self._restore_states(tasks)
        info = dict(run_info or {})
        same_workload = {r["run_id"] for r in self.store.runs() if _same_workload(r["info"], info)}
        already = sum(r.run_id in same_workload for s in states for r in s.history)
        budget = max(0, trials - already)
        round_size = self.round_size or default_round_size(budget, len(tasks), self.measurer.capacity)
        info.update(trials=trials, seed=self.seed, scheduler=self.scheduler_name, round_size=round_size)
        self.device = device = self.measurer.device()
        self.cost_model.device = device
        run_id = self.store.start_run(dict(info, device=device))
        run = dict(info, run_id=run_id, device=device)
        self.hooks.tunecore_on_run_start(run=run, tasks=list(tasks))
        self._warm_start(states)
        scheduler = SCHEDULERS[self.scheduler_name](states, seed=derive_seed(self.seed, "scheduler"))
        measured = errors = 0
        self.phase_seconds = dict.fromkeys(PHASES, 0.0)
        status = "failed"
        try:
            while measured < budget:
                state = scheduler.next()
                if state is None:
                    break
                records = self._round(state, min(round_size, budget - measured), already + measured, run_id)
                if not records:
                    continue
                measured += len(records)
                errors += sum(r.latency is None for r in records)
                if self.on_round:
                    self.on_round(RoundReport(state.task, measured, budget, errors, estimated_latency(states), states))
            status = "finished"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            summary = summarize(states, run, measured=measured, errors=errors, elapsed=time.time() - started,
                                status=status, phase_seconds=self.phase_seconds, search=self.search)
            self.store.finish_run(run_id, summary)
            self.hooks.tunecore_on_run_end(run=run, summary=summary)
        return summary

    def _restore_states(self, tasks: Sequence[Task]) -> list[TaskState]:
        states = []
        for task in tasks:
            state = TaskState(task, history=self.store.records(task.task_id))
            if state.history:
                state.add_round(state.history)
                state.failed_rounds = 0
                state.done_reason = None
            states.append(state)
        return states

    def _warm_start(self, states: list[TaskState]) -> None:
        """Teach the cost model what the store already knows about these tasks (on whichever device)."""
        devices = self.store.devices()
        for state in states:
            if state.history:
                task, records = state.task, state.history
                self.cost_model.update(task, [r.candidate(task) for r in records],
                                       [r.result(devices.get(r.device_id)) for r in records])

    def _round(self, state: TaskState, n: int, trial_base: int, run_id: int) -> list[Record]:
        task = state.task
        clock = time.perf_counter()  # starting a task (its design space, the policy's preparation) is search time
        if not state.started:
            from tunecore.space import DesignSpace

            seed = derive_seed(self.seed, task.task_id, state.trials)  # a resumed run samples afresh
            space = DesignSpace(task, seed=seed)
            self.search.start_task(TaskContext(task, space, seed, set(state.measured), state.history))
            state.started, state.history = True, []
        candidates = distinct(self.search.propose(task, n), state.measured)[:n]
        clock = self._spent("search", clock)
        if not candidates:
            state.done_reason = f"search '{self.search.name}' has no new candidates"
            return []
        results = self.measurer.measure(task, candidates)
        for result in results:
            result.device = result.device or self.device
        self.hooks.tunecore_on_measured(task=task, candidates=candidates, results=results)
        clock = self._spent("measure", clock)
        now = time.time()
        records = [
            Record.from_result(c, r, trial=trial_base + i, measured_at=now, run_id=run_id)
            for i, (c, r) in enumerate(zip(candidates, results))
        ]
        self.store.commit(records)  # durable before anything else learns from them
        state.add_round(records)
        clock = self._spent("store", clock)
        self.cost_model.update(task, candidates, results)
        self.search.observe(task, candidates, results)
        self.hooks.tunecore_on_results(task=task, records=records)
        self._spent("learn", clock)
        return records

    def _spent(self, phase: str, since: float) -> float:
        now = time.perf_counter()
        self.phase_seconds[phase] += now - since
        return now


def run_key(info: dict[str, Any]) -> str | None:
    """The run key a run was started with (stores written before 0.2 call a bench cell's key ``bench_cell``)."""
    return info.get("run_key", info.get("bench_cell"))


def _same_workload(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two runs tuned the same workload under the same run key (see TuneConfig.run_key)."""
    return a.get("model") == b.get("model") and run_key(a) == run_key(b)


def estimated_latency(states: Sequence[TaskState]) -> float | None:
    if not states or any(s.best >= UNMEASURED for s in states):
        return None
    return sum(s.task.weight * s.best for s in states)


class TaskSummary(TypedDict):
    name: str
    task_id: str
    kernel_class: str
    weight: int
    flops: float
    trials: int  # records in the store, failures included, earlier runs included
    errors: int
    best_latency_s: float | None  # None: no successful record
    gflops: float | None
    stopped: str | None  # why the task got no more rounds, if it stopped early
    search_report: dict[str, Any]  # what the search policy has to say about the task (e.g. transfer: the donor)


class RunSummary(TypedDict):
    """How a run ended: what ``tunecore run --json`` prints and the store keeps with the run."""

    run_id: int
    model: str
    target: str  # canonical JSON
    search: str
    cost_model: str
    measurer: str
    store: str
    seed: int
    status: str  # "finished", "interrupted" or "failed"
    trials_requested: int
    trials_measured: int  # by this run
    errors: int  # of this run
    trials_total: int  # in the store for these tasks
    errors_total: int
    elapsed_s: float
    # where the time of the rounds went: proposing, measuring (+ profiling hooks), committing,
    # and the cost model and search learning from the results
    phase_s: dict[str, float]
    estimated_latency_ms: float | None  # sum of weight x best; None while a task has no success
    tasks: list[TaskSummary]


def summarize(states: Sequence[TaskState], run: dict[str, Any], *, measured: int, errors: int, elapsed: float,
              status: str, phase_seconds: dict[str, float] | None = None,
              search: SearchPolicy | None = None) -> RunSummary:
    total = estimated_latency(states)
    return RunSummary(
        run_id=run["run_id"], model=run.get("model", ""), target=run.get("target", ""), search=run.get("search", ""),
        cost_model=run.get("cost_model", ""), measurer=run.get("measurer", ""), store=run.get("store", ""),
        seed=run.get("seed", 0), status=status, trials_requested=run.get("trials", 0), trials_measured=measured,
        errors=errors, trials_total=sum(s.trials for s in states), errors_total=sum(s.errors for s in states),
        elapsed_s=round(elapsed, 3), phase_s={k: round(v, 3) for k, v in (phase_seconds or {}).items()},
        estimated_latency_ms=None if total is None else total * 1e3,
        tasks=[
            TaskSummary(
                name=s.task.name, task_id=s.task.task_id, kernel_class=s.task.kernel_class, weight=s.task.weight,
                flops=s.task.flops, trials=s.trials, errors=s.errors,
                best_latency_s=None if s.best >= UNMEASURED else s.best,
                gflops=None if s.best >= UNMEASURED or not s.task.flops else s.task.flops / s.best / 1e9,
                stopped=s.done_reason, search_report=search.task_report(s.task) if search is not None else {},
            )
            for s in states
        ],
    )
