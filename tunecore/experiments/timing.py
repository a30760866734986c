"""Timing things together, so that the machine's drift falls on all of them alike: alternating passes in random
orders over builds, callables or programs re-measured in one measurer."""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from tunecore.compile import pass_orders, passes_together, ratio_bounds


def build_from_store(workload, tasks: list, target, store_file: str) -> tuple[Any, int]:
    """The workload built with the best records of a SQLite store, as `tunecore compile` builds it;
    (executable, tasks covered). The Winograd convs chosen from this store's records are this build's alone:
    ``workload`` is left as it was, for the builds of other stores."""
    import copy

    from tunecore.compile import best_database, build, choose_winograd
    from tunecore.store.sqlite import SqliteStore

    workload = copy.copy(workload)
    store = SqliteStore(store_file)
    try:
        choose_winograd(workload, store, tasks)
        database, covered = best_database(store, tasks, target)
    finally:
        store.close()
    return build(workload, target, database), covered

def median_call_seconds(function: Callable[[], Any]) -> float:
    """One pass: calls for at least 0.3 s (and at least 2), median seconds per call."""
    import numpy as np

    times, started = [], time.perf_counter()
    while time.perf_counter() - started < 0.3 or len(times) < 2:
        t = time.perf_counter()
        function()
        times.append(time.perf_counter() - t)
    return float(np.median(times))

def ratio_range(reference_passes: Sequence[float], own_passes: Sequence[float]) -> str:
    """' (low-high)' of ``ratio_bounds``; '' without passes."""
    if not reference_passes or not own_passes:
        return ""
    low, high = ratio_bounds(reference_passes, own_passes)
    return f" ({low:.2f}-{high:.2f})"


def time_builds_together(model: str, stores: dict[str, str], passes: int) -> dict:
    """Build untuned + one build per store; check outputs; median latency over alternating passes."""
    import numpy as np
    from tvm.s_tir import meta_schedule as ms

    from tunecore.check import max_relative_error
    from tunecore.compile import Runnable, build, random_inputs
    from tunecore.targets import resolve_target, use_target_threads
    from tunecore.workloads import extract_tasks, load_workload

    target = resolve_target("llvm")
    use_target_threads(target)
    workload = load_workload(model)
    tasks = extract_tasks(workload, target)
    inputs = random_inputs(workload)
    runnables, builds = {}, {}
    untuned = build(workload, target, ms.database.MemoryDatabase())
    runnables["untuned"] = Runnable(untuned, workload, target, inputs)
    expected = runnables["untuned"].outputs()
    for name, path in stores.items():
        executable, covered = build_from_store(workload, tasks, target, path)
        runnables[name] = Runnable(executable, workload, target, inputs)
        builds[name] = {"tasks_tuned": covered, "tasks_total": len(tasks),
                        "max_relative_error": max_relative_error(runnables[name].outputs(), expected)}
    # every build timed the same way: one sample per pass, as many calls as fill a second (one for a slow build)
    samples = passes_together({name: (lambda r=r: r.time(1, min_repeat_ms=1000)) for name, r in runnables.items()},
                              passes)
    return {name: {"latency_ms": float(np.median(s)) * 1e3, "passes_ms": [x * 1e3 for x in s], **builds.get(name, {})}
            for name, s in samples.items()}

def remeasure_together(task: Any, programs: dict[str, Sequence[Any]], passes: int = 8,
                       seed: int = 0) -> dict[str, list[float]]:
    """Latencies (seconds, per program, fastest first) of several groups of programs measured together.

    For comparing what different searches found: a machine's speed drifts (a shared VM's within
    minutes), so latencies recorded during different runs are not comparable. Here
    every program of every group is measured in each of ``passes`` passes, each pass in its own random
    order, by one measurer; a program's latency is its median over the passes (inf if it failed).
    """
    import numpy as np

    return {name: sorted(float(np.median(samples)) for samples in group)
            for name, group in remeasure_passes(task, programs, passes, seed).items()}

def remeasure_passes(task: Any, programs: dict[str, Sequence[Any]], passes: int = 8,
                     seed: int = 0) -> dict[str, list[list[float]]]:
    """``remeasure_together``'s measurements before the median: per group, per program (in the order given),
    its latency in each pass (inf where it failed)."""
    from tunecore.measure.local import LocalMeasurer

    flat = {f"{name}/{i}": candidate for name, group in programs.items() for i, candidate in enumerate(group)}
    samples: dict[str, list[float]] = {key: [] for key in flat}
    measurer = LocalMeasurer(task.target, screen=0, repeat=5, min_repeat_ms=50)
    try:
        for order in pass_orders(list(flat), passes, seed):  # a pass is one batch: its builds run in parallel
            for key, result in zip(order, measurer.measure(task, [flat[key] for key in order])):
                samples[key].append(result.latency or float("inf"))
    finally:
        measurer.close()
    return {name: [samples[f"{name}/{i}"] for i in range(len(group))] for name, group in programs.items()}
