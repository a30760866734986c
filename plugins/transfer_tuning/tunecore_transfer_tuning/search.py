"""The `transfer` search policy: replay the best schedules of same-class kernels from the store.

Per task (Transfer-Tuning, PACT'22, with the whole store as the donor pool):
1. Donors: every other stored task of the same kernel class (fused operator sequence and output
   rank) and target kind, from any model and any earlier run, nearest shapes first.
2. Pairs: each donor's ``per_donor`` best schedules, replayed on this task. A tile-size decision
   is re-fitted to this task's loop extent in two ways: ``divisible`` keeps each inner factor
   that still divides what is left (else its largest divisor below it) and gives the outer loop
   the rest; ``padded`` keeps the donor's inner factors and rounds the outer one up, so the loop
   runs past the extent under a guard (what Ansor's split steps do on new shapes). A pair whose
   trace does not replay, or that a postprocessor rejects, is skipped and counted by reason.
3. Order: nearest shape first; when the cost model has an opinion (it is first taught the donor
   tasks' measurements), its ranking and the shape ranking take turns, so a poor model can cost
   at most half of the pairs.
4. The first round also measures the task's unscheduled program, for the speedup in the report.
   When a task's pairs are used up the policy has nothing more to propose (``--then ansor``
   continues from the transferred schedules).
"""

from __future__ import annotations

import collections
import math
from typing import Any

import numpy as np

from tunecore.interfaces import Candidate, SearchPolicy, Task, TaskContext, check_options, is_int

FITS = ("divisible", "padded")


