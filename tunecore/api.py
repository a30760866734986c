"""The Python API, and what ``tunecore run`` and ``tunecore bench`` share: from names to working components.

    from tunecore import api
    summary = api.tune(api.TuneConfig("op:matmul-512", trials=64, search="random", store="memory:"))
    summary = api.tune("op:matmul-512", trials=64, store="memory:")  # the same, fields as keywords
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
from typing import TYPE_CHECKING, Any, Callable, Iterator

from tunecore.errors import UsageError
from tunecore.options import check_option_scopes, options_for
from tunecore.registry import Registry
from tunecore.roles import CostModel, Measurer, RecordStore, SearchPolicy
from tunecore.store import DEFAULT_STORE, parse_store_url

if TYPE_CHECKING:
    from tunecore.summary import RunSummary
    from tunecore.tuner import RoundReport


@dataclasses.dataclass
class TuneConfig:
    """One tuning run, as ``tunecore run`` takes it; ``tunecore bench`` makes one per cell."""

    model: str  # zoo:<name> | op:<name> | a path to .onnx, to file.py:factory or to a Relax module .json
    input_shapes: dict[str, tuple[int, ...]] | None = None  # --input-shape: an ONNX or PyTorch model's inputs
    layout: str | None = None  # --layout: the layout a network's convs are tuned in (None: nchw, tunecore.layouts)
    winograd: bool = False  # --winograd: Winograd kernels as candidates for 3x3 stride-1 convs (tunecore.winograd)
    # the workload's budget, whichever ends first, earlier runs included: records its runs put in the
    # store, seconds its runs tuned (None: no limit of that kind; one of the two must be given)
    trials: int | None = None
    time_budget: float | None = None
    target: str | None = None  # as a user types it (llvm, cuda, a JSON dict, a tag); None: llvm
    search: str = "random"
    then: str | None = None  # per task, the search policy that spends what ``search`` leaves
    cost_model: str = "none"
    measurer: str = "local"
    store: str | None = None  # a --store value; None: tunecore.db
    seed: int = 0
    options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # role or name -> key -> value
    scheduler: str = "gradient"
    round_size: int | None = None  # None: sized by budget and the measurer's capacity
    # Runs of the same model and run key share a budget; a bench cell's key is its id, so cells that
    # tune one model into one store do not use up each other's trials.
    run_key: str | None = None


def open_store(url: str | None, registry: Registry | None = None, *, create: bool = True) -> RecordStore:
    """The store a ``--store`` value names. With ``create=False`` a missing file is a UsageError."""
    registry = registry or Registry.shared()
    name, location = parse_store_url(url, registry.names("store"))
    if not create and name == "sqlite" and not os.path.exists(location):
        raise UsageError(f"--store {url or DEFAULT_STORE}: no such store (run `tunecore run` first, or pass --store)")
    return registry.get("store", name)(location)


def notes(config: TuneConfig, registry: Registry | None = None) -> list[str]:
    """What a user should know about a run before it starts, e.g. a cost model its search never asks."""
    registry = registry or Registry.shared()
    registry.get("cost_model", config.cost_model)  # an unknown name: its one-line error, before any note
    out = []
    for search in filter(None, [config.search, config.then]):
        if config.cost_model != "none" and not registry.get("search", search).uses_cost_model:
            out.append(f"search '{search}' does not use a cost model: --cost-model {config.cost_model} is trained "
                       "for nothing (--cost-model none runs the same search)")
    return out


def _construct(registry: Registry, role: str, name: str, /, *args: Any, **kwargs: Any) -> Any:
    cls = registry.get(role, name)
    try:
        return cls(*args, **kwargs)
    except TypeError as error:  # an unknown --option key lands here
        raise UsageError(f"{role.replace('_', ' ')} '{name}': {error}") from None


@contextlib.contextmanager
def components(
    target: Any, config: TuneConfig, registry: Registry | None = None
) -> Iterator[tuple[SearchPolicy, CostModel, RecordStore, Measurer]]:
    """Construct the four components ``config`` names (refusing impossible combinations and options no component
    of it takes first) and close them afterwards. ``target``: a TVM target or what ``--target`` takes ("llvm").

    With ``config.then``, the search policy is ``search`` followed per task by ``then`` (see tunecore.chain);
    ``search.KEY`` options go to ``search``, ``then`` gets only its own ``NAME.KEY`` options.
    """
    from tunecore.targets import resolve_target

    registry = registry or Registry.shared()
    c = config
    target = resolve_target(target) if isinstance(target, str) else target
    check_option_scopes(c.options, [c.search, *([c.then] if c.then else []), c.cost_model, c.measurer])
    registry.check_target(target, search=c.search, cost_model=c.cost_model, measurer=c.measurer)
    if c.then:
        registry.check_target(target, search=c.then)
    opened: list[Any] = []
    try:
        store = open_store(c.store, registry)
        opened.append(store)
        cost_model = _construct(registry, "cost_model", c.cost_model, seed=c.seed,
                                **options_for(c.options, "cost_model", c.cost_model))
        opened.append(cost_model)
        search = _construct(registry, "search", c.search, cost_model=cost_model, store=store, seed=c.seed,
                            **options_for(c.options, "search", c.search))
        opened.append(search)
        if c.then:
            from tunecore.chain import SearchChain

            follower = _construct(registry, "search", c.then, cost_model=cost_model, store=store, seed=c.seed,
                                  **c.options.get(c.then, {}))
            opened[-1] = search = SearchChain(search, follower)  # closes both
        measurer_options = options_for(c.options, "measurer", c.measurer)
        wanted = cost_model.profilers(target)
        if wanted:  # the cost model learns from profiles: the measurer must take them
            chosen = measurer_options.get("profilers", [])
            chosen = [chosen] if isinstance(chosen, str) else list(chosen)
            measurer_options["profilers"] = list(dict.fromkeys(chosen + list(wanted)))
        measurer = _construct(registry, "measurer", c.measurer, target, **measurer_options)
        opened.append(measurer)
        yield search, cost_model, store, measurer
    finally:
        for component in reversed(opened):
            component.close()


def tune(
    config: TuneConfig | str,
    *,
    on_round: Callable[[RoundReport], None] | None = None,
    on_tasks: Callable | None = None,
    **fields: Any,
) -> RunSummary:
    """Tune a workload until the store holds ``config.trials`` records for its tasks; returns the run summary.

    ``config`` may also be a model name, with the other ``TuneConfig`` fields as keywords.
    """
    from tunecore.targets import resolve_target
    from tunecore.tuner import Tuner
    from tunecore.workloads import extract_tasks, load_workload

    if isinstance(config, str):
        config = TuneConfig(config, **fields)
    elif fields:
        config = dataclasses.replace(config, **fields)
    if config.trials is None and config.time_budget is None:
        raise UsageError("give trials (--trials), a time budget (--time-budget) or both")
    if config.trials is not None and config.trials < 0:
        raise UsageError("trials must be >= 0")
    if config.time_budget is not None and config.time_budget <= 0:
        raise UsageError("time_budget must be > 0")
    tvm_target = resolve_target(config.target)
    registry = Registry.shared()
    if config.winograd and tvm_target.kind.name == "llvm" and _times_cold(registry, config):
        # Winograd's transformed weights are 4x the filter: timed warm, its kernels win where inside the network,
        # their weights coming from memory, they lose (bench/results/e2e_gap-spr-resnet18-winograd-warm.md), so
        # both sides of a conv are timed cold unless the user says otherwise (-O measurer.cpu_cache_flush=false)
        cold = {"cpu_cache_flush": True, "repeat": 10, **config.options.get("measurer", {})}
        config = dataclasses.replace(config, options={**config.options, "measurer": cold})
    with components(tvm_target, config, registry) as (search, cost_model, store, measurer):
        def tuner() -> Tuner:
            return Tuner(search=search, cost_model=cost_model, store=store, measurer=measurer, seed=config.seed,
                         scheduler=config.scheduler, round_size=config.round_size, plugin_manager=registry.pm,
                         on_round=on_round)

        choice = None
        if config.layout == AUTO:
            choice = _choose_layout(config, tvm_target, tuner, store, search.name, on_tasks)
        workload = load_workload(config.model, config.input_shapes, choice["layout"] if choice else config.layout,
                                 config.winograd)
        tasks = extract_tasks(workload, tvm_target)
        if on_tasks:
            on_tasks(tasks)
        info = _run_info(config, workload, tvm_target, search.name)
        if choice:
            info["layout_choice"] = choice
        summary = tuner().tune(tasks, config.trials, info, time_budget=config.time_budget)
        if choice:
            summary["layout_choice"] = choice  # type: ignore[typeddict-unknown-key]
        return summary


def _times_cold(registry: Registry, config: TuneConfig) -> bool:
    """Whether the measurer takes ``cpu_cache_flush``: itself, or, where it is a builder and a runner (``local``),
    its runner."""
    measurer = registry.get("measurer", config.measurer)
    if "runner" in inspect.signature(measurer).parameters:
        runner = options_for(config.options, "measurer", config.measurer).get("runner", "local")
        measurer = registry.get("runner", runner)
    return "cpu_cache_flush" in inspect.signature(measurer).parameters


def _run_info(config: TuneConfig, workload: Any, target: Any, search_name: str) -> dict[str, Any]:
    from tunecore.tvmjson import target_to_json

    info = {"model": workload.name, "layout": workload.layout, "winograd": workload.winograd,
            "target": target_to_json(target), "search": search_name,
            "cost_model": config.cost_model, "measurer": config.measurer, "store": config.store or DEFAULT_STORE,
            "options": config.options}
    if config.run_key is not None:
        info["run_key"] = config.run_key
    return info


AUTO = "auto"
PROBE_SHARE = 0.1  # of the budget, per layout, that ``--layout auto`` spends before it chooses


def _choose_layout(config: TuneConfig, target: Any, tuner: Callable[[], Any], store: RecordStore,
                   search_name: str, on_tasks: Callable | None) -> dict[str, Any]:
    """``--layout auto``: tune the network a little in each layout the target can use (PROBE_SHARE of the budget
    each, at least a round of four trials per task), build each with what was found and time the builds in
    alternating passes; the fastest is the choice (what was measured is returned). A network whose tasks no
    layout changes (no 2-D conv) is left as it is, unmeasured."""
    import math

    from tunecore.compile import Runnable, best_database, build, choose_winograd, passes_together, random_inputs
    from tunecore.layouts import DEFAULT, LAYOUTS
    from tunecore.targets import use_target_threads
    from tunecore.winograd import LAYOUTS as WINOGRAD_LAYOUTS
    from tunecore.workloads import extract_tasks, load_workload

    candidates = [layout for layout in LAYOUTS if layout != "nchwc" or target.kind.name == "llvm"]
    workloads = {layout: load_workload(config.model, config.input_shapes, layout,
                                       config.winograd and layout in WINOGRAD_LAYOUTS)  # where the layout has it
                 for layout in candidates}
    if not workloads[DEFAULT].is_network:
        raise UsageError(f"--layout auto: {config.model} is a single operator; layouts apply to networks")
    tasks = {layout: extract_tasks(w, target) for layout, w in workloads.items()}
    plain = {t.workload_hash for t in tasks[DEFAULT]}
    if all({t.workload_hash for t in ts} == plain for ts in tasks.values()):
        return {"layout": DEFAULT, "why": "no layout changes its tasks (no 2-D conv)"}
    use_target_threads(target)
    runnables, probes = {}, {}
    for layout, workload in workloads.items():
        # a round of the smallest size (4) on every task, so that no build is compared with an untuned kernel
        least = 4 * len(tasks[layout])
        share = None if config.trials is None else math.ceil(PROBE_SHARE * config.trials)
        trials = least if share is None else min(config.trials, max(least, share))
        seconds = None if config.time_budget is None else PROBE_SHARE * config.time_budget
        info = _run_info(config, workload, target, search_name)
        if on_tasks:
            on_tasks(tasks[layout])
        summary = tuner().tune(tasks[layout], trials, dict(info, layout_probe=True), time_budget=seconds)
        choose_winograd(workload, store, tasks[layout])
        database, covered = best_database(store, tasks[layout], target)
        runnables[layout] = Runnable(build(workload, target, database), workload, target, random_inputs(workload))
        probes[layout] = {"trials": summary["trials_total"], "tasks": len(tasks[layout]), "tasks_tuned": covered}
    samples = passes_together({layout: (lambda r=r: r.time(1, min_repeat_ms=300)) for layout, r in runnables.items()},
                              5)
    for layout, times in samples.items():
        probes[layout]["latency_ms"] = round(sorted(times)[len(times) // 2] * 1e3, 4)
    chosen = min(probes, key=lambda layout: probes[layout]["latency_ms"])
    return {"layout": chosen, "why": "fastest build after probing each layout", "probes": probes}
