"""End-to-end compile of a workload with the best stored schedules (``tunecore compile``).

The tuned build is checked against the untuned build of the same module on the same random inputs,
and both are timed in this process the same way, in alternating passes.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from tunecore.check import mismatch, random_array
from tunecore.errors import UsageError
from tunecore.roles import RecordStore
from tunecore.workloads import Workload, extract_tasks


def best_database(store: RecordStore, tasks: list, target: Any,
                  chosen: dict[str, str] | None = None) -> tuple[Any, int]:
    """A MetaSchedule in-memory database with the best stored record of each task; returns (db, tasks covered).

    ``chosen``: task id -> the key of the record to use (a task not in it is left untuned).
    """
    from tvm.s_tir import meta_schedule as ms

    from tunecore.tvmjson import replay_trace_json

    db = ms.database.MemoryDatabase()
    covered = 0
    for task in tasks:
        if chosen is not None and task.task_id not in chosen:
            continue
        if chosen is None:
            records = store.best(task.task_id, k=4)  # fall back if a trace no longer applies
        else:
            records = [r for r in store.records(task.task_id) if r.key == chosen[task.task_id]]
        for record in records:
            try:
                trace = replay_trace_json(task.mod, record.trace_json).trace
            except Exception:
                continue
            workload = db.commit_workload(task.mod)
            args_info = [ms.arg_info.ArgInfo.from_json(a) for a in task.args]
            db.commit_tuning_record(ms.database.TuningRecord(trace, workload, record.run_secs, target, args_info))
            covered += 1
            break
    return db, covered


def choose_winograd(workload: Workload, store: RecordStore, tasks: list) -> None:
    """A workload tuned with Winograd candidates (``--winograd``) is built with Winograd for the convs whose
    Winograd kernels measured faster (tunecore.winograd.choose), direct for the others."""
    if workload.winograd:
        from tunecore.winograd import choose

        workload.winograd_convs = choose(store, tasks)


def build(workload: Workload, target: Any, database: Any) -> Any:
    """An executable of the workload with the database's schedules (an empty database: untuned).

    A network is built as MetaSchedule's compile_relax builds it, plus Ansor's layout rewrite: the weight
    packing that a tuned kernel's RewriteLayout asks for is split out of the kernel and done once, at
    compile time for weights bound as constants (ONNX), or by ``main_transform_params`` for weights passed
    as parameters (zoo models; ``Runnable`` calls it once).
    """
    if workload.is_network:
        return _build_network(workload.mod, target, database, workload.layout, workload.winograd_convs)
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build

    return default_build(scheduled_operator(workload, target, database), target, None)


def _build_network(mod: Any, target: Any, database: Any, layout: str = "nchw",
                   winograd: frozenset = frozenset()) -> Any:
    import tvm
    from tvm import relax

    from tunecore.workloads import fusion_passes

    @tvm.transform.module_pass(opt_level=3, name="TunecoreBuild")
    def passes(mod: Any, _context: Any) -> Any:
        return tvm.transform.Sequential([
            *fusion_passes(target, layout, winograd),  # as tasks were extracted, so the database's keys match
            relax.transform.MetaScheduleApplyDatabase(),
            *_default_gpu_schedules(target),
            tvm.transform.module_pass(_split_layout_rewrite_preproc, opt_level=0, name="SplitLayoutRewritePreproc"),
            relax.transform.LiftTransformParams(),
            relax.transform.FoldConstant(),
            *_lowering_passes(target),
        ])(mod)

    with target, database, tvm.transform.PassContext(opt_level=3):
        return relax.build(mod, target=target, relax_pipeline=passes)


def _default_gpu_schedules(target: Any) -> list:
    """On a GPU, the kernels without a record get TVM's default GPU schedules (dlight, as relax.build's own cuda
    pipeline gives them) rather than being lowered from their unscheduled form, which TVM 0.27 also builds: the
    untuned baseline is TVM's own. Kernels scheduled from the database are marked scheduled and left alone."""
    if "gpu" not in target.keys:
        return []
    from tvm.s_tir import dlight as dl

    return [dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
                                    dl.gpu.Fallback())]


