"""The Python API, and what ``tunecore run`` and ``tunecore bench`` share: from names to working components.

    from tunecore import api
    summary = api.tune(api.TuneConfig("op:matmul-512", trials=64, search="random", store="memory:"))
    summary = api.tune("op:matmul-512", trials=64, store="memory:")  # the same, fields as keywords
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import TYPE_CHECKING, Any, Callable, Iterator

from tunecore.errors import UsageError
from tunecore.options import options_for
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
    """Construct the four components ``config`` names (refusing impossible combinations first)
    and close them afterwards.

    With ``config.then``, the search policy is ``search`` followed per task by ``then`` (see tunecore.chain);
    ``search.KEY`` options go to ``search``, ``then`` gets only its own ``NAME.KEY`` options.
    """
    registry = registry or Registry.shared()
    c = config
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
    from tunecore.tvmjson import target_to_json
    from tunecore.workloads import extract_tasks, load_workload

    if isinstance(config, str):
        config = TuneConfig(config, **fields)
    elif fields:
        config = dataclasses.replace(config, **fields)
    if config.trials is None and config.time_budget is None:
        raise UsageError("give --trials, --time-budget or both")
    if config.trials is not None and config.trials < 0:
        raise UsageError("--trials must be >= 0")
    if config.time_budget is not None and config.time_budget <= 0:
        raise UsageError("--time-budget must be > 0")
    tvm_target = resolve_target(config.target)
    registry = Registry.shared()
    with components(tvm_target, config, registry) as (search, cost_model, store, measurer):
        workload = load_workload(config.model, config.input_shapes, config.layout)
        tasks = extract_tasks(workload, tvm_target)
        if on_tasks:
            on_tasks(tasks)
        tuner = Tuner(search=search, cost_model=cost_model, store=store, measurer=measurer, seed=config.seed,
                      scheduler=config.scheduler, round_size=config.round_size, plugin_manager=registry.pm,
                      on_round=on_round)
        info = {"model": workload.name, "layout": workload.layout, "target": target_to_json(tvm_target),
                "search": search.name,
                "cost_model": config.cost_model, "measurer": config.measurer, "store": config.store or DEFAULT_STORE,
                "options": config.options}
        if config.run_key is not None:
            info["run_key"] = config.run_key
        return tuner.tune(tasks, config.trials, info, time_budget=config.time_budget)
