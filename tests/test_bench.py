"""`tunecore bench` and `tunecore report`: a tiny real matrix, its files, and resuming after an interruption."""

import json
import os

import pytest

from tunecore.api import TuneConfig
from tunecore.testing.cli import assert_one_line_exit_2, run_cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_tiny_matrix_writes_every_output_and_a_report(tmp_path):
    out = str(tmp_path / "m")
    result = run_cli("bench", "--model", "op:matmul-64", "--search", "random", "--cost-model", "none",
                     "--trials", "8", "--seeds", "2", "--out", out)
    assert result.returncode == 0, result.stderr

    results = json.load(open(os.path.join(out, "results.json")))
    assert results["format"] == "tunecore-bench" and results["trials"] == 8
    env = results["environment"]
    assert env["cores"] == os.cpu_count() and env["target"]["kind"] == "llvm"
    assert env["versions"]["apache-tvm"] == "0.27.0.post1"
    assert "tunecore" in {p["distribution"] for p in env["plugins"]}
    assert set(results["cells"]) == {"op:matmul-64 | random | none | seed 0", "op:matmul-64 | random | none | seed 1"}
    for cell in results["cells"].values():
        assert cell["status"] == "finished" and cell["error"] is None
        assert cell["trials_total"] == 8
        assert os.path.exists(os.path.join(out, cell["store"]))
        curve = cell["curve"]
        assert curve["trials"][-1] == 8 and len(curve["trials"]) == len(curve["seconds"]) == len(curve["best_s"])
        assert curve["best_s"] == sorted(curve["best_s"], reverse=True)  # best so far never gets worse
        assert curve["seconds"] == sorted(curve["seconds"]) and curve["seconds"][-1] > 0
        assert curve["best_s"][-1] == pytest.approx(cell["tasks"][0]["best_latency_s"])

    md = open(os.path.join(out, "results.md")).read()
    assert "| op:matmul-64 | random | none | 0 | finished | 8 (0) |" in md
    assert "| op:matmul-64 | random+none | 2 |" in md
    plots = sorted(os.listdir(os.path.join(out, "plots")))
    assert plots == ["best_vs_seconds-op_matmul-64.png", "best_vs_trials-op_matmul-64.png"]
    for name in plots:
        with open(os.path.join(out, "plots", name), "rb") as f:
            assert f.read(8) == PNG_MAGIC

    report = run_cli("report", out)
    assert report.returncode == 0, report.stderr
    page = open(os.path.join(out, "report.html")).read()
    assert page.count("data:image/png;base64,") == 2 and "<table>" in page and "random+none" in page
    assert "src=\"http" not in page and "href=" not in page  # self-contained


def test_an_interrupted_matrix_resumes_without_measuring_again(tmp_path):
    from tunecore.experiments import matrix
    from tunecore.store.sqlite import SqliteStore

    out = str(tmp_path / "m")
    cells = matrix.plan(["op:matmul-64"], ["random"], ["none"], seeds=2)
    rounds = []

    def interrupt_in_second_cell(report):
        rounds.append(report)
        if len(rounds) == 3:  # cell 0 took rounds 1-2 (16 trials, rounds of 8); stop after cell 1's first
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        matrix.run_matrix(cells, TuneConfig("", trials=16), out=out, on_round=interrupt_in_second_cell)
    results = matrix.load_results(out)
    assert list(results["cells"]) == [cells[0].id]  # the interrupted cell is not recorded as done

    def records(cell):
        store = SqliteStore(os.path.join(out, cell.store_path))
        try:
            (task,) = store.get_tasks()
            return store.records(task.task_id), store.runs()
        finally:
            store.close()

    before, _ = records(cells[1])
    assert len(before) == 8

    skipped = []
    matrix.run_matrix(cells, TuneConfig("", trials=16), out=out, on_cell=lambda i, c, s: skipped.append(s))
    assert skipped == [True, False]
    after, runs = records(cells[1])
    assert len(after) == 16 and len({r.key for r in after}) == 16
    assert {(r.key, r.measured_at) for r in before} <= {(r.key, r.measured_at) for r in after}  # kept, not redone
    assert [r["summary"]["trials_measured"] for r in runs] == [8, 8]
    first_cell_records, first_cell_runs = records(cells[0])
    assert len(first_cell_records) == 16 and len(first_cell_runs) == 1  # the finished cell was not run again
    cell = matrix.load_results(out)["cells"][cells[1].id]
    assert cell["status"] == "finished" and cell["curve"]["trials"][-1] == 16


