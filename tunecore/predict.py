"""Predicted latency of a workload without measuring it (``tunecore predict``), from a cost model that
predicts seconds (``CostModel.predicts_latency``).

Each task's schedule is its best stored record (or, with none stored, the task as it is, which is
what an untuned build compiles); the workload's latency is the sum over tasks of calls per inference
x predicted seconds (CDMPP's end-to-end estimate: the operators between tasks and the VM's own work
are not counted). With ``measure`` the workload is also built with the same records and timed.
"""

from __future__ import annotations

from typing import Any

from tunecore.errors import UsageError
from tunecore.roles import CostModel, RecordStore
from tunecore.workloads import Workload, extract_tasks


def predict_workload(workload: Workload, target: Any, store: RecordStore | None, cost_model: CostModel, *,
                     measure: bool = False, repeat: int = 5, min_repeat_ms: int = 200) -> dict[str, Any]:
    """Per task and in all, predicted (and with ``measure`` measured) milliseconds: what ``--json`` prints."""
    from tunecore.data import Candidate
    from tunecore.dataset.table import describe_device
    from tunecore.targets import device_descriptor, use_target_threads
    from tunecore.tvmjson import new_schedule

    if not cost_model.predicts_latency:
        raise UsageError(f"cost model '{cost_model.name}' ranks programs but does not predict latency "
                         "(try --cost-model cdmpp)")
    threads = use_target_threads(target)
    device = device_descriptor(target)
    cost_model.device = device
    tasks = extract_tasks(workload, target)
    rows, total = [], 0.0
    for task in tasks:
        candidate, stored_ms = None, None
        for record in store.best(task.task_id, k=4) if store is not None else []:
            try:
                candidate = record.candidate(task)
                _ = candidate.sch  # replayed once here; a trace that no longer applies is skipped, as compile skips it
            except Exception:
                candidate = None
                continue
            stored_ms = record.latency * 1e3
            break
        if candidate is None:
            candidate = Candidate.from_schedule(task, new_schedule(task.mod), origin="default")
        seconds = float(cost_model.predict_latency(task, [candidate])[0])
        total += task.weight * seconds
        rows.append({"task": task.name, "weight": task.weight, "schedule": "default" if stored_ms is None else "stored",
                     "predicted_ms": seconds * 1e3, "stored_ms": stored_ms})
    out: dict[str, Any] = {"model": workload.name, "device": describe_device(device), "cost_model": cost_model.name,
                           "tasks": rows, "tasks_with_records": sum(r["schedule"] == "stored" for r in rows),
                           "predicted_ms": total * 1e3, "threads": threads,
                           "device_note": cost_model.device_note(device)}
    if measure:
        from tvm.s_tir import meta_schedule as ms

        from tunecore.compile import Runnable, best_database, build, random_inputs

        database = best_database(store, tasks, target)[0] if store is not None else ms.database.MemoryDatabase()
        runnable = Runnable(build(workload, target, database), workload, target, random_inputs(workload))
        measured = runnable.time(repeat, min_repeat_ms)
        out.update(measured_ms=measured * 1e3, error=abs(total - measured) / measured)
    return out
