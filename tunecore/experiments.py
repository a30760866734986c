"""What experiments (the scripts under bench/, `tunecore bench`) share: timed child processes for each tuner,
timing things together so that the machine's drift falls on all alike, the environment record, result files.

Each tuner runs in its own process and is timed from start to exit (imports and setup included):
`run_tunecore` through the `tunecore run` command, `run_metaschedule` through `ms.tune_tir`
(this module runs as that child with ``--_metaschedule``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

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


def run_metaschedule(model: str, trials: int, seed: int, work_dir: str, *, strategy: str = "evolutionary",
                     builder_timeout: float | None = BUILDER_TIMEOUT_S) -> dict:
    """ms.tune_tir into ``work_dir`` in a child process (cost model xgb, 64 trials per iteration).

    ``builder_timeout=None`` keeps MetaSchedule's stock LocalBuilder.
    """
    wall, out = run_timed([sys.executable, "-m", "tunecore.experiments", "--_metaschedule", model, str(trials),
                           str(seed), work_dir, strategy, str(builder_timeout or 0)])
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
            child = subprocess.Popen([sys.executable, "-m", "tunecore.experiments", "--_metaschedule", model,
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
                        builder_timeout: float, trials_per_iter: int = 64, layout: str = "nchw") -> None:
    """Tune with MetaSchedule (a network: ``tune_relax`` on the tasks tunecore extracts, fused and marked the
    same way); print a JSON line with what got measured (best = lowest mean, MetaSchedule's ranking)."""
    import numpy as np
    from tvm.s_tir import meta_schedule as ms

    from tunecore.targets import resolve_target, use_target_threads
    from tunecore.workloads import load_workload, tuning_module

    target = resolve_target("llvm")
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


def cached_run(done_path: str, key: str, run: Callable[[], dict]) -> dict:
    """``run()``'s result, kept under ``key`` in the JSON file ``done_path``: a repeated command skips it."""
    done = json.load(open(done_path)) if os.path.exists(done_path) else {}
    if key not in done:
        print(f"running {key} ...", file=sys.stderr, flush=True)
        done[key] = run()
        with open(done_path, "w") as f:
            json.dump(done, f, indent=2)
    return done[key]


def build_from_store(workload, tasks: list, target, store_file: str) -> tuple[Any, int]:
    """The workload built with the best records of a SQLite store, as `tunecore compile` builds it;
    (executable, tasks covered)."""
    from tunecore.compile import best_database, build
    from tunecore.store.sqlite import SqliteStore

    store = SqliteStore(store_file)
    try:
        database, covered = best_database(store, tasks, target)
    finally:
        store.close()
    return build(workload, target, database), covered


def pass_orders(names: Sequence[str], passes: int, seed: int | None = None) -> list[list[str]]:
    """The order of ``names`` in each of ``passes`` passes, so that the machine's drift within an experiment
    falls on all of them alike: alternately forwards and backwards, or, with ``seed``, a random
    permutation per pass (numpy's generator, so that a seed gives the same orders everywhere)."""
    import numpy as np

    names = list(names)
    if seed is None:
        return [names if p % 2 == 0 else names[::-1] for p in range(passes)]
    rng = np.random.default_rng(seed)
    return [[names[j] for j in rng.permutation(len(names))] for _ in range(passes)]


def median_call_seconds(function: Callable[[], Any]) -> float:
    """One pass: calls for at least 0.3 s (and at least 2), median seconds per call."""
    import numpy as np

    times, started = [], time.perf_counter()
    while time.perf_counter() - started < 0.3 or len(times) < 2:
        t = time.perf_counter()
        function()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def passes_together(timers: dict[str, Callable[[], float]], passes: int,
                    seed: int | None = None) -> dict[str, list[float]]:
    """Seconds from each timer in each pass over all of them, in the orders of ``pass_orders``."""
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for order in pass_orders(list(timers), passes, seed):
        for name in order:
            samples[name].append(timers[name]())
    return samples


def time_builds_together(model: str, stores: dict[str, str], passes: int) -> dict:
    """Build untuned + one build per store; check outputs; median latency over alternating passes."""
    import numpy as np
    from tvm.s_tir import meta_schedule as ms

    from tunecore.check import max_relative_error
    from tunecore.compile import Runnable, build, random_inputs
    from tunecore.targets import resolve_target, use_target_threads
    from tunecore.workloads import extract_tasks, load_workload

    target = resolve_target("llvm")
    use_target_threads(target)
    workload = load_workload(model)
    tasks = extract_tasks(workload, target)
    inputs = random_inputs(workload)
    runnables, builds = {}, {}
    untuned = build(workload, target, ms.database.MemoryDatabase())
    runnables["untuned"] = Runnable(untuned, workload, target, inputs)
    expected = runnables["untuned"].outputs()
    for name, path in stores.items():
        executable, covered = build_from_store(workload, tasks, target, path)
        runnables[name] = Runnable(executable, workload, target, inputs)
        builds[name] = {"tasks_tuned": covered, "tasks_total": len(tasks),
                        "max_relative_error": max_relative_error(runnables[name].outputs(), expected)}
    # every build timed the same way: one sample per pass, as many calls as fill a second (one for a slow build)
    samples = passes_together({name: (lambda r=r: r.time(1, min_repeat_ms=1000)) for name, r in runnables.items()},
                              passes)
    return {name: {"latency_ms": float(np.median(s)) * 1e3, "passes_ms": [x * 1e3 for x in s], **builds.get(name, {})}
            for name, s in samples.items()}


def remeasure_together(task: Any, programs: dict[str, Sequence[Any]], passes: int = 8,
                       seed: int = 0) -> dict[str, list[float]]:
    """Latencies (seconds, per program, fastest first) of several groups of programs measured together.

    For comparing what different searches found: a machine's speed drifts (a shared VM's within
    minutes), so latencies recorded during different runs are not comparable. Here
    every program of every group is measured in each of ``passes`` passes, each pass in its own random
    order, by one measurer; a program's latency is its median over the passes (inf if it failed).
    """
    import numpy as np

    return {name: sorted(float(np.median(samples)) for samples in group)
            for name, group in remeasure_passes(task, programs, passes, seed).items()}


def remeasure_passes(task: Any, programs: dict[str, Sequence[Any]], passes: int = 8,
                     seed: int = 0) -> dict[str, list[list[float]]]:
    """``remeasure_together``'s measurements before the median: per group, per program (in the order given),
    its latency in each pass (inf where it failed)."""
    from tunecore.measure.local import LocalMeasurer

    flat = {f"{name}/{i}": candidate for name, group in programs.items() for i, candidate in enumerate(group)}
    samples: dict[str, list[float]] = {key: [] for key in flat}
    measurer = LocalMeasurer(task.target, screen=0, repeat=5, min_repeat_ms=50)
    try:
        for order in pass_orders(list(flat), passes, seed):  # a pass is one batch: its builds run in parallel
            for key, result in zip(order, measurer.measure(task, [flat[key] for key in order])):
                samples[key].append(result.latency or float("inf"))
    finally:
        measurer.close()
    return {name: [samples[f"{name}/{i}"] for i in range(len(group))] for name, group in programs.items()}


def environment(target: Any = None) -> dict[str, Any]:
    """Where an experiment ran: CPU, cores, target (default: this machine), device, versions, installed plugins."""
    import importlib.metadata
    import platform

    from tunecore.registry import describe_plugins
    from tunecore.targets import device_descriptor, resolve_target
    from tunecore.tvmjson import target_to_json

    this_machine = resolve_target("llvm")
    host = device_descriptor(this_machine)
    device = host if target is None else device_descriptor(target)
    target = this_machine if target is None else target
    return {
        "cpu": host.get("cpu") or platform.processor(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "target": json.loads(target_to_json(target)),
        "device": device,
        "versions": {d: importlib.metadata.version(d) for d in ("apache-tvm", "apache-tvm-ffi", "tunecore")},
        "plugins": describe_plugins(),
    }


def script_parser(doc: str, script: str) -> argparse.ArgumentParser:
    """The argument parser of a benchmark script: described by its docstring's first line, with ``--out``
    (default: the ``results`` folder beside the script)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(script)), "results"),
                        help="where <name>.json and <name>.md are written (default: %(default)s)")
    return parser


def command_line(script: str) -> str:
    """How this benchmark was invoked, for the report."""
    return " ".join(["python", f"bench/{script}", *sys.argv[1:]])


def environment_line(report: dict, threads: int | None = None) -> str:
    """The line of a results markdown that says where and how it was measured."""
    env = report["environment"]
    cores = f"{env['cores']} cores" + (f", kernels on {threads} threads" if threads is not None else "")
    return (f"CPU: {env['cpu']} ({cores}), target `{json.dumps(env['target'])}`, "
            f"TVM {env['versions']['apache-tvm']}. Command: `{report['command']}`.")


def split_tables(results: dict[str, dict], columns: Sequence[str]) -> list[str]:
    """Markdown lines: per split of ``tunecore.dataset.evaluate`` results, its sizes and a row per cost model."""
    from tunecore.cli.render import cell

    lines = []
    for name, result in results.items():
        lines += [f"## {name}: `{result['split']}`", "",
                  f"train {result['train']['measurements']} measurements, test {result['test']['measurements']} "
                  f"programs in {result['test']['groups']} task x device groups", "",
                  "| cost model | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
        for model, metrics in {**result["models"], **result.get("references", {})}.items():
            lines.append(f"| {model} | " + " | ".join(cell(metrics.get(c)) for c in columns) + " |")
        lines.append("")
    return lines


def write_results(out_dir: str, name: str, report: dict, markdown: str) -> None:
    """bench/results/<name>.json and .md; the markdown is also printed."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(markdown)
    print(markdown)


if __name__ == "__main__" and sys.argv[1:2] == ["--_metaschedule"]:
    model, trials, seed, work_dir, strategy, timeout = sys.argv[2:8]
    _metaschedule_child(model, int(trials), int(seed), work_dir, strategy, float(timeout), *map(int, sys.argv[8:9]),
                        *sys.argv[9:10])
