"""A dataset in memory, and its file: one Parquet table, a row per program measured on a device.

Why Parquet: it is columnar and compressed (zstd over dictionary-encoded columns), so the module of a
task and the description of a device, repeated on every row, are stored once per row group, and the
traces, which repeat the same instructions with other decisions, shrink about tenfold; pandas,
polars, DuckDB and Arrow read it as it is, without tunecore. SQLite (the record store) is the
format for appending one round at a time; a dataset is written whole and read in bulk.

Rows carry the task (``task_key`` = the kernel's structural hash, the same on every target and
machine, so one program is one (task_key, program_key) on any device), the program (trace JSON and
its schedule key), the device and target it was measured on, and the measurement (latency samples,
error, build time, profile metrics, when). A task that occurs in several workloads lists them all
with their weights in ``workloads`` (JSON), so splits can keep shared kernels on one side.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import statistics
import time
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from tunecore.data import spread
from tunecore.errors import UsageError, first_line

if TYPE_CHECKING:
    from tunecore.data import Record, Task
    from tunecore.roles import RecordStore

FORMAT = "tunecore-dataset"
FORMAT_VERSION = 1
SUFFIX = ".parquet"
LOCK = ".lock"  # beside the dataset file, while a command changes it (``changing``)


@dataclasses.dataclass
class DatasetTask:
    """A kernel, independent of the device: what the rows of its programs share."""

    key: str  # structural hash of ``mod_json`` (Task.workload_hash)
    name: str
    kernel_class: str
    flops: float
    mod_json: str
    args: list
    workloads: dict[str, int]  # workload -> calls per inference

    @classmethod
    def of(cls, task: Task) -> DatasetTask:
        return cls(task.workload_hash, task.name, task.kernel_class, task.flops, task.mod_json, task.args,
                   {task.model: task.weight} if task.model else {})

    def for_target(self, target_json: str) -> Task:
        """The tuning task of this kernel on a target (the same task id ``extract_tasks`` gives it)."""
        from tunecore.data import Task, task_id_for

        model, weight = next(iter(self.workloads.items()), ("", 1))
        return Task(task_id_for(self.key, target_json), self.name, self.kernel_class, self.key, target_json,
                    self.mod_json, self.flops, self.args, weight=weight, model=model)


@dataclasses.dataclass
class Measurement:
    """One program of a task measured on one device."""

    task_key: str
    program_key: str
    trace: str
    device_id: str
    target: str  # target JSON it was built for
    run_secs: list[float] | None
    error: str | None = None
    build_secs: float = 0.0
    profile: dict[str, float] = dataclasses.field(default_factory=dict)
    origin: str = ""  # what proposed it, as in Candidate.origin
    collected_by: str = ""  # the search policy of the collection phase: "random", "ansor", ...
    measured_at: float = dataclasses.field(default_factory=time.time)

    @property
    def latency(self) -> float | None:
        if self.error is not None or not self.run_secs:
            return None
        return float(statistics.median(self.run_secs))

    @property
    def spread(self) -> float | None:
        """std / mean of the timings; None for a failed program or a single timing (nothing to spread)."""
        return spread(self.run_secs) if self.latency is not None else None

    @classmethod
    def of(cls, task: Task, record: Record, device_id: str, collected_by: str = "") -> Measurement:
        return cls(task.workload_hash, record.key, record.trace_json, device_id, task.target_json, record.run_secs,
                   record.error, record.build_secs, dict(record.profile), record.origin, collected_by,
                   record.measured_at)

    def record(self, task: Task) -> Record:
        from tunecore.data import Record

        return Record(task.task_id, self.program_key, self.trace, self.run_secs, self.error, self.build_secs,
                      dict(self.profile), self.origin, measured_at=self.measured_at, device_id=self.device_id)


class Dataset:
    def __init__(self) -> None:
        self.tasks: dict[str, DatasetTask] = {}
        self.devices: dict[str, dict[str, Any]] = {}  # device id -> Measurer.device()
        self.rows: list[Measurement] = []
        # how labels were taken (tunecore.dataset.protocol): the anchor programs, [task key, program key] each,
        # and one entry per collection run with the anchors' latencies at its start and end
        self.anchors: list[list[str]] = []
        self.collections: list[dict[str, Any]] = []
        self.exhausted: dict[str, list[str]] = {}  # device id -> tasks whose design space uniform sampling ran out of
        self._row_of: dict[tuple[str, str, str], Measurement] = {}  # (task, program, device) -> its row
        self._by_task: dict[tuple[str, str], list[Measurement]] = collections.defaultdict(list)

    # building

    def add_task(self, task: Task | DatasetTask) -> DatasetTask:
        """Add a kernel, or another workload it occurs in."""
        new = task if isinstance(task, DatasetTask) else DatasetTask.of(task)
        known = self.tasks.setdefault(new.key, new)
        if known is not new:
            known.workloads.update(new.workloads)
        return known

    def add_device(self, description: dict[str, Any]) -> str:
        from tunecore.targets import device_id

        identity = device_id(description)
        self.devices.setdefault(identity, description)
        return identity

    def add(self, row: Measurement, replace: bool = False) -> bool:
        """Add a measurement unless that program is in already for that device (``replace``: then it
        takes the place of the one in); True if added or replaced."""
        if row.task_key not in self.tasks or row.device_id not in self.devices:
            raise ValueError("add the task and the device before their measurements")
        identity = (row.task_key, row.program_key, row.device_id)
        known = self._row_of.get(identity)
        if known is not None:
            if replace:  # in place: the row keeps its position in rows and in its task's list
                for field in dataclasses.fields(Measurement):
                    setattr(known, field.name, getattr(row, field.name))
            return replace
        self._row_of[identity] = row
        self.rows.append(row)
        self._by_task[row.task_key, row.device_id].append(row)
        return True

    def row(self, task_key: str, program_key: str, device_id: str) -> Measurement | None:
        """The measurement of a program on a device, if there is one."""
        return self._row_of.get((task_key, program_key, device_id))

    def merge(self, other: Dataset) -> int:
        """Add another dataset's tasks, devices and rows; returns how many rows were new."""
        for task in other.tasks.values():
            self.add_task(dataclasses.replace(task, workloads=dict(task.workloads)))
        for description in other.devices.values():
            self.add_device(description)
        self.anchors = self.anchors or [list(a) for a in other.anchors]
        known = {(c["device_id"], c["started_at"]) for c in self.collections}
        self.collections += [c for c in other.collections if (c["device_id"], c["started_at"]) not in known]
        for device, keys in other.exhausted.items():
            self.exhausted[device] = sorted(set(self.exhausted.get(device, [])) | set(keys))
        return sum(self.add(row) for row in other.rows)

    # reading

    def rows_of(self, task_key: str, device_id: str) -> list[Measurement]:
        """The measurements of a task on a device."""
        return list(self._by_task.get((task_key, device_id), ()))

    def workloads(self) -> set[str]:
        """Every workload (``zoo:resnet-18``, ...) one of the dataset's tasks came from."""
        return {w for task in self.tasks.values() for w in task.workloads}

    def info(self) -> dict[str, Any]:
        """Counts by device, workload and task (what ``tunecore dataset info --json`` prints)."""
        from tunecore.dataset.protocol import anchor_drift, is_clean

        by_task: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        ok_by_device: collections.Counter = collections.Counter()
        clean_by_device: collections.Counter = collections.Counter()
        spreads: dict[str, list[float]] = collections.defaultdict(list)
        targets: dict[str, set[str]] = collections.defaultdict(set)
        for row in self.rows:
            by_task[row.task_key][row.device_id] += 1
            targets[row.device_id].add(row.target)
            ok_by_device[row.device_id] += row.latency is not None
            clean_by_device[row.device_id] += is_clean(row)
            if row.spread is not None:
                spreads[row.device_id].append(row.spread)
        rows_by_device = collections.Counter(r.device_id for r in self.rows)
        workloads: dict[str, dict[str, int]] = {}
        for key, task in self.tasks.items():
            for workload in task.workloads:
                entry = workloads.setdefault(workload, {"tasks": 0, "rows": 0})
                entry["tasks"] += 1
                entry["rows"] += sum(by_task[key].values())
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "rows": len(self.rows),
            "measured": sum(ok_by_device.values()),
            "failed": len(self.rows) - sum(ok_by_device.values()),
            "programs": len({(r.task_key, r.program_key) for r in self.rows}),
            "tasks": len(self.tasks),
            "clean": sum(clean_by_device.values()),
            "devices": {
                identity: {"description": describe_device(d), "rows": rows_by_device[identity],
                           "measured": ok_by_device[identity], "clean": clean_by_device[identity],
                           "median_spread": (round(statistics.median(spreads[identity]), 5) if spreads[identity]
                                             else None),
                           "anchor_drift": anchor_drift(self.collections, identity), "device": d,
                           "targets": sorted(targets[identity])}
                for identity, d in sorted(self.devices.items(), key=lambda item: -rows_by_device[item[0]])
            },
            "workloads": dict(sorted(workloads.items())),
            "by_task": {
                key: {"name": t.name, "kernel_class": t.kernel_class, "workloads": t.workloads,
                      "rows_by_device": dict(by_task[key])}
                for key, t in sorted(self.tasks.items(), key=lambda item: item[1].name)
            },
        }

    # files

    @classmethod
    def load(cls, path: str) -> Dataset:
        """Read a dataset file; UsageError (one line) for a missing file, another format or version, missing
        columns, or a damaged file."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not os.path.exists(path):
            raise UsageError(f"{path}: no such dataset file")
        try:
            schema = pq.read_schema(path)
        except (pa.ArrowException, OSError) as error:
            raise UsageError(f"{path}: not a Parquet file ({first_line(error, 120)})") from None
        meta = {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}
        if meta.get("format") != FORMAT:
            raise UsageError(f"{path}: a Parquet file, but not a {FORMAT} file")
        if meta.get("format_version") != str(FORMAT_VERSION):
            raise UsageError(f"{path}: {FORMAT} version {meta.get('format_version')}; this tunecore reads version "
                             f"{FORMAT_VERSION}")
        missing = [name for name in (*_TASK_COLUMNS, *_ROW_COLUMNS) if name not in schema.names]
        if missing or "devices" not in meta:
            raise UsageError(f"{path}: a {FORMAT} file without its " + (f"columns {', '.join(missing)}" if missing
                                                                          else "device descriptions"))
        try:
            return cls._read(pq.read_table(path, read_dictionary=list(_SHARED_COLUMNS)), meta)
        except (pa.ArrowException, OSError, ValueError, TypeError, KeyError, AttributeError) as error:
            raise UsageError(f"{path}: a damaged {FORMAT} file ({type(error).__name__}: "
                             f"{(str(error).splitlines() or [''])[0][:120]})") from None

    @classmethod
    def _read(cls, table: Any, meta: dict[str, str]) -> Dataset:
        dataset = cls()
        dataset.devices = json.loads(meta["devices"])
        dataset.anchors = json.loads(meta.get("anchors", "[]"))
        dataset.collections = json.loads(meta.get("collections", "[]"))
        dataset.exhausted = json.loads(meta.get("exhausted", "{}"))
        columns = {name: table.column(name) for name in table.column_names}
        tasks = _unique_rows(columns, _TASK_COLUMNS)
        for values in tasks.values():
            key, name, kernel_class, flops, mod_json, args, workloads = values
            dataset.tasks[key] = DatasetTask(key, name, kernel_class, flops, mod_json, json.loads(args),
                                             json.loads(workloads))
        plain = {name: columns[name].to_pylist() for name in _ROW_COLUMNS}
        for i in range(table.num_rows):
            dataset.add(Measurement(**{name: plain[name][i] for name in _ROW_COLUMNS if name != "profile"},
                                    profile=json.loads(plain["profile"][i])))
        return dataset

    @classmethod
    def open(cls, path: str) -> Dataset:
        """The dataset in ``path``, or an empty one when the file does not exist yet."""
        return cls.load(path) if os.path.exists(path) else cls()

    def save(self, path: str) -> None:
        """Write the whole dataset; atomic (a reader or a crash sees the old file or the new one)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = sorted(self.rows, key=lambda r: (r.task_key, r.device_id, r.measured_at))
        tasks = sorted(self.tasks)
        task_index = pa.array(_indices([r.task_key for r in rows], tasks), pa.int32())
        task_values = {
            "task_key": tasks,
            "task_name": [self.tasks[k].name for k in tasks],
            "kernel_class": [self.tasks[k].kernel_class for k in tasks],
            "flops": [self.tasks[k].flops for k in tasks],
            "mod_json": [self.tasks[k].mod_json for k in tasks],
            "args": [json.dumps(self.tasks[k].args) for k in tasks],
            "workloads": [json.dumps(self.tasks[k].workloads, sort_keys=True) for k in tasks],
        }
        types = {"run_secs": pa.list_(pa.float64()), "build_secs": pa.float64(), "measured_at": pa.float64()}
        arrays: dict[str, pa.Array] = {}
        for name, values in task_values.items():
            dictionary = pa.array(values, pa.float64() if name == "flops" else pa.string())
            arrays[name] = (pa.DictionaryArray.from_arrays(task_index, dictionary) if name in _SHARED_COLUMNS
                            else dictionary.take(task_index))
        for name in _ROW_COLUMNS:
            if name in arrays:
                continue
            values = [getattr(r, name) for r in rows]
            if name == "profile":
                values = [json.dumps(v, sort_keys=True) for v in values]
            arrays[name] = pa.array(values, types.get(name, pa.string()))
        arrays["latency"] = pa.array([r.latency for r in rows], pa.float64())
        metadata = {"format": FORMAT, "format_version": str(FORMAT_VERSION),
                    "devices": json.dumps(self.devices, sort_keys=True), "written_at": str(time.time()),
                    "anchors": json.dumps(self.anchors), "collections": json.dumps(self.collections),
                    "exhausted": json.dumps(self.exhausted, sort_keys=True)}
        table = pa.table(arrays).replace_schema_metadata(metadata)
        temporary = f"{path}.writing.{os.getpid()}"
        pq.write_table(table, temporary, compression="zstd", compression_level=9, row_group_size=1 << 16,
                       use_dictionary=list(_SHARED_COLUMNS) + ["device_id", "target", "origin", "collected_by"],
                       dictionary_pagesize_limit=1 << 26)
        os.replace(temporary, path)

    # record stores

    @classmethod
    def from_store(cls, store: RecordStore, models: Iterable[str] | None = None) -> tuple[Dataset, int]:
        """The store's measurements (of ``models``' tasks, or all); also how many records were left
        out because they do not say which device measured them (stores written before tunecore 0.2)."""
        dataset = cls()
        devices = store.devices()
        for identity, description in devices.items():
            dataset.devices[identity] = description
        tasks = [t for model in models for t in store.get_tasks(model)] if models else store.get_tasks()
        unknown = 0
        for task in tasks:
            dataset.add_task(task)
            for record in store.records(task.task_id):
                if record.device_id in devices:
                    dataset.add(Measurement.of(task, record, record.device_id))
                else:
                    unknown += 1
        return dataset, unknown

    def to_store(self, store: RecordStore) -> int:
        """Put every measurement into a record store (a run per device); returns how many records were new."""
        added = 0
        by_device: dict[str, list[Measurement]] = collections.defaultdict(list)
        for row in self.rows:
            by_device[row.device_id].append(row)
        for identity, rows in by_device.items():
            tasks: dict[tuple[str, str], Task] = {}
            for row in rows:
                if (row.task_key, row.target) not in tasks:
                    tasks[row.task_key, row.target] = self.tasks[row.task_key].for_target(row.target)
            store.put_tasks(list(tasks.values()))
            for task in tasks.values():
                for workload, weight in self.tasks[task.workload_hash].workloads.items():
                    store.put_tasks([task.for_model(workload, weight)])
            task_ids = [t.task_id for t in tasks.values()]
            before = sum(store.counts(task_ids).values())
            run_id = store.start_run({"source": "dataset import", "device": self.devices[identity]})
            store.commit([dataclasses.replace(row.record(tasks[row.task_key, row.target]), run_id=run_id)
                          for row in rows])
            store.finish_run(run_id, {"status": "finished", "trials_measured": len(rows)})
            added += sum(store.counts(task_ids).values()) - before
        return added


