"""The ``local`` measurer: a warm pool of build workers and one runner process on this machine.

Builds run in parallel (one worker per core); runs are serial and happen while no build runs,
so timings are not disturbed by compilation. Per-candidate timeouts kill and replace a worker.

A candidate whose first (cold) run is more than ``screen`` times slower than the best this measurer
has seen for the task is timed once, not ``repeat`` times: it cannot be the best, and slow
candidates would otherwise dominate measurement time. Its latency is that single cold timing.
"""

from __future__ import annotations

import concurrent.futures
import shutil
import subprocess
import tempfile
from typing import Any, Sequence

from tunecore.data import Candidate, MeasureResult, Task
from tunecore.errors import error_line
from tunecore.measure import worker
from tunecore.roles import Measurer


class LocalMeasurer(Measurer):
    name = "local"
    target_kinds = frozenset({"llvm", "cuda", "rocm", "metal", "vulkan", "opencl"})

    def __init__(
        self,
        target: Any,
        *,
        build_workers: int | None = None,
        build_timeout: float = 60.0,
        run_timeout: float = 20.0,
        repeat: int = 3,
        number: int = 1,
        min_repeat_ms: int = 20,
        cpu_cache_flush: bool = False,
        screen: float = 2.0,
        **options: Any,
    ):
        super().__init__(target, **options)
        from tvm.support.popen_pool import PopenPoolExecutor

        from tunecore.targets import physical_cores
        from tunecore.tvmjson import target_to_json

        self.target_json = target_to_json(target)
        self.build_timeout = build_timeout
        self.run_timeout = run_timeout
        self.evaluator = dict(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms,
                              enable_cpu_cache_flush=cpu_cache_flush)
        self.screen = screen
        self.best: dict[str, float] = {}  # task id -> best latency this measurer has seen
        self.artifact_dir = tempfile.mkdtemp(prefix="tunecore-build-")
        self.build_workers = build_workers or physical_cores()
        quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        init = dict(initializer=worker.init_worker, initargs=(self.target_json,))
        self.builders = PopenPoolExecutor(self.build_workers, timeout=build_timeout, **init, **quiet)
        self.runner = PopenPoolExecutor(1, timeout=run_timeout, **init, **quiet)
        # start the workers now, while the tuner prepares its tasks
        self._warmup = [self.builders.submit(worker.ping) for _ in range(self.build_workers)]
        self._warmup.append(self.runner.submit(worker.ping))

    @classmethod
    def unsupported_reason(cls, target: Any) -> str | None:
        import tvm

        reason = super().unsupported_reason(target)
        if reason is None and target.kind.name != "llvm" and not tvm.device(target.kind.name, 0).exist:
            reason = f"there is no {target.kind.name} device on this machine (the local measurer measures only here)"
        return reason

    def measure(self, task: Task, candidates: Sequence[Candidate]) -> list[MeasureResult]:
        import time

        import tvm

        concurrent.futures.wait(self._warmup)
        started = time.perf_counter()
        results = [MeasureResult() for _ in candidates]
        builds: list[concurrent.futures.Future | None] = []
        for result, candidate in zip(results, candidates):
            try:
                mod_json = tvm.ir.save_json(candidate.mod)
            except Exception as error:  # the trace does not replay on this task: a failed candidate
                result.error = f"build: cannot apply the schedule: {error_line(error)}"
                builds.append(None)
                continue
            builds.append(self.builders.submit(worker.build, mod_json, self.target_json, self.artifact_dir))
        paths: list[str | None] = []
        for result, future in zip(results, builds):
            path = None
            if future is not None:
                try:
                    path, result.build_secs = future.result()
                except Exception as error:
                    result.error = "build: " + _describe(error, self.build_timeout)
            paths.append(path)
        for result, path in zip(results, paths):
            if path is None:
                continue
            best = self.best.get(task.task_id)
            screen_above = best * self.screen if best is not None and self.screen > 0 else None
            try:
                result.run_secs = self.runner.submit(
                    worker.run, path, self.target_json, task.args, self.evaluator, screen_above
                ).result()
            except Exception as error:
                result.error = "run: " + _describe(error, self.run_timeout)
            _remove(path)
            if result.latency is not None:
                self.best[task.task_id] = min(result.latency, best or result.latency)
        per_candidate = (time.perf_counter() - started) / max(1, len(results))
        for result in results:
            result.measure_secs = per_candidate
        return results

    def close(self) -> None:
        # A worker still starting cannot be killed cleanly (TVM's PopenWorker has no pipes yet and
        # the process would outlive us): let the warm-up pings finish first.
        concurrent.futures.wait(self._warmup, timeout=self.build_timeout)
        self.builders.shutdown(wait=False)
        self.runner.shutdown(wait=False)
        shutil.rmtree(self.artifact_dir, ignore_errors=True)


def _describe(error: BaseException, timeout: float) -> str:
    if isinstance(error, TimeoutError):
        return f"timed out after {timeout:g} s"
    if isinstance(error, ChildProcessError):
        return "the worker process crashed (e.g. a segmentation fault in the kernel)"
    return error_line(error)


def _remove(path: str) -> None:
    import os

    try:
        os.remove(path)
    except OSError:
        pass
