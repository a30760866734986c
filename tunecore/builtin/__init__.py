"""The core's own components, registered through the same hooks as any plugin (see plugins.DEFAULT_PLUGINS)."""

from tunecore.hookspecs import hookimpl


@hookimpl
def tunecore_register_search_policies(register):
    from tunecore.builtin.random_search import RandomSearch

    register(RandomSearch)


@hookimpl
def tunecore_register_cost_models(register):
    from tunecore.builtin.none_model import NoneModel

    register(NoneModel)


@hookimpl
def tunecore_register_record_stores(register):
    from tunecore.store.postgres import PostgresStore
    from tunecore.store.sqlite import MemoryStore, SqliteStore

    register(SqliteStore)
    register(MemoryStore)
    register(PostgresStore)


@hookimpl
def tunecore_register_measurers(register):
    from tunecore.measure.local import LocalMeasurer

    register(LocalMeasurer)


@hookimpl
def tunecore_register_builders(register):
    from tunecore.measure.dask_builder import DaskBuilder
    from tunecore.measure.local import LocalBuilder

    register(LocalBuilder)
    register(DaskBuilder)


@hookimpl
def tunecore_register_runners(register):
    from tunecore.measure.local import LocalRunner
    from tunecore.measure.rpc import RpcRunner

    register(LocalRunner)
    register(RpcRunner)


@hookimpl
def tunecore_register_commands(register):
    from tunecore.cli import bench, compile, costmodel, dataset, fleet, plugins, predict, records, run, tasks

    for command in (run, tasks, records, compile, predict, bench, dataset, costmodel, fleet, plugins):
        command.add_commands(register)
