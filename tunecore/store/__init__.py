"""Record stores, and how a ``--store`` value selects one.

``--store PATH`` is the default ``sqlite`` store in that file; ``--store NAME:LOCATION`` picks the
registered store ``NAME`` (``memory:``, ``sqlite:runs/a.db``, or a plugin's).
"""

from __future__ import annotations

import os
import re
from typing import Any

from tunecore.errors import UsageError

DEFAULT_STORE = "tunecore.db"


def parse_store_url(url: str | None, store_names: list[str]) -> tuple[str, str]:
    """(store name, location) for a ``--store`` value: NAME:LOCATION for a store NAME, else a SQLite file's path
    (an unknown NAME: is a UsageError, not a file of that name; ./foo:bar is the file)."""
    url = url or DEFAULT_STORE
    match = re.fullmatch(r"([a-z][a-z0-9_-]*):(.*)", url)
    if match and match.group(1) in store_names:
        return match.group(1), match.group(2)
    if match and not os.path.exists(url):
        raise UsageError(f"--store {url}: unknown store '{match.group(1)}' (stores: {', '.join(sorted(store_names))}; "
                         f"a file whose name has a colon: ./{url})")
    return "sqlite", url


def copy_store(source: Any, dest: Any, label: str) -> tuple[int, int]:
    """Copy every task (with its models' names and weights), run (with its times and device) and record of one
    store into another; returns (runs, records) added. Copying again adds nothing: a run remembers where it came
    from (``info["imported_from"]``, ``label#run_id``) and a record is stored once by its key."""
    models = source.models() if hasattr(source, "models") else []
    for model in models:
        dest.put_tasks(source.get_tasks(model=model))
    tasks = source.get_tasks()
    dest.put_tasks([t for t in tasks if not t.model])
    devices = source.devices()
    copied = {r["info"].get("imported_from"): r["run_id"] for r in dest.runs()}
    run_ids, new_runs = {}, 0
    for run in source.runs():
        origin = f"{label}#{run['run_id']}"
        if origin not in copied:
            info = dict(run["info"], imported_from=origin)
            if run["device_id"] in devices:
                info["device"] = devices[run["device_id"]]
            copied[origin] = dest.start_run(info, started_at=run["started_at"])
            if run["finished_at"] is not None:
                dest.finish_run(copied[origin], run["summary"] or {}, finished_at=run["finished_at"])
            new_runs += 1
        run_ids[run["run_id"]] = copied[origin]
    ids = [t.task_id for t in tasks]
    before = sum(dest.counts(ids).values())
    for task in tasks:
        records = source.records(task.task_id)
        for record in records:
            record.run_id = run_ids.get(record.run_id)
        dest.commit(records)
    return new_runs, sum(dest.counts(ids).values()) - before
