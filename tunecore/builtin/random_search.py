"""The ``random`` search policy: uniform samples of the task's design space. The control in every comparison."""

from __future__ import annotations

from tunecore.data import Candidate, Task
from tunecore.roles import SearchPolicy, TaskContext


class RandomSearch(SearchPolicy):
    name = "random"
    uses_cost_model = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.contexts: dict[str, TaskContext] = {}

    def start_task(self, context: TaskContext) -> None:
        self.contexts[context.task.task_id] = context

    def propose(self, task: Task, n: int) -> list[Candidate]:
        context = self.contexts[task.task_id]
        return context.space.sample_new(n, context.measured, origin=self.name)
