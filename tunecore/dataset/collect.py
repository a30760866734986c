"""Measuring programs into a dataset: ``tunecore dataset collect`` and ``tunecore dataset remeasure``.

``collect`` gives every task of every workload ``per_task`` measured programs on each device, as
TenSet does: a share of them uniform random samples of the design space (``random_fraction``, by
default half), the rest found by a short guided search (by default Ansor's evolutionary search
with its XGBoost model, per task, starting from the random ones), so the dataset holds both the
typical program and the good ones a tuner looks for. It runs the ordinary tuning loop on one task
at a time, so failures are data (a record with its error) exactly as in ``tunecore run``.

Both take their labels by the label protocol (tunecore.dataset.protocol): no screening, a warm-up call
and 5 timings of >= 20 ms each, noisy programs measured again and flagged, the machine's load per batch,
one thread by default, and an anchor set measured at the start and end of every run.

Both commands resume: the dataset file is rewritten after every task, a program already in it for
a device is never measured again for that device, and running the same command twice measures
nothing the second time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import time
from typing import Any, Callable, Collection, Iterator

from tunecore.dataset import protocol
from tunecore.dataset.protocol import CollectionRun, LabelMeasurer
from tunecore.dataset.table import Dataset, Measurement, changing, describe_device
from tunecore.errors import UsageError
from tunecore.progress import Progress
from tunecore.workloads import has_kernel

RANDOM = "random"


@dataclasses.dataclass
class CollectPlan:
    models: list[str]
    targets: list[str] | None = None  # default: this CPU, one thread (protocol.one_thread_target)
    per_task: int = 64  # programs per task on each device
    random_fraction: float = 0.5  # of ``per_task``, sampled uniformly; the rest by ``search``
    search: str = "ansor"
    cost_model: str = "xgb"
    measurer: str = "local"
    options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    seed: int = 0
    max_programs: int | None = None  # new measurements per device in this invocation
    time_limit: float | None = None  # seconds for this invocation
    max_spread: float = protocol.MAX_SPREAD  # a program whose timings spread more is measured again, then flagged
    anchors: int = protocol.ANCHORS  # programs measured at the start and end of the run (0: none)
    kernels: tuple[str, ...] = ()  # only tasks whose kernel class contains one of these (e.g. "conv"); (): all
    skip: frozenset[str] = frozenset()  # task keys not to measure (e.g. the kernels of held-out workloads)

    def wants(self, task: Any) -> bool:
        return task.workload_hash not in self.skip and (
            not self.kernels or has_kernel(task.kernel_class, self.kernels))


# files beside the dataset a running collection obeys: DATASET.pause holds it before its next batch until the file is
# removed (while something else is timed); DATASET.stop ends it after its current batch, as its time limit would
PAUSE, STOP = ".pause", ".stop"


class _Stop(Exception):
    """The time limit or the program limit is reached, or a stop file found: save and stop."""


def collect(path: str, plan: CollectPlan, *, registry: Any = None,
            on_progress: Callable[[Progress], None] | None = None) -> dict[str, Any]:
    """Measure what ``plan`` asks for that ``path`` does not hold yet; returns what was done."""
    from tunecore.registry import Registry
    from tunecore.targets import resolve_target
    from tunecore.tvmjson import target_to_json
    from tunecore.workloads import extract_tasks, load_workload

    _check_plan(plan)
    registry = registry or Registry.shared()
    guided = plan.random_fraction < 1 and plan.search != RANDOM  # `--search random`: the whole share is random
    if guided:
        _check_installed(registry, "search", plan.search, "--search")
        _check_installed(registry, "cost_model", plan.cost_model, "--cost-model")
    with changing(path):
        dataset = Dataset.open(path)
        workloads = [load_workload(spec) for spec in plan.models]
        started = _start(path)
        report: dict[str, Any] = {"dataset": path, "devices": []}
        for spec in plan.targets or [protocol.one_thread_target()]:
            target = resolve_target(spec)
            tasks = {}
            for workload in workloads:
                for task in filter(plan.wants, extract_tasks(workload, target)):
                    dataset.add_task(task)
                    tasks.setdefault(task.workload_hash, task)
            with _measurer(registry, plan, target, path) as measurer:
                device = measurer.device()
                device_id = dataset.add_device(device)
                counts = _Counts(dataset, device_id)
                n_random = round(plan.per_task * plan.random_fraction) if guided else plan.per_task
                exhausted = dataset.exhausted.setdefault(device_id, [])
                needs = {key: 0 if key in exhausted else max(0, plan.per_task - counts.total(key)) for key in tasks}
                total = sum(needs.values())
                total = total if plan.max_programs is None else min(plan.max_programs, total)
                done = {"measured": 0, "failed": 0}
                label = describe_device(device)
                entry = {"device_id": device_id, "device": label, "tasks": len(tasks), "measured": 0, "failed": 0,
                         "stopped": None}
                report["devices"].append(entry)

                def on_round(task_name: str, new: int, failed: int) -> None:
                    done["measured"] += new
                    done["failed"] += failed
                    if on_progress:
                        on_progress(Progress(f"measuring on {label}", done["measured"], total, task_name,
                                             done["failed"]))
                    _check_limits(plan, started, done["measured"], path)

                saver = _Saver(dataset, path)
                run = CollectionRun(dataset, device_id, measurer, target_to_json(target), plan.anchors, plan.seed,
                                    "collect", _anchor_progress(on_progress, label))
                try:
                    try:
                        for key in _first_what_no_device_has(dataset, tasks, device_id, plan.per_task):
                            task = tasks[key]
                            # rounds until the task has its usable programs: a noisy one is replaced by another
                            while needs[key] and key not in exhausted:
                                rows_before = len(dataset.rows_of(key, device_id))
                                _collect_task(dataset, task, device_id, plan, registry, measurer, counts, n_random,
                                              guided, exhausted, done, on_round)
                                saver.save(at_most_every=60)
                                if (counts.total(key) >= plan.per_task
                                        or len(dataset.rows_of(key, device_id)) == rows_before):
                                    break
                    except _Stop as stop:
                        entry["stopped"] = str(stop)
                    except BaseException:
                        run.interrupted({**entry, "measured": done["measured"], "failed": done["failed"],
                                         "stopped": "interrupted"})
                        raise
                    entry.update(measured=done["measured"], failed=done["failed"])
                    entry.update(run.finish(dict(entry)))
                finally:
                    saver.save()
                if entry["stopped"]:
                    break
        report["elapsed_s"] = round(time.time() - started, 1)
        report["info"] = {k: v for k, v in dataset.info().items() if k in ("rows", "measured", "programs", "tasks")}
        return report


def remeasure(path: str, target_spec: str | None = None, *, per_task: int | None = None,
              source_device: str | None = None, task_keys: Collection[str] | None = None,
              again_before: float | None = None, measurer_name: str = "local",
              options: dict[str, dict[str, Any]] | None = None, seed: int = 0,
              time_limit: float | None = None, max_spread: float = protocol.MAX_SPREAD, anchors: int = protocol.ANCHORS,
              second_labels: bool = False, registry: Any = None,
              on_progress: Callable[[Progress], None] | None = None) -> dict[str, Any]:
    """Measure programs of the dataset on the device of ``target_spec``: the same traces, so that
    models see one program on several devices.

    ``target_spec`` defaults to this CPU, one thread. Takes every program measured successfully on
    ``source_device`` (default: on any device), or per task the first ``per_task`` of them in an order
    fixed by ``seed`` (so an interrupted remeasure continues with the same programs); of the tasks in
    ``task_keys`` only, if given. A program already measured on that device is skipped, unless its
    measurement is older than ``again_before`` (a Unix time): then it is measured again and the new
    measurement replaces the old, so that a device's labels can be renewed on a quiet machine, resumably
    (run again with the same time).

    ``second_labels``: measure the programs this device has measured once more, in this run, and keep the
    latency beside the row's own as ``label.second`` (the yardstick's noise ceiling); programs that have one
    are skipped, so it resumes too.
    """
    from tunecore.registry import Registry
    from tunecore.targets import resolve_target
    from tunecore.tvmjson import target_to_json

    registry = registry or Registry.shared()
    with changing(path):
        dataset = Dataset.load(path)
        if source_device is not None:
            from tunecore.dataset.split import device_of

            source_device = device_of(dataset, source_device)
        if second_labels and (again_before is not None or source_device is not None):
            raise UsageError("--second-labels measures this device's own programs again: not with --again-before "
                             "or --from-device")
        target = resolve_target(target_spec or protocol.one_thread_target())
        target_json = target_to_json(target)
        kind = target.kind.name
        plan = CollectPlan([], measurer=measurer_name, options=options or {}, time_limit=time_limit,
                           max_spread=max_spread, anchors=anchors)
        _check_protocol(plan)

        def programs(source: str | None) -> dict[str, list[Measurement]]:
            chosen = programs_to_remeasure(dataset, kind, per_task, source, seed)
            chosen = {key: rows for key, rows in chosen.items() if task_keys is None or key in task_keys}
            if not chosen:
                raise UsageError(f"{path}: no successfully measured {kind} programs to remeasure"
                                 + (" on this device" if second_labels else ""))
            return chosen

        chosen = None if second_labels else programs(source_device)
        started = _start(path)
        with _measurer(registry, plan, target, path) as measurer:
            device = measurer.device()
            device_id = dataset.add_device(device)
            chosen = chosen or programs(device_id)

            def wanted(key: str, program_key: str) -> bool:
                known = dataset.row(key, program_key, device_id)
                if second_labels:
                    return not {protocol.SECOND_LABEL, protocol.SECOND_FAILED} & known.profile.keys()
                return known is None or (again_before is not None and known.measured_at < again_before)

            todo = {key: [r for r in rows if wanted(key, r.program_key)] for key, rows in chosen.items()}
            total = sum(map(len, todo.values()))
            label = describe_device(device)
            done = {"measured": 0, "failed": 0}
            saver = _Saver(dataset, path)
            run = CollectionRun(dataset, device_id, measurer, target_json, anchors, seed, "remeasure",
                             _anchor_progress(on_progress, label))
            report = {"dataset": path, "device_id": device_id, "device": label, "stopped": None}
            try:
                try:
                    for key, rows in todo.items():
                        _remeasure_task(dataset, dataset.tasks[key].for_target(target_json), rows, device_id, measurer,
                                        "second" if second_labels else "replace" if again_before else "add", done,
                                        total, label, on_progress,
                                        lambda: _check_limits(plan, started, done["measured"], path))
                        saver.save(at_most_every=60)
                except _Stop as stop:
                    report["stopped"] = str(stop)
                except BaseException:
                    run.interrupted({**report, **done, "left": total - done["measured"], "stopped": "interrupted"})
                    raise
                report.update(done, left=total - done["measured"])
                report.update(run.finish(dict(report)))
            finally:
                saver.save()
        report["elapsed_s"] = round(time.time() - started, 1)
        return report


def _remeasure_task(dataset: Dataset, task: Any, rows: list[Measurement], device_id: str, measurer: Any,
                    mode: str, done: dict[str, int], total: int, label: str,
                    on_progress: Callable[[Progress], None] | None, check_limits: Callable[[], None]) -> None:
    """Measure ``rows``' programs on the device; ``mode``: add them as its rows, replace its rows, or keep the
    latency as its rows' second label. ``check_limits`` after every batch (a task may hold hundreds)."""
    from tunecore.data import Candidate

    batch = 32 * measurer.capacity
    for start in range(0, len(rows), batch):
        part = rows[start:start + batch]
        results = measurer.measure(task, [Candidate(task, r.trace, r.program_key, r.origin) for r in part])
        now = time.time()
        for row, result in zip(part, results):
            if mode == "second":
                known = dataset.row(row.task_key, row.program_key, device_id)
                key = protocol.SECOND_LABEL if result.latency is not None else protocol.SECOND_FAILED
                known.profile[key] = result.latency if result.latency is not None else 1.0
                continue
            dataset.add(Measurement(row.task_key, row.program_key, row.trace, device_id, task.target_json,
                                    result.run_secs, result.error, result.build_secs, dict(result.profile),
                                    row.origin, row.collected_by, now), replace=mode == "replace")
        done["measured"] += len(part)
        done["failed"] += sum(r.latency is None for r in results)
        if on_progress:
            on_progress(Progress(f"measuring on {label}", done["measured"], total, task.name, done["failed"]))
        check_limits()


