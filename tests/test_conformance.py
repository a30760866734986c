"""Every registered component passes its role's conformance suite."""

import pytest

from tunecore.registry import Registry
from tunecore.testing import CostModelConformance, MeasurerConformance, RecordStoreConformance, SearchPolicyConformance

REGISTRY = Registry()
# Settings under which each component is reproducible from its seed (the suites check that) and quick.
OPTIONS = {"ansor": {"population": 48, "iterations": 2}, "xgb": {"min_data": 4}, "transfer": {"per_donor": 8}}


# What this repository ships (core + plugins/): a component that is not installed fails here instead of
# silently dropping out of the suites below.
SHIPPED = {"search": {"random", "ansor", "transfer"}, "cost_model": {"none", "xgb"}, "store": {"sqlite", "memory"},
           "measurer": {"local"}}


@pytest.mark.parametrize("role", sorted(SHIPPED))
def test_every_shipped_component_is_installed(role):
    assert SHIPPED[role] <= set(REGISTRY.names(role)), f"not installed: {SHIPPED[role] - set(REGISTRY.names(role))}"


class TestSearchPolicies(SearchPolicyConformance):
    options_by_name = OPTIONS

    @pytest.fixture(params=REGISTRY.names("search"))
    def component_name(self, request):
        return request.param


class TestCostModels(CostModelConformance):
    options_by_name = OPTIONS

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
