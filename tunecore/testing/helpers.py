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