def test_bad_matrix_input_is_one_line_and_exit_2(tmp_path):
    out = str(tmp_path / "m")
    assert_one_line_exit_2(run_cli("bench", "--model", "op:matmul-64", "--search", "random,nosuch", "--trials", "4",
                                   "--out", out), "nosuch")
    assert not os.path.exists(os.path.join(out, "results.json"))
    assert_one_line_exit_2(run_cli("bench", "--model", "op:matmul-64,", "--trials", "4", "--out", out), "--model")
    assert_one_line_exit_2(run_cli("bench", "--model", "op:matmul-64", "--trials", "4", "--seeds", "0", "--out", out),
                           "--seeds")
    assert_one_line_exit_2(run_cli("report", str(tmp_path / "nothing")), "results.json")
    os.makedirs(out)
    with open(os.path.join(out, "results.json"), "w") as f:
        f.write("{not json")
    assert_one_line_exit_2(run_cli("report", out), "not a tunecore bench result")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"format": "tunecore-bench", "cells": {}, "settings": {"measurer": "rpc"}}, f)
    assert_one_line_exit_2(run_cli("bench", "--model", "op:matmul-64", "--trials", "4", "--out", out),
                           "other settings", "measurer", "another --out")


def test_a_network_cell_is_compiled_and_timed_end_to_end(tmp_path):
    from tunecore import report
    from tunecore.experiments import matrix

    out = str(tmp_path / "m")
    (cell,) = matrix.plan(["zoo:bert-tiny"], ["random"], ["none"], seeds=1)
    results = matrix.run_matrix([cell], TuneConfig("", trials=42), out=out)  # 14 tasks
    entry = results["cells"][cell.id]
    assert entry["status"] == "finished" and entry["trials_total"] == 42
    e2e = entry["e2e"]
    assert e2e["outputs_match"] and e2e["tasks_tuned"] == e2e["tasks_total"] == 14
    assert results["untuned"]["zoo:bert-tiny"] == e2e["untuned_latency_ms"]
    assert e2e["speedup"] == pytest.approx(e2e["untuned_latency_ms"] / e2e["latency_ms"])
    # a network's curve is the estimate: sum over tasks of weight x best, defined once every task has a success
    assert entry["curve"]["trials"][-1] == 42
    assert entry["curve"]["best_s"][-1] * 1e3 == pytest.approx(entry["estimated_latency_ms"])
    # given each task's latency before tuning, the curve starts at the first trial and ends at the same estimate
    from tunecore.store.sqlite import SqliteStore

    store = SqliteStore(os.path.join(out, cell.store_path))
    weights = {t.task_id: t.weight for t in store.get_tasks()}
    store.close()
    started = matrix.curve(os.path.join(out, cell.store_path), run_key=cell.id, start_s=dict.fromkeys(weights, 1.0))
    assert started["trials"][0] == 1
    assert sum(weights.values()) - max(weights.values()) < started["best_s"][0] < sum(weights.values())
    assert started["best_s"] == sorted(started["best_s"], reverse=True)
    assert started["best_s"][-1] == pytest.approx(entry["curve"]["best_s"][-1])
    assert "| zoo:bert-tiny | random | none | 0 | finished | 42 (0) |" in report.markdown(results)


def test_a_search_that_asks_no_cost_model_gets_one_cell_not_one_per_cost_model():
    from tunecore.experiments import matrix

    cells = matrix.plan(["op:matmul-64"], ["random", "ansor"], ["none", "xgb"], seeds=1, without_cost_model=["random"])
    assert [(c.search, c.cost_model) for c in cells] == [("random", "none"), ("ansor", "none"), ("ansor", "xgb")]