def _collect_task(dataset: Dataset, task: Any, device_id: str, plan: CollectPlan, registry: Any, measurer: Any,
                  counts: _Counts, n_random: int, guided: bool, exhausted: list[str], done: dict[str, int],
                  on_round: Callable[[str, int, int], None]) -> None:
    """One pass over a task's phases: its random share, then the guided search, each measuring what is missing
    of its own share, so that a noisy program is replaced by one of its own kind and the mix holds."""
    key = task.workload_hash
    phases = [(RANDOM, n_random - counts.by(key, RANDOM))] if n_random else []
    if guided:
        phases.append((plan.search, plan.per_task - n_random - counts.by(key, plan.search)))
    for search, wanted in phases:
        left = plan.per_task - counts.total(key)
        if plan.max_programs is not None:
            left = min(left, plan.max_programs - done["measured"])
        trials = min(left, wanted)
        if trials > 0:
            stopped = _tune_one(dataset, task, device_id, search, trials, plan, registry, measurer, on_round)
            # the tuner's reason when uniform sampling finds no new program (not "every candidate failed"): the
            # task's design space holds no more
            if search == RANDOM and stopped and "no new candidates" in stopped:
                exhausted.append(key)
                return


def _first_what_no_device_has(dataset: Dataset, tasks: dict[str, Any], device_id: str, per_task: int) -> list[str]:
    """The task keys in order, those another device already holds ``per_task`` usable programs of last: a run
    that stops at its time limit has then covered new kernels before it repeats known ones on a new device."""
    others = [_Counts(dataset, d) for d in dataset.devices if d != device_id]

    def held_elsewhere(key: str) -> bool:
        return any(counts.total(key) >= per_task for counts in others)

    return sorted(tasks, key=held_elsewhere)


