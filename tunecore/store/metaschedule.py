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
    TVM reads the files in a child process: a damaged database can crash TVM's parser (found by
    fuzzing), and that must be one line, not the end of this process.
    """
    import tvm

    from tunecore.targets import load_tensor_intrinsics
    from tunecore.tvmjson import target_from_json
    from tunecore.workloads import kernel_class_of, make_task

    paths = [os.path.join(directory, f) for f in ("database_workload.json", "database_tuning_record.json")]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise UsageError(f"{directory}: not a MetaSchedule JSON database (missing {os.path.basename(missing[0])})")
    model = f"metaschedule:{os.path.abspath(directory)}"
    tasks: dict[str, Task] = {}
    records: list[Record] = []
    for trial, read in enumerate(_read_in_child(directory)):
        record_target = target or target_from_json(read["target"])
        load_tensor_intrinsics(record_target)
        mod = tvm.ir.load_json(read["mod"])
        task = make_task(mod, record_target, name=_function_name(mod), kernel_class=kernel_class_of(mod), model=model)
        tasks.setdefault(task.task_id, task)
        if read["trace"] is None:  # it does not replay on its workload
            continue
        run_secs = read["run_secs"]
        failed = not run_secs or min(run_secs) >= FAILED_RUN_SECS / 10
        records.append(
            Record(
                task_id=task.task_id,
                key=read["key"],
                trace_json=read["trace"],
                run_secs=None if failed else run_secs,
                error="failed in MetaSchedule (imported)" if failed else None,
                origin="metaschedule-import",
                trial=trial,
            )
        )
    store.put_tasks(list(tasks.values()))
    store.commit(records)
    return len(tasks), len(records)


def _read_in_child(directory: str) -> list[dict[str, Any]]:
    """The database's records as plain JSON written by TVM itself (module, replayed trace, its key, run
    seconds, target), read by ``python -m tunecore.store.metaschedule DIRECTORY``."""
    import json
    import subprocess
    import sys

    from tunecore.measure.local import keep_torch_out

    keep_torch_out()
    try:
        child = subprocess.run([sys.executable, "-m", "tunecore.store.metaschedule", directory], capture_output=True,
                               text=True, timeout=3600)
    except subprocess.TimeoutExpired:
        raise UsageError(f"{directory}: MetaSchedule did not finish reading this database in an hour") from None
    if child.returncode < 0:
        raise UsageError(f"{directory}: MetaSchedule crashed reading this database (signal {-child.returncode}); "
                         "it is damaged")
    if child.returncode != 0:
        lines = child.stderr.strip().splitlines() or ["no message"]
        raise UsageError(f"{directory}: MetaSchedule cannot read this database ({lines[-1][:200]})")
    return json.loads(child.stdout)


def _read(directory: str) -> list[dict[str, Any]]:
    """In the child: every tuning record, with its trace replayed on its workload (None where it does not)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tunecore.tvmjson import replay_trace_json, schedule_key, target_to_json, trace_to_json

    paths = [os.path.join(directory, f) for f in ("database_workload.json", "database_tuning_record.json")]
    db = ms.database.JSONDatabase(path_workload=paths[0], path_tuning_record=paths[1], allow_missing=False)
    out = []
    for ms_record in db.get_all_tuning_records():
        mod = ms_record.workload.mod
        read = {"mod": tvm.ir.save_json(mod), "target": target_to_json(ms_record.target), "trace": None, "key": None,
                "run_secs": [float(s) for s in ms_record.run_secs] if ms_record.run_secs else None}
        try:
            sch = replay_trace_json(mod, trace_to_json(ms_record.trace))
            read.update(trace=trace_to_json(sch.trace), key=schedule_key(sch))
        except Exception:
            pass
        out.append(read)
    return out


def _function_name(mod: Any) -> str:
    func = mod["main"]
    symbol = func.attrs.get("global_symbol") if func.attrs is not None else None
    return str(symbol) if symbol and str(symbol) != "main" else "imported"


if __name__ == "__main__":
    import json
    import sys

    from tunecore.errors import error_line

    try:
        print(json.dumps(_read(sys.argv[1])))
    except Exception as error:  # the parent shows this line
        print(error_line(error), file=sys.stderr)
        sys.exit(1)
