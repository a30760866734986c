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

# The core's own components; each plugin's tests (plugins/*/tests) run the suites on its components.
REGISTRY = Registry(new_plugin_manager(autoload=False))
BUILTIN = {"search": ["random"], "cost_model": ["none"], "store": ["memory", "sqlite"], "measurer": ["local"],
           "builder": ["local"], "runner": ["local"], "profiler": []}


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
        return request.param

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