class _Counts:
    """Programs per task on one device, in all and by the search that collected them."""

    def __init__(self, dataset: Dataset, device_id: str):
        self.dataset, self.device_id = dataset, device_id

    def total(self, key: str) -> int:
        """The usable ones (protocol.is_usable): a program whose timings stayed noisy is replaced by another."""
        return sum(map(protocol.is_usable, self.dataset.rows_of(key, self.device_id)))

    def by(self, key: str, collected_by: str) -> int:
        return sum(r.collected_by == collected_by and protocol.is_usable(r)
                   for r in self.dataset.rows_of(key, self.device_id))


def _tune_one(dataset: Dataset, task: Any, device_id: str, search_name: str, trials: int, plan: CollectPlan,
              registry: Any, measurer: Any, on_round: Callable[[str, int, int], None]) -> str | None:
    """Run the tuning loop on one task with one search policy, starting from what the dataset holds
    for it on this device; whatever got measured goes into the dataset, also when stopped or interrupted.
    Returns why the task stopped before its trials (the search had no new candidates), or None."""
    from tunecore.api import _construct
    from tunecore.options import options_for
    from tunecore.store.sqlite import MemoryStore
    from tunecore.tuner import Tuner, derive_seed

    store = MemoryStore()
    store.put_tasks([task])
    store.commit([r.record(task) for r in dataset.rows_of(task.workload_hash, device_id)])
    seed = derive_seed(plan.seed, task.workload_hash, device_id, search_name)
    cost_model_name = "none" if search_name == RANDOM else plan.cost_model
    cost_model = _construct(registry, "cost_model", cost_model_name, seed=seed,
                            **options_for(plan.options, "cost_model", cost_model_name))
    search = _construct(registry, "search", search_name, cost_model=cost_model, store=store, seed=seed,
                        **options_for(plan.options, "search", search_name))
    last = {"measured": 0, "errors": 0}

    def report(round_report: Any) -> None:
        new, errors = round_report.measured - last["measured"], round_report.errors - last["errors"]
        last.update(measured=round_report.measured, errors=round_report.errors)
        on_round(task.name, new, errors)

    try:
        summary = Tuner(search=search, cost_model=cost_model, store=store, measurer=measurer, seed=seed,
                        on_round=report).tune([task], trials, {"model": task.model, "run_key": "dataset"})
        return summary["tasks"][0]["stopped"]
    finally:
        for record in store.records(task.task_id):
            dataset.add(Measurement.of(task, record, device_id, collected_by=search_name))
        search.close()
        cost_model.close()
        store.close()


