"""The ``postgresql`` record store: one database shared by every tuning job of a team, through SQLAlchemy.

    tunecore run ... --store postgresql://USER@HOST:PORT/DATABASE

The same contract as the sqlite store (the conformance suite holds both), and what several jobs at once
need: every call is one transaction; a record is stored once, by its unique (task, key); before a round is
measured its candidates are *claimed*, so a program two jobs propose at the same moment is measured by
one of them (a claim left by a killed job lapses after ``CLAIM_TTL_S``, on the database's clock); the
schema is created once under an advisory lock (two jobs opening a new database at once do not race), and a
store of an older schema is refused on open until ``tunecore records upgrade --store URL`` brings it up to
date, once, explicitly.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Sequence

from tunecore.data import Record, Task
from tunecore.errors import UsageError, first_line
from tunecore.roles import RecordStore
from tunecore.store.sqlite import FORMAT, SCHEMA_VERSION, record_from_row, run_from_row, task_from_row

CLAIM_TTL_S = 3600.0  # a claim older than this (its job was killed mid-round) no longer holds its candidate
_SCHEMA_LOCK = 0x74756E65  # pg_advisory_xact_lock key while the schema is created or upgraded

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE tasks (
    seq BIGSERIAL UNIQUE,
    task_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    kernel_class TEXT NOT NULL,
    workload_hash TEXT NOT NULL,
    target_json TEXT NOT NULL,
    target_kind TEXT NOT NULL,
    mod_json TEXT NOT NULL,
    flops DOUBLE PRECISION NOT NULL,
    args TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX tasks_by_class ON tasks (kernel_class, target_kind);
CREATE TABLE task_models (
    seq BIGSERIAL,
    model TEXT NOT NULL,
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    name TEXT NOT NULL,
    weight INTEGER NOT NULL,
    PRIMARY KEY (model, task_id)
);
CREATE INDEX task_models_by_task ON task_models (task_id);
CREATE TABLE devices (device_id TEXT PRIMARY KEY, description TEXT NOT NULL);
CREATE TABLE runs (
    run_id BIGSERIAL PRIMARY KEY,
    started_at DOUBLE PRECISION NOT NULL,
    finished_at DOUBLE PRECISION,
    info TEXT NOT NULL,
    summary TEXT,
    device_id TEXT REFERENCES devices (device_id)
);
CREATE TABLE records (
    record_id BIGSERIAL PRIMARY KEY,
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    key TEXT NOT NULL,
    trace_json TEXT NOT NULL,
    latency DOUBLE PRECISION,
    run_secs TEXT,
    error TEXT,
    build_secs DOUBLE PRECISION NOT NULL,
    profile TEXT NOT NULL,
    origin TEXT NOT NULL,
    trial INTEGER NOT NULL,
    measured_at DOUBLE PRECISION NOT NULL,
    run_id BIGINT,
    device_id TEXT REFERENCES devices (device_id),
    UNIQUE (task_id, key)
);
CREATE INDEX records_by_latency ON records (task_id, latency);
CREATE TABLE claims (
    task_id TEXT NOT NULL,
    key TEXT NOT NULL,
    run_id BIGINT NOT NULL,
    claimed_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (task_id, key)
)
"""

# schema version -> the statements that bring a store of that version to the next one
_UPGRADES: dict[int, list[str]] = {
    1: ["ALTER TABLE runs ADD COLUMN device_id TEXT REFERENCES devices (device_id)",
        "ALTER TABLE records ADD COLUMN device_id TEXT REFERENCES devices (device_id)"],
}

_TASK_COLUMNS = "t.*, m.model, m.name AS model_name, m.weight"


