"""How a dataset's labels are measured (``tunecore dataset collect`` and ``remeasure``), as opposed to the
tuner's own measuring, which stays as it is.

A tuner needs to know which candidate is best, cheaply: it times a clearly slow candidate once
(screening) and a few times otherwise. A dataset needs every program's latency as a model must learn it,
so its labels are taken another way (``LABEL_OPTIONS``, the default of both commands):

- no screening; a warm-up call, then ``repeat`` = 5 timings of at least ``min_repeat_ms`` = 20 ms each;
- every row keeps its timings, so its spread (std/mean) is known; a program whose timings spread more
  than ``max_spread`` (2%) is measured once more (built and timed again), and if it still spreads too
  much its row is flagged ``label.noisy``: a model can leave it out (``costmodel eval --max-spread``);
- builds never overlap timing (the local measurer builds a batch, then times it);
- the machine's load is recorded per batch (``label.foreign_load``: cores' worth of CPU time that other
  processes, or the hypervisor, took while the batch was measured), so a disturbed batch can be found;
- one thread by default: on these 2-vCPU VMs two-thread kernels repeat to 19% MAPE and one-thread kernels
  to 3-5% (bench/results/label_noise-v1.md); a model learns the program, not the neighbour's noise;
- while a file named like the dataset plus ``.pause`` exists, no new batch starts: ``touch
  DATASET.pause`` before timing something else on the machine, remove it to go on;
- an anchor set of fixed programs (``ANCHORS``) is measured at the start and at the end of every
  collection and the ratio stored with the dataset (``Dataset.collections``): the drift of the machine
  between and during collections, which no single row can show.

The ``label.*`` entries go in each row's ``profile`` beside the output check's; cost models learn only
from profilers' metrics (``cpu.*``, ``mca.*``, ``ncu.*``).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from typing import Any, Callable, Sequence

from tunecore.data import spread

LABEL_OPTIONS = {"screen": 0, "repeat": 5, "min_repeat_ms": 20}
MAX_SPREAD = 0.02
MIN_REPEATS = 5
ANCHORS = 300
# anchors are programs of this latency: long enough to time steadily, short enough to cost little
ANCHOR_LATENCY = (20e-6, 20e-3)

ATTEMPTS, NOISY, FOREIGN_LOAD = "label.attempts", "label.noisy", "label.foreign_load"
# timed while builds ran on the host, without a load measured (rows from before GPU batches measured it): the
# launches of short GPU kernels were slowed (datasets/README.md), so such a row is not clean
BUILD_OVERLAP = "label.build_overlap"
SECOND_LABEL = "label.second"  # a second, independent latency of the row's program (remeasure --second-labels)
SECOND_FAILED = "label.second_failed"  # the program failed when measured for its second label


def one_thread_target() -> str:
    """This CPU, one thread: the default device of a dataset collection (see the module docstring)."""
    from tunecore.targets import host_mcpu

    return json.dumps({"kind": "llvm", "mcpu": host_mcpu(), "num-cores": 1})


def label_options(options: dict[str, dict[str, Any]], measurer_name: str) -> dict[str, dict[str, Any]]:
    """Component options with the label protocol's measurer settings under the user's own (theirs win)."""
    out = {role: dict(values) for role, values in options.items()}
    given = {**out.get("measurer", {}), **out.get(measurer_name, {})}
    out.setdefault("measurer", {}).update({k: v for k, v in LABEL_OPTIONS.items() if k not in given})
    return out


def is_usable(row: Any) -> bool:
    """A row that counts towards a task's programs (``collect --per-task``): a clean timing, a failure (a failure is a
    label too) or a timing from before the protocol flagged noise; not a program whose timings stayed noisy."""
    return NOISY not in row.profile


def is_clean(row: Any, max_spread: float = MAX_SPREAD, min_repeats: int = MIN_REPEATS) -> bool:
    """A row a model can learn from as it is: ran, timed at least ``min_repeats`` times within ``max_spread``."""
    return (row.latency is not None and len(row.run_secs) >= min_repeats
            and row.spread is not None and row.spread <= max_spread and BUILD_OVERLAP not in row.profile)


class LabelMeasurer:
    """A measurer taking dataset labels: it measures a noisy program once more, flags the ones that stay
    noisy, and records the machine's load of each batch in every result."""

    def __init__(self, measurer: Any, max_spread: float = MAX_SPREAD, pause_file: str | None = None):
        self.measurer, self.max_spread, self.pause_file = measurer, max_spread, pause_file
        self.capacity = measurer.capacity

    def device(self) -> dict[str, Any]:
        return self.measurer.device()

    def measure(self, task: Any, candidates: Sequence[Any]) -> list[Any]:
        while self.pause_file and os.path.exists(self.pause_file):
            time.sleep(2)
        load = ForeignLoad()
        results = self.measurer.measure(task, candidates)
        for result in results:
            result.profile[ATTEMPTS] = 1.0
        if self.max_spread > 0:
            noisy = [i for i, r in enumerate(results) if _too_spread(r, self.max_spread)]
            again = self.measurer.measure(task, [candidates[i] for i in noisy]) if noisy else []
            for i, result in zip(noisy, again):
                if result.latency is None:  # failed the second time: the first timings stay, flagged
                    result = results[i]
                result.profile[ATTEMPTS] = 2.0
                if _too_spread(result, self.max_spread):
                    result.profile[NOISY] = 1.0
                results[i] = result
        foreign = load.cores()
        for result in results:
            result.profile[FOREIGN_LOAD] = foreign
        return results

    def close(self) -> None:
        self.measurer.close()


