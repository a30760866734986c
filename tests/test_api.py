"""The Python API as the user guide shows it: what it refuses and what it accepts, as the command line does."""

import re

import pytest

from tunecore.api import TuneConfig, components, tune
from tunecore.errors import UsageError


@pytest.mark.parametrize("options, fragment", [
    ({"serach": {"population": 8}}, "options['serach']: expected a role"),
    ({"ansor.population": 64}, "options['ansor.population']: expected a role"),
    ({"search": 64}, "options['search'] must be a dict"),
])
def test_options_the_api_cannot_mean_are_one_line_errors(options, fragment):
    with pytest.raises(UsageError, match=re.escape(fragment)):
        tune("op:matmul-64", trials=1, store="memory:", options=options)


def test_options_of_the_runs_components_are_taken():
    with pytest.raises(UsageError, match="unknown option"):  # reaches the component, which refuses the key
        tune("op:matmul-64", trials=1, store="memory:", options={"random": {"no_such_key": 1}})


def test_components_takes_a_target_as_the_command_line_does():
    config = TuneConfig("op:matmul-64", trials=1, store="memory:")
    with components("llvm", config) as (search, cost_model, store, measurer):
        assert (search.name, cost_model.name) == ("random", "none") and store.runs() == []


def test_a_cost_model_the_search_never_asks_is_a_note():
    from tunecore.api import notes

    assert notes(TuneConfig("op:matmul-64", search="random", cost_model="none")) == []
    (note,) = notes(TuneConfig("op:matmul-64", search="random", cost_model="xgb"))
    assert "search 'random' does not use a cost model" in note


def test_library_errors_name_parameters_not_flags(tmp_path):
    from tunecore.dataset.collect import CollectPlan, collect

    with pytest.raises(UsageError, match="^per_task must be >= 1$"):
        collect(str(tmp_path / "d.parquet"), CollectPlan(["op:matmul-64"], per_task=0))
    with pytest.raises(UsageError, match="^trials must be >= 0$"):
        tune("op:matmul-64", trials=-1, store="memory:")