class PostgresStore(RecordStore):
    name = "postgresql"

    def __init__(self, location: str, *, upgrade: bool = False):
        try:
            import sqlalchemy
        except ImportError:
            raise UsageError("the postgresql store needs SQLAlchemy and psycopg: bash install.sh, or pip install "
                             "'tunecore[fleet]'") from None
        self.url = "postgresql:" + location
        self.sa = sqlalchemy
        try:
            self.engine = sqlalchemy.create_engine("postgresql+psycopg:" + location, pool_pre_ping=True,
                                                   pool_size=2, max_overflow=2)
            with self.engine.begin() as db:
                db.execute(self.sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK})
                if db.execute(self.sa.text("SELECT to_regclass('meta')")).scalar() is None:
                    for statement in _SCHEMA.split(";"):
                        db.execute(self.sa.text(statement))
                    db.execute(self.sa.text("INSERT INTO meta VALUES ('format', :format), ('schema', :schema)"),
                               {"format": FORMAT, "schema": str(SCHEMA_VERSION)})
                else:
                    self._check_schema(db, upgrade)
        except sqlalchemy.exc.SQLAlchemyError as error:
            raise UsageError(f"--store {self.url}: {first_line(error.orig or error)}") from None

    def _check_schema(self, db: Any, upgrade: bool) -> None:
        rows = dict(db.execute(self.sa.text("SELECT key, value FROM meta")).all())
        if rows.get("format") != FORMAT:
            raise UsageError(f"--store {self.url}: this database holds something else than a tunecore store")
        version = int(rows["schema"])
        if version > SCHEMA_VERSION:
            raise UsageError(f"--store {self.url}: written by a newer tunecore (schema {version}); upgrade tunecore")
        if version < SCHEMA_VERSION and not upgrade:
            raise UsageError(f"--store {self.url}: schema {version} is older than this tunecore's ({SCHEMA_VERSION}); "
                             f"stop the jobs using it and run once: tunecore records upgrade --store {self.url}")
        for step in range(version, SCHEMA_VERSION):
            for statement in _UPGRADES[step]:
                db.execute(self.sa.text(statement))
        db.execute(self.sa.text("UPDATE meta SET value = :schema WHERE key = 'schema'"),
                   {"schema": str(SCHEMA_VERSION)})

    def close(self) -> None:
        self.engine.dispose()

    def _transaction(self, work: Callable[[Any], Any]) -> Any:
        """One transaction, retried when the connection drops before it committed (a restarted server)."""
        for attempt in range(3):
            try:
                with self.engine.begin() as db:
                    return work(db)
            except self.sa.exc.OperationalError:
                if attempt == 2:
                    raise
                time.sleep(1.0 + attempt)

    def _read(self, sql: str, **params: Any) -> list[Any]:
        return self._transaction(lambda db: [row._mapping for row in db.execute(self.sa.text(sql), params)])

    # tasks
    def put_tasks(self, tasks: Sequence[Task]) -> None:
        now = time.time()

        def work(db: Any) -> None:
            for t in tasks:
                db.execute(self.sa.text(
                    "INSERT INTO tasks (task_id, name, kernel_class, workload_hash, target_json, target_kind, mod_json,"
                    " flops, args, created_at) VALUES (:task_id, :name, :kernel_class, :workload_hash, :target_json,"
                    " :target_kind, :mod_json, :flops, :args, :now) ON CONFLICT DO NOTHING"),
                    dict(task_id=t.task_id, name=t.name, kernel_class=t.kernel_class, workload_hash=t.workload_hash,
                         target_json=t.target_json, target_kind=t.target_kind, mod_json=t.mod_json, flops=t.flops,
                         args=json.dumps(t.args), now=now))
                if t.model:
                    db.execute(self.sa.text(
                        "INSERT INTO task_models (model, task_id, name, weight) VALUES (:model, :task_id, :name,"
                        " :weight) ON CONFLICT (model, task_id) DO UPDATE SET name = :name, weight = :weight"),
                        dict(model=t.model, task_id=t.task_id, name=t.name, weight=t.weight))

        self._transaction(work)

    def get_tasks(self, model: str | None = None, task_ids: Sequence[str] | None = None) -> list[Task]:
        if model is not None:
            rows = self._read(f"SELECT {_TASK_COLUMNS} FROM tasks t JOIN task_models m USING (task_id)"
                              " WHERE m.model = :model ORDER BY t.seq", model=model)
        else:
            rows = self._read(f"SELECT {_TASK_COLUMNS} FROM tasks t LEFT JOIN LATERAL (SELECT * FROM task_models"
                              " WHERE task_id = t.task_id ORDER BY seq LIMIT 1) m ON true ORDER BY t.seq")
        tasks = [task_from_row(r) for r in rows]
        if task_ids is not None:
            wanted = set(task_ids)
            tasks = [t for t in tasks if t.task_id in wanted]
        return tasks

    def models(self) -> list[str]:
        return [r["model"] for r in self._read("SELECT DISTINCT model FROM task_models ORDER BY model")]

    def tasks_by_kernel_class(self, kernel_class: str, target_kind: str | None = None) -> list[Task]:
        rows = self._read("SELECT task_id FROM tasks WHERE kernel_class = :kernel_class"
                          " AND (CAST(:kind AS TEXT) IS NULL OR target_kind = :kind)",
                          kernel_class=kernel_class, kind=target_kind)
        return self.get_tasks(task_ids=[r["task_id"] for r in rows])

    # records
    def commit(self, records: Sequence[Record]) -> None:
        if not records:
            return
        self._transaction(lambda db: db.execute(self.sa.text(
            "INSERT INTO records (task_id, key, trace_json, latency, run_secs, error, build_secs, profile, origin,"
            " trial, measured_at, run_id, device_id) VALUES (:task_id, :key, :trace_json, :latency, :run_secs,"
            " :error, :build_secs, :profile, :origin, :trial, :measured_at, :run_id,"
            " COALESCE(:device_id, (SELECT device_id FROM runs WHERE run_id = :run_id)))"
            " ON CONFLICT (task_id, key) DO NOTHING"),
            [dict(task_id=r.task_id, key=r.key, trace_json=r.trace_json, latency=r.latency,
                  run_secs=None if r.run_secs is None else json.dumps(r.run_secs), error=r.error,
                  build_secs=r.build_secs, profile=json.dumps(r.profile), origin=r.origin, trial=r.trial,
                  measured_at=r.measured_at, run_id=r.run_id, device_id=r.device_id) for r in records]))

    def claim(self, task_id: str, keys: Sequence[str], run_id: int) -> set[str]:
        if not keys:
            return set()
        rows = self._transaction(lambda db: db.execute(self.sa.text(
            "INSERT INTO claims (task_id, key, run_id, claimed_at)"
            " SELECT :task_id, k, :run_id, EXTRACT(EPOCH FROM clock_timestamp()) FROM unnest(CAST(:keys AS TEXT[])) k"
            " WHERE NOT EXISTS (SELECT 1 FROM records r WHERE r.task_id = :task_id AND r.key = k)"
            " ON CONFLICT (task_id, key) DO UPDATE SET run_id = excluded.run_id, claimed_at = excluded.claimed_at"
            " WHERE claims.run_id = excluded.run_id OR claims.claimed_at < excluded.claimed_at - :ttl"
            " RETURNING key"), dict(task_id=task_id, keys=list(keys), run_id=run_id, ttl=CLAIM_TTL_S)).all())
        return {r[0] for r in rows}

    def records(self, task_id: str) -> list[Record]:
        return [record_from_row(r) for r in
                self._read("SELECT * FROM records WHERE task_id = :task_id ORDER BY record_id", task_id=task_id)]

    def all_records(self) -> list[Record]:
        return [record_from_row(r) for r in self._read("SELECT * FROM records ORDER BY record_id")]

    def best(self, task_id: str, k: int = 1) -> list[Record]:
        return [record_from_row(r) for r in self._read(
            "SELECT * FROM records WHERE task_id = :task_id AND latency IS NOT NULL ORDER BY latency, record_id"
            " LIMIT :k", task_id=task_id, k=k)]

    def mark_failed(self, task_id: str, key: str, error: str, profile: dict[str, float] | None = None) -> None:
        self._transaction(lambda db: db.execute(self.sa.text(
            "UPDATE records SET error = :error, latency = NULL,"
            " profile = CAST(CAST(profile AS JSONB) || CAST(:profile AS JSONB) AS TEXT)"
            " WHERE task_id = :task_id AND key = :key"),
            dict(error=error, profile=json.dumps(profile or {}), task_id=task_id, key=key)))

    def counts(self, task_ids: Sequence[str]) -> dict[str, int]:
        return self._count(task_ids, "")

    def failure_counts(self, task_ids: Sequence[str]) -> dict[str, int]:
        return self._count(task_ids, " AND error IS NOT NULL")

    def _count(self, task_ids: Sequence[str], condition: str) -> dict[str, int]:
        counts = dict.fromkeys(task_ids, 0)
        rows = self._read("SELECT task_id, COUNT(*) AS n FROM records WHERE task_id = ANY(CAST(:ids AS TEXT[]))"
                          f"{condition} GROUP BY task_id", ids=list(task_ids))
        counts.update({r["task_id"]: int(r["n"]) for r in rows})
        return counts

    # runs
    def start_run(self, info: dict[str, Any], started_at: float | None = None) -> int:
        from tunecore.targets import device_id

        info = dict(info)
        device = info.pop("device", None)
        identity = None if device is None else device_id(device)

        def work(db: Any) -> int:
            if device is not None:
                db.execute(self.sa.text("INSERT INTO devices VALUES (:id, :description) ON CONFLICT DO NOTHING"),
                           {"id": identity, "description": json.dumps(device)})
            return int(db.execute(self.sa.text(
                "INSERT INTO runs (started_at, info, device_id) VALUES (:at, :info, :device) RETURNING run_id"),
                {"at": started_at or time.time(), "info": json.dumps(info), "device": identity}).scalar())

        with self.engine.begin() as db:  # not retried: a run row must not be made twice
            return work(db)

    def finish_run(self, run_id: int, summary: dict[str, Any], finished_at: float | None = None) -> None:
        self._transaction(lambda db: db.execute(self.sa.text(
            "UPDATE runs SET finished_at = :at, summary = :summary WHERE run_id = :run_id"),
            {"at": finished_at or time.time(), "summary": json.dumps(summary), "run_id": run_id}))

    def runs(self) -> list[dict[str, Any]]:
        return [run_from_row(r) for r in self._read("SELECT * FROM runs ORDER BY run_id")]

    def devices(self) -> dict[str, dict[str, Any]]:
        return {r["device_id"]: json.loads(r["description"])
                for r in self._read("SELECT device_id, description FROM devices")}