def _too_spread(result: Any, max_spread: float) -> bool:
    value = spread(result.run_secs) if result.error is None else None
    return value is not None and value > max_spread


class ForeignLoad:
    """CPU time that processes other than this one and its children (or the hypervisor: steal) took since
    construction, in cores (1.0: one core's worth on average). A child that ended meanwhile counts as foreign for
    the time it ran in the interval; one that started meanwhile counts as this process's. ``children=False``: the
    children count as foreign too (a GPU's timing shares the host with nothing, its own compile workers included:
    the launches of short kernels slow down when the host is busy)."""

    def __init__(self, children: bool = True) -> None:
        self.children = children
        self.started, self.busy, self.own = time.monotonic(), _machine_busy(), _own_cpu(children)

    def cores(self) -> float:
        wall = time.monotonic() - self.started
        if wall <= 0:
            return 0.0
        own = sum(seconds - self.own.get(pid, 0.0) for pid, seconds in _own_cpu(self.children).items())
        foreign = (_machine_busy() - self.busy) - own
        return round(max(0.0, foreign / wall), 3)


def _machine_busy() -> float:
    import psutil

    t = psutil.cpu_times()
    return sum(getattr(t, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal"))


def _own_cpu(children: bool = True) -> dict[int, float]:
    """CPU seconds of this process and of each of its children, by pid."""
    import psutil

    out = {}
    me = psutil.Process()
    for process in [me, *(me.children(recursive=True) if children else [])]:
        try:
            t = process.cpu_times()
        except psutil.Error:  # ended meanwhile
            continue
        out[process.pid] = t.user + t.system
    return out


# anchors

def choose_anchors(dataset: Any, kind: str, count: int = ANCHORS, seed: int = 0) -> list[list[str]]:
    """``count`` fixed programs of the dataset, [task key, program key] each: programs that ran on some device
    of the target kind within ``ANCHOR_LATENCY``, taken in turn from as many tasks as possible, in an order
    fixed by ``seed``."""
    low, high = ANCHOR_LATENCY
    by_task: dict[str, set[str]] = {}
    for row in dataset.rows:
        if row.latency is not None and low <= row.latency <= high and json.loads(row.target)["kind"] == kind:
            by_task.setdefault(row.task_key, set()).add(row.program_key)

    def order(*keys: str) -> bytes:
        return hashlib.sha256("|".join((str(seed), *keys)).encode()).digest()

    queues = {key: sorted(programs, key=lambda p, key=key: order(key, p)) for key, programs in by_task.items()}
    tasks = sorted(queues, key=order)
    chosen: list[list[str]] = []
    while len(chosen) < count and any(queues.values()):
        for key in tasks:
            if queues[key] and len(chosen) < count:
                chosen.append([key, queues[key].pop(0)])
    return chosen


def measure_anchors(dataset: Any, anchors: list[list[str]], measurer: Any, target_json: str,
                    on_progress: Callable[[str, int, int], None] | None = None,
                    errors: list[str] | None = None) -> list[float | None]:
    """Latency in seconds of each anchor on the measurer's device, in the anchors' order (None: failed, or
    not in the dataset); the failures' errors are appended to ``errors``."""
    from tunecore.data import Candidate

    rows = {}
    for row in dataset.rows:
        rows.setdefault((row.task_key, row.program_key), row)
    by_task: dict[str, list[int]] = {}
    for i, (task_key, program_key) in enumerate(anchors):
        if (task_key, program_key) in rows:
            by_task.setdefault(task_key, []).append(i)
    out: list[float | None] = [None] * len(anchors)
    done = 0
    for task_key, positions in by_task.items():
        task = dataset.tasks[task_key].for_target(target_json)
        chosen = [rows[tuple(anchors[i])] for i in positions]
        results = measurer.measure(task, [Candidate(task, r.trace, r.program_key, r.origin) for r in chosen])
        for i, result in zip(positions, results):
            out[i] = result.latency
            if result.latency is None and errors is not None:
                errors.append(result.error or "no latency")
        done += len(positions)
        if on_progress:
            on_progress(task.name, done, len(anchors))
    return out


def drift(before: Sequence[float | None], after: Sequence[float | None]) -> dict[str, Any] | None:
    """How the anchors' latencies moved: median after/before ratio, MAPE of after against before, and the
    number compared; None with nothing to compare."""
    ratios = [b / a for a, b in zip(before, after) if a and b]
    if not ratios:
        return None
    return {"ratio": round(statistics.median(ratios), 4),
            "mape": round(statistics.fmean(abs(r - 1) for r in ratios), 4), "programs": len(ratios)}


def anchor_drift(collections: list[dict[str, Any]], device_id: str) -> dict[str, Any] | None:
    """A device's anchors over its collection runs: how many runs measured them, the largest move within a
    run (end against start), and the latest measurement against the first; None if they never were."""
    runs = [c for c in collections if c["device_id"] == device_id]
    passes = [p for c in runs for p in (c["anchors_start"], c["anchors_end"]) if p]
    if not passes:
        return None
    within = [c["drift"] for c in runs if c.get("drift")]
    return {"runs": len([c for c in runs if c["anchors_start"] or c["anchors_end"]]),
            "worst_within_run": max(within, key=lambda d: abs(d["ratio"] - 1), default=None),
            "latest_vs_first": drift(passes[0], passes[-1]) if len(passes) > 1 else None}


class CollectionRun:
    """One run of collect or remeasure on a device: its anchors at the start and the end, stored in the
    dataset's ``collections`` when it ends."""

    def __init__(self, dataset: Any, device_id: str, measurer: Any, target_json: str, anchors: int, seed: int,
                 command: str, on_progress: Callable[[str, int, int], None] | None = None):
        self.dataset, self.device_id, self.measurer = dataset, device_id, measurer
        self.target_json, self.count, self.seed, self.on_progress = target_json, anchors, seed, on_progress
        self.entry: dict[str, Any] = {"device_id": device_id, "command": command, "started_at": time.time(),
                                      "protocol": {"max_spread": getattr(measurer, "max_spread", None)},
                                      "anchors_start": [], "anchors_end": []}
        if self.anchors():
            self.entry["anchors_start"] = self._measure("start")

    def anchors(self) -> list[list[str]]:
        """The dataset's anchor set: chosen once, when the dataset first holds enough programs, and kept in
        its file; empty before that (a run on a new dataset measures them at its end only)."""
        if self.count and not self.dataset.anchors:
            chosen = choose_anchors(self.dataset, json.loads(self.target_json)["kind"], self.count, self.seed)
            if len(chosen) == self.count:
                self.dataset.anchors = chosen
        return self.dataset.anchors if self.count else []

    def _measure(self, when: str) -> list[float | None]:
        """The anchors' latencies; how many failed, and the first error, kept in the entry (``anchor_errors``)."""
        errors: list[str] = []
        latencies = measure_anchors(self.dataset, self.anchors(), self.measurer, self.target_json, self.on_progress,
                                    errors)
        if errors:
            self.entry.setdefault("anchor_errors", {})[when] = {"failed": len(errors), "first": errors[0][:500]}
        return latencies

    def finish(self, report: dict[str, Any]) -> dict[str, Any]:
        """Measure the anchors again, store the run; returns the run's drift summary."""
        if self.anchors():
            self.entry["anchors_end"] = self._measure("end")
        self.entry.update(ended_at=time.time(), report=report,
                          drift=drift(self.entry["anchors_start"], self.entry["anchors_end"]))
        self.dataset.collections.append(self.entry)
        return {"anchors": sum(x is not None for x in self.entry["anchors_end"]), "drift": self.entry["drift"]}

    def interrupted(self, report: dict[str, Any]) -> None:
        """Store a run stopped before its end (Ctrl-C, kill): no drift, but its start anchors still say how fast
        the machine was when its rows were taken."""
        self.entry.update(ended_at=time.time(), report=report, drift=None, interrupted=True)
        self.dataset.collections.append(self.entry)
