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


def test_run_help_shows_the_defaults_and_what_a_target_can_be():
    from tunecore.testing.cli import run_cli

    text = " ".join(run_cli("run", "--help").stdout.split())
    for fragment in ("(default: random;", "(default: none;", "(default: local;", "seed of every random choice",
                     "TVM target tag, e.g. nvidia/nvidia-h100"):
        assert fragment in text, fragment


def test_a_seeded_mutation_is_reproducible(matmul_task):
    """DesignSpace.mutate, the public way to mutate a trace (what ansor's evolution uses)."""
    from tunecore.interfaces import Candidate, DesignSpace
    from tunecore.testing import sample_candidates

    (parent,) = sample_candidates(matmul_task, 1)
    space = DesignSpace(matmul_task, seed=0)
    children = {}
    for mutator, _ in space.mutators():
        keys = [Candidate.from_schedule(matmul_task, sch).key if sch is not None else None
                for sch in (space.mutate(parent.trace, mutator, seed) for seed in (11, 11, 12))]
        assert keys[0] == keys[1], mutator  # the same seed, the same program
        children[str(mutator)] = keys
    assert any(k[0] not in (None, parent.key) for k in children.values())  # some mutation changes the program