def _split_layout_rewrite_preproc(mod: Any, _context: Any) -> Any:
    """relax's SplitLayoutRewritePreproc (packing split out of the kernels that asked for it), over every
    function it accepts: it stops at a kernel without a compute block (cumsum lowered from TE, an opaque
    extern), which has nothing to split and is kept as it is."""
    import tvm
    from tvm import relax

    split = relax.transform.SplitLayoutRewritePreproc()
    try:
        return split(mod)
    except tvm.error.InternalError:
        pass
    opaque = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc):
            try:
                split(tvm.IRModule({"main": func}))
            except tvm.error.InternalError:
                opaque[gv] = func
    rest = tvm.IRModule({gv: func for gv, func in mod.functions.items() if gv not in opaque}, attrs=mod.attrs,
                        global_infos=mod.global_infos)
    out = split(rest)
    for gv, func in opaque.items():
        out[gv] = func
    return out


def _lowering_passes(target: Any) -> list:
    from tvm.relax import pipeline

    try:
        return [*pipeline.dataflow_lower_passes(target), *pipeline.finalize_passes(target)]
    except AttributeError:  # TVM 0.27's relax.backend.cpu_generic does not export dataflow_lower_passes
        from tvm.relax.backend.cpu_generic import pipeline as cpu

        return [*cpu.dataflow_lower_passes(target), *cpu.finalize_passes(target)]


