"""MetaSchedule JSONDatabase import and export (``tunecore records import|export --format metaschedule``).

The files are written and read by TVM's own ``JSONDatabase``, so what tunecore exports is what
MetaSchedule reads and vice versa. MetaSchedule keeps a failed candidate as ``run_secs = [1e10]``.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from tunecore.data import Record, Task
from tunecore.errors import UsageError
from tunecore.roles import RecordStore

FAILED_RUN_SECS = 1e10


def export_metaschedule(store: RecordStore, directory: str, tasks: Sequence[Task]) -> int:
    """Append every record of ``tasks`` to a JSONDatabase in ``directory``; returns how many were written."""
    from tvm.s_tir import meta_schedule as ms

    from tunecore.targets import load_tensor_intrinsics
    from tunecore.tvmjson import replay_trace_json

    os.makedirs(directory, exist_ok=True)
    db = ms.database.JSONDatabase(work_dir=directory)
    written = 0
    for task in tasks:
        load_tensor_intrinsics(task.target)
        workload = db.commit_workload(task.mod)
        args_info = [ms.arg_info.ArgInfo.from_json(a) for a in task.args]
        for record in store.records(task.task_id):
            try:
                trace = replay_trace_json(task.mod, record.trace_json).trace
            except Exception:  # a trace the task no longer accepts cannot be expressed in the file
                continue
            run_secs = record.run_secs if record.latency is not None else [FAILED_RUN_SECS]
            db.commit_tuning_record(ms.database.TuningRecord(trace, workload, run_secs, task.target, args_info))
            written += 1
    return written


def import_metaschedule(store: RecordStore, directory: str, target: Any | None = None) -> tuple[int, int]:
    """Read a JSONDatabase directory into ``store``; returns (tasks, records) imported.

    ``target`` replaces the targets in the file (MetaSchedule ignores targets in queries; tunecore
    keys tasks by target, so importing records of ``llvm`` for this host needs the host's target).
    """
    from tvm.s_tir import meta_schedule as ms

    from tunecore.targets import load_tensor_intrinsics
    from tunecore.tvmjson import replay_trace_json, schedule_key, trace_to_json
    from tunecore.workloads import kernel_class_of, make_task

    paths = [os.path.join(directory, f) for f in ("database_workload.json", "database_tuning_record.json")]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise UsageError(f"{directory}: not a MetaSchedule JSON database (missing {os.path.basename(missing[0])})")
    try:
        db = ms.database.JSONDatabase(path_workload=paths[0], path_tuning_record=paths[1], allow_missing=False)
        ms_records = db.get_all_tuning_records()
    except Exception as error:
        raise UsageError(f"{directory}: MetaSchedule cannot read this database "
                         f"({str(error).splitlines()[0][:200]})") from None
    model = f"metaschedule:{os.path.abspath(directory)}"
    tasks: dict[str, Task] = {}
    records: list[Record] = []
    for trial, ms_record in enumerate(ms_records):
        record_target = target or ms_record.target
        load_tensor_intrinsics(record_target)
        mod = ms_record.workload.mod
        task = make_task(mod, record_target, name=_function_name(mod), kernel_class=kernel_class_of(mod), model=model)
        tasks.setdefault(task.task_id, task)
        try:
            sch = replay_trace_json(mod, trace_to_json(ms_record.trace))
        except Exception:
            continue
        run_secs = [float(s) for s in ms_record.run_secs] if ms_record.run_secs else None
        failed = not run_secs or min(run_secs) >= FAILED_RUN_SECS / 10
        records.append(
            Record(
                task_id=task.task_id,
                key=schedule_key(sch),
                trace_json=trace_to_json(sch.trace),
                run_secs=None if failed else run_secs,
                error="failed in MetaSchedule (imported)" if failed else None,
                origin="metaschedule-import",
                trial=trial,
            )
        )
    store.put_tasks(list(tasks.values()))
    store.commit(records)
    return len(tasks), len(records)


def _function_name(mod: Any) -> str:
    func = mod["main"]
    symbol = func.attrs.get("global_symbol") if func.attrs is not None else None
    return str(symbol) if symbol and str(symbol) != "main" else "imported"
