"""A batch directory's two ends where TVM's compiler is: ``export_batch`` builds programs into it, ``import_batch``
puts its timed results into a dataset. The middle, on the device, is tunecore.measure.batch."""

from __future__ import annotations

import json
import os
from typing import Any

from tunecore.measure.batch import MANIFEST, PROFILES, device_kernels, read_results, write_manifest


def export_batch(directory: str, workloads: list[str], target: Any, per_task: int | None, *,
                 trials: int | None = None, scheduler: str = "gradient", kernels: tuple[str, ...] = (),
                 task_names: tuple[str, ...] = (), seed: int = 0, search: str = "random", cost_model: str = "none",
                 store: Any = None, options: dict | None = None, dataset_programs: dict[str, list[Any]] | None = None,
                 registry: Any = None, on_progress: Any = None) -> dict[str, Any]:
    """Build ``per_task`` programs of every task of ``workloads`` for ``target`` into ``directory``, with each task's
    reference outputs (its unscheduled program run here on the host CPU): uniform samples of its design space, or
    the batch another ``search`` proposes (``options``: as for `run`, {role or name: {key: value}}; e.g. tlm's
    programs, to be timed where TVM's compiler is not).

    With ``store`` (a RecordStore holding these tasks' records for ``target``: earlier batches, timed and imported),
    the batch is the next round of a search whose measurements are made elsewhere: ``cost_model`` learns from every
    task's records first, as at the start of a run, the search starts each task from them, and no program measured
    before is built again (random samples skip them too).

    ``trials`` instead of ``per_task``: that many programs in all, split over the tasks as a run's ``scheduler``
    would give them out, from what the store's records say each task gains (tunecore.schedulers.plan); a task may
    get none.

    ``dataset_programs`` (task key -> a dataset's rows, e.g. ``unrepeated_programs``): those programs again, from
    their traces, instead of new ones; a task without any is left out. ``task_names``: only the tasks so named."""
    import dataclasses
    import shutil

    import tvm

    from tunecore.api import _construct
    from tunecore.check import weight_arguments, written_arguments
    from tunecore.data import Candidate
    from tunecore.dataset.table import DatasetTask
    from tunecore.errors import UsageError
    from tunecore.measure import worker
    from tunecore.measure.local import LocalBuilder
    from tunecore.options import options_for
    from tunecore.progress import Progress
    from tunecore.registry import Registry
    from tunecore.roles import Artifact
    from tunecore.space import DesignSpace
    from tunecore.targets import host_target
    from tunecore.tuner import warm_start
    from tunecore.tvmjson import target_to_json
    from tunecore.workloads import extract_tasks, has_kernel, load_workload

    os.makedirs(directory, exist_ok=True)
    host = host_target()
    registry = registry or Registry.shared()
    model = _construct(registry, "cost_model", cost_model, seed=seed, **options_for(options, "cost_model", cost_model))
    builder, host_builder = LocalBuilder(target), LocalBuilder(host)
    tasks: dict[str, dict] = {}
    programs: list[dict] = []
    written: dict[str, dict] = {}  # task name -> what the search says it did (its task_report) and the task's key
    try:
        found: dict[str, Any] = {}  # a kernel two workloads share: once, as the first has it
        for spec in workloads:
            for t in extract_tasks(load_workload(spec), target):
                if (not kernels or has_kernel(t.kernel_class, kernels)) and (not task_names or t.name in task_names):
                    found.setdefault(t.workload_hash, t)
        missing = set(task_names) - {t.name for t in found.values()}
        if missing:
            raise UsageError(f"--tasks: no task named {', '.join(sorted(missing))} in {', '.join(workloads)}")
        if dataset_programs is not None and not any(dataset_programs.get(key) for key in found):
            raise UsageError("no program of these tasks to build again: the dataset has none on that device, or "
                             "each has its second label")
        history = {t.task_id: store.records(t.task_id) for t in found.values()} if store is not None else {}
        device = _device_of([r for records in history.values() for r in records])
        if any(history.values()):
            model.device = store.devices().get(device) if device else None
            warm_start(model, store, [(t, history[t.task_id]) for t in found.values()])
        wanted = dict.fromkeys(found, per_task)
        if trials is not None:
            wanted = _split(found, history, device, trials, scheduler, seed)
        for n, (key, task) in enumerate(found.items()):
            if not wanted[key] or (dataset_programs is not None and not dataset_programs.get(key)):
                continue
            reference, weights = None, weight_arguments(task.mod)
            built = host_builder.build([tvm.ir.save_json(task.mod)])[0]
            if isinstance(built, Artifact):
                reference = f"reference-{key}.npz"
                worker.save_reference(built.path, target_to_json(host), task.args, weights,
                                      written_arguments(task.mod), os.path.join(directory, reference))
            tasks[key] = {"args": task.args, "weights": weights, "reference": reference,
                          "task": dataclasses.asdict(DatasetTask.of(task))}
            measured = history.get(task.task_id, [])
            if dataset_programs is not None:
                candidates = [Candidate(task, r.trace, r.program_key, r.origin) for r in dataset_programs[key]]
            elif search == "random":
                candidates = DesignSpace(task, seed).sample_new(wanted[key], {r.key for r in measured}, "random")
            else:
                name = task.name if task.name not in written else f"{task.name} ({key[:8]})"  # two networks' names
                candidates, report = _proposed(task, wanted[key], seed, search, options, registry, model, measured)
                written[name] = {**report, "task_key": key}
            replayed = [_replayed(c) for c in candidates]
            artifacts = iter(builder.build([module for module, _ in replayed if module is not None]))
            for candidate, (module, why) in zip(candidates, replayed):
                artifact = next(artifacts) if module is not None else why
                program = {"id": f"{key}-{candidate.key}", "task": key, "key": candidate.key,
                           "trace": candidate.trace_json, "origin": candidate.origin}
                if isinstance(artifact, Artifact):
                    program.update(library=f"{key[:16]}-{candidate.key[:16]}.so", args=artifact.arguments(task),
                                   packing=artifact.packing, build_secs=artifact.build_secs)
                    shutil.move(artifact.path, os.path.join(directory, program["library"]))
                    program["kernels"] = device_kernels(os.path.join(directory, program["library"]))
                else:
                    program["build_error"] = artifact
                programs.append(program)
            if on_progress:
                on_progress(Progress("building", n + 1, len(found), task.name))
    finally:
        builder.close()
        host_builder.close()
        model.close()
    write_manifest(directory, target_to_json(target), tasks,
                   [p for p in programs if "library" in p] + [p for p in programs if "library" not in p],
                   search=search)
    return {"tasks": len(tasks), "programs": len(programs), "built": sum("library" in p for p in programs),
            **({"measured_before": sum(map(len, history.values()))} if store is not None else {}),
            **({"split": {f"{found[key].name} ({key[:8]})": n for key, n in wanted.items()}} if trials else {}),
            **({"search": search, "cost_model": cost_model, "written": written} if search != "random" else {})}


