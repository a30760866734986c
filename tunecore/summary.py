"""A run's summary: what ``tunecore run --json`` prints and the store keeps with the run."""

from __future__ import annotations

from typing import Any, Sequence, TypedDict

from tunecore.roles import SearchPolicy
from tunecore.schedulers import UNMEASURED, TaskState, network_latency, network_parts


def estimated_latency(states: Sequence[TaskState]) -> float | None:
    """The sum of weight x best latency over what compile builds (the faster of a conv's direct and Winograd
    kernels); None while a part has no side whose every task has a success."""
    total = network_latency(network_parts(states)) if states else UNMEASURED
    return None if total >= UNMEASURED else total


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
    trials_requested: int | None  # None: a time budget alone
    time_budget_s: float | None  # None: trials alone
    trials_measured: int  # by this run
    errors: int  # of this run
    trials_total: int  # in the store for these tasks
    errors_total: int
    elapsed_s: float
    elapsed_total_s: float  # this run's and the earlier runs' of the workload (what --time-budget counts)
    # where the time of the rounds went: proposing, measuring (+ profiling hooks), committing,
    # and the cost model and search learning from the results
    phase_s: dict[str, float]
    estimated_latency_ms: float | None  # tunecore.summary.estimated_latency
    tasks: list[TaskSummary]


def summarize(states: Sequence[TaskState], run: dict[str, Any], *, measured: int, errors: int, elapsed: float,
              status: str, elapsed_before: float = 0.0, phase_seconds: dict[str, float] | None = None,
              search: SearchPolicy | None = None) -> RunSummary:
    total = estimated_latency(states)
    return RunSummary(
        run_id=run["run_id"], model=run.get("model", ""), target=run.get("target", ""), search=run.get("search", ""),
        cost_model=run.get("cost_model", ""), measurer=run.get("measurer", ""), store=run.get("store", ""),
        seed=run.get("seed", 0), status=status, trials_requested=run.get("trials", 0),
        time_budget_s=run.get("time_budget_s"), trials_measured=measured,
        errors=errors, trials_total=sum(s.trials for s in states), errors_total=sum(s.errors for s in states),
        elapsed_s=round(elapsed, 3), elapsed_total_s=round(elapsed_before + elapsed, 3),
        phase_s={k: round(v, 3) for k, v in (phase_seconds or {}).items()},
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
