"""The hooks a tunecore plugin can implement.

A plugin is a module (found through the entry-point group ``tunecore``) with functions decorated by
``tunecore.hookimpl`` whose names are the hooks below. The core's built-ins use the same hooks.

Registration hooks are called once when the registry is built (at the first command that needs a
component). Lifecycle hooks are called by the tuning loop, in the order: ``tunecore_on_run_start``,
then per round ``tunecore_on_measured`` and ``tunecore_on_results``, then ``tunecore_on_run_end``.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, Callable, Sequence

import pluggy

if TYPE_CHECKING:
    from tunecore.data import Candidate, MeasureResult, Record, Task
    from tunecore.roles import Builder, CostModel, Measurer, Profiler, RecordStore, Runner, SearchPolicy

hookspec = pluggy.HookspecMarker("tunecore")
hookimpl = pluggy.HookimplMarker("tunecore")


@hookspec
def tunecore_register_search_policies(register: Callable[[type[SearchPolicy]], None]) -> None:
    """Register search policy classes: call ``register(cls)`` for each.

    The class's ``name`` attribute is what users pass to ``--search``.
    """


@hookspec
def tunecore_register_cost_models(register: Callable[[type[CostModel]], None]) -> None:
    """Register cost model classes (selected with ``--cost-model``)."""


@hookspec
def tunecore_register_record_stores(register: Callable[[type[RecordStore]], None]) -> None:
    """Register record store classes (selected with ``--store NAME:LOCATION``)."""


@hookspec
def tunecore_register_measurers(register: Callable[[type[Measurer]], None]) -> None:
    """Register measurer classes (selected with ``--measurer``)."""


@hookspec
def tunecore_register_builders(register: Callable[[type[Builder]], None]) -> None:
    """Register measurer parts that build candidates (selected with ``-O measurer.builder=NAME``)."""


@hookspec
def tunecore_register_runners(register: Callable[[type[Runner]], None]) -> None:
    """Register measurer parts that time built candidates on a device (``-O measurer.runner=NAME``)."""


@hookspec
def tunecore_register_profilers(register: Callable[[type[Profiler]], None]) -> None:
    """Register profilers, which add metrics of a built candidate where it runs (``-O measurer.profilers=[NAME]``)."""


@hookspec
def tunecore_register_commands(register: Callable[..., argparse.ArgumentParser]) -> None:
    """Add subcommands to ``tunecore``: ``parser = register(name, handler, help="...")`` for each.

    ``parser`` is the subcommand's ``argparse.ArgumentParser``: add its arguments to it.
    ``handler(args: argparse.Namespace) -> int`` runs the command and returns its exit code; raise
    ``tunecore.errors.UsageError`` for a mistake of the user's (one line, exit code 2). A name that
    another distribution registered already is refused, naming both. Called every time ``tunecore``
    starts, so import heavy modules inside ``handler``, not at the top of the plugin module.
    """


@hookspec
def tunecore_on_run_start(run: dict[str, Any], tasks: Sequence[Task]) -> None:
    """A run starts: ``run`` holds its settings and id, ``tasks`` the tasks it will tune."""


@hookspec
def tunecore_on_measured(task: Task, candidates: Sequence[Candidate], results: Sequence[MeasureResult]) -> None:
    """Candidates were measured and are about to be stored.

    The one hook that may change data: add entries to ``result.profile`` and they are stored beside the
    latency. The built artifacts are gone by now; metrics that need the program (hardware counters) come
    from a ``Profiler``, which the runner calls while it has the artifact. Must not raise for a failure.
    """


@hookspec
def tunecore_on_results(task: Task, records: Sequence[Record]) -> None:
    """Records were committed to the store (successes and failures). Observe only."""


@hookspec
def tunecore_on_run_end(run: dict[str, Any], summary: dict[str, Any]) -> None:
    """A run ended (normally or by an error); ``summary`` is what ``tunecore run --json`` prints."""