def _replayed(candidate: Any) -> tuple[str | None, str | None]:
    """The candidate's scheduled module (JSON) for the builder, or why there is none: a stored trace that no longer
    replays is a failed build, not the batch's end."""
    import tvm

    try:
        return tvm.ir.save_json(candidate.mod), None
    except (RuntimeError, tvm.TVMError) as error:
        return None, f"the trace did not replay: {(str(error).strip().splitlines() or [''])[-1][:300]}"


def unrepeated_programs(path: str, device: str | None, kind: str, per_task: int | None,
                        seed: int) -> dict[str, list[Any]]:
    """Per task key, the programs the dataset at ``path`` measured on ``device`` (an id or its prefix; None: its only
    device) that have no second label yet: the first ``per_task`` of a task in an order fixed by ``seed``, as
    ``remeasure`` takes them (so a batch made again after importing the first leaves out what got its label)."""
    from tunecore.dataset import protocol
    from tunecore.dataset.collect import programs_to_remeasure
    from tunecore.dataset.split import device_of
    from tunecore.dataset.table import Dataset
    from tunecore.errors import UsageError

    dataset = Dataset.load(path)
    if device is None and len(dataset.devices) != 1:
        raise UsageError(f"{path}: {len(dataset.devices)} devices; name the one whose labels to repeat "
                         "(--from-device, ids in `tunecore dataset info`)")
    device_id = device_of(dataset, device) if device is not None else next(iter(dataset.devices))
    repeated = {protocol.SECOND_LABEL, protocol.SECOND_FAILED}
    chosen = programs_to_remeasure(dataset, kind, per_task, device_id, seed)
    return {key: [r for r in rows if not repeated & r.profile.keys()] for key, rows in chosen.items()}


def _device_of(records: list[Any]) -> str | None:
    """The device most of ``records`` were measured on: the one the batch's cost model predicts for."""
    import collections

    counts = collections.Counter(r.device_id for r in records if r.device_id)
    return counts.most_common(1)[0][0] if counts else None


def _split(tasks: dict[str, Any], history: dict[str, list[Any]], device: str | None, trials: int, scheduler: str,
           seed: int) -> dict[str, int]:
    """``trials`` programs over ``tasks`` (by key) as a run's scheduler would give them out, from their records on
    ``device``."""
    from tunecore.schedulers import plan, restored_state
    from tunecore.tuner import default_round_size, derive_seed

    states = [restored_state(t, [r for r in history.get(t.task_id, []) if r.device_id == device])
              for t in tasks.values()]
    counts = plan(states, trials, default_round_size(trials, len(states)), scheduler, derive_seed(seed, "scheduler"))
    return dict(zip(tasks, counts))


