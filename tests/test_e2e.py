"""Tune a whole network and compile it with its records, as a user would."""

import json

import pytest

from tunecore.testing.cli import run_cli


def _run_then_compile(model, trials, store, *options):
    run = run_cli("run", "--model", model, "--trials", str(trials), "--store", store, *options, "--json",
                  timeout=3000)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    compiled = run_cli("compile", "--model", model, "--store", store, "--json", timeout=3000)
    assert compiled.returncode == 0, compiled.stderr
    return summary, json.loads(compiled.stdout)


def test_bert_tiny_tunes_every_task_and_compiles(tmp_path):
    summary, report = _run_then_compile("zoo:bert-tiny", 42, str(tmp_path / "t.db"))
    assert summary["trials_measured"] == 42 and summary["errors"] == 0
    assert all(t["best_latency_s"] for t in summary["tasks"])
    assert report["tasks_tuned"] == report["tasks_total"] == 14
    assert report["outputs_match"] and report["max_relative_error"] <= 1e-3


@pytest.mark.slow
def test_resnet18_readme_example_ansor_xgb_at_150_trials_then_compile(tmp_path):
    """README.md's main example (`tunecore run --model zoo:resnet-18 --search ansor --cost-model xgb --trials 300`,
    then `tunecore compile --model zoo:resnet-18`) at half its budget."""
    summary, report = _run_then_compile("zoo:resnet-18", 150, str(tmp_path / "t.db"),
                                        "--search", "ansor", "--cost-model", "xgb")
    assert summary["search"] == "ansor" and summary["cost_model"] == "xgb"
    assert summary["trials_measured"] == 150 and all(t["best_latency_s"] for t in summary["tasks"])
    assert report["tasks_tuned"] == report["tasks_total"] == 22 and report["outputs_match"]


@pytest.fixture(scope="module")
def mobilenet_donors(tmp_path_factory):
    """A store with zoo:mobilenet-v2 tuned (ansor + xgb), as an earlier run leaves it: donors for transfer."""
    store = str(tmp_path_factory.mktemp("donors") / "donors.db")
    run = run_cli("run", "--model", "zoo:mobilenet-v2", "--search", "ansor", "--cost-model", "xgb", "--trials", "200",
                  "--store", store, "--json", timeout=3000)
    assert run.returncode == 0, run.stderr
    return store


@pytest.mark.slow
@pytest.mark.parametrize("search, cost_model", [("random", "none"), ("ansor", "xgb"), ("transfer", "cdmpp"),
                                                ("tlm", "none")])
def test_every_search_after_mobilenet_donors_tunes_resnet18_and_compiles_matching(search, cost_model, tmp_path,
                                                                                   mobilenet_donors):
    """Issue 34: whatever a search proposes, no wrong program becomes a best: each search's records compile into a
    build whose outputs match the untuned one (transfer + cdmpp is the user's example)."""
    import shutil
    import sqlite3

    store = str(tmp_path / "s.db")
    shutil.copy(mobilenet_donors, store)
    run = run_cli("run", "--model", "zoo:resnet-18", "--search", search, "--cost-model", cost_model, "--trials", "64",
                  "--store", store, "--json", timeout=3000)
    assert run.returncode == 0, run.stderr
    compiled = run_cli("compile", "--model", "zoo:resnet-18", "--store", store, "--json", timeout=3000)
    assert compiled.returncode == 0, compiled.stderr
    report = json.loads(compiled.stdout)
    assert report["outputs_match"] and report["wrong_records"] == [], report
    with sqlite3.connect(store) as db:  # every success of the run was checked
        unchecked = db.execute("SELECT COUNT(*) FROM records WHERE run_id = (SELECT MAX(run_id) FROM runs)"
                               " AND error IS NULL AND profile NOT LIKE '%check.max_relative_error%'").fetchone()[0]
    assert unchecked == 0
