"""The default record store: one SQLite file (WAL), committed durably after every round.

``memory`` is the same store on an in-memory database, for tests and throwaway runs.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from typing import Any, Sequence

from tunecore.data import Record, Task
from tunecore.errors import UsageError
from tunecore.roles import RecordStore

FORMAT = "tunecore-store"
SCHEMA_VERSION = 2  # 2: devices; runs and records name the device they measured on

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    kernel_class TEXT NOT NULL,
    workload_hash TEXT NOT NULL,
    target_json TEXT NOT NULL,
    target_kind TEXT NOT NULL,
    mod_json TEXT NOT NULL,
    flops REAL NOT NULL,
    args TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_by_class ON tasks (kernel_class, target_kind);
CREATE TABLE IF NOT EXISTS task_models (
    model TEXT NOT NULL,
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    name TEXT NOT NULL,
    weight INTEGER NOT NULL,
    PRIMARY KEY (model, task_id)
);
CREATE INDEX IF NOT EXISTS task_models_by_task ON task_models (task_id);
CREATE TABLE IF NOT EXISTS devices (device_id TEXT PRIMARY KEY, description TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at REAL NOT NULL,
    finished_at REAL,
    info TEXT NOT NULL,
    summary TEXT,
    device_id TEXT REFERENCES devices (device_id)
);
CREATE TABLE IF NOT EXISTS records (
    record_id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    key TEXT NOT NULL,
    trace_json TEXT NOT NULL,
    latency REAL,
    run_secs TEXT,
    error TEXT,
    build_secs REAL NOT NULL,
    profile TEXT NOT NULL,
    origin TEXT NOT NULL,
    trial INTEGER NOT NULL,
    measured_at REAL NOT NULL,
    run_id INTEGER,
    device_id TEXT REFERENCES devices (device_id),
    UNIQUE (task_id, key)
);
CREATE INDEX IF NOT EXISTS records_by_latency ON records (task_id, latency);
"""


