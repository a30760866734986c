"""``--search A --then B``: per task, policy A until it has nothing new to propose, then policy B.

B starts on a task only when A is done with it, and sees everything measured so far (A's results
included) as the task's history, so e.g. ``--search transfer --then ansor`` evolves from the
transferred schedules. Both share the run's cost model and store; the budget is the run's.
"""

from __future__ import annotations

from typing import Any, Sequence

from tunecore.data import Candidate, MeasureResult, Task
from tunecore.roles import SearchPolicy, TaskContext


class SearchChain(SearchPolicy):
    def __init__(self, first: SearchPolicy, then: SearchPolicy):
        self.first, self.then = first, then
        self.name = f"{first.name}+{then.name}"
        self.cost_model, self.store, self.seed = first.cost_model, first.store, first.seed
        self.contexts: dict[str, TaskContext] = {}
        self.handed_over: set[str] = set()  # task ids now proposed for by ``then``

    def start_task(self, context: TaskContext) -> None:
        self.contexts[context.task.task_id] = context
        self.first.start_task(context)

    def propose(self, task: Task, n: int) -> list[Candidate]:
        if task.task_id not in self.handed_over:
            candidates = self.first.propose(task, n)
            if candidates:
                return candidates
            self.handed_over.add(task.task_id)
            context = self.contexts[task.task_id]
            history = self.store.records(task.task_id)
            self.then.start_task(TaskContext(task, context.space, context.seed, {r.key for r in history}, history))
        return self.then.propose(task, n)

    def observe(self, task: Task, candidates: Sequence[Candidate], results: Sequence[MeasureResult]) -> None:
        policy = self.then if task.task_id in self.handed_over else self.first
        policy.observe(task, candidates, results)

    def task_report(self, task: Task) -> dict[str, Any]:
        report = dict(self.first.task_report(task))
        report.update({f"{self.then.name}_{k}": v for k, v in self.then.task_report(task).items()})
        if task.task_id in self.contexts:
            report["then_started"] = task.task_id in self.handed_over
        return report

    def close(self) -> None:
        self.first.close()
        self.then.close()
