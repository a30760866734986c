"""The command line as a user drives it: real TVM, real builds, tiny workloads."""

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from tunecore.data import Record
from tunecore.testing.cli import assert_one_line_exit_2, run_cli
from tunecore.testing.cli import cli_json as _json
from tunecore.testing.helpers import write_tiny_onnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_run_stores_records_and_resumes_with_the_difference(tmp_path):
    store = str(tmp_path / "t.db")
    first = _json(run_cli("run", "--model", "op:matmul-64", "--trials", "8", "--store", store, "--json"))
    assert first["trials_measured"] == 8 and first["trials_total"] == 8
    (task,) = first["tasks"]
    assert set(task) >= {"name", "weight", "flops", "trials", "best_latency_s"}  # keys a script reads (more may come)
    assert task["name"] == "matmul-64" and task["flops"] == 2 * 64**3 and task["best_latency_s"] > 0
    second = _json(run_cli("run", "--model", "op:matmul-64", "--trials", "12", "--store", store, "--json"))
    assert second["trials_measured"] == 4 and second["trials_total"] == 12
    again = _json(run_cli("run", "--model", "op:matmul-64", "--trials", "12", "--store", store, "--json"))
    assert again["trials_measured"] == 0

    listed = _json(run_cli("records", "list", "--store", store, "--json"))
    assert listed[0]["trials"] == 12 and listed[0]["model"] == "op:matmul-64"
    best = _json(run_cli("records", "best", "--store", store, "--json"))
    assert best[0]["latency_s"] == pytest.approx(second["tasks"][0]["best_latency_s"])
    with sqlite3.connect(store) as db:
        trials = [r[0] for r in db.execute("SELECT trial FROM records ORDER BY record_id")]
        assert trials == list(range(12))  # the trial index continues across resumed runs
        assert db.execute("SELECT COUNT(DISTINCT key) FROM records").fetchone()[0] == 12


def test_best_of_a_store_without_measured_records_says_so(tmp_path):
    store = str(tmp_path / "t.db")
    assert run_cli("run", "--model", "op:matmul-64", "--trials", "0", "--store", store).returncode == 0  # tasks only
    result = run_cli("records", "best", "--store", store, "--model", "op:matmul-64")
    assert result.returncode == 0, result.stderr
    assert "no task of model op:matmul-64 in the store has a measured record" in result.stdout
    assert _json(run_cli("records", "best", "--store", store, "--json")) == []


def test_records_best_and_list_read_no_records_and_list_counts_errors(tmp_path, monkeypatch, capsys):
    from tunecore import api
    from tunecore.cli import records

    path = str(tmp_path / "t.db")
    assert run_cli("run", "--model", "op:matmul-64", "--trials", "3", "--store", path).returncode == 0
    store = api.open_store(path, create=False)
    try:
        (task,) = store.get_tasks()
        (failed,) = store.best(task.task_id)
        store.mark_failed(task.task_id, failed.key, "wrong output")
        args = argparse.Namespace(model=None, json=True, store=path)
        records._records_list(args, store)
        (listed,) = json.loads(capsys.readouterr().out)
        assert listed["trials"] == 3 and listed["errors"] == 1 and len(listed["records"]) == 3
        monkeypatch.setattr(store, "records", lambda task_id: pytest.fail("loaded every record of a task"))
        records._records_best(args, store)
        (best,) = json.loads(capsys.readouterr().out)
        assert best["name"] == "matmul-64" and best["latency_s"] > 0
        records._records_list(argparse.Namespace(model=None, json=False, store=path), store)
        (row,) = [line for line in capsys.readouterr().out.splitlines() if "matmul-64" in line]
        assert [cell.strip() for cell in row.split("│")][4:6] == ["3", "1"]  # trials, errors
        stale = '[[["NoSuchInstruction", [], [], []]], []]'  # what a trace of another TVM can look like
        store.commit([Record(task_id=task.task_id, key="stale", trace_json=stale, run_secs=[1e-9], origin="old")])
        records._records_best(argparse.Namespace(model=None, json=False, store=path), store)
        out = capsys.readouterr().out
        assert "this trace does not replay on the task" in out and "NoSuchInstruction" in out
        assert "Instruction kind NoSuchInstruction is not registered" in out  # TVM's reason, as error_line finds it
    finally:
        store.close()


def test_human_output_has_a_summary_table(tmp_path):
    store = str(tmp_path / "s.db")
    result = run_cli("run", "--model", "op:matmul-64", "--trials", "4", "--store", store, "--cost-model", "xgb")
    assert result.returncode == 0, result.stderr
    assert "matmul-64" in result.stdout and "best ms" in result.stdout and "measured 4 candidates" in result.stdout
    assert "target llvm" in result.stdout and f"store {store}" in result.stdout.replace("\n", "")
    assert "tunecore: note: search 'random' does not use a cost model" in result.stderr
    again = run_cli("run", "--model", "op:matmul-64", "--trials", "4", "--store", store)
    assert "nothing to measure" in again.stdout