class SqliteStore(RecordStore):
    name = "sqlite"

    def __init__(self, location: str):
        self.location = location
        in_memory = location in ("", ":memory:")
        if not in_memory and os.path.isdir(location):
            raise UsageError(f"--store {location}: is a directory, not a tunecore store file")
        directory = os.path.dirname(os.path.abspath(location))
        if not in_memory and not os.path.isdir(directory):
            raise UsageError(f"--store {location}: directory {directory} does not exist")
        is_new = in_memory or not os.path.exists(location) or os.path.getsize(location) == 0
        try:
            self.db = sqlite3.connect(":memory:" if in_memory else location, isolation_level=None)
            self.db.row_factory = sqlite3.Row
            if not is_new:
                self._check_format()
            if not in_memory:
                self.db.execute("PRAGMA journal_mode=WAL")
                # FULL: a committed round survives even a power cut, and costs one fsync per round
                self.db.execute("PRAGMA synchronous=FULL")
            with self.db:
                # IMMEDIATE: two processes opening an old store at once upgrade it one after the other
                self.db.execute("BEGIN IMMEDIATE")
                if not is_new:
                    self._upgrade()
                for statement in _SCHEMA.split(";"):  # executescript would commit half-way
                    if statement.strip():
                        self.db.execute(statement)
                self.db.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?), ('schema', ?)",
                                (FORMAT, str(SCHEMA_VERSION)))
        except sqlite3.DatabaseError as error:
            raise UsageError(f"--store {location}: not a tunecore store ({error})") from None

    def _check_format(self) -> None:
        try:
            row = self.db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
        except sqlite3.DatabaseError:
            row = None
        if row is None or row[0] != FORMAT:
            raise UsageError(f"--store {self.location}: not a tunecore store (an SQLite file of another program?)")
        version = int(self.db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise UsageError(f"--store {self.location}: written by a newer tunecore (schema {version}); "
                             "upgrade tunecore")

    def _upgrade(self) -> None:
        """Bring a store written by an older tunecore to this schema, in place (inside the open transaction)."""
        version = int(self.db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0])
        if version >= SCHEMA_VERSION:
            return
        if version < 2:  # records measured before devices were recorded keep device_id NULL: unknown
            self.db.execute("ALTER TABLE runs ADD COLUMN device_id TEXT REFERENCES devices (device_id)")
            self.db.execute("ALTER TABLE records ADD COLUMN device_id TEXT REFERENCES devices (device_id)")
        self.db.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(SCHEMA_VERSION),))

    def close(self) -> None:
        self.db.close()

    # tasks
    def put_tasks(self, tasks: Sequence[Task]) -> None:
        now = time.time()
        with self.db:
            self.db.execute("BEGIN")
            for t in tasks:
                self.db.execute(
                    "INSERT OR IGNORE INTO tasks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (t.task_id, t.name, t.kernel_class, t.workload_hash, t.target_json, t.target_kind,
                     t.mod_json, t.flops, json.dumps(t.args), now),
                )
                if t.model:
                    self.db.execute(
                        "INSERT OR REPLACE INTO task_models VALUES (?, ?, ?, ?)", (t.model, t.task_id, t.name, t.weight)
                    )

    def get_tasks(self, model: str | None = None, task_ids: Sequence[str] | None = None) -> list[Task]:
        if model is not None:
            rows = self.db.execute(
                "SELECT t.*, m.model, m.name AS model_name, m.weight FROM tasks t JOIN task_models m USING (task_id)"
                " WHERE m.model = ? ORDER BY t.created_at, t.rowid",
                (model,),
            ).fetchall()
        else:
            rows = self.db.execute(
                "SELECT t.*, m.model, m.name AS model_name, m.weight FROM tasks t LEFT JOIN task_models m"
                " ON m.rowid = (SELECT rowid FROM task_models WHERE task_id = t.task_id LIMIT 1)"
                " ORDER BY t.created_at, t.rowid"
            ).fetchall()
        tasks = [task_from_row(r) for r in rows]
        if task_ids is not None:
            wanted = set(task_ids)
            tasks = [t for t in tasks if t.task_id in wanted]
        return tasks

    def models(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT DISTINCT model FROM task_models ORDER BY model")]

    def tasks_by_kernel_class(self, kernel_class: str, target_kind: str | None = None) -> list[Task]:
        ids = [
            r[0]
            for r in self.db.execute(
                "SELECT task_id FROM tasks WHERE kernel_class = ? AND (? IS NULL OR target_kind = ?)",
                (kernel_class, target_kind, target_kind),
            )
        ]
        return self.get_tasks(task_ids=ids)

    # records
    def commit(self, records: Sequence[Record]) -> None:
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany(
                "INSERT OR IGNORE INTO records (task_id, key, trace_json, latency, run_secs, error, build_secs,"
                " profile, origin, trial, measured_at, run_id, device_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
                " COALESCE(?, (SELECT device_id FROM runs WHERE run_id = ?)))",
                [
                    (r.task_id, r.key, r.trace_json, r.latency, None if r.run_secs is None else json.dumps(r.run_secs),
                     r.error, r.build_secs, json.dumps(r.profile), r.origin, r.trial, r.measured_at, r.run_id,
                     r.device_id, r.run_id)
                    for r in records
                ],
            )

    def records(self, task_id: str) -> list[Record]:
        rows = self.db.execute("SELECT * FROM records WHERE task_id = ? ORDER BY record_id", (task_id,))
        return [record_from_row(r) for r in rows]

    def all_records(self) -> list[Record]:
        return [record_from_row(r) for r in self.db.execute("SELECT * FROM records ORDER BY record_id")]

    def best(self, task_id: str, k: int = 1) -> list[Record]:
        rows = self.db.execute(
            "SELECT * FROM records WHERE task_id = ? AND latency IS NOT NULL ORDER BY latency, record_id LIMIT ?",
            (task_id, k),
        )
        return [record_from_row(r) for r in rows]

    def mark_failed(self, task_id: str, key: str, error: str, profile: dict[str, float] | None = None) -> None:
        with self.db:
            row = self.db.execute("SELECT profile FROM records WHERE task_id = ? AND key = ?",
                                  (task_id, key)).fetchone()
            if row is not None:
                merged = {**json.loads(row[0]), **(profile or {})}
                self.db.execute("UPDATE records SET error = ?, latency = NULL, profile = ?"
                                " WHERE task_id = ? AND key = ?", (error, json.dumps(merged), task_id, key))

    def counts(self, task_ids: Sequence[str]) -> dict[str, int]:
        return self._count(task_ids, "")

    def failure_counts(self, task_ids: Sequence[str]) -> dict[str, int]:
        return self._count(task_ids, " WHERE error IS NOT NULL")

    def _count(self, task_ids: Sequence[str], where: str) -> dict[str, int]:
        counts = dict.fromkeys(task_ids, 0)
        for row in self.db.execute(f"SELECT task_id, COUNT(*) FROM records{where} GROUP BY task_id"):
            if row[0] in counts:
                counts[row[0]] = row[1]
        return counts

    # runs
    def start_run(self, info: dict[str, Any], started_at: float | None = None) -> int:
        from tunecore.targets import device_id

        info = dict(info)
        device = info.pop("device", None)
        identity = None if device is None else device_id(device)
        with self.db:
            self.db.execute("BEGIN")
            if device is not None:
                self.db.execute("INSERT OR IGNORE INTO devices VALUES (?, ?)", (identity, json.dumps(device)))
            cursor = self.db.execute("INSERT INTO runs (started_at, info, device_id) VALUES (?, ?, ?)",
                                     (started_at or time.time(), json.dumps(info), identity))
        return int(cursor.lastrowid)

    def finish_run(self, run_id: int, summary: dict[str, Any], finished_at: float | None = None) -> None:
        with self.db:
            self.db.execute(
                "UPDATE runs SET finished_at = ?, summary = ? WHERE run_id = ?",
                (finished_at or time.time(), json.dumps(summary), run_id)
            )

    def runs(self) -> list[dict[str, Any]]:
        return [run_from_row(r) for r in self.db.execute("SELECT * FROM runs ORDER BY run_id")]

    def devices(self) -> dict[str, dict[str, Any]]:
        return {r[0]: json.loads(r[1]) for r in self.db.execute("SELECT device_id, description FROM devices")}


class MemoryStore(SqliteStore):
    """Nothing is kept after the process ends."""

    name = "memory"

    def __init__(self, location: str = ""):
        super().__init__(":memory:")


def task_from_row(row: Any) -> Task:
    """A task from a row of tasks joined with task_models (any database's row mapping)."""
    return Task(
        task_id=row["task_id"],
        name=row["model_name"] or row["name"],
        kernel_class=row["kernel_class"],
        workload_hash=row["workload_hash"],
        target_json=row["target_json"],
        mod_json=row["mod_json"],
        flops=row["flops"],
        args=json.loads(row["args"]),
        weight=row["weight"] if row["weight"] is not None else 1,
        model=row["model"] or "",
    )


def record_from_row(row: Any) -> Record:
    return Record(
        task_id=row["task_id"],
        key=row["key"],
        trace_json=row["trace_json"],
        run_secs=None if row["run_secs"] is None else json.loads(row["run_secs"]),
        error=row["error"],
        build_secs=row["build_secs"],
        profile=json.loads(row["profile"]),
        origin=row["origin"],
        trial=row["trial"],
        measured_at=row["measured_at"],
        run_id=row["run_id"],
        device_id=row["device_id"],
    )


def run_from_row(row: Any) -> dict[str, Any]:
    return {"run_id": row["run_id"], "started_at": row["started_at"], "finished_at": row["finished_at"],
            "info": json.loads(row["info"]), "summary": json.loads(row["summary"]) if row["summary"] else None,
            "device_id": row["device_id"]}
