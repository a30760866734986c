"""The benchmark matrix behind ``tunecore bench``: workloads × searches × cost models × seeds.

Every cell is one tuning run into the cell's own SQLite store under ``OUT/cells/``, so cells never
share records (``--store`` gives each cell a copy of a store to start from, e.g. donor records).
``OUT/results.json`` is rewritten after every cell. Repeating the command skips finished cells and
resumes an interrupted cell from its store, so nothing measured is measured again; a larger
``--trials`` extends every cell. Curves are read back from the stores: records carry their trial
index and time, runs their start and end.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sqlite3
import time
from typing import TYPE_CHECKING, Any, Callable, Collection, Sequence

from tunecore.errors import UsageError
from tunecore.options import options_of

if TYPE_CHECKING:
    from tunecore.api import TuneConfig

RESULTS = "results.json"
CELLS_DIR = "cells"
# what must match for a repeated command to continue a matrix in the same directory
_SETTINGS = ("target", "measurer", "options", "scheduler", "seed_store")


@dataclasses.dataclass(frozen=True)
class Cell:
    model: str
    search: str
    cost_model: str
    seed: int

    @property
    def id(self) -> str:
        return f"{self.model} | {self.search} | {self.cost_model} | seed {self.seed}"

    @property
    def store_path(self) -> str:
        """Relative to the output directory; readable, and unique even for file paths as models."""
        readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{self.model}-{self.search}-{self.cost_model}-{self.seed}")[-80:]
        return os.path.join(CELLS_DIR, f"{readable}-{hashlib.sha1(self.id.encode()).hexdigest()[:8]}.db")


def plan(models: Sequence[str], searches: Sequence[str], cost_models: Sequence[str], seeds: int,
         without_cost_model: Collection[str] = ()) -> list[Cell]:
    """The cells of a matrix; a search in ``without_cost_model`` (one that asks no cost model: random) gets one
    cell per model and seed, with the cost model ``none``, not one per cost model that would all be the same."""
    if seeds < 1:
        raise UsageError("seeds must be >= 1")
    cells = [Cell(m, s, "none" if s in without_cost_model else c, k)
             for m in models for s in searches for c in cost_models for k in range(seeds)]
    return list(dict.fromkeys(cells))


def load_results(out: str) -> dict[str, Any] | None:
    path = os.path.join(out, RESULTS)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            results = json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise UsageError(f"{path}: not a tunecore bench result ({error})") from None
    if (not isinstance(results, dict) or results.get("format") != "tunecore-bench"
            or not isinstance(results.get("cells"), dict)):
        raise UsageError(f"{path}: not a tunecore bench result")
    return results


def _save_results(out: str, results: dict[str, Any]) -> None:
    path = os.path.join(out, RESULTS)
    with open(path + ".tmp", "w") as f:
        json.dump(results, f, indent=2)
    os.replace(path + ".tmp", path)  # a crash mid-write leaves the previous file


def copy_sqlite(source: str, destination: str) -> None:
    """A consistent copy of a SQLite store, even while another process writes to it."""
    with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as src, sqlite3.connect(destination) as dst:
        src.backup(dst)


def curve(store_file: str, *, start_s: dict[str, float] | None = None, task_ids: Collection[str] | None = None,
          **run_info: Any) -> dict[str, Any]:
    """Best latency so far against trials and against tuning seconds, from a store alone, counting the
    runs whose info has the given values (a bench cell: ``run_key=cell.id``; or ``model=..., search=...``).

    For a network the latency is the estimate (sum of weight × best over its tasks), defined once
    every task has a successful record, or from the first record on if ``start_s`` gives each task's
    latency before tuning (task id -> seconds, e.g. its untuned program's). Seconds count only the
    cell's runs: the time between an interruption and the resumed run is left out. Points are kept
    where the best improves, plus the last trial. ``task_ids`` restricts the estimate (and the trials
    counted) to those of the model's tasks.
    """
    from tunecore.store.sqlite import SqliteStore
    from tunecore.tuner import run_key, tuned_seconds

    def matches(info: dict[str, Any]) -> bool:
        return all((run_key(info) if k == "run_key" else info.get(k)) == v for k, v in run_info.items())

    store = SqliteStore(store_file)
    try:
        runs = {r["run_id"]: r for r in store.runs() if matches(r["info"])}
        if not runs:
            return {"trials": [], "seconds": [], "best_s": []}
        model = next(iter(runs.values()))["info"]["model"]
        tasks = [t for t in store.get_tasks(model=model) if task_ids is None or t.task_id in task_ids]
        records = [r for t in tasks for r in store.records(t.task_id) if r.run_id in runs]
    finally:
        store.close()
    weights = {t.task_id: t.weight for t in tasks}
    offsets, elapsed = {}, 0.0
    for run_id in sorted(runs):
        offsets[run_id] = elapsed - runs[run_id]["started_at"]
        elapsed += tuned_seconds([runs[run_id]], [r for r in records if r.run_id == run_id])
    best = {t: s for t, s in (start_s or {}).items() if t in weights}
    points: list[tuple[int, float, float]] = []
    records.sort(key=lambda r: (r.trial, r.measured_at))
    for i, r in enumerate(records):
        latency = r.latency
        improved = latency is not None and latency < best.get(r.task_id, float("inf"))
        if improved:
            best[r.task_id] = latency
        if len(best) == len(weights) and (improved or i == len(records) - 1):
            estimate = sum(weights[t] * b for t, b in best.items())
            points.append((i + 1, round(offsets[r.run_id] + r.measured_at, 3), estimate))
    return {"trials": [p[0] for p in points], "seconds": [p[1] for p in points], "best_s": [p[2] for p in points]}


def run_matrix(
    cells: Sequence[Cell],
    settings: TuneConfig,
    *,
    out: str,
    seed_store: str | None = None,
    e2e: bool = True,
    on_cell: Callable[[int, Cell, bool], None] | None = None,
    on_round: Callable | None = None,
) -> dict[str, Any]:
    """Run every cell not finished yet; returns the results (also in ``OUT/results.json``).

    ``settings`` holds what every cell shares (trials, target, measurer, options, scheduler, round
    size); each cell runs it with its own model, search, cost model, seed, store and run key.

    ``on_cell(index, cell, skipped)`` is called before each cell, ``on_round`` after each round.
    Anything the user got wrong is refused before the first cell; a cell whose run fails is
    recorded with its error and the matrix goes on.
    """
    from tunecore import api
    from tunecore.compile import compile_and_check
    from tunecore.experiments.results import environment
    from tunecore.registry import Registry
    from tunecore.store.sqlite import SqliteStore
    from tunecore.targets import resolve_target
    from tunecore.tvmjson import target_to_json
    from tunecore.workloads import load_workload

    trials = settings.trials
    if trials < 1:
        raise UsageError("trials must be >= 1")
    tvm_target = resolve_target(settings.target)
    registry = Registry.shared()
    for s, c in {(cell.search, cell.cost_model) for cell in cells}:
        registry.check_target(tvm_target, search=s, cost_model=c, measurer=settings.measurer)
    workloads = {m: load_workload(m) for m in {cell.model for cell in cells}}
    if seed_store is not None:
        seed_store = os.path.abspath(seed_store.removeprefix("sqlite:"))
        if not os.path.exists(seed_store):
            raise UsageError(f"--store {seed_store}: no such store (bench copies it into every cell)")
        SqliteStore(seed_store).close()  # refuses a file that is not a tunecore store

    shared = {"target": json.loads(target_to_json(tvm_target)), "measurer": settings.measurer,
              "options": settings.options, "scheduler": settings.scheduler, "seed_store": seed_store}
    os.makedirs(os.path.join(out, CELLS_DIR), exist_ok=True)
    results = load_results(out)
    if results is None:
        results = {"format": "tunecore-bench", "settings": shared, "cells": {}, "untuned": {}}
    elif results["settings"] != shared:
        changed = ", ".join(k for k in _SETTINGS if results["settings"].get(k) != shared[k])
        raise UsageError(f"{out} holds a matrix with other settings ({changed}); use another --out")
    results["environment"] = environment(tvm_target)
    results["trials"] = trials

    for index, cell in enumerate(cells):
        done = results["cells"].get(cell.id)
        skipped = bool(done and done["status"] == "finished" and done["trials"] == trials)
        if on_cell:
            on_cell(index, cell, skipped)
        if skipped:
            continue
        store_file = os.path.join(out, cell.store_path)
        if seed_store and not os.path.exists(store_file):
            copy_sqlite(seed_store, store_file)
        entry: dict[str, Any] = {"model": cell.model, "search": cell.search, "cost_model": cell.cost_model,
                                 "seed": cell.seed, "trials": trials, "store": cell.store_path, "error": None}
        started = time.time()
        try:
            options = options_of(settings.options, [cell.search, cell.cost_model, settings.measurer])
            if not registry.get("search", cell.search).uses_cost_model:  # its cell runs `none`: no model options
                options.pop("cost_model", None)
            config = dataclasses.replace(settings, model=cell.model, search=cell.search, cost_model=cell.cost_model,
                                         seed=cell.seed, store=f"sqlite:{store_file}", run_key=cell.id,
                                         options=options)
            summary = api.tune(config, on_round=on_round)
        except (UsageError, KeyboardInterrupt):
            raise
        except Exception as error:  # a broken plugin or workload fails its cell, not the matrix
            summary = None
            entry["error"] = f"{type(error).__name__}: {error}"
        entry["status"] = "failed" if summary is None else summary["status"]
        entry["wall_s"] = round(time.time() - started, 3)
        if summary is not None:
            entry.update({k: summary[k] for k in ("trials_total", "errors_total", "estimated_latency_ms", "phase_s")})
            entry["tasks"] = [{k: t[k] for k in ("name", "weight", "trials", "errors", "best_latency_s")}
                              for t in summary["tasks"]]
        entry["curve"] = curve(store_file, run_key=cell.id)
        entry["tuning_s"] = entry["curve"]["seconds"][-1] if entry["curve"]["seconds"] else None
        workload = workloads[cell.model]
        if e2e and workload.is_network and summary is not None:
            entry["e2e"] = _end_to_end(compile_and_check, workload, tvm_target, store_file)
            if "untuned_latency_ms" in entry["e2e"]:
                results["untuned"][cell.model] = entry["e2e"]["untuned_latency_ms"]
        results["cells"][cell.id] = entry
        _save_results(out, results)
    return results


def _end_to_end(compile_and_check: Callable, workload: Any, target: Any, store_file: str) -> dict[str, Any]:
    from tunecore.store.sqlite import SqliteStore

    store = SqliteStore(store_file)
    try:
        report = compile_and_check(workload, target, store)
    except Exception as error:  # recorded: a build that fails is a result of the cell
        return {"error": f"{type(error).__name__}: {error}"}
    finally:
        store.close()
    return {k: report[k] for k in ("latency_ms", "untuned_latency_ms", "latency_passes_ms", "untuned_passes_ms",
                                    "speedup", "speedup_range", "outputs_match", "max_relative_error",
                                    "tasks_tuned", "tasks_total", "threads")}