@contextlib.contextmanager
def changing(path: str) -> Iterator[None]:
    """Held by a command that loads a dataset file, changes it and saves it (collect, remeasure, ncu profile,
    import-batch) for as long as it runs: a second one on the same file would save over the first one's rows
    (each writes the whole file), so it is refused with one line naming the process that holds the file."""
    import fcntl

    try:
        lock = open(path + LOCK, "a+")
    except OSError as error:
        raise UsageError(f"cannot write {path}: {error.strerror}") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            raise UsageError(f"{path} is being changed by another command (pid {holder}): let it end, or stop it "
                             "first") from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        yield


def describe_device(description: dict[str, Any]) -> str:
    """One line: "AMD EPYC (znver3, 2 cores)" or "NVIDIA H100 (sm_90)"."""
    if description.get("gpu"):
        return f"{description['gpu']} ({description.get('arch', '?')})"
    return f"{description.get('cpu', '?')} ({description.get('mcpu', '?')}, {description.get('cores', '?')} cores)"


# Columns with one value per task (stored once per row group, as a dictionary)
_TASK_COLUMNS = ("task_key", "task_name", "kernel_class", "flops", "mod_json", "args", "workloads")
_SHARED_COLUMNS = ("task_key", "task_name", "kernel_class", "mod_json", "args", "workloads")
_ROW_COLUMNS = tuple(f.name for f in dataclasses.fields(Measurement))


def _indices(values: list[str], ordered: list[str]) -> list[int]:
    position = {v: i for i, v in enumerate(ordered)}
    return [position[v] for v in values]


def _unique_rows(columns: dict[str, Any], names: tuple[str, ...]) -> dict[str, tuple]:
    """First row of each distinct value of the first column, as tuples of ``names``' values."""
    first: dict[str, int] = {}
    keys = columns[names[0]].to_pylist()
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    return {key: tuple(columns[name][i].as_py() for name in names) for key, i in first.items()}
