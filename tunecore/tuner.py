"""The tuning loop (task states and schedulers: tunecore.schedulers; the run summary: tunecore.summary).

A round: the scheduler picks a task -> the search policy proposes candidates -> the measurer builds
and runs them -> the store commits every result -> the cost model and the policy learn from them.
The budget (``trials``, and/or ``time_budget`` seconds: whichever ends first) counts what earlier runs
of the same workload spent (records they put in the store for its tasks, seconds they ran), so running
the same command again with a larger budget measures only the difference, and an interrupted run
resumes where its last committed round ended. Records that runs of other
workloads left on shared kernels (donors for ``transfer``, kernels two models have in common) do
not use up this workload's budget; they are its history all the same.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from typing import Any, Callable, Sequence

from tunecore.data import Record, Task, distinct
from tunecore.roles import CostModel, Measurer, RecordStore, SearchPolicy, TaskContext
from tunecore.schedulers import SCHEDULERS, TaskState, restored_state
from tunecore.summary import RunSummary, estimated_latency, summarize

PHASES = ("search", "measure", "store", "learn")


def derive_seed(*parts: Any) -> int:
    """A 31-bit seed from a base seed and names, stable across processes and machines."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def default_round_size(budget: float, n_tasks: int, capacity: int = 1) -> int:
    """Candidates per round: small enough that the scheduler can move budget between tasks, large
    enough to keep the build pool busy, and up to 32 for each candidate the measurer measures at once
    (``Measurer.capacity``: a fleet of N devices gets rounds N times as large). An unlimited budget
    (a time budget alone) gets the largest rounds. At least 4, but never so many that the first round of each
    task overruns the budget: 100 trials over a network's 33 tasks are rounds of 3, not 33 rounds of 4 that
    would leave 8 tasks unmeasured."""
    least = min(4, max(1, budget // max(1, n_tasks)))
    return int(max(least, min(32 * capacity, budget // max(1, 2 * n_tasks))))


def tuned_seconds(runs: Sequence[dict[str, Any]], records: Sequence[Record]) -> float:
    """Seconds the runs tuned: each to its end, or, killed before it could record one, to its last
    committed record; the time between runs does not count."""
    last_at: dict[int, float] = {}
    for r in records:
        last_at[r.run_id] = max(last_at.get(r.run_id, 0.0), r.measured_at)
    return sum((run["finished_at"] or last_at.get(run["run_id"], run["started_at"])) - run["started_at"]
               for run in runs)


@dataclasses.dataclass
class RoundReport:
    """Passed to the progress callback after each round."""

    task: Task
    measured: int  # this run so far
    budget: float  # this run's trials (inf: a time budget alone)
    errors: int  # this run so far
    estimated_latency: float | None  # tunecore.summary.estimated_latency
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

    def tune(self, tasks: Sequence[Task], trials: int | None, run_info: dict[str, Any] | None = None,
             time_budget: float | None = None) -> RunSummary:
        """Measure until runs of this workload put ``trials`` records for ``tasks`` in the store, or have
        tuned for ``time_budget`` seconds (None: no limit of that kind), or every task is exhausted.

        Returns the run summary (what ``tunecore run --json`` prints).
        """
        started = time.time()
        self.store.put_tasks(tasks)
        states = self._restore_states(tasks)
        info = dict(run_info or {})
        earlier = [r for r in self.store.runs() if _same_workload(r["info"], info)]
        earlier_ids = {run["run_id"] for run in earlier}
        mine = [r for s in states for r in s.history if r.run_id in earlier_ids]
        already = len(mine)
        budget = math.inf if trials is None else max(0, trials - already)
        spent = tuned_seconds(earlier, mine)
        deadline = math.inf if time_budget is None else started + max(0.0, time_budget - spent)
        round_size = self.round_size or default_round_size(budget, len(tasks), self.measurer.capacity)
        info.update(trials=trials, time_budget_s=time_budget, seed=self.seed, scheduler=self.scheduler_name,
                    round_size=round_size)
        self.device = device = self.measurer.device()
        self.cost_model.device = device
        run_id = self.store.start_run(dict(info, device=device))
        run = dict(info, run_id=run_id, device=device)
        self.hooks.tunecore_on_run_start(run=run, tasks=list(tasks))
        warm_start(self.cost_model, self.store, [(state.task, state.history) for state in states])
        scheduler = SCHEDULERS[self.scheduler_name](states, seed=derive_seed(self.seed, "scheduler"))
        measured = errors = 0
        self.phase_seconds = dict.fromkeys(PHASES, 0.0)
        status = "failed"
        try:
            while measured < budget and time.time() < deadline:
                state = scheduler.next()
                if state is None:
                    break
                size = min(scheduler.round_size(state, round_size), budget - measured)
                records = self._round(state, size, already + measured, run_id)
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
                                elapsed_before=spent, status=status, phase_seconds=self.phase_seconds,
                                search=self.search)
            self.store.finish_run(run_id, summary)
            self.hooks.tunecore_on_run_end(run=run, summary=summary)
        return summary

    def _restore_states(self, tasks: Sequence[Task]) -> list[TaskState]:
        states = []
        for task in tasks:
            history = self.store.records(task.task_id)
            states.append(dataclasses.replace(restored_state(task, history), history=history))
        return states

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
        claimed = self.store.claim(task.task_id, [c.key for c in candidates], run_id)
        if len(claimed) < len(candidates):  # a job sharing the store measures the others
            state.measured.update(c.key for c in candidates if c.key not in claimed)
            candidates = [c for c in candidates if c.key in claimed]
            if not candidates:
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


def warm_start(cost_model: CostModel, store: RecordStore, histories: Sequence[tuple[Task, list[Record]]]) -> None:
    """Teach the cost model what the store already knows about these tasks (their records, on whichever device)."""
    devices = store.devices()
    cost_model.update_all([
        (task, [r.candidate(task) for r in history], [r.result(devices.get(r.device_id)) for r in history])
        for task, history in histories if history
    ])


def run_key(info: dict[str, Any]) -> str | None:
    """The run key a run was started with (stores written by tunecore 0.1 call a bench cell's key ``bench_cell``)."""
    return info.get("run_key", info.get("bench_cell"))


def _same_workload(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two runs tuned the same workload under the same run key (see TuneConfig.run_key)."""
    return a.get("model") == b.get("model") and run_key(a) == run_key(b)