def programs_to_remeasure(dataset: Dataset, kind: str, per_task: int | None, source_device: str | None,
                          seed: int) -> dict[str, list[Measurement]]:
    """Per task key, the programs of ``kind`` measured successfully on ``source_device`` (None: on any device), the
    first ``per_task`` in an order fixed by ``seed``: the same ones each time."""
    import json

    chosen: dict[str, dict[str, Measurement]] = {}
    for row in dataset.rows:
        if row.latency is None or json.loads(row.target)["kind"] != kind:
            continue
        if source_device is None or row.device_id == source_device:
            chosen.setdefault(row.task_key, {}).setdefault(row.program_key, row)
    out = {}
    for key, programs in sorted(chosen.items()):
        order = sorted(programs, key=lambda p: hashlib.sha256(f"{seed}|{p}".encode()).digest())
        out[key] = [programs[p] for p in order[:per_task]]
    return out


class _Saver:
    """Rewrites the dataset file, at most once a minute while collecting (the file grows; rewriting it
    after every task would cost more than the task as it nears its full size), and at the end."""

    def __init__(self, dataset: Dataset, path: str):
        self.dataset, self.path, self.saved_at = dataset, path, time.time()

    def save(self, at_most_every: float = 0) -> None:
        if time.time() - self.saved_at >= at_most_every:
            self.dataset.save(self.path)
            self.saved_at = time.time()


