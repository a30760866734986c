"""Device identity: every run and record names the device it was measured on; old stores are upgraded."""

import pathlib
import shutil
import sqlite3

from tunecore.store.sqlite import SCHEMA_VERSION, SqliteStore
from tunecore.targets import device_descriptor, device_id, resolve_target
from tunecore.testing.cli import cli_json, run_cli

# A store written by tunecore before devices were recorded (schema 1): 4 records of op:matmul-64. Regenerate it with
# `.venv/bin/python tests/data/make_store_v1.py`, which runs that release's `tunecore run` (from git history).
STORE_V1 = pathlib.Path(__file__).parent / "data" / "store-v1.db"


def _cpuinfo(key):
    for line in open("/proc/cpuinfo"):
        if line.startswith(key) and ":" in line:
            return line.split(":", 1)[1].strip()
    return ""


def test_the_host_is_described_by_its_cpu_and_the_targets_cores():
    desc = device_descriptor(resolve_target("llvm"))
    assert desc["cpu"] == _cpuinfo("model name") and desc["vendor"] == _cpuinfo("vendor_id")
    assert desc["family_model"] == f"{_cpuinfo('cpu family')}/{_cpuinfo('model')}"
    assert desc["cores"] == int(resolve_target("llvm").attrs["num-cores"])


def test_other_mcpu_or_cores_is_another_device_and_the_clock_is_not():
    one = device_descriptor(resolve_target('{"kind": "llvm", "mcpu": "haswell", "num-cores": 1}'))
    two_cores = device_descriptor(resolve_target('{"kind": "llvm", "mcpu": "haswell", "num-cores": 2}'))
    other_mcpu = device_descriptor(resolve_target('{"kind": "llvm", "mcpu": "skylake", "num-cores": 1}'))
    assert len({device_id(one), device_id(two_cores), device_id(other_mcpu)}) == 3
    assert device_id(one) == device_id(dict(one, clock_mhz=one.get("clock_mhz", 0) + 700))
    assert device_id(one) != device_id(dict(one, cpu="another CPU"))  # another machine


def test_records_list_shows_the_device_of_every_record(tmp_path):
    store = str(tmp_path / "s.db")
    cli_json(run_cli("run", "--model", "op:matmul-64", "--trials", "8", "--store", store, "--json"))
    (row,) = cli_json(run_cli("records", "list", "--store", store, "--json"))
    assert len(row["records"]) == 8
    expected = device_descriptor(resolve_target("llvm"))
    for record in row["records"]:
        assert record["device"]["cpu"] == expected["cpu"] and record["device"]["cores"] == expected["cores"]
        assert record["device_id"] == device_id(expected)


def test_a_schema_1_store_is_upgraded_in_place_and_keeps_its_records(tmp_path):
    path = tmp_path / "old.db"
    shutil.copy(STORE_V1, path)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0] == "1"
    store = SqliteStore(str(path))
    (task,) = store.get_tasks(model="op:matmul-64")
    old = store.records(task.task_id)
    assert len(old) == 4 and all(r.latency for r in old) and {r.device_id for r in old} == {None}  # unknown
    assert [r["device_id"] for r in store.runs()] == [None]
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0] == str(SCHEMA_VERSION)

    # the upgraded store resumes: the old records count against the budget, the new ones name their device
    # (on the target the old store was tuned for: another CPU's default target would be another task)
    summary = cli_json(run_cli("run", "--model", "op:matmul-64", "--trials", "6", "--store", str(path),
                               "--target", task.target_json, "--json"))
    assert summary["trials_measured"] == 2 and summary["trials_total"] == 6
    store = SqliteStore(str(path))
    records = store.records(task.task_id)
    devices = store.devices()
    store.close()
    assert [r.device_id for r in records[:4]] == [None] * 4
    (new_device,) = {r.device_id for r in records[4:]}
    assert devices[new_device]["cpu"] == _cpuinfo("model name")


def test_cost_models_learn_which_device_each_result_came_from(tmp_path, target):
    from tunecore.builtin.none_model import NoneModel
    from tunecore.builtin.random_search import RandomSearch
    from tunecore.testing import InstantMeasurer
    from tunecore.tuner import Tuner

    class Recording(NoneModel):
        seen = []

        def update(self, task, candidates, results):
            self.seen.append((self.device, [r.device for r in results]))

    path = tmp_path / "old.db"
    shutil.copy(STORE_V1, path)
    store = SqliteStore(str(path))
    (task,) = store.get_tasks(model="op:matmul-64")
    model = Recording()
    Tuner(search=RandomSearch(cost_model=model, store=store), cost_model=model, store=store,
          measurer=InstantMeasurer(target)).tune([task], 8, {"model": "op:matmul-64"})
    store.close()
    host = device_descriptor(target)
    (warm_start, *rounds) = Recording.seen
    assert warm_start == (host, [None] * 4)  # the old records: device unknown
    assert rounds and all(device == host and devices == [host] * len(devices) for device, devices in rounds)
