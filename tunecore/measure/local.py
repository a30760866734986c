"""The ``local`` measurer: a builder and a runner, by default a warm pool of build workers and one runner
process on this machine, with any profilers.

Builds run in parallel (one worker per core); runs are serial and happen while no build runs,
so timings are not disturbed by compilation. Per-candidate timeouts kill and replace a worker.

The parts are chosen by option: ``-O measurer.builder=NAME -O measurer.runner=NAME
-O measurer.profilers='["NAME"]'`` (registered through ``tunecore_register_builders`` / ``_runners`` /
``_profilers``); every other ``measurer.KEY`` option goes to whichever part's constructor takes it.

A candidate whose first (cold) run is more than ``screen`` times slower than the best the runner
has seen for the task is timed once, not ``repeat`` times: it cannot be the best, and slow
candidates would otherwise dominate measurement time. Its latency is that single cold timing.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

from tunecore.check import CHECKED
from tunecore.data import Candidate, MeasureResult, Task
from tunecore.errors import UsageError, error_line
from tunecore.measure import worker
from tunecore.options import check_options, is_int, reject_unknown_options
from tunecore.roles import Artifact, Builder, Measurer, Profiler, Runner

_LOCAL_KINDS = frozenset({"llvm", "cuda", "rocm", "metal", "vulkan", "opencl"})


def keep_torch_out() -> None:
    """Make TVM popen workers started from now on unable to import torch (a plugin's dependency, such as
    cdmpp's): TVM's FFI imports it on ``import tvm`` whenever it is installed, seconds per process for
    nothing. TVM's pool restarts workers lazily, so this stays in the environment; other processes
    started from it still get the real torch (see without_torch/torch/__init__.py)."""
    stub = os.path.join(os.path.dirname(os.path.abspath(__file__)), "without_torch")
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if stub not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([stub] + [p for p in paths if p])


def import_tvm_without_torch() -> None:
    """``import tvm`` in this process without importing torch: TVM imports it whenever it is installed
    (tvm_ffi, tvm.relax.base_py_module), 2 s per process, for a torch interop tunecore does not use;
    TVM takes the ImportError as "no torch". A plugin that needs torch still imports it afterwards."""
    if "tvm" in sys.modules or "torch" in sys.modules:
        return
    sys.modules["torch"] = None  # type: ignore[assignment]  # makes `import torch` raise ImportError
    try:
        import tvm  # noqa: F401
    finally:
        del sys.modules["torch"]


# A library a runner loads stays mapped until its process ends (TVM never unloads it: 5 memory maps each, measured),
# and Linux gives a process at most vm.max_map_count (65,530) maps: a collection failed every run after ~12,000
# programs in one worker. Runner workers are therefore replaced after this many calls (a fresh one imports TVM, ~1 s).
RUNS_PER_WORKER = 2000


class _WarmPool:
    """Worker processes for a target, started at once (while the tuner prepares its tasks) and kept for the run
    (a worker for at most ``uses`` calls, if given: then a fresh one takes its place)."""

    def __init__(self, workers: int, timeout: float, target_json: str, uses: int | None = None):
        from tvm.support.popen_pool import PopenPoolExecutor

        keep_torch_out()
        self.timeout = timeout
        self.executor = PopenPoolExecutor(workers, timeout=timeout, initializer=worker.init_worker,
                                          initargs=(target_json,), maximum_process_uses=uses,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.warmup = [self.executor.submit(worker.ping) for _ in range(workers)]

    def ready(self) -> None:
        concurrent.futures.wait(self.warmup)

    def submit(self, *call: Any) -> concurrent.futures.Future:
        return self.executor.submit(*call)

    def close(self) -> None:
        # A worker still starting cannot be killed cleanly (TVM's PopenWorker has no pipes yet and
        # the process would outlive us): let the warm-up pings finish first.
        concurrent.futures.wait(self.warmup, timeout=self.timeout)
        self.executor.shutdown(wait=False)


def check_export(target: Any, export: str, cross_compiler: str | None) -> None:
    """Refuse a way of exporting built candidates that cannot work for the target (a builder's options)."""
    from tunecore.targets import foreign_architecture

    if export not in ("so", "tar"):
        raise UsageError(f"measurer.export must be so or tar, not {export!r}")
    foreign = foreign_architecture(target)
    if foreign and export == "so" and not cross_compiler:
        raise UsageError(f"the target is for {foreign}, not this machine: give -O measurer.cross_compiler="
                         f"{foreign}-linux-gnu-g++ (or the toolchain for it), or -O measurer.export=tar to have "
                         "the device link each candidate (it needs a C compiler)")
    if cross_compiler and shutil.which(cross_compiler) is None:
        raise UsageError(f"measurer.cross_compiler: {cross_compiler!r} is not on PATH")


class LocalBuilder(Builder):
    """Worker processes on this machine that stay warm for the whole run (TVM imported once each)."""

    name = "local"

    def __init__(self, target: Any, *, build_workers: int | None = None, build_timeout: float = 60.0,
                 export: str = "so", cross_compiler: str | None = None, **options: Any):
        super().__init__(target, **options)
        from tunecore.targets import physical_cores
        from tunecore.tvmjson import target_to_json

        check_export(target, export, cross_compiler)
        self.export, self.cross_compiler = export, cross_compiler
        self.target_json = target_to_json(target)
        self.timeout = build_timeout
        self.capacity = build_workers or physical_cores()
        self.directory = tempfile.mkdtemp(prefix="tunecore-build-")
        self.pool = _WarmPool(self.capacity, build_timeout, self.target_json)

    def ready(self) -> None:
        self.pool.ready()

    def build(self, mods_json: Sequence[str]) -> list[Artifact | str]:
        self.pool.ready()
        futures = [self.pool.submit(worker.build, mod_json, self.target_json, self.directory, self.export,
                                    self.cross_compiler) for mod_json in mods_json]
        out: list[Artifact | str] = []
        for future in futures:
            try:
                out.append(Artifact(*future.result()))
            except Exception as error:
                out.append("build: " + describe_failure(error, self.timeout))
        return out

    def close(self) -> None:
        self.pool.close()
        shutil.rmtree(self.directory, ignore_errors=True)


class Screen:
    """The best latency a runner has seen per task, and the cold time above which a candidate is timed once."""

    def __init__(self, screen: float):
        self.screen = screen
        self.best: dict[str, float] = {}  # task id -> best latency this runner has seen

    def screen_above(self, task_id: str) -> float | None:
        best = self.best.get(task_id)
        return best * self.screen if best is not None and self.screen > 0 else None

    def saw(self, task_id: str, latency: float | None) -> None:
        if latency is not None:
            self.best[task_id] = min(latency, self.best.get(task_id, latency))


CHECKS = ("all", "best", "none")


class OutputCheck:
    """Which candidates a runner checks against their task's reference, and the references it holds.

    ``check``: ``all`` (default: every candidate), ``best`` (each that beats the best this runner has timed
    for its task, and one in ``check_sample`` of the others), ``none``. With ``all`` or ``best`` no wrong
    program can be a task's best. A task whose reference cannot be made is not checked, with one warning.
    """

    def __init__(self, check: str = "all", check_sample: int = 8):
        check_options(check=(check, check in CHECKS, " or ".join(CHECKS)),
                      check_sample=(check_sample, is_int(check_sample, 1), "an integer >= 1"))
        self.check, self.check_sample = check, check_sample
        self.references: dict[str, Any] = {}  # task id -> the runner's reference, or why there is none (str)
        self.unchecked = 0  # candidates of the "best" mode since the last sampled one

    def needs_reference(self, task: Task) -> bool:
        return self.check != "none" and task.task_id not in self.references

    def no_reference(self, task: Task, why: str) -> None:
        self.references[task.task_id] = why
        print(f"tunecore: warning: {task.name}: outputs not checked: its unscheduled program {why}", file=sys.stderr)

    def reference(self, task: Task) -> Any:
        """The task's reference, or None when its candidates are not checked."""
        reference = self.references.get(task.task_id)
        return None if self.check == "none" or isinstance(reference, str) else reference

    def check_below(self, best: float | None) -> tuple[bool, float | None]:
        """For the next candidate: (whether it must be checked whatever its latency, else the latency it is
        checked below)."""
        if self.check == "all" or best is None:
            return True, None
        self.unchecked += 1
        if self.unchecked >= self.check_sample:
            self.unchecked = 0
            return True, None
        return False, best


def apply_verdict(result: MeasureResult, verdict: tuple[float, str | None] | None) -> None:
    """A check's verdict (max relative error, None or why the outputs are wrong) on the result it checked."""
    if verdict is not None:
        result.profile[CHECKED] = verdict[0]
        if verdict[1] is not None:
            result.error = verdict[1]


class LocalRunner(Runner, Screen, OutputCheck):
    """One worker process on this machine times one candidate at a time (see the module docstring).

    The check's references are computed by a worker of their own, with a longer timeout (an unscheduled
    program runs on one core, untiled), and handed to the timing worker as .npz files.
    """

    name = "local"
    target_kinds = _LOCAL_KINDS
    needs_reference = OutputCheck.needs_reference  # not Runner's (it checks nothing)

    def __init__(self, target: Any, *, run_timeout: float = 20.0, repeat: int = 3, number: int = 1,
                 min_repeat_ms: int = 20, cpu_cache_flush: bool = False, screen: float = 2.0, check: str = "all",
                 check_sample: int = 8, reference_timeout: float = 300.0, **options: Any):
        super().__init__(target, **options)
        from tunecore.targets import host_target
        from tunecore.tvmjson import target_to_json

        self.target_json = target_to_json(target)
        self.timeout = run_timeout
        self.evaluator = dict(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms,
                              enable_cpu_cache_flush=cpu_cache_flush)
        Screen.__init__(self, screen)
        OutputCheck.__init__(self, check, check_sample)
        self.directory = tempfile.mkdtemp(prefix="tunecore-references-")
        self.pool = _WarmPool(1, run_timeout, self.target_json, uses=RUNS_PER_WORKER)
        self.reference_timeout = reference_timeout
        # A GPU task's reference is its unscheduled program built and run on the host CPU (the target's host), on
        # the same seeded inputs: a check that shares neither the CUDA code generator nor the GPU with what it checks.
        self.reference_on_host = target.kind.name not in ("llvm", "c")
        self.reference_target_json = (target_to_json(target.host or host_target()) if self.reference_on_host
                                      else self.target_json)
        self.reference_pool = (_WarmPool(1, reference_timeout, self.reference_target_json, uses=RUNS_PER_WORKER)
                               if check != "none" else None)

    @classmethod
    def unsupported_reason(cls, target: Any) -> str | None:
        import tvm

        reason = super().unsupported_reason(target)
        if reason is None and target.kind.name != "llvm" and not tvm.device(target.kind.name, 0).exist:
            reason = f"there is no {target.kind.name} device on this machine (the local runner measures only here)"
        return reason

    def ready(self) -> None:
        self.pool.ready()

    def set_reference(self, task: Task, reference: Artifact | str | None) -> None:
        """``reference`` None: build it here, for the host CPU (``reference_on_host``)."""
        import tvm

        from tunecore.check import weight_arguments, written_arguments

        if isinstance(reference, str):
            return self.no_reference(task, f"failed to build ({reference})")
        path = os.path.join(self.directory, f"{task.task_id}.npz")
        weights = weight_arguments(task.mod)
        try:
            if reference is None:
                built = self.reference_pool.submit(worker.build, tvm.ir.save_json(task.mod),
                                                   self.reference_target_json, self.directory).result()
                reference = Artifact(*built)
            self.reference_pool.submit(worker.save_reference, reference.path, self.reference_target_json, task.args,
                                       weights, written_arguments(task.mod), path).result()
        except Exception as error:
            return self.no_reference(task, f"failed to run ({describe_failure(error, self.reference_timeout)})")
        self.references[task.task_id] = {"reference": path, "task_args": task.args, "weights": weights}

    def run(self, task: Task, artifacts: Sequence[Artifact], profilers: Sequence[Profiler]) -> list[MeasureResult]:
        self.pool.ready()
        reference = self.reference(task)
        results = []
        for artifact in artifacts:
            result = MeasureResult(build_secs=artifact.build_secs)
            check = None
            if reference is not None:
                always, below = self.check_below(self.best.get(task.task_id))
                check = dict(reference, packing=artifact.packing, below=None if always else below)
            try:
                result.run_secs, verdict = self.pool.submit(
                    worker.run, artifact.path, self.target_json, artifact.arguments(task), self.evaluator,
                    self.screen_above(task.task_id), check
                ).result()
                apply_verdict(result, verdict)
            except Exception as error:
                result.error = "run: " + describe_failure(error, self.timeout)
            for profiler in profilers:
                try:
                    result.profile.update(profiler.profile(task, artifact, result))
                except Exception:  # a profiler's failure costs its metrics, not the measurement
                    result.profile[f"{profiler.name}.failed"] = 1.0
            self.saw(task.task_id, result.latency)
            results.append(result)
        return results

    def close(self) -> None:
        self.pool.close()
        if self.reference_pool is not None:
            self.reference_pool.close()
        shutil.rmtree(self.directory, ignore_errors=True)


class LocalMeasurer(Measurer):
    """A builder and a runner (``local`` and ``local`` unless chosen by option), with profilers.

    Which targets it serves depends on the parts chosen: they are checked when it is constructed.
    """

    name = "local"

    def __init__(self, target: Any, *, builder: str = "local", runner: str = "local",
                 profilers: Sequence[str] | str = (), registry: Any = None, **options: Any):
        super().__init__(target)
        from tunecore.registry import Registry

        if registry is not None and not isinstance(registry, Registry):
            raise TypeError("registry is not an option")  # a Python API argument (tests), not for -O
        registry = registry or Registry.shared()
        profilers = [profilers] if isinstance(profilers, str) else list(profilers)
        registry.check_target(target, builder=builder, runner=runner)
        for profiler in profilers:
            registry.check_target(target, profiler=profiler)
        builder_cls, runner_cls = registry.get("builder", builder), registry.get("runner", runner)
        if profilers and not runner_cls.runs_profilers:
            raise UsageError(f"runner '{runner}' cannot run profilers ({', '.join(profilers)}): a profiler runs "
                             "where the candidate runs")
        builder_options, runner_options = _accepted(builder_cls, options), _accepted(runner_cls, options)
        taken = builder_options.keys() | runner_options.keys()
        reject_unknown_options("measurer", self.name, {k: v for k, v in options.items() if k not in taken})
        self.builder = builder_cls(target, **builder_options)
        self.runner: Runner | None = None
        self.profilers: list[Profiler] = []
        try:
            self.runner = runner_cls(target, **runner_options)
            self.profilers = [registry.get("profiler", name)() for name in profilers]
        except BaseException:
            self.close()
            raise
        self.capacity = self.runner.capacity

    def device(self) -> dict[str, Any]:
        return self.runner.device()

    def measure(self, task: Task, candidates: Sequence[Candidate]) -> list[MeasureResult]:
        import tvm

        self.builder.ready()
        self.runner.ready()
        started = time.perf_counter()
        results: list[MeasureResult | None] = [None] * len(candidates)
        mods, positions = [], []
        reference = self.runner.needs_reference(task)
        on_host = reference and getattr(self.runner, "reference_on_host", False)
        if on_host:  # the runner builds it for the host CPU
            self.runner.set_reference(task, None)
            reference = False
        if reference:  # built with the candidates: the task's unscheduled program, whose outputs the runner keeps
            mods.append(tvm.ir.save_json(task.mod))
        for i, candidate in enumerate(candidates):
            try:
                mods.append(tvm.ir.save_json(candidate.mod))
                positions.append(i)
            except Exception as error:  # the trace does not replay on this task: a failed candidate
                results[i] = MeasureResult(error=f"build: cannot apply the schedule: {error_line(error)}")
        built = _one_each(self.builder.build(mods), mods, f"builder '{self.builder.name}'")
        if reference:
            self.runner.set_reference(task, built[0])
            if isinstance(built[0], Artifact):
                self.builder.discard(built[0])
            built = built[1:]
        artifacts = [(i, a) for i, a in zip(positions, built) if isinstance(a, Artifact)]
        for i, failure in zip(positions, built):
            if not isinstance(failure, Artifact):
                results[i] = MeasureResult(error=str(failure))
        try:
            ran = _one_each(self.runner.run(task, [a for _, a in artifacts], self.profilers), artifacts,
                            f"runner '{self.runner.name}'")
        finally:
            for _, artifact in artifacts:
                self.builder.discard(artifact)
        for (i, _), result in zip(artifacts, ran):
            results[i] = result
        per_candidate = (time.perf_counter() - started) / max(1, len(candidates))
        for result in results:
            result.measure_secs = per_candidate
        return results

    def close(self) -> None:
        try:
            for profiler in self.profilers:
                profiler.close()
            if self.runner is not None:
                self.runner.close()
        finally:
            self.builder.close()


def _one_each(out: list, inputs: Sequence, part: str) -> list:
    """A part's answers, refusing a part that does not answer once for each input (a plugin bug)."""
    if len(out) != len(inputs):
        raise RuntimeError(f"{part} returned {len(out)} results for {len(inputs)} inputs")
    return out


def _accepted(cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """The options a part's constructor takes by name, through its base classes while it passes ``**options`` on."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        parameters = inspect.signature(init).parameters
        names.update(k for k, p in list(parameters.items())[2:]  # after self and target
                     if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            break
    return {k: v for k, v in options.items() if k in names}


def describe_failure(error: BaseException, timeout: float) -> str:
    """A worker's failure as one line: a timeout, a crash, or the error."""
    if isinstance(error, TimeoutError):
        return f"timed out after {timeout:g} s"
    if isinstance(error, ChildProcessError):
        return "the worker process crashed (e.g. a segmentation fault in the kernel)"
    return error_line(error)