def refit_tile(factors: list[int], extent: int, fit: str) -> list[int]:
    """Tile factors of a donor loop, re-fitted to a loop of ``extent`` (see the module docstring)."""
    if fit == "padded":
        inner = math.prod(factors[1:])
        return [max(1, -(-extent // inner)), *factors[1:]]
    out, rest = [1] * len(factors), extent
    for i in range(len(factors) - 1, 0, -1):
        f = min(factors[i], rest)
        while rest % f:
            f -= 1
        out[i], rest = f, rest // f
    out[0] = rest
    return out


def shape_distance(a: Task, b: Task) -> float:
    """How far apart two kernels' shapes are: summed |log2| ratios of their buffer dimensions
    and FLOPs; kernels whose buffers do not correspond (count, rank, dtype) come after all others."""
    flops = abs(math.log2(max(a.flops, 1.0) / max(b.flops, 1.0)))
    same_layout = len(a.args) == len(b.args) and all(
        x[1] == y[1] and len(x[2]) == len(y[2]) for x, y in zip(a.args, b.args))
    if not same_layout:
        return 1e6 + flops
    dims = sum(abs(math.log2(max(p, 1) / max(q, 1))) for x, y in zip(a.args, b.args) for p, q in zip(x[2], y[2]))
    return dims + flops


class _Pair:
    """A donor schedule replayed on the task."""

    def __init__(self, candidate: Candidate, distance: float, donor_latency: float):
        self.candidate, self.distance, self.donor_latency = candidate, distance, donor_latency


class _TaskState:
    def __init__(self, context: TaskContext):
        self.context = context
        self.queue: list[Candidate] = []
        self.pairs = 0  # donor schedules that replayed on the task
        self.skipped: collections.Counter[str] = collections.Counter()


class TransferSearch(SearchPolicy):
    name = "transfer"

    def __init__(self, *, per_donor: int = 2, max_pairs: int | None = None, max_donors: int = 32,
                 train_per_donor: int = 64, untuned: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        check_options(
            per_donor=(per_donor, is_int(per_donor, 1), "an integer >= 1"),
            max_pairs=(max_pairs, max_pairs is None or is_int(max_pairs, 1), "an integer >= 1"),
            max_donors=(max_donors, is_int(max_donors, 1), "an integer >= 1"),
            train_per_donor=(train_per_donor, is_int(train_per_donor, 0), "an integer >= 0"),
            untuned=(untuned, isinstance(untuned, bool), "true or false"),
        )
        self.per_donor, self.max_pairs, self.max_donors = per_donor, max_pairs, max_donors
        self.train_per_donor, self.untuned = train_per_donor, untuned
        self.tasks: dict[str, _TaskState] = {}
        self.taught: set[str] = set()  # donor task ids whose records the cost model has seen
        self.donor_spaces: dict[str, Any] = {}

    def start_task(self, context: TaskContext) -> None:
        task = context.task
        state = self.tasks[task.task_id] = _TaskState(context)
        if _searched(context.history):
            # the same kernel, tuned by a search in an earlier run (models share kernels: resnet-18's stem
            # conv is resnet-50's); no donor schedule is closer than its own, so no pair is worth a trial
            return
        donors = sorted(self._same_class(task),
                        key=lambda d: (d.target_json != task.target_json, shape_distance(task, d)))
        donors = donors[: self.max_donors]
        self._teach(donors)
        untuned = None
        if self.untuned:
            from tunecore.interfaces import new_schedule

            untuned = Candidate.from_schedule(task, new_schedule(task.mod), origin="untuned")
        ranked = self._rank(task, self._pairs(state, donors, exclude={untuned.key} if untuned else set()))
        state.queue = [p.candidate for p in ranked][: self.max_pairs]
        state.pairs = len(ranked)
        if untuned is not None and untuned.key not in context.measured:
            state.queue.insert(0, untuned)

    def _pairs(self, state: _TaskState, donors: list[Task], exclude: set[str]) -> list[_Pair]:
        task, space = state.context.task, state.context.space
        pairs, seen = [], set(state.context.measured) | exclude
        for donor in donors:
            # a donor's unscheduled program (measured when it was a transfer target itself) is no schedule to reuse
            tuned = [r for r in self.store.best(donor.task_id, k=self.per_donor + 1) if r.origin != "untuned"]
            for record in tuned[: self.per_donor]:
                try:
                    trace = self._donor_space(donor).sketch_part(record.candidate(donor).trace)
                except Exception:  # the donor's own record no longer replays (another TVM version)
                    state.skipped["donor record does not replay on its own task"] += 1
                    continue
                for fit in FITS:
                    sch, reason = space.apply_explained(trace, seed=1, decision_provider=_refitter(fit))
                    if sch is None:
                        state.skipped[reason] += 1
                        continue
                    candidate = Candidate.from_schedule(task, sch, origin=f"transfer:{donor.task_id}")
                    if candidate.key not in seen:
                        seen.add(candidate.key)
                        pairs.append(_Pair(candidate, shape_distance(task, donor), record.latency))
        return pairs

    def _donor_space(self, donor: Task) -> Any:
        """The donor's design space: its records' postprocessing is cut off by it, not by this task's."""
        if donor.task_id not in self.donor_spaces:
            from tunecore.interfaces import DesignSpace

            self.donor_spaces[donor.task_id] = DesignSpace(donor)
        return self.donor_spaces[donor.task_id]

    def _teach(self, donors: list[Task]) -> None:
        """Let the cost model learn the donor tasks' measurements (once per donor per run)."""
        for donor in donors:
            if donor.task_id in self.taught or not self.train_per_donor:
                continue
            self.taught.add(donor.task_id)
            records = sorted(self.store.records(donor.task_id), key=lambda r: (r.latency is None, r.latency or 0.0))
            if len(records) > self.train_per_donor:  # an even spread from fastest to failed
                picks = np.linspace(0, len(records) - 1, self.train_per_donor).round().astype(int)
                records = [records[i] for i in sorted(set(picks))]
            usable = []
            for r in records:
                candidate = r.candidate(donor)
                try:
                    candidate.sch
                except Exception:  # not replayable here: nothing to learn from
                    continue
                usable.append((candidate, r.result()))
            if usable:
                self.cost_model.update(donor, [c for c, _ in usable], [r for _, r in usable])

    def _rank(self, task: Task, pairs: list[_Pair]) -> list[_Pair]:
        by_shape = sorted(pairs, key=lambda p: (p.distance, p.donor_latency))
        if len(pairs) < 2:
            return by_shape
        scores = np.asarray(self.cost_model.predict(task, [p.candidate for p in pairs]), dtype=float)
        if np.ptp(scores) == 0:  # no opinion (e.g. cost model `none`)
            return by_shape
        by_model = [pairs[i] for i in np.argsort(-scores, kind="stable")]
        ranked, taken = [], set()
        for a, b in zip(by_shape, by_model):
            for p in (a, b):
                if id(p) not in taken:
                    taken.add(id(p))
                    ranked.append(p)
        return ranked

    def propose(self, task: Task, n: int) -> list[Candidate]:
        state = self.tasks[task.task_id]
        batch, state.queue = state.queue[:n], state.queue[n:]
        return batch

    def task_report(self, task: Task) -> dict[str, Any]:
        """Read back from the store, so a resumed or repeated run reports the pairs of earlier runs too."""
        state = self.tasks.get(task.task_id)
        records = self.store.records(task.task_id)
        transferred = [r for r in records if r.origin.startswith("transfer:")]
        best = min((r for r in transferred if r.latency is not None), key=lambda r: r.latency, default=None)
        untuned = next((r.latency for r in records if r.origin == "untuned"), None)
        donors = self.store.get_tasks(task_ids=[best.origin.split(":", 1)[1]]) if best else []
        return {
            "donor_task": donors[0].name if donors else None,
            "donor_model": donors[0].model if donors else None,
            "pairs": len(transferred),
            "speedup_over_untuned": untuned / best.latency if best and untuned else None,
            "skipped": dict(state.skipped) if state else {},
            "note": self._note(task, state, records, transferred, best, untuned),
        }

    def _same_class(self, task: Task) -> list[Task]:
        """Every other stored task of the task's kernel class and target kind: its possible donors."""
        return [d for d in self.store.tasks_by_kernel_class(task.kernel_class, task.target_kind)
                if d.task_id != task.task_id]

    def _note(self, task: Task, state: _TaskState | None, records: list, transferred: list, best: Any,
              untuned: float | None) -> str:
        if best is not None and untuned is not None and untuned < best.latency:
            # e.g. a tiny reshape given a donor's parallel schedule: thread start-up outweighs the work
            return "transferred, but slower than the untuned program (which the build keeps)"
        if best is not None:
            return "transferred"
        if transferred:
            return "every transferred schedule failed to build or run"
        searched = _searched(records)
        if searched:
            return f"kernel already tuned in the store ({len(searched)} programs), used as it is"
        if not self._same_class(task):
            return f"no donor of class {task.kernel_class} in the store"
        if state is None:
            return "not started (no budget left for it)"
        if not state.pairs and not state.skipped:
            return f"no donor of class {task.kernel_class} has a tuned schedule in the store"
        if not state.pairs:
            return f"none of {sum(state.skipped.values())} donor schedules replays on this task"
        return "no pair measured yet (budget)"


def _searched(records: list) -> list:
    """The successful records a search policy measured (not transfer's pairs, not untuned programs)."""
    return [r for r in records
            if r.latency is not None and r.origin != "untuned" and not r.origin.startswith("transfer:")]


def _refitter(fit: str) -> Any:
    def provide(sch: Any, inst: Any, inputs: list, attrs: list, decision: Any) -> Any:
        if inst.kind.name == "SamplePerfectTile" and decision is not None:
            return refit_tile([int(d) for d in decision], int(sch.get(inputs[0]).extent), fit)
        return decision

    return provide
