"""Per-task tuning state, and the schedulers that decide which task gets the next round."""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

from tunecore.data import Record, Task

UNMEASURED = 1e10  # seconds; the latency a task without any successful record counts as
_GIVE_UP_AFTER_FAILED_ROUNDS = 3


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


Part = list[list[TaskState]]  # alternative sides, each the tasks one way of computing the part takes


def network_parts(states: Sequence[TaskState]) -> list[Part]:
    """The network's parts, each a list of sides of which ``compile`` builds the fastest: a conv tuned both
    direct and by Winograd (tunecore.winograd) is one part of two sides (each side every task of the conv's
    signature, its epilogues alike); any other task is a part of one side of its own."""
    from tunecore.winograd import task_signature

    parts: list[Part] = []
    convs: dict[str, dict[bool, list[TaskState]]] = {}
    for s in states:
        named = task_signature(s.task)
        if named is None:
            parts.append([[s]])
        else:
            convs.setdefault(named[0], {}).setdefault(named[1], []).append(s)
    return parts + [list(sides.values()) for sides in convs.values()]


def network_latency(parts: Sequence[Part], best: Mapping[int, float] | None = None) -> float:
    """The objective f: sum over parts of the fastest side's sum of weight x best latency (a task without a
    success counts UNMEASURED); ``best`` overrides the best of tasks (by ``id`` of their state)."""
    best = best or {}
    return sum(min(sum(s.task.weight * best.get(id(s), s.best) for s in side) for side in part) for part in parts)


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

    def round_size(self, state: TaskState, size: int) -> int:
        """Candidates for the task's next round, given the run's round size."""
        return size

    def expect(self, state: TaskState) -> None:
        """Count a round the task was given, whose results are not known yet (``plan``): it changes nothing."""
        state.rounds += 1
        state.best_history.append(state.best)


class GradientScheduler(RoundRobinScheduler):
    """Ansor's task scheduler (Zheng et al., OSDI'20, section 6).

    Minimises the end-to-end latency estimate f = sum_i w_i * g_i (g_i: best latency of task i).
    After every task had one round, it picks the task whose next round is expected to reduce f
    most, estimating dg_i/dt from the task's recent progress (backward window) and from what a
    similar task of the same kernel class achieves (optimistic forward guess); with probability
    ``eps`` it picks a random task instead. Where a conv has alternative kernels (``network_parts``),
    f counts the fastest side only, so a side's round gains only what would bring it below the
    other: the slower side is left alone once its expected progress cannot overtake.
    """

    name = "gradient"

    def __init__(self, states: list[TaskState], seed: int = 0, alpha: float = 0.2, beta: float = 2.0,
                 backward_window: int = 3, eps: float = 0.05):
        super().__init__(states)
        self.alpha, self.beta, self.window, self.eps = alpha, beta, backward_window, eps
        self.rng = np.random.default_rng(seed)
        self.parts = network_parts(states)
        self.alternatives = {id(s) for part in self.parts if len(part) > 1 for side in part for s in side}
        self.planned_rates: dict[int, float] = {}  # a task's measured progress per round / its best, in a plan

    def next(self) -> TaskState | None:
        alive = [s for s in self.states if s.done_reason is None]
        if not alive:
            return None
        unstarted = [s for s in alive if s.rounds == 0]
        if unstarted:  # warm-up: one round each
            return unstarted[0]
        if self.rng.random() < self.eps:
            return alive[int(self.rng.integers(len(alive)))]
        now = network_latency(self.parts)
        gradients = [network_latency(self.parts, {id(s): s.best + self._step(s)}) - now for s in alive]
        if max(gradients) == min(gradients):
            return alive[int(self.rng.integers(len(alive)))]
        return alive[int(np.argmin(gradients))]

    def expect(self, state: TaskState) -> None:
        """Count a round whose results are not known yet (``plan``) as gaining what the scheduler expects of it, so
        that the task's next round is expected to gain less. A task whose records all failed expects to fail again
        (a run gives up on it after a few such rounds); one without records gets its first round only, since
        nothing says what the next would gain."""
        if state.best >= UNMEASURED:
            state.add_round([])
            state.failed_rounds += state.trials > 0
            if state.trials == 0:
                state.done_reason = "not measured yet"
            elif state.failed_rounds >= _GIVE_UP_AFTER_FAILED_ROUNDS:
                state.done_reason = "every candidate failed"
            return
        # the measured progress is kept as a rate: the falls a plan expects are no progress to extrapolate from, or
        # each planned round would expect more than the last, down to zero
        self.planned_rates.setdefault(id(state), self._backward(state, self._forward(state)) / state.best)
        state.best *= math.exp(self._step(state) / state.best)  # ~ best + step; a large step never reaches zero
        super().expect(state)

    def _step(self, s: TaskState) -> float:
        """The expected change of the task's best latency in its next round (<= 0)."""
        forward = self._forward(s)
        return self.alpha * self._backward(s, forward) + (1 - self.alpha) * forward

    def _forward(self, s: TaskState) -> float:
        """The optimistic guess: the change to the best latency a similar task reached (or best / rounds)."""
        optimistic = s.best - s.best / s.rounds
        peers = [p for p in self.states if p.task.kernel_class == s.task.kernel_class and p.best < UNMEASURED]
        if len(peers) > 1 and s.task.flops > 0:
            best_throughput = max(p.task.flops / p.best for p in peers)
            optimistic = min(optimistic, self.beta * s.task.flops / best_throughput)
        return optimistic - s.best

    def _backward(self, s: TaskState, forward: float) -> float:
        """The task's recent progress per round."""
        if id(s) in self.planned_rates:
            return self.planned_rates[id(s)] * s.best
        history = s.best_history
        if len(history) > self.window:
            return (history[-1] - history[-1 - self.window]) / self.window
        if id(s) in self.alternatives:
            # too few rounds to show progress. Ansor counts that as none, which only ranks tasks, but a side of a
            # conv must reach below the other side's value: a side whose one round measured the untuned program
            # (e.g. --search transfer without a donor, before --then takes over) would never get a second round
            return forward
        return 0.0


