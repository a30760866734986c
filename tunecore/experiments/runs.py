"""Each tuner in its own child process, timed from start to exit (imports and setup included): `run_tunecore`
through the `tunecore run` command, `run_metaschedule` through MetaSchedule's own tuning (this module runs as that
child with ``--_metaschedule``); and a cache of such runs, so that a repeated benchmark command skips them."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from typing import Callable

# MetaSchedule's LocalBuilder starts a fresh process pool for every batch and each worker imports all
# of tvm.s_tir.tensor_intrin first: on a slow machine that alone exceeds the stock 30 s timeout.
BUILDER_TIMEOUT_S = 600

def run_timed(args: list[str]) -> tuple[float, str]:
    """Run a benchmark child process; returns (wall seconds from start to exit, its stdout)."""
    started = time.perf_counter()
    result = subprocess.run(args, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode == 2:  # the child refused its arguments: its one line says why
        lines = result.stderr.strip().splitlines()
        print(lines[-1] if lines else f"{' '.join(args)}: bad arguments", file=sys.stderr)
        raise SystemExit(2)
    if result.returncode != 0:
        raise SystemExit(f"benchmark child failed ({result.returncode}): {' '.join(args)}\n{result.stderr[-3000:]}")
    return wall, result.stdout

def remove_sqlite(path: str) -> None:
    """Delete a SQLite store with its WAL files, so that a repeated run starts from nothing."""
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)

def run_tunecore(model: str, trials: int | None, seed: int, *, search: str, cost_model: str, store: str,
                 extra_args: list[str] = (), time_budget: float | None = None, resume: bool = False) -> dict:
    """`tunecore run ... --json` in a child process; ``store`` is a --store URL (a sqlite file is emptied first,
    unless ``resume``); ``extra_args`` go to `tunecore run` as they are (e.g. ["-O", "search.time_ratio=1"])."""
    if store.startswith("sqlite:") and not resume:
        remove_sqlite(store[len("sqlite:"):])
    budget = ([] if trials is None else ["--trials", str(trials)]) + (
        [] if time_budget is None else ["--time-budget", f"{time_budget:g}"])
    wall, out = run_timed([sys.executable, "-m", "tunecore.cli", "run", "--model", model, *budget,
                           "--search", search, "--cost-model", cost_model, "--measurer", "local", "--store", store,
                           "--seed", str(seed), "--json", *extra_args])
    summary = json.loads(out)
    return {"wall_s": wall, "measured": summary["trials_measured"], "errors": summary["errors"],
            "ok": summary["trials_measured"] - summary["errors"],
            "best_latency_s": summary["tasks"][0]["best_latency_s"],
            "estimated_latency_ms": summary["estimated_latency_ms"], "phase_s": summary.get("phase_s"),
            "elapsed_s": summary["elapsed_s"], "elapsed_total_s": summary["elapsed_total_s"], "tasks": summary["tasks"]}

def best_candidates(store_file: str, task, k: int) -> list:
    """The k best measured programs in a one-task SQLite store, as candidates of ``task``."""
    from tunecore.store.sqlite import SqliteStore

    store = SqliteStore(store_file)
    try:
        (stored,) = store.get_tasks()
        return [r.candidate(task) for r in store.best(stored.task_id, k=k)]
    finally:
        store.close()

def best_programs(run: dict, task, k: int) -> list:
    """The k best measured programs of a `run_tunecore` run (its "store") or a `run_metaschedule` run (its
    "work_dir", MetaSchedule's JSON database, ranked by mean latency), as candidates of ``task``."""
    if "store" in run:
        return best_candidates(run["store"], task, k)
    import numpy as np
    from tvm.s_tir import meta_schedule as ms

    from tunecore.data import Candidate
    from tunecore.tvmjson import trace_to_json

    db = ms.database.JSONDatabase(work_dir=run["work_dir"])
    records = sorted((r for r in db.get_all_tuning_records() if r.run_secs and float(np.mean(r.run_secs)) < 1e9),
                     key=lambda r: float(np.mean(r.run_secs)))
    return [Candidate(task, trace_json=trace_to_json(r.trace), origin="metaschedule") for r in records[:k]]

def run_metaschedule(model: str, trials: int, seed: int, work_dir: str, *, strategy: str = "evolutionary",
                     builder_timeout: float | None = BUILDER_TIMEOUT_S, target: str = "llvm") -> dict:
    """ms.tune_tir into ``work_dir`` in a child process (cost model xgb, 64 trials per iteration) for ``target``
    (as `--target` takes it).

    ``builder_timeout=None`` keeps MetaSchedule's stock LocalBuilder.
    """
    wall, out = run_timed([sys.executable, "-m", "tunecore.experiments.runs", "--_metaschedule", model, str(trials),
                           str(seed), work_dir, strategy, str(builder_timeout or 0), "64", "nchw", target])
    return {"wall_s": wall, **json.loads(out.strip().splitlines()[-1]), "work_dir": work_dir}

def run_metaschedule_for(model: str, seconds: float, seed: int, work_dir: str, trials_per_iter: int = 64,
                         layout: str = "nchw") -> dict:
    """MetaSchedule tuning a network (``tune_relax``) for ``seconds`` of wall time, in a child process that is
    stopped then: its JSON database keeps every record committed so far. Resumable: the seconds of earlier
    attempts are kept in ``work_dir`` and count.

    MetaSchedule commits a task's measurements only when its scheduler comes back to that task, after one
    batch of ``trials_per_iter`` candidates for every task: with 64 (its default) and ResNet-18's 19 tasks,
    that first pass took 22 minutes on a 2-core Zen 4, and a 15-minute run committed nothing."""
    import signal

    os.makedirs(work_dir, exist_ok=True)
    spent_path = os.path.join(work_dir, "tuning_seconds")
    spent = float(open(spent_path).read()) if os.path.exists(spent_path) else 0.0
    if seconds - spent > 1:
        started = time.perf_counter()
        with open(os.path.join(work_dir, "child.log"), "a") as log:
            child = subprocess.Popen([sys.executable, "-m", "tunecore.experiments.runs", "--_metaschedule", model,
                                      str(10**6), str(seed), work_dir, "evolutionary", str(BUILDER_TIMEOUT_S),
                                      str(trials_per_iter), layout],
                                     stdout=log, stderr=log, preexec_fn=_own_group_dying_with_parent)
            while child.poll() is None and time.perf_counter() - started < seconds - spent:
                time.sleep(min(10.0, max(0.1, seconds - spent - (time.perf_counter() - started))))
                with open(spent_path, "w") as f:  # a killed bench resumes with what is left
                    f.write(str(spent + time.perf_counter() - started))
            if child.poll() is None:  # the whole group: MetaSchedule's builder and runner processes too
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        spent += time.perf_counter() - started
        with open(spent_path, "w") as f:
            f.write(str(spent))
    from tvm.s_tir import meta_schedule as ms

    records = ms.database.JSONDatabase(work_dir=work_dir).get_all_tuning_records()
    ok = [r for r in records if r.run_secs and all(float(s) < 1e9 for s in r.run_secs)]
    return {"wall_s": spent, "measured": len(records), "errors": len(records) - len(ok), "work_dir": work_dir}

def _own_group_dying_with_parent() -> None:
    """In a child: its own process group (so it is stopped with all its workers) that the kernel kills
    should the benchmark die first (Linux's PR_SET_PDEATHSIG), rather than tuning on unseen."""
    import ctypes
    import signal

    os.setsid()
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)

