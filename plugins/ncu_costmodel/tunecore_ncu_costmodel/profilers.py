"""The profilers a measurer runs on built candidates (``-O measurer.profilers='["cpu"]'``; ``--cost-model ncu``
adds the one for its target itself), and ``tunecore ncu profile``, which adds the same metrics to a dataset.

A profile costs about as much as a measurement (callgrind runs a kernel 150-300x slower), so a profiler in a run
profiles a sample: every candidate that is the fastest of its task so far, and every ``EVERY``-th other one.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

from tunecore.interfaces import Artifact, MeasureResult, Profiler, Progress, Task, error_line
from tunecore_ncu_costmodel import cpu, ncu_csv

EVERY = 8
MAX_LATENCY_SECS = 0.05  # slower candidates are not profiled in a run: ~15 s of callgrind each


class _Sampling(Profiler):
    """Which measured candidates get profiled (see the module docstring)."""

    def __init__(self) -> None:
        self.seen: collections.Counter = collections.Counter()
        self.best: dict[str, float] = {}

    def profile(self, task: Task, artifact: Artifact, result: MeasureResult) -> dict[str, float]:
        latency = result.latency
        if latency is None:
            return {}
        seen = self.seen[task.task_id]
        self.seen[task.task_id] += 1
        fastest = latency < self.best.get(task.task_id, float("inf"))
        if fastest:
            self.best[task.task_id] = latency
        if latency > MAX_LATENCY_SECS or not (fastest or seen % EVERY == 0):
            return {}
        return self.metrics(task, artifact)

    def metrics(self, task: Task, artifact: Artifact) -> dict[str, float]:
        raise NotImplementedError


class CPUProfiler(_Sampling):
    """callgrind + llvm-mca on a native harness (tunecore_ncu_costmodel.cpu)."""

    name = "cpu"
    target_kinds = frozenset({"llvm"})

    def __init__(self) -> None:
        super().__init__()
        cpu.check_tools()

    def metrics(self, task: Task, artifact: Artifact) -> dict[str, float]:
        cores, mcpu = cpu.target_facts(task.target_json)
        return cpu.profile_library(artifact.path, artifact.arguments(task), threads=cores, mcpu=mcpu)


class NcuProfiler(_Sampling):
    """Nsight Compute on the candidate's CUDA kernels: ``ncu --csv --page raw --metrics ...`` around a small
    Python process that loads the library and calls it once (ncu, unlike valgrind, costs little per start)."""

    name = "ncu"
    target_kinds = frozenset({"cuda"})

    def __init__(self) -> None:
        super().__init__()
        ncu_csv.check_tool()

    def metrics(self, task: Task, artifact: Artifact) -> dict[str, float]:
        command = [ncu_csv.check_tool(), *ncu_csv.COMMAND, sys.executable, "-m",
                   "tunecore_ncu_costmodel.run_cuda", artifact.path, json.dumps(artifact.arguments(task))]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"ncu exited with {done.returncode}")
        return ncu_csv.candidate_metrics(ncu_csv.parse(done.stdout))


# --- tunecore ncu profile ---


def profile_dataset(path: str, *, limit: int, per_task: int | None = None, workloads: Sequence[str] = (),
                    devices: Sequence[str] = (), max_latency: float = 0.05, timeout: float = 120.0, seed: int = 0,
                    save_every: float = 60.0, retry_failed: bool = False,
                    on_progress: Callable[[Progress], None] | None = None) -> dict[str, Any]:
    """Add CPU profile metrics to up to ``limit`` rows of a dataset measured on this machine's device, in place.

    Rows are taken round-robin over tasks (in a seeded order within each), so any ``limit`` covers the tasks
    evenly; ``per_task`` caps the rows profiled per task and device, counting those profiled before. By default
    only rows of this machine's devices are profiled; ``devices`` (ids or prefixes) names the devices to profile,
    which may be another machine's whose code runs here: callgrind simulates that device's L1 and L2 sizes, so
    the counts are the ones its own machine would give (same cache ways and line). Rows that have a profile
    already are skipped, so the command resumes where it stopped; a profile an earlier version made warm
    (``cpu.warm = 1``) is made again. A row that cannot be profiled gets ``cpu.failed = 1`` (its reason goes to
    stderr) and is not tried again unless ``retry_failed`` (after a fix of the tools)."""
    import concurrent.futures

    import numpy as np
    import tvm

    from tunecore.dataset import Dataset, changing, device_of
    from tunecore.interfaces import Candidate, LocalBuilder, UsageError, target_from_json
    from tunecore.targets import device_descriptor, device_id

    cpu.check_tools()
    with changing(path):
        dataset = Dataset.load(path)
        unknown = [w for w in workloads if not any(w in t.workloads for t in dataset.tasks.values())]
        if unknown:
            raise UsageError(f"no workload {unknown[0]} in {path}")
        chosen = {device_of(dataset, d) for d in devices}
        by_task: dict[tuple[str, str], list] = collections.defaultdict(list)
        for row in dataset.rows:
            task = dataset.tasks[row.task_key]
            if workloads and not any(w in task.workloads for w in workloads):
                continue
            by_task[row.task_key, row.target].append(row)
        rng = np.random.default_rng(seed)
        here: dict[str, str | None] = {}
        queues = []
        for (task_key, target), rows in sorted(by_task.items()):
            if target not in here:  # the device this machine is for that target
                tvm_target = target_from_json(target)
                here[target] = device_id(device_descriptor(tvm_target)) if tvm_target.kind.name == "llvm" else None
            if here[target] is None:
                continue
            rows = [r for r in rows if (r.device_id in chosen if chosen else r.device_id == here[target])]
            for r in rows:
                if retry_failed and "cpu.failed" in r.profile:
                    _clear(r)
            done = sum(_profiled(dataset, r) for r in rows)
            todo = [rows[i] for i in rng.permutation(len(rows)) if not _profiled(dataset, rows[i])
                    and rows[i].latency is not None and rows[i].latency <= max_latency]
            if per_task is not None:
                todo = todo[:max(0, per_task - done)]
            if todo:
                queues.append(todo)
        order = [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)][:limit]
        if not order:
            return {"profiled": 0, "failed": 0, "total": 0,
                    "rows_with_profile": sum(_profiled(dataset, r) for r in dataset.rows),
                    "seconds": 0.0}

        started = saved = time.perf_counter()
        counts = {"profiled": 0, "failed": 0, "total": len(order)}
        batch = max(2, 4 * (os.cpu_count() or 1))
        kinds = dict.fromkeys((r.target, _by_twin(dataset, r)) for r in order)  # a batch: one target, twins or not
        batches = [rows[i:i + batch] for kind in kinds
                   for rows in [[r for r in order if (r.target, _by_twin(dataset, r)) == kind]]
                   for i in range(0, len(rows), batch)]
        builders: dict[str, LocalBuilder] = {}
        workers = concurrent.futures.ThreadPoolExecutor(max(1, os.cpu_count() or 1))
        try:
            for rows in batches:
                target = rows[0].target
                cores, mcpu = cpu.target_facts(target)
                builder = builders.get(target) or builders.setdefault(target, LocalBuilder(target_from_json(target)))
                mods, built = [], []
                for row in rows:
                    try:
                        task = dataset.tasks[row.task_key].for_target(target)
                        mods.append(tvm.ir.save_json(Candidate(task, row.trace, row.program_key).mod))
                        built.append(row)
                    except Exception as error:  # the trace does not replay
                        _failed(dataset, row, counts, f"its trace does not replay ({error_line(error)})")
                # a device with AVX-512: callgrind counts every program's twin (cpu.twin_target), whatever its own code
                twins = [None] * len(mods)
                if mods and _by_twin(dataset, rows[0]):
                    twin = cpu.twin_target(target)
                    twin_builder = builders.get(twin) or builders.setdefault(twin, LocalBuilder(target_from_json(twin)))
                    twins = twin_builder.build(mods)
                futures = {}
                for row, artifact, twin_artifact in zip(built, builder.build(mods) if mods else [], twins):
                    if not isinstance(artifact, Artifact):
                        _failed(dataset, row, counts, f"it does not build ({artifact})")
                        continue
                    device = dataset.devices.get(row.device_id, {})
                    twin_path = None  # no twin wanted; "" when it did not build
                    if twin_artifact is not None:
                        twin_path = twin_artifact.path if isinstance(twin_artifact, Artifact) else ""
                    caches = cpu.cache_geometry(device.get("l1_bytes"), device.get("l2_bytes"))
                    future = workers.submit(
                        cpu.profile_library, artifact.path, artifact.arguments(dataset.tasks[row.task_key]),
                        threads=cores, mcpu=mcpu, caches=caches, timeout=timeout, twin=twin_path)
                    futures[future] = row, artifact, twin_artifact
                for future in concurrent.futures.as_completed(futures):
                    row, artifact, twin_artifact = futures[future]
                    try:
                        metrics = future.result()
                        _clear(row)
                        row.profile.update(metrics)
                        counts["profiled"] += 1
                    except Exception as error:
                        _failed(dataset, row, counts, error_line(error))
                    builder.discard(artifact)
                    if isinstance(twin_artifact, Artifact):
                        twin_builder.discard(twin_artifact)
                if on_progress:
                    on_progress(Progress("profiling", counts["profiled"] + counts["failed"], counts["total"],
                                         dataset.tasks[rows[-1].task_key].name, counts["failed"]))
                if time.perf_counter() - saved > save_every:
                    dataset.save(path)
                    saved = time.perf_counter()
        finally:
            dataset.save(path)
            workers.shutdown(wait=True, cancel_futures=True)  # after Ctrl-C, only the profiles under way finish
            for builder in builders.values():
                builder.close()
        return dict(counts, rows_with_profile=sum(_profiled(dataset, r) for r in dataset.rows),
                    seconds=round(time.perf_counter() - started, 1))


def _clear(row: Any) -> None:
    row.profile = {k: v for k, v in row.profile.items() if not k.startswith(("cpu.", "mca."))}


def _failed(dataset: Any, row: Any, counts: dict[str, int], why: str) -> None:
    print(f"tunecore: {dataset.tasks[row.task_key].name} program {row.program_key} cannot be profiled: {why}",
          file=sys.stderr, flush=True)
    _clear(row)
    row.profile["cpu.failed"] = 1.0
    counts["failed"] += 1


def _profiled(dataset: Any, row: Any) -> bool:
    """Whether the row has a profile this version keeps (a failure included): not one made warm, nor AVX-512 code's
    from before twins, nor, on a device whose programs are counted by their twins (``_by_twin``), one that was not
    (those are made again)."""
    profile = row.profile
    if "cpu.failed" in profile:
        return True
    if profile.get("cpu.warm") == 1.0 or ("cpu.avx512" in profile and "cpu.twin" not in profile):
        return False
    if _by_twin(dataset, row) and profile.get("cpu.twin") != 1.0:
        return False
    return any(key.startswith(("cpu.", "mca.")) for key in profile)


def _by_twin(dataset: Any, row: Any) -> bool:
    """Whether the row's device runs AVX-512, so that its programs are counted by their twins."""
    return dataset.devices.get(row.device_id, {}).get("vector_bits") == 512



