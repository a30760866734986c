"""Small real workloads and a measurer that needs no compiler, for testing plugins quickly."""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

from tunecore.interfaces import Candidate, Measurer, MeasureResult, Task


def tiny_task(op: str = "matmul-64", target: Any = None) -> Task:
    """A real task (default: 64x64x64 fp32 matmul) on this host's CPU target."""
    from tunecore.targets import host_target
    from tunecore.workloads import extract_tasks, load_workload

    return extract_tasks(load_workload(f"op:{op}"), target or host_target())[0]


def sample_candidates(task: Task, n: int, seed: int = 1) -> list[Candidate]:
    """Up to n distinct random programs of the task (fewer only if the space has fewer)."""
    from tunecore.space import DesignSpace

    space = DesignSpace(task, seed=seed)
    out: dict[str, Candidate] = {}
    for _ in range(n * 20):
        sch = space.sample()
        if sch is not None:
            c = Candidate.from_schedule(task, sch, origin="test")
            out.setdefault(c.key, c)
        if len(out) == n:
            break
    return list(out.values())


class InstantMeasurer(Measurer):
    """Pretends to measure: a latency derived from the candidate's key, no build, no run.

    For testing search policies and cost models in milliseconds. Candidates whose origin starts
    with "fail" come back as failures. Not registered as a component; construct it directly.
    """

    name = "instant"

    def measure(self, task: Task, candidates: Sequence[Candidate]) -> list[MeasureResult]:
        results = []
        for c in candidates:
            if c.origin.startswith("fail"):
                results.append(MeasureResult(error="run: failure requested by the test"))
                continue
            fraction = int(hashlib.sha256(c.key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
            results.append(MeasureResult(run_secs=[1e-4 * (1 + 9 * fraction)] * 3))
        return results


def remeasure_together(task: Task, programs: dict[str, Sequence[Candidate]], passes: int = 8, seed: int = 0) -> dict[str, list[float]]:
    """Latencies (seconds, per program, fastest first) of several groups of programs measured together.

    For comparing what different searches found: a machine's speed drifts (by 20% and more over
    minutes on a shared VM), so latencies recorded during different runs are not comparable. Here
    all programs of all groups are measured in each of ``passes`` passes, each pass in its own random
    order, in one measurer, so that drift falls on every group alike; a program's latency is its
    median over the passes (inf if it failed).
    """
    import numpy as np

    from tunecore.measure.local import LocalMeasurer

    flat = [(name, c) for name, group in programs.items() for c in group]
    timings = np.full((passes, len(flat)), np.inf)
    order = np.random.default_rng(seed)
    measurer = LocalMeasurer(task.target, screen=0, repeat=5, min_repeat_ms=50)
    try:
        for p in range(passes):
            permutation = order.permutation(len(flat))
            results = measurer.measure(task, [flat[j][1] for j in permutation])
            for j, r in zip(permutation, results):
                if r.latency is not None:
                    timings[p, j] = r.latency
    finally:
        measurer.close()
    medians = np.median(timings, axis=0)
    return {name: sorted(float(m) for m, (n, _) in zip(medians, flat) if n == name) for name in programs}
