"""The `ansor` search policy: sketches, random annotation, evolutionary search ranked by any cost model.

Per round and task (Ansor, OSDI'20, section 5):
1. Initial population: the best measured programs of the task (a fifth of it) plus random
   annotations of the sketches (MetaSchedule's space generator applies Ansor's derivation rules:
   multi-level tiling, fusion, caching, rfactor, inlining).
2. Evolution: the cost model scores the population; parents are drawn in proportion to their
   scores and mutated (tile sizes, parallel extent, unroll, compute location) with MetaSchedule's
   mutators; every valid unmeasured program enters a ranking by score.
3. Proposal: the best-scored unmeasured programs, with a fraction ``eps_greedy`` of random ones.

Search effort follows the machine: by default the population is sized so that searching a round
takes about ``time_ratio`` (0.5) times as long as measuring the previous round did. Setting
``population`` fixes it, and the search is then reproducible from the seed alone.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any, Sequence

import numpy as np

from tunecore.interfaces import (
    Candidate,
    MeasureResult,
    SearchPolicy,
    Task,
    TaskContext,
    check_options,
    distinct,
    is_int,
    is_number,
)

_KEEP_BEST = 64  # measured programs remembered per task as seeds of the initial population
_PRIOR_MEASURE_S = 0.25  # measuring time per candidate assumed before the first round was measured
_PRIOR_EVAL_S = 0.01  # search time per evaluated program assumed before the first round was searched


class _TaskState:
    def __init__(self, context: TaskContext, seed: int):
        self.context = context
        self.space = context.space
        self.rng = np.random.default_rng(seed)
        self.measured = set(context.measured)
        self.best: list[tuple[float, str]] = sorted(
            (r.latency, r.trace_json) for r in context.history if r.latency is not None)[:_KEEP_BEST]
        self.eval_s = _PRIOR_EVAL_S  # search seconds per evaluated program, measured as we go
        self.measure_s = None  # measuring seconds per candidate in the last round
        self.proposed_at = None
        self.proposed_n = 0


class AnsorSearch(SearchPolicy):
    name = "ansor"

    def __init__(self, *, population: int | None = None, iterations: int = 4, mutate_prob: float = 0.85,
                 eps_greedy: float = 0.05, init_measured_ratio: float = 0.2, time_ratio: float = 0.5,
                 min_population: int = 32, max_population: int = 2048, max_per_lineage: float = 1.0,
                 threads: int | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        from tunecore.targets import physical_cores

        check_options(
            population=(population, population is None or is_int(population, 2), "an integer >= 2"),
            iterations=(iterations, is_int(iterations, 0), "an integer >= 0"),
            mutate_prob=(mutate_prob, is_number(mutate_prob, 0, 1), "between 0 and 1"),
            eps_greedy=(eps_greedy, is_number(eps_greedy, 0, 1), "between 0 and 1"),
            init_measured_ratio=(init_measured_ratio, is_number(init_measured_ratio, 0, 1), "between 0 and 1"),
            time_ratio=(time_ratio, is_number(time_ratio, 1e-3), "a positive number"),
            min_population=(min_population, is_int(min_population, 2), "an integer >= 2"),
            max_population=(max_population, is_int(max_population, 2) and max_population >= min_population,
                            f"an integer >= min_population ({min_population})"),
            max_per_lineage=(max_per_lineage, is_number(max_per_lineage, 1e-6, 1), "in (0, 1]"),
            threads=(threads, threads is None or is_int(threads, 1), "an integer >= 1"),
        )
        self.population, self.iterations = population, iterations
        self.mutate_prob, self.eps_greedy, self.init_measured_ratio = mutate_prob, eps_greedy, init_measured_ratio
        self.time_ratio, self.min_population, self.max_population = time_ratio, min_population, max_population
        self.max_per_lineage = max_per_lineage
        self.pool = concurrent.futures.ThreadPoolExecutor(threads or physical_cores())  # TVM releases the GIL
        self.local = threading.local()
        self.tasks: dict[str, _TaskState] = {}

    def close(self) -> None:
        self.pool.shutdown(wait=False)

    def start_task(self, context: TaskContext) -> None:
        self.tasks[context.task.task_id] = _TaskState(context, context.seed)

    # one round

    def propose(self, task: Task, n: int) -> list[Candidate]:
        state = self.tasks[task.task_id]
        started = time.perf_counter()
        size, budget = self._effort(state, n)
        deadline = started + budget
        evaluated = 0

        n_seeds = min(len(state.best), int(size * self.init_measured_ratio))
        seeds = self._replay([trace for _, trace in state.best[:n_seeds]], state, task)
        randoms = self._sample(size - len(seeds), state, task)
        population = seeds + randoms
        lineage = {c.key: c.key for c in population}  # program -> the initial program it descends from
        ranking: dict[str, tuple[float, Candidate]] = {}
        for iteration in range(self.iterations + 1):
            if not population:
                break
            scores = np.asarray(self.cost_model.predict(task, population), dtype=np.float64)
            evaluated += len(population)
            for candidate, score in zip(population, scores):
                if candidate.key not in state.measured and candidate.key not in ranking:
                    ranking[candidate.key] = (float(score), candidate)
            if iteration == self.iterations or (self.population is None and time.perf_counter() > deadline):
                break
            population = self._evolve(population, scores, size, state, task, lineage)

        best_first = [c for _, c in sorted(ranking.values(), key=lambda item: -item[0])]
        n_random = int(n * self.eps_greedy)
        picks = _diverse(best_first, n - n_random, self.max_per_lineage, lineage)
        chosen = {c.key for c in picks}
        spare = [c for c in randoms if c.key not in state.measured and c.key not in chosen]
        for i in state.rng.permutation(len(spare))[: n - len(picks)]:
            spare[i].origin = f"{self.name}:random"
            picks.append(spare[i])
        elapsed = time.perf_counter() - started
        state.eval_s = 0.5 * state.eval_s + 0.5 * elapsed / max(1, evaluated)
        state.proposed_at, state.proposed_n = time.perf_counter(), len(picks)
        return picks

    def observe(self, task: Task, candidates: Sequence[Candidate], results: Sequence[MeasureResult]) -> None:
        state = self.tasks[task.task_id]
        spent = [r.measure_secs for r in results if r.measure_secs > 0]
        if spent:  # measurers that report their time
            state.measure_s = float(np.mean(spent))
        elif state.proposed_at is not None and state.proposed_n:  # otherwise: everything between propose and observe
            state.measure_s = (time.perf_counter() - state.proposed_at) / state.proposed_n
        for c, r in zip(candidates, results):
            state.measured.add(c.key)
            if r.latency is not None:
                state.best.append((r.latency, c.trace_json))
        state.best = sorted(state.best)[:_KEEP_BEST]

    def _effort(self, state: _TaskState, n: int) -> tuple[int, float]:
        """(population size, seconds) for this round: the search may take time_ratio x the measuring time."""
        budget = self.time_ratio * n * (state.measure_s if state.measure_s is not None else _PRIOR_MEASURE_S)
        if self.population is not None:
            return self.population, budget
        size = int(budget / ((self.iterations + 1) * state.eval_s))
        return max(self.min_population, min(self.max_population, size)), budget

    # parallel pieces: each job gets its own seed, so results do not depend on thread timing

    def _postprocs(self, state: _TaskState) -> list:
        per_task = getattr(self.local, "postprocs", None)
        if per_task is None:
            per_task = self.local.postprocs = {}
        task_id = state.context.task.task_id
        if task_id not in per_task:
            per_task[task_id] = state.space.thread_postprocs()
        return per_task[task_id]

    def _map(self, function: Any, jobs: list) -> list:
        return list(self.pool.map(function, jobs))

    def _sample(self, count: int, state: _TaskState, task: Task) -> list[Candidate]:
        if count <= 0:
            return []
        seeds = state.rng.integers(1, 2**31 - 1, size=count * 2).tolist()  # some samples come out invalid

        def sample(seed: int) -> Candidate | None:
            sch = state.space.sample(seed=seed, postprocs=self._postprocs(state))
            return _keyed(Candidate.from_schedule(task, sch, origin=f"{self.name}:random")) if sch else None

        return distinct([c for c in self._map(sample, seeds) if c is not None])[:count]

    def _replay(self, traces: list[str], state: _TaskState, task: Task) -> list[Candidate]:
        from tunecore.interfaces import replay_trace_json

        seeds = state.rng.integers(1, 2**31 - 1, size=len(traces)).tolist()

        def replay(job: tuple[str, int]) -> Candidate | None:
            trace_json, seed = job
            try:  # measured traces include postprocessing: keep their decisions, postprocess afresh
                trace = replay_trace_json(task.mod, trace_json).trace
            except Exception:
                return None
            sch = state.space.apply(trace, seed=seed, postprocs=self._postprocs(state))
            return _keyed(Candidate.from_schedule(task, sch, origin=f"{self.name}:measured")) if sch else None

        return [c for c in self._map(replay, list(zip(traces, seeds))) if c is not None]

    def _evolve(self, population: list[Candidate], scores: np.ndarray, size: int, state: _TaskState,
                task: Task, lineage: dict[str, str]) -> list[Candidate]:
        """The next generation: parents drawn in proportion to score, mutated with probability mutate_prob."""
        weights = scores - scores.min()
        total = weights.sum()
        probs = weights / total if total > 0 and np.isfinite(total) else None
        parents = state.rng.choice(len(population), size=size, p=probs)
        mutators = state.space.mutators()
        mutator_p = np.array([p for _, p in mutators]) / sum(p for _, p in mutators)
        mutate = state.rng.random(size) < self.mutate_prob
        which = state.rng.choice(len(mutators), size=size, p=mutator_p)
        seeds = state.rng.integers(1, 2**31 - 1, size=size)

        def child(i: int) -> Candidate:
            parent = population[parents[i]]
            if not mutate[i]:
                return parent
            sch = state.space.mutate(parent.trace, mutators[which[i]][0], int(seeds[i]),
                                     postprocs=self._postprocs(state))
            return parent if sch is None else _keyed(Candidate.from_schedule(task, sch, origin=f"{self.name}:evolve"))

        children = self._map(child, list(range(size)))
        for i, c in enumerate(children):
            lineage.setdefault(c.key, lineage[population[parents[i]].key])
        return distinct(children)


def _diverse(best_first: list[Candidate], n: int, max_per_lineage: float, lineage: dict[str, str]) -> list[Candidate]:
    """The n best, at most a share ``max_per_lineage`` of them descending from one initial program.

    Evolution concentrates the ranking on the offspring of a few programs, near-copies of each other;
    measuring 30 siblings teaches the model one neighbourhood and stops exploration of the others.
    Places the cap leaves empty go to the next best, whatever their lineage.
    """
    cap = max(1, int(np.ceil(n * max_per_lineage)))
    picks, rest, per_root = [], [], {}
    for c in best_first:
        root = lineage.get(c.key, c.key)
        if len(picks) < n and per_root.get(root, 0) < cap:
            picks.append(c)
            per_root[root] = per_root.get(root, 0) + 1
        else:
            rest.append(c)
    return picks + rest[: n - len(picks)]


def _keyed(candidate: Candidate) -> Candidate:
    """Hash the program now, in the worker thread, rather than later in the main one."""
    candidate.key  # noqa: B018
    return candidate