# --- a batch directory (tunecore.measure.batch): every program profiled by one ncu process per chunk ---


def profile_batch(directory: str, *, limit: int | None = None, chunk: int = 200, timeout: float = 600.0,
                  on_progress: Callable[[Progress], None] | None = None) -> dict[str, Any]:
    """Nsight Compute metrics of a batch's programs, on the machine that times them (no TVM compiler needed):
    ``ncu`` runs ``python -m tunecore.measure.batch DIR --call-once`` over ``chunk`` programs at a time, and its
    kernel launches are matched to programs by the kernels each library defines (in call order; a chunk
    whose launches do not match is left unprofiled). Each chunk's CUDA is compiled first, by a pool outside ncu
    (compiling under the profiler is slow and serial). Written to the batch's profiles file, which
    ``tunecore dataset import-batch`` puts into the rows; resumes where it stopped."""
    from tunecore.dataset import BATCH_MANIFEST, BATCH_PROFILES, batch_cubins

    tool = ncu_csv.check_tool()
    with open(os.path.join(directory, BATCH_MANIFEST)) as f:
        programs = {p["id"]: p for p in json.load(f)["programs"] if "library" in p}
    path = os.path.join(directory, BATCH_PROFILES)
    profiles: dict[str, dict[str, float]] = json.load(open(path)) if os.path.exists(path) else {}
    todo = [i for i in programs if i not in profiles][:limit]
    counts = {"profiled": 0, "failed": 0, "unmatched": 0, "total": len(todo)}
    started = time.perf_counter()
    cubins = batch_cubins(directory) if todo else None
    try:
        for start in range(0, len(todo), chunk):
            ids = todo[start:start + chunk]
            if cubins is not None:
                cubins.compile([os.path.join(directory, programs[i]["library"]) for i in ids])
            _profile_chunk(tool, directory, ids, programs, profiles, counts, timeout)
            with open(path + ".tmp", "w") as f:
                json.dump(profiles, f)
            os.replace(path + ".tmp", path)
            if on_progress:
                on_progress(Progress("profiling", min(start + chunk, len(todo)), len(todo), "", counts["failed"]))
    finally:
        if cubins is not None:
            cubins.close()
    return dict(counts, seconds=round(time.perf_counter() - started, 1))