def _metaschedule_child(model: str, trials: int, seed: int, work_dir: str, strategy: str,
                        builder_timeout: float, trials_per_iter: int = 64, layout: str = "nchw",
                        target_spec: str = "llvm") -> None:
    """Tune with MetaSchedule (a network: ``tune_relax`` on the tasks tunecore extracts, fused and marked the
    same way); print a JSON line with what got measured (best = lowest mean, MetaSchedule's ranking)."""
    import numpy as np
    from tvm.s_tir import meta_schedule as ms

    from tunecore.targets import resolve_target, use_target_threads
    from tunecore.workloads import load_workload, tuning_module

    target = resolve_target(target_spec)
    use_target_threads(target)  # LocalRunner's workers inherit it; else TVM runs kernels on half the cores
    builder = ms.builder.LocalBuilder(timeout_sec=builder_timeout) if builder_timeout else "local"
    workload = load_workload(model, layout=layout if layout != "nchw" else None)
    common = dict(num_trials_per_iter=trials_per_iter, strategy=strategy, cost_model="xgb", builder=builder,
                  seed=seed)
    if workload.is_network:
        db = ms.relax_integration.tune_relax(tuning_module(workload, target), {}, target, work_dir,
                                             max_trials_global=trials, **common)
    else:
        db = ms.tune_tir(workload.mod, target, work_dir, max_trials_global=trials, **common)
    secs = [float(np.mean(r.run_secs)) for r in db.get_all_tuning_records()]
    ok = [s for s in secs if s < 1e9]
    print(json.dumps({"measured": len(secs), "ok": len(ok), "best_latency_s": min(ok) if ok else None}))


MADE_ON = "_made_on"  # a run cache's entry naming the machine its runs were made on


@functools.lru_cache(maxsize=1)
def _this_machine() -> dict:
    from tunecore.targets import device_descriptor, device_identity, resolve_target

    return device_identity(device_descriptor(resolve_target("llvm")))


def cached_run(done_path: str, key: str, run: Callable[[], dict]) -> dict:
    """``run()``'s result, kept under ``key`` in the JSON file ``done_path``: a repeated command skips it.

    The file names the machine its runs were made on and is refused on another: there the runs' stores would
    resume, and one results file would mix two machines' timings. (A file from before it names none: taken as
    this machine's.)"""
    done = json.load(open(done_path)) if os.path.exists(done_path) else {}
    saved = MADE_ON in done and key in done
    here = _this_machine()
    made_on = done.setdefault(MADE_ON, here)
    if made_on != here:
        print(f"{done_path}: its runs were made on {made_on}, this machine is {here}: give the benchmark another "
              "work folder (--out or --work) or remove it", file=sys.stderr)
        raise SystemExit(2)
    if key not in done:
        print(f"running {key} ...", file=sys.stderr, flush=True)
        done[key] = run()
    if not saved:
        with open(done_path, "w") as f:
            json.dump(done, f, indent=2)
    return done[key]


if __name__ == "__main__" and sys.argv[1:2] == ["--_metaschedule"]:
    model, trials, seed, work_dir, strategy, timeout = sys.argv[2:8]
    _metaschedule_child(model, int(trials), int(seed), work_dir, strategy, float(timeout), *map(int, sys.argv[8:9]),
                        *sys.argv[9:11])
