"""From names to working components: what ``tunecore run`` and the Python API share.

    import tunecore.session as ts
    summary = ts.tune("op:matmul-512", trials=64, search="random", store="memory:")
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

from tunecore.errors import UsageError
from tunecore.roles import CostModel, Measurer, RecordStore, SearchPolicy
from tunecore.options import options_for
from tunecore.registry import Registry
from tunecore.store import DEFAULT_STORE, parse_store_url


def open_store(url: str | None, registry: Registry | None = None, *, create: bool = True) -> RecordStore:
    """The store a ``--store`` value names. With ``create=False`` a missing file is a UsageError."""
    registry = registry or Registry()
    name, location = parse_store_url(url, registry.names("store"))
    if not create and name == "sqlite" and not os.path.exists(location):
        raise UsageError(f"--store {url or DEFAULT_STORE}: no such store (run `tunecore run` first, or pass --store)")
    return registry.get("store", name)(location)


def _construct(registry: Registry, role: str, name: str, *args: Any, **kwargs: Any) -> Any:
    cls = registry.get(role, name)
    try:
        return cls(*args, **kwargs)
    except TypeError as error:  # an unknown --option key lands here
        raise UsageError(f"{role.replace('_', ' ')} '{name}': {error}") from None


@contextlib.contextmanager
def components(
    target: Any,
    *,
    search: str = "random",
    cost_model: str = "none",
    measurer: str = "local",
    store: str | None = None,
    seed: int = 0,
    options: dict[str, dict[str, Any]] | None = None,
    registry: Registry | None = None,
    then: str | None = None,
) -> Iterator[tuple[SearchPolicy, CostModel, RecordStore, Measurer]]:
    """Construct the four components (refusing impossible combinations first) and close them afterwards.

    With ``then``, the search policy is ``search`` followed per task by ``then`` (see tunecore.chain);
    ``search.KEY`` options go to ``search``, ``then`` gets only its own ``NAME.KEY`` options.
    """
    registry = registry or Registry()
    options = options or {}
    registry.check_target(target, search=search, cost_model=cost_model, measurer=measurer)
    if then:
        registry.check_target(target, search=then)
    opened: list[Any] = []
    try:
        record_store = open_store(store, registry)
        opened.append(record_store)
        model = _construct(registry, "cost_model", cost_model, seed=seed, **options_for(options, "cost_model", cost_model))
        opened.append(model)
        policy = _construct(registry, "search", search, cost_model=model, store=record_store, seed=seed,
                            **options_for(options, "search", search))
        opened.append(policy)
        if then:
            from tunecore.chain import SearchChain

            follower = _construct(registry, "search", then, cost_model=model, store=record_store, seed=seed,
                                  **options.get(then, {}))
            opened[-1] = policy = SearchChain(policy, follower)  # closes both
        runner = _construct(registry, "measurer", measurer, target, **options_for(options, "measurer", measurer))
        opened.append(runner)
        yield policy, model, record_store, runner
    finally:
        for component in reversed(opened):
            component.close()


def tune(
    model: str,
    *,
    trials: int,
    target: str | None = None,
    search: str = "random",
    cost_model: str = "none",
    measurer: str = "local",
    store: str | None = None,
    seed: int = 0,
    options: dict[str, dict[str, Any]] | None = None,
    scheduler: str = "gradient",
    round_size: int | None = None,
    on_round: Callable | None = None,
    on_tasks: Callable | None = None,
    run_info: dict[str, Any] | None = None,
    then: str | None = None,
) -> dict[str, Any]:
    """Tune a workload until the store holds ``trials`` records for its tasks; returns the run summary.

    ``run_info`` is kept with the run in the store (``tunecore bench`` marks its cells' runs with it).
    """
    from tunecore.targets import resolve_target
    from tunecore.tvmjson import target_to_json
    from tunecore.tuner import Tuner
    from tunecore.workloads import extract_tasks, load_workload

    if trials < 0:
        raise UsageError("--trials must be >= 0")
    tvm_target = resolve_target(target)
    registry = Registry()
    with components(tvm_target, search=search, cost_model=cost_model, measurer=measurer, store=store, seed=seed,
                    options=options, registry=registry, then=then) as (policy, cost, record_store, runner):
        workload = load_workload(model)
        tasks = extract_tasks(workload, tvm_target)
        if on_tasks:
            on_tasks(tasks)
        tuner = Tuner(search=policy, cost_model=cost, store=record_store, measurer=runner, seed=seed,
                      scheduler=scheduler, round_size=round_size, plugin_manager=registry.pm, on_round=on_round)
        info = {**(run_info or {}), "model": workload.name, "target": target_to_json(tvm_target), "search": policy.name,
                "cost_model": cost_model, "measurer": measurer, "store": store or DEFAULT_STORE, "options": options or {}}
        return tuner.tune(tasks, trials, info)