def _profile_chunk(tool: str, directory: str, ids: list[str], programs: dict[str, dict],
                   profiles: dict[str, dict[str, float]], counts: dict[str, int], timeout: float) -> None:
    ids_file = os.path.join(directory, "profile-ids.json")
    with open(ids_file, "w") as f:
        json.dump(ids, f)
    command = [tool, *ncu_csv.COMMAND, sys.executable, "-m", "tunecore.measure.batch", directory,
               "--call-once", ids_file]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    # ncu's own output, kept for a re-reading; named by the chunk's first program (a chunk of other programs has
    # another name; only the same chunk profiled again, its launches unmatched before, replaces its file). Its log
    # (the profiled process's errors; ncu's own ==ERROR== and ==WARNING== lines where they go there) is what says
    # why a chunk's launches did not match
    with open(os.path.join(directory, f"ncu-{ids[0]}.csv"), "w") as f:
        f.write(done.stdout)
    with open(os.path.join(directory, f"ncu-{ids[0]}.log"), "w") as f:
        f.write(done.stderr)
    with open(os.path.join(directory, "calls.json")) as f:
        calls = json.load(f)
    try:
        launches = ncu_csv.parse(done.stdout)
    except ValueError:
        launches = []
    for program_id, metrics in match_launches(calls, programs, launches).items():
        profiles[program_id] = metrics
        counts["failed" if "ncu.failed" in metrics else "profiled"] += 1
    counts["unmatched"] = counts["total"] - counts["profiled"] - counts["failed"]


