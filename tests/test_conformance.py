"""Every registered component passes its role's conformance suite."""

import pytest

from tunecore.plugins import new_plugin_manager
from tunecore.registry import Registry
from tunecore.testing import (
    BuilderConformance,
    CostModelConformance,
    MeasurerConformance,
    RecordStoreConformance,
    RunnerConformance,
    SearchPolicyConformance,
)
from tunecore.testing.fleet import Fleet

# The core's own components; each plugin's tests (plugins/*/tests) run the suites on its components.
REGISTRY = Registry(new_plugin_manager(autoload=False))
BUILTIN = {"search": ["random"], "cost_model": ["none"], "store": ["memory", "postgresql", "sqlite"],
           "measurer": ["local"],
           "builder": ["dask", "local"], "runner": ["local", "rpc"], "profiler": []}


@pytest.mark.parametrize("role", sorted(BUILTIN))
def test_the_core_registers_its_components_through_the_hooks(role):
    assert REGISTRY.names(role) == BUILTIN[role]


class TestSearchPolicies(SearchPolicyConformance):
    @pytest.fixture(params=REGISTRY.names("search"))
    def component_name(self, request):
        return request.param


class TestCostModels(CostModelConformance):
    @pytest.fixture(params=REGISTRY.names("cost_model"))
    def component_name(self, request):
        return request.param


class TestRecordStores(RecordStoreConformance):
    @pytest.fixture(params=REGISTRY.names("store"))
    def component_name(self, request):
        if request.param == "postgresql":
            self.postgres = request.getfixturevalue("postgres")
        return request.param

    def make_store(self, name, location):
        if name == "postgresql":  # one database per test, the same one for the same location
            import hashlib

            database = "t" + hashlib.sha256(location.encode()).hexdigest()[:16]
            if database not in self.made:
                self.made.add(database)
                return super().make_store(name, self.postgres.database(database))
            return super().make_store(name, f"{self.postgres.url}/{database}")
        return super().make_store(name, location)

    made: set = set()

    def test_survives_reopen(self, component_name, task, tmp_path):
        if component_name == "memory":
            pytest.skip("the memory store forgets on close by design")
        super().test_survives_reopen(component_name, task, tmp_path)


class TestLocalMeasurer(MeasurerConformance):
    name = "local"


class TestLocalBuilder(BuilderConformance):
    name = "local"


class TestLocalRunner(RunnerConformance):
    name = "local"


class TestDaskBuilder(BuilderConformance):
    name = "dask"
    options = {"build_workers": 2}


@pytest.fixture(scope="module")
def fleet():
    fleet = Fleet(key="conformance", servers=2)
    yield fleet
    fleet.close()


class TestRpcRunner(RunnerConformance):
    name = "rpc"

    @pytest.fixture(scope="class")
    @classmethod
    def component(cls, task, fleet):
        runner = REGISTRY.get("runner", "rpc")(task.target, tracker=fleet.address, key=fleet.key)
        yield runner
        runner.close()


class TestRpcMeasurer(MeasurerConformance):
    """The local measurer with the dask builder and the rpc runner: every part remote at once."""

    name = "local"
    measures_this_host = False

    @pytest.fixture(scope="class")
    @classmethod
    def component(cls, task, fleet):
        from tunecore.measure.local import LocalMeasurer

        measurer = LocalMeasurer(task.target, builder="dask", build_workers=2, **fleet.options())
        yield measurer
        measurer.close()