def _proposed(task: Any, n: int, seed: int, search_name: str, options: dict | None, registry: Any,
              cost_model: Any, history: list[Any]) -> tuple[list[Any], dict]:
    """The ``n`` candidates ``search_name`` proposes for ``task`` (none of them in ``history``, its records so far)
    asking ``cost_model``, and its report of the task."""
    from tunecore.api import _construct
    from tunecore.data import distinct
    from tunecore.options import options_for
    from tunecore.roles import TaskContext
    from tunecore.space import DesignSpace
    from tunecore.store.sqlite import MemoryStore
    from tunecore.tuner import derive_seed

    task_seed = derive_seed(seed, task.workload_hash, search_name)
    store = MemoryStore()
    search = _construct(registry, "search", search_name, cost_model=cost_model, store=store, seed=task_seed,
                        **options_for(options, "search", search_name))
    measured = {r.key for r in history}
    try:
        store.put_tasks([task])
        search.start_task(TaskContext(task, DesignSpace(task, seed=task_seed), task_seed, measured, history))
        return distinct(search.propose(task, n), measured)[:n], search.task_report(task)
    finally:
        search.close()
        store.close()


def import_batch(directory: str, dataset_path: str) -> dict[str, Any]:
    """Put a batch's results into a dataset (created if missing): one row per program, failures included, on
    the device the results name; programs not timed yet are left out (import again after timing them). A program
    the dataset has on that device already keeps its row: its new clean timing becomes the row's second label
    (an independent repeat: the noise ceiling of the yardstick), and profile metrics it lacks are added (a batch
    profiled after its timings were imported)."""
    from tunecore.dataset import protocol
    from tunecore.dataset.table import Dataset, DatasetTask, Measurement, changing

    with open(os.path.join(directory, MANIFEST)) as f:
        manifest = json.load(f)
    done = read_results(directory)
    if done["device"] is None:
        raise ValueError(f"{directory}: no results yet (run `python -m tunecore.measure.batch {directory}` there)")
    target_json = json.dumps(manifest["target"], sort_keys=True)
    device = dict(done["device"])
    if device["kind"] == "cuda":  # results timed before the runner named the arch it ran (the dataset's H100 rows)
        device.setdefault("arch", manifest["target"].get("arch", ""))
    profiles_path = os.path.join(directory, PROFILES)
    profiles = json.load(open(profiles_path)) if os.path.exists(profiles_path) else {}
    with changing(dataset_path):
        dataset = Dataset.open(dataset_path)
        device_id = dataset.add_device(device)
        counts = {"added": 0, "failed": 0, "not_timed": 0, "second_labels": 0, "profiles_added": 0}
        for program in manifest["programs"]:
            task = dataset.add_task(DatasetTask(**manifest["tasks"][program["task"]]["task"]))
            if "build_error" in program:
                result = {"run_secs": None, "error": program["build_error"]}
            else:
                result = done["results"].get(program["id"])
                if result is None:
                    counts["not_timed"] += 1
                    continue
            profile = {protocol.ATTEMPTS: float(result.get("attempts", 1))}
            if result.get("noisy"):
                profile[protocol.NOISY] = 1.0
            if result.get("host_load") is not None:
                profile[protocol.FOREIGN_LOAD] = result["host_load"]
            profile.update(profiles.get(program["id"], {}))
            if result.get("max_relative_error") is not None:
                from tunecore.check import CHECKED

                profile[CHECKED] = result["max_relative_error"]
            row = Measurement(task.key, program["key"], program["trace"], device_id, target_json, result["run_secs"],
                              result["error"], program.get("build_secs", 0.0), profile, program["origin"],
                              manifest.get("search", "random"))
            if dataset.add(row):
                counts["added"] += 1
                counts["failed"] += row.error is not None
            else:
                known = dataset.row(row.task_key, row.program_key, row.device_id)
                new_metrics = {k: v for k, v in profiles.get(program["id"], {}).items() if k not in known.profile}
                if new_metrics:  # profiled after its timing was imported
                    known.profile.update(new_metrics)
                    counts["profiles_added"] += 1
                counts["second_labels"] += _second_label(known, row)
        dataset.save(dataset_path)
        return {**counts, "device_id": device_id}


def _second_label(known: Any, row: Any) -> bool:
    """Give ``known`` (the dataset's row of ``row``'s program) ``row``'s clean timing as its second label."""
    from tunecore.dataset import protocol

    if (known.run_secs == row.run_secs  # the same timings imported again: not a repeat
            or protocol.SECOND_LABEL in known.profile or not protocol.is_clean(row) or known.error):
        return False
    known.profile[protocol.SECOND_LABEL] = row.latency
    return True
