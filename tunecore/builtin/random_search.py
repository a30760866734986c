"""The ``random`` search policy: uniform samples of the task's design space. The control in every comparison."""

from __future__ import annotations

from tunecore.data import Candidate, Task
from tunecore.roles import SearchPolicy, TaskContext

# Give up on a task after this many consecutive samples that were invalid or already measured.
_MAX_MISSES = 64


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
        seen = set(context.measured)
        out: list[Candidate] = []
        misses = 0
        while len(out) < n and misses < _MAX_MISSES:
            sch = context.space.sample()
            candidate = Candidate.from_schedule(task, sch, origin=self.name) if sch is not None else None
            if candidate is None or candidate.key in seen:
                misses += 1
                continue
            misses = 0
            seen.add(candidate.key)
            out.append(candidate)
        return out