def match_launches(calls: list[list], programs: dict[str, dict], launches: list) -> dict[str, dict[str, float]]:
    """Each called program's metrics from ncu's launches (in order): a program that failed to run gets
    ``ncu.failed``; the matching stops at the first program whose launches do not have its kernels' names."""
    out: dict[str, dict[str, float]] = {}
    ran = [program_id for program_id, error in calls if error is None]
    if launches and not any(programs[i].get("kernels") for i in ran):
        # kernels unknown (a library compiled for the GPU carries no source): every program's function launches
        # its first kernel first, under the same name ("main_kernel"; more kernels are "main_kernel_1", ...), so
        # a launch of that name starts the next program; used only when that gives one group per program
        groups: list[list] = []
        for launch in launches:
            if launch.kernel == launches[0].kernel or not groups:
                groups.append([])
            groups[-1].append(launch)
        if len(groups) != len(ran):
            return {}
        launches_of = dict(zip(ran, groups))
        return {program_id: ncu_csv.candidate_metrics(launches_of[program_id]) if error is None
                else {"ncu.failed": 1.0} for program_id, error in calls}
    position = 0
    for program_id, error in calls:
        if error is not None:
            out[program_id] = {"ncu.failed": 1.0}
            continue
        names = programs[program_id].get("kernels") or []
        mine = launches[position:position + len(names)]
        if not names or len(mine) < len(names) or sorted(k.kernel.split("(")[0] for k in mine) != sorted(names):
            break
        out[program_id] = ncu_csv.candidate_metrics(mine)
        position += len(names)
    return out