@contextlib.contextmanager
def _measurer(registry: Any, plan: CollectPlan, target: Any, path: str) -> Iterator[LabelMeasurer]:
    """The measurer of a plan for a target, taking labels by the label protocol for the dataset in ``path``;
    closed afterwards."""
    from tunecore.api import _construct
    from tunecore.options import options_for

    registry.check_target(target, measurer=plan.measurer)
    options = options_for(protocol.label_options(plan.options, plan.measurer), "measurer", plan.measurer)
    measurer = LabelMeasurer(_construct(registry, "measurer", plan.measurer, target, **options), plan.max_spread,
                             pause_file=path + PAUSE)
    try:
        yield measurer
    finally:
        measurer.close()


def _anchor_progress(on_progress: Callable[[Progress], None] | None, label: str) -> Callable[[str, int, int], None]:
    def report(task_name: str, done: int, total: int) -> None:
        if on_progress:
            on_progress(Progress(f"measuring on {label}, anchors", done, total, task_name))
    return report


def _start(path: str) -> float:
    """A run's start time, once a stop file left from an earlier run is gone (it is not for this one)."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(path + STOP)
    return time.time()


def _check_limits(plan: CollectPlan, started: float, measured: int, path: str) -> None:
    if plan.time_limit is not None and time.time() - started >= plan.time_limit:
        raise _Stop(f"time limit {plan.time_limit:g} s")
    if plan.max_programs is not None and measured >= plan.max_programs:
        raise _Stop(f"max programs {plan.max_programs}")
    if os.path.exists(path + STOP):  # ends the run as its time limit would: end anchors measured, everything saved
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + STOP)
        raise _Stop(f"{path + STOP} found")


def _check_plan(plan: CollectPlan) -> None:
    if not plan.models:
        raise UsageError("name at least one model (--model)")
    if plan.per_task < 1:
        raise UsageError("per_task must be >= 1")
    if isinstance(plan.kernels, str) or any(not kind.strip() for kind in plan.kernels):
        raise UsageError("kernels must be a sequence of operator names, e.g. ('conv', 'dense', 'matmul')")
    if not 0 <= plan.random_fraction <= 1:
        raise UsageError("random_fraction must be between 0 and 1")
    for name, value in (("max_programs", plan.max_programs), ("time_limit", plan.time_limit)):
        if value is not None and value <= 0:
            raise UsageError(f"{name} must be > 0")
    _check_protocol(plan)


def _check_protocol(plan: CollectPlan) -> None:
    if plan.max_spread < 0:
        raise UsageError("max_spread must be >= 0")
    if plan.anchors < 0:
        raise UsageError("anchors must be >= 0")


def _check_installed(registry: Any, role: str, name: str, flag: str) -> None:
    if name not in registry.names(role):
        raise UsageError(f"{flag} {name}: not installed (installed: {', '.join(registry.names(role))}); "
                         "pass another, or --random-fraction 1 to sample at random only")