def test_the_table_says_why_a_task_stopped_early(tmp_path):
    model = tmp_path / "tiny.onnx"
    write_tiny_onnx(str(model))  # its reshape has a design space of a few programs
    # wide enough that the reason is not wrapped inside its cell (without a terminal, rich draws 80 columns)
    result = run_cli("run", "--model", str(model), "--trials", "30", "--store", "memory:", "--scheduler", "round-robin",
                     env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert "stopped" in result.stdout and "has no new candidates" in result.stdout


def test_tasks_of_a_zoo_model():
    out = _json(run_cli("tasks", "--model", "zoo:resnet-18", "--json"))
    assert len(out["tasks"]) == 22
    assert sum(t["flops"] * t["weight"] for t in out["tasks"]) == pytest.approx(3.64e9, rel=0.02)
    assert {"conv2d_add_relu@4d", "conv2d_add_add_relu@4d"} <= {t["kernel_class"] for t in out["tasks"]}


def test_a_command_that_needs_no_torch_does_not_import_it():
    """TVM imports torch whenever it is installed (2 s per process); the command line imports TVM
    without it, and a plugin that needs torch can still import it afterwards."""
    code = ("import importlib.util, sys\n"
            "from tunecore.cli import main\n"
            "assert main(['tasks', '--model', 'op:matmul-64', '--json']) == 0\n"
            "assert 'tvm' in sys.modules and 'torch' not in sys.modules\n"
            "if importlib.util.find_spec('torch'):\n"
            "    import torch\n"
            "    assert torch.ones(2).sum().item() == 2\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_output_cut_short_by_its_reader_ends_quietly():
    """`tunecore ... --json | head`: no BrokenPipeError traceback."""
    process = subprocess.Popen([sys.executable, "-m", "tunecore.cli", "plugins"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    process.stdout.close()  # the reader is gone before the command writes
    assert process.wait(timeout=120) == 141 and process.stderr.read() == ""


def test_records_export_import_round_trip(tmp_path):
    store = str(tmp_path / "a.db")
    _json(run_cli("run", "--model", "op:matmul-64", "--trials", "5", "--store", store, "--json"))
    exported = run_cli("records", "export", "--format", "metaschedule", str(tmp_path / "ms"), "--store", store)
    assert exported.returncode == 0 and "wrote 5 records" in exported.stdout
    unknown = run_cli("records", "export", str(tmp_path / "none"), "--store", store, "--model", "op:nosuch")
    assert_one_line_exit_2(unknown, "no tasks of model 'op:nosuch'", "op:matmul-64")
    other = str(tmp_path / "b.db")
    imported = run_cli("records", "import", "--format", "metaschedule", str(tmp_path / "ms"), "--store", other)
    assert imported.returncode == 0 and "imported 5 records of 1 tasks" in imported.stdout
    a, b = (_json(run_cli("records", "best", "--store", s, "--json"))[0] for s in (store, other))
    assert a["latency_s"] == pytest.approx(b["latency_s"]) and a["trace"] == b["trace"]


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["run", "--model", "op:matmul-64", "--trials", "4", "--search", "nosuch"],
         ["unknown search policy 'nosuch'", "random"]),
        (["run", "--model", "op:matmul-64", "--trials", "4", "--cost-model", "nosuch"],
         ["unknown cost model 'nosuch'"]),
        (["run", "--model", "op:nosuch", "--trials", "4"],
         ["unknown operator 'op:nosuch'", "c2d-0", "dense-bert", "matmul-MxNxK"]),
        (["run", "--model", "zoo:nosuch", "--trials", "4"], ["unknown zoo model"]),
        (["run", "--model", "missing.onnx", "--trials", "4"], ["no such file"]),
        (["run", "--model", "op:matmul-64", "--trials", "4", "--target", "{bad json"], ["not valid JSON"]),
        (["run", "--model", "op:matmul-64", "--trials", "4", "--target", '{"kind": "nosuch"}'], ["nosuch"]),
        (["run", "--model", "op:matmul-64", "--trials", "4", "--target", '{"kind": "llvm", "mcpu": "bogus"}'],
         ["bogus"]),
        (["run", "--model", "op:matmul-64", "--trials", "4", "--target", "nvidia/nosuch"], ["nvidia/nosuch"]),
        (["run", "--model", "op:matmul-64", "--trials", "4", "-O", "search.nosuch=1"], ["unknown option", "nosuch"]),
        (["run", "--model", "op:matmul-64", "--trials", "4", "-O", "nodot"], ["ROLE.KEY=VALUE"]),
        # option keys that name the core's own construction arguments are options like any other
        (["run", "--model", "op:matmul-64", "--trials", "4", "-O", "measurer.registry=x"],
         ["registry is not an option"]),
        (["run", "--model", "op:matmul-64", "--trials", "4", "-O", "search.name=x"], ["unknown option", "name"]),
        (["run", "--model", "op:matmul-64", "--trials", "4", "-O", "measurer.builder=nosuch"],
         ["unknown builder 'nosuch'"]),
        (["run", "--model", "op:matmul-64", "--trials", "4", "-O", "xgb.min_data=3"],
         ["NAME.KEY=VALUE", "random, none, local"]),
        (["run", "--model", "op:matmul-64"], ["(--trials), a time budget (--time-budget) or both"]),
        (["run", "--model", "op:matmul-64", "--time-budget", "ten minutes"], ["not a duration"]),
        (["run", "--model", "op:matmul-64", "--time-budget", "0"], ["argument --time-budget: expected a duration > 0"]),
        (["run", "--model", "op:matmul-64", "--trials", "-1"], ["argument --trials/-n: expected an integer >= 0"]),
        (["records", "list", "--store", "does-not-exist.db"], ["no such store"]),
        # one kit for counts, lists and numbers in every command, the plugins' too
        (["dataset", "collect", "--model", "op:matmul-64", "--per-task", "0", "--out", "d.parquet"],
         ["argument --per-task: expected an integer >= 1, not '0'"]),
        (["bench", "--model", "op:matmul-64,", "--trials", "2"], ["argument --model/-m: expected a comma-separated"]),
        (["dataset", "collect", "--model", "op:matmul-64", "--per-task", "1", "--out", "d.parquet",
          "--random-fraction", "2"], ["argument --random-fraction: expected a number from 0 to 1"]),
        (["records", "list", "--store", "foo:bar"], ["unknown store 'foo'", "./foo:bar"]),
        (["run", "--model", "op:matmul-64", "--trials", "1", "--store", "/missing/dir/x.db"],
         ["directory /missing/dir does not exist"]),
        (["compile", "--model", "op:matmul-64", "--store", "does-not-exist.db"], ["no such store"]),
        (["records", "import", "--format", "metaschedule", "/nonexistent-dir", "--store", "memory:"],
         ["not a MetaSchedule JSON database"]),
    ],
)
def test_mistakes_are_one_line_and_exit_2(args, fragments, tmp_path):
    own_store = args[0] != "run" or "--store" in args
    assert_one_line_exit_2(run_cli(*args, cwd=tmp_path) if own_store else run_cli(*args, "--store", "memory:"),
                           *fragments)


def test_options_apply_by_role_or_by_component_name():
    from tunecore.options import options_for, parse_options

    options = parse_options(["search.population=64", "ansor.iterations=2", "cost-model.rounds=5", "ansor.population=8"],
                            ["random", "ansor", "xgb"])
    assert options_for(options, "search", "ansor") == {"population": 8, "iterations": 2}  # its own option wins
    assert options_for(options, "search", "random") == {"population": 64}
    assert options_for(options, "cost_model", "xgb") == {"rounds": 5}


def test_broken_onnx_file_is_one_line_and_exit_2(tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"this is not an onnx model")
    assert_one_line_exit_2(run_cli("run", "--model", str(broken), "--trials", "4", "--store", "memory:"),
                           "not a valid ONNX model")


def test_store_of_another_program_is_refused(tmp_path):
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE things (x)")
    assert_one_line_exit_2(run_cli("records", "list", "--store", str(foreign)), "not a tunecore store")
    text = tmp_path / "notes.txt"
    text.write_text("hello " * 1000)
    assert_one_line_exit_2(run_cli("run", "--model", "op:matmul-64", "--trials", "1", "--store", str(text)),
                           "not a tunecore store")


def test_kill_9_loses_nothing_committed_and_measures_nothing_twice(tmp_path):
    store = str(tmp_path / "k.db")
    args = [sys.executable, "-m", "tunecore.cli", "run", "--model", "op:matmul-128", "--trials", "400", "--round-size",
            "4", "--store", store, "--json"]
    process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and _count(store) < 12:
            time.sleep(0.2)
        assert _count(store) >= 12, "the run did not commit records in time"
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the run and its worker processes, mid-round
        process.wait()
    with sqlite3.connect(store) as db:
        before = {r[0]: r[1] for r in db.execute("SELECT key, latency FROM records")}
    target = len(before) + 8
    resumed = _json(run_cli("run", "--model", "op:matmul-128", "--trials", str(target), "--round-size", "4",
                            "--store", store, "--json"))
    assert resumed["trials_measured"] == 8 and resumed["trials_total"] == target
    with sqlite3.connect(store) as db:
        after = {r[0]: r[1] for r in db.execute("SELECT key, latency FROM records")}
        runs = db.execute("SELECT COUNT(*), COUNT(finished_at) FROM runs").fetchone()
    assert len(after) == target and all(after[k] == v for k, v in before.items())
    assert runs == (2, 1)  # the killed run never finished; the resumed one did


def _count(store):
    if not os.path.exists(store):
        return 0
    try:
        with sqlite3.connect(store) as db:
            return db.execute("SELECT COUNT(*) FROM records").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_a_run_whose_every_candidate_failed_exits_1():
    result = run_cli("run", "--model", "op:matmul-64", "--trials", "4", "--store", "memory:",
                     "-O", "measurer.run_timeout=0.0001", "-O", "measurer.screen=0")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "all 4 measured candidates failed" in result.stderr.strip().splitlines()[-1]