def scheduled_operator(workload: Workload, target: Any, database: Any) -> Any:
    """A single operator's module as ``build`` compiles it: its database record's schedule applied (none: as it is)."""
    from tunecore.tvmjson import new_schedule

    record = database.query_tuning_record(workload.mod, target, "main")
    if record is None:
        return workload.mod
    sch = new_schedule(workload.mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod


def _device(target: Any) -> Any:
    import tvm

    kind = target.kind.name
    return tvm.cpu(0) if kind in ("llvm", "c") else tvm.device(kind, 0)


def random_inputs(workload: Workload, seed: int = 0) -> list[np.ndarray]:
    """Inputs for every parameter of the workload: small floats, small non-negative integers (token ids)."""
    return inputs_of(input_specs(workload), seed)


def input_specs(workload: Workload) -> list[tuple[tuple[int, ...], str, str]]:
    """(shape, dtype, name) of every parameter of the workload."""
    from tvm import relax

    if workload.is_network:
        func = workload.mod["main"]
        if any(not isinstance(p.ty, relax.TensorType) for p in func.params):
            raise UsageError(f"{workload.name}: only models whose inputs are all tensors can be compiled and checked")
        return [(tuple(int(d) for d in p.ty.shape), str(p.ty.dtype), p.name) for p in func.params]
    from tvm.s_tir import meta_schedule as ms

    return [(tuple(a.shape), str(a.dtype), "") for a in ms.arg_info.ArgInfo.from_prim_func(workload.mod["main"])]


def inputs_of(specs: list, seed: int = 0) -> list[np.ndarray]:
    """random_inputs from the specs alone (numpy only: also where TVM's compiler is absent)."""
    rng = np.random.default_rng(seed)
    return [random_array(shape, dtype, rng, weight=name.endswith(".weight"), integers=(0, 16))
            for shape, dtype, name in specs]


def num_input(workload: Workload) -> int | None:
    """How many of a network's parameters are its inputs (the rest are weights), where its main says so."""
    attrs = workload.mod["main"].attrs
    return int(attrs["num_input"]) if workload.is_network and "num_input" in attrs else None


def pass_orders(names: Sequence[str], passes: int, seed: int | None = None) -> list[list[str]]:
    """The order of ``names`` in each of ``passes`` passes, so that the machine's drift within an experiment
    falls on all of them alike: alternately forwards and backwards, or, with ``seed``, a random
    permutation per pass (numpy's generator, so that a seed gives the same orders everywhere)."""
    names = list(names)
    if seed is None:
        return [names if p % 2 == 0 else names[::-1] for p in range(passes)]
    rng = np.random.default_rng(seed)
    return [[names[j] for j in rng.permutation(len(names))] for _ in range(passes)]


def passes_together(timers: dict[str, Callable[[], float]], passes: int,
                    seed: int | None = None) -> dict[str, list[float]]:
    """Seconds from each timer in each pass over all of them, in the orders of ``pass_orders``."""
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for order in pass_orders(list(timers), passes, seed):
        for name in order:
            samples[name].append(timers[name]())
    return samples


def ratio_bounds(reference_passes: Sequence[float], own_passes: Sequence[float]) -> list[float]:
    """[low, high] of reference / own time over two variants' passes: the reference's fastest pass over this
    one's slowest, and its slowest over this one's fastest. Only a range wholly above 1 (this one faster) or below
    it (slower) is a difference beyond the spread."""
    return [min(reference_passes) / max(own_passes), max(reference_passes) / min(own_passes)]


class Runnable:
    """Calls and times an executable the same way for networks (Relax VM) and single operators."""

    def __init__(self, executable: Any, workload: Workload, target: Any, inputs: list[np.ndarray]):
        self._start(executable, _device(target), inputs, workload.is_network, num_input(workload))

    @classmethod
    def network(cls, executable: Any, device: Any, inputs: list[np.ndarray], num_input: int | None) -> Runnable:
        """A network's executable loaded with TVM's runtime alone (no workload: ``num_input`` is its main's
        attribute, the count of inputs before the weights)."""
        runnable = cls.__new__(cls)
        runnable._start(executable, device, inputs, True, num_input)
        return runnable

    def _start(self, executable: Any, device: Any, inputs: list[np.ndarray], is_network: bool,
               num_input: int | None) -> None:
        import tvm

        self.device = device
        self.args = [tvm.runtime.tensor(x, self.device) for x in inputs]
        self.is_network = is_network
        if self.is_network:
            from tvm.runtime.vm import VirtualMachine

            self.vm = VirtualMachine(executable, self.device)
            if num_input is not None and self.vm.module.implements_function("main_transform_params"):
                # weights packed once, as a deployment does after loading them
                weights = self.vm["main_transform_params"](self.args[num_input:])
                self.args = [*self.args[:num_input], *weights]
        else:
            self.module = executable
            self.output = self.args[-1]

    def outputs(self) -> list[np.ndarray]:
        if self.is_network:
            result = self.vm["main"](*self.args)
            return [np.asarray(t.numpy()) for t in _flatten(result)]
        self.module(*self.args)
        return [self.output.numpy()]

    def time(self, repeat: int, min_repeat_ms: int) -> float:
        """Median seconds per call."""
        if self.is_network:
            evaluator = self.vm.time_evaluator("main", self.device, number=1, repeat=repeat,
                                               min_repeat_ms=min_repeat_ms)
        else:
            evaluator = self.module.time_evaluator(self.module.entry_name, self.device, number=1, repeat=repeat,
                                                   min_repeat_ms=min_repeat_ms)
        return float(np.median(evaluator(*self.args).results))


def _flatten(value: Any) -> list:
    import tvm

    if isinstance(value, tvm.runtime.Tensor):
        return [value]
    return [t for item in value for t in _flatten(item)]


def compile_and_check(workload: Workload, target: Any, store: RecordStore, *, output: str | None = None,
                      repeat: int = 5, min_repeat_ms: int = 200) -> dict[str, Any]:
    """Build tuned and untuned, compare outputs, time both the same way: ``repeat`` alternating passes (so that
    the machine's drift falls on both alike), each pass as many calls as fill ``min_repeat_ms``; the latency is
    the median pass. Returns the report ``tunecore compile --json`` prints.

    When the outputs differ, each task's best record is checked on its own (tunecore.check.verify_best): the
    wrong ones are marked failed in the store, and the model is built again with the best correct record of
    each task. With no record for any of the workload's tasks nothing was tuned: the untuned build is checked
    (against the model's framework) and timed alone, and ``speedup`` and ``speedup_range`` are None.
    """
    from tvm.s_tir import meta_schedule as ms

    from tunecore.targets import use_target_threads

    threads = use_target_threads(target)
    tasks = extract_tasks(workload, target)
    choose_winograd(workload, store, tasks)
    database, covered = best_database(store, tasks, target)
    inputs = random_inputs(workload)
    started = time.time()
    untuned = build(workload, target, ms.database.MemoryDatabase())
    compile_s = time.time() - started
    untuned_run = Runnable(untuned, workload, target, inputs)
    expected = untuned_run.outputs()
    tuned, tuned_run = untuned, untuned_run
    if covered:
        started = time.time()
        tuned = build(workload, target, database)
        compile_s = time.time() - started
        tuned_run = Runnable(tuned, workload, target, inputs)
    got = tuned_run.outputs()
    error, wrong = mismatch(got, expected)
    replaced: list[str] = []
    if wrong is not None:  # find the tasks whose records are wrong, and build with correct ones
        chosen, replaced = _correct_records(store, tasks, target)
        database, covered = best_database(store, tasks, target, chosen)
        tuned = build(workload, target, database)
        tuned_run = Runnable(tuned, workload, target, inputs)
        got = tuned_run.outputs()
        error, wrong = mismatch(got, expected)
    # the model's own framework on the same inputs: catches an import that changed what the model computes,
    # which the untuned build shares with the tuned one
    reference_error, reference_wrong = None, None
    if workload.reference is not None:
        reference = workload.reference(inputs)
        if len(reference) == len(got) and all(r.shape == g.shape for r, g in zip(reference, got)):
            reference_error, reference_wrong = mismatch(got, reference)
        else:
            reference_error, reference_wrong = float("inf"), "outputs of other shapes"
    runs = {"untuned": untuned_run, **({"tuned": tuned_run} if covered else {})}
    passes = passes_together({name: (lambda r=r: r.time(1, min_repeat_ms)) for name, r in runs.items()}, repeat)
    untuned_passes, tuned_passes = passes["untuned"], passes.get("tuned", passes["untuned"])
    untuned_latency, latency = float(np.median(untuned_passes)), float(np.median(tuned_passes))
    if output:
        tuned.export_library(output)
    return {
        "model": workload.name,
        "layout": workload.layout,
        "winograd_convs": sorted(workload.winograd_convs),
        "tasks_total": len(tasks),
        "tasks_tuned": covered,
        "latency_ms": latency * 1e3,
        "untuned_latency_ms": untuned_latency * 1e3,
        "latency_passes_ms": [t * 1e3 for t in tuned_passes],
        "untuned_passes_ms": [t * 1e3 for t in untuned_passes],
        "speedup": untuned_latency / latency if covered else None,  # nothing tuned: no speedup to speak of
        "speedup_range": ratio_bounds(untuned_passes, tuned_passes) if covered else None,
        "outputs_match": wrong is None and reference_wrong is None,
        "max_relative_error": error,
        "reference": workload.reference_name or None,
        "reference_relative_error": reference_error,
        "wrong_records": replaced,  # tasks whose best record computed something else (now failed in the store)
        "compile_s": round(compile_s, 2),
        "threads": threads,
        "output": output,
    }


def _correct_records(store: RecordStore, tasks: list, target: Any) -> tuple[dict[str, str], list[str]]:
    """Each task's best record that passes the check on its own (task id -> key), and the names of the tasks
    whose best record did not (now marked failed in the store)."""
    from tunecore.check import verify_best
    from tunecore.measure.local import LocalMeasurer

    chosen, replaced = {}, []
    measurer = LocalMeasurer(target)
    try:
        for task in tasks:
            report = verify_best(store, task, measurer)
            if report["best"] is not None:
                chosen[task.task_id] = report["best"]
            if report["wrong"]:
                replaced.append(task.name)
    finally:
        measurer.close()
    return chosen, replaced
