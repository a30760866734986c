"""The postgresql store shared by several jobs: claims, concurrent runs, kill -9, schema versions, sqlite import."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tunecore.testing.cli import assert_one_line_exit_2, cli_json, run_cli


@pytest.fixture
def store_url(postgres):
    return "postgresql:" + postgres.database("s" + uuid.uuid4().hex[:12])


def _open(url):
    from tunecore.store.postgres import PostgresStore

    return PostgresStore(url.removeprefix("postgresql:"))


def test_a_program_is_claimed_by_one_job(store_url, matmul_task):
    from tunecore.data import Record

    store = _open(store_url)
    store.put_tasks([matmul_task])
    a, b = store.start_run({"model": "m"}), store.start_run({"model": "m"})
    task_id = matmul_task.task_id
    assert store.claim(task_id, ["k0", "k1", "k2", "k3"], a) == {"k0", "k1", "k2", "k3"}
    assert store.claim(task_id, ["k2", "k3", "k4", "k5"], b) == {"k4", "k5"}  # a holds k2, k3
    assert store.claim(task_id, ["k0"], a) == {"k0"}  # its own claim
    store.commit([Record(task_id=task_id, key="k4", trace_json="[[], []]", run_secs=[1e-3], run_id=b)])
    assert store.claim(task_id, ["k4"], a) == set()  # stored already
    store.close()


def _run(store_url, *extra, trials=24):
    return subprocess.Popen(
        [sys.executable, "-m", "tunecore.cli", "run", "--model", "op:matmul-64", "--trials", str(trials),
         "--round-size", "8", "--store", store_url, "--json", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_concurrent_runs_measure_nothing_twice_and_lose_nothing(store_url):
    jobs = [_run(store_url), _run(store_url)]  # the same seed: they propose the same programs
    outputs = [job.communicate(timeout=600) for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0], [err for _, err in outputs]
    measured = [json.loads(out)["trials_measured"] for out, _ in outputs]
    store = _open(store_url)
    (task,) = store.get_tasks()
    records = store.records(task.task_id)
    runs = store.runs()
    # the premise: the runs overlapped. One that starts after the other's first commit counts those records as
    # earlier ones of this workload and measures the rest (24 - 8): still nothing twice and nothing lost.
    assert len(runs) == 2 and all(run["started_at"] < other["finished_at"] for run, other in (runs, runs[::-1]))
    assert max(measured) == 24 and len(records) == sum(measured) == len({r.key for r in records})
    assert sorted(len([r for r in records if r.run_id == run["run_id"]]) for run in runs) == sorted(measured)
    store.close()


def test_a_tuner_killed_while_writing_keeps_every_committed_round(store_url):
    job = _run(store_url, trials=2000)
    store = _open(store_url)
    try:
        deadline = time.monotonic() + 300
        while _stored(store) < 24:
            assert job.poll() is None and time.monotonic() < deadline, job.stderr.read() if job.poll() else "slow"
            time.sleep(0.05)
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=30)
        kept = _stored(store)
        assert kept >= 24 and kept % 8 == 0  # whole rounds: each is one transaction
        (run,) = store.runs()
        assert run["finished_at"] is None
    finally:
        store.close()
    resumed = cli_json(run_cli("run", "--model", "op:matmul-64", "--trials", str(kept + 8), "--round-size", "8",
                               "--store", store_url, "--json"))
    assert resumed["trials_measured"] == 8


def _stored(store):
    tasks = store.get_tasks()
    return store.counts([tasks[0].task_id])[tasks[0].task_id] if tasks else 0


def test_the_schema_is_checked_on_open_and_upgraded_only_by_the_command(store_url):
    import psycopg

    _open(store_url).close()
    with psycopg.connect(store_url, autocommit=True) as db:  # as a tunecore of schema 1 left it
        db.execute("ALTER TABLE runs DROP COLUMN device_id")
        db.execute("ALTER TABLE records DROP COLUMN device_id")
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema'")
    refused = run_cli("records", "list", "--store", store_url)
    assert_one_line_exit_2(refused, "schema 1 is older", f"tunecore records upgrade --store {store_url}")
    upgraded = run_cli("records", "upgrade", "--store", store_url)
    assert upgraded.returncode == 0 and "schema is current" in upgraded.stdout, upgraded.stderr
    assert cli_json(run_cli("run", "--model", "op:matmul-64", "--trials", "8", "--store", store_url,
                            "--json"))["trials_measured"] == 8
    with psycopg.connect(store_url, autocommit=True) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    assert_one_line_exit_2(run_cli("records", "list", "--store", store_url), "newer tunecore")


def test_a_sqlite_store_is_imported_once_with_its_runs(store_url, tmp_path):
    local = str(tmp_path / "local.db")
    cli_json(run_cli("run", "--model", "op:matmul-64", "--trials", "16", "--round-size", "8", "--store", local,
                     "--json"))
    for expected in ("imported 16 records and 1 runs", "imported 0 records and 0 runs"):
        copied = run_cli("records", "import", "--format", "tunecore", local, "--store", store_url)
        assert copied.returncode == 0 and expected in copied.stdout, (copied.stdout, copied.stderr)
    listed = {(r["name"], r["trials"], r["best_latency_s"]) for r in
              cli_json(run_cli("records", "list", "--store", store_url, "--json"))}
    assert listed == {(r["name"], r["trials"], r["best_latency_s"]) for r in
                      cli_json(run_cli("records", "list", "--store", local, "--json"))}
    from tunecore.store.sqlite import SqliteStore

    (before,), (after,) = SqliteStore(local).runs(), _open(store_url).runs()
    assert (after["started_at"], after["finished_at"]) == (before["started_at"], before["finished_at"])
    resumed = cli_json(run_cli("run", "--model", "op:matmul-64", "--trials", "24", "--store", store_url, "--json"))
    assert resumed["trials_measured"] == 8  # the imported run counts towards the budget


def test_an_unreachable_server_is_one_line_exit_2():
    assert_one_line_exit_2(run_cli("records", "list", "--store", "postgresql://nobody@127.0.0.1:1/none"),
                           "postgresql://nobody@127.0.0.1:1/none")