class FlopsWarmupGradientScheduler(GradientScheduler):
    """Ansor's, but a task's first round shrinks with its share of the network's work (weight x FLOPs): at 100
    trials over resnet-18's 22 tasks, Ansor's rounds of 4 spend 28 trials on its 7 tasks of under 1% of the FLOPs.
    Not the default: with tlm at 100 trials it was level with Ansor's on resnet-18 and worse on mobilenet-v2,
    whose depthwise convs are slow for their FLOPs and start from one or two programs (bench/results/warmup-tlm.md).
    """

    name = "gradient-flops-warmup"

    def __init__(self, states: list[TaskState], seed: int = 0, **kwargs: float):
        super().__init__(states, seed, **kwargs)
        work = sum(s.task.weight * s.task.flops for s in states)
        self.work_share = {id(s): s.task.weight * s.task.flops / work if work > 0 else 1.0 for s in states}

    def round_size(self, state: TaskState, size: int) -> int:
        """A first round of ``size`` for a task of an even share of the work (or more), down to 1 for none."""
        if state.rounds:
            return size
        return max(1, min(size, math.ceil(size * len(self.states) * self.work_share[id(state)])))


SCHEDULERS = {cls.name: cls for cls in (GradientScheduler, FlopsWarmupGradientScheduler, RoundRobinScheduler)}


def restored_state(task: Task, records: Sequence[Record]) -> TaskState:
    """A task's state from its stored records, one round per run that measured them (an earlier run, an imported
    batch), as a resumed run and a batch plan both see it."""
    state = TaskState(task)
    by_run: dict[int | None, list[Record]] = {}
    for r in records:
        by_run.setdefault(r.run_id, []).append(r)
    for run_id in sorted(by_run, key=lambda run: -1 if run is None else run):
        state.add_round(by_run[run_id])
    state.failed_rounds, state.done_reason = 0, None
    return state


def plan(states: Sequence[TaskState], trials: int, round_size: int, scheduler: str = "gradient",
         seed: int = 0) -> list[int]:
    """How many of ``trials`` programs each task gets when all of them are measured later, elsewhere (a batch for a
    device without TVM's compiler): the scheduler gives out rounds as in a run, each taken to gain what the
    scheduler expects of it, since no measurement comes back to say. Returns a count per state, in order."""
    planned = [dataclasses.replace(s, best_history=list(s.best_history), measured=set(), history=[]) for s in states]
    if all(s.best >= UNMEASURED for s in states):  # nothing measured yet (a first batch): tasks in turn
        scheduler = RoundRobinScheduler.name
    picker = SCHEDULERS[scheduler](planned, seed=seed)
    index = {id(s): i for i, s in enumerate(planned)}
    counts = [0] * len(planned)
    left = trials
    while left > 0:
        state = picker.next()
        if state is None:
            break
        n = min(picker.round_size(state, round_size), left)
        counts[index[id(state)]] += n
        left -= n
        picker.expect(state)
    return counts
