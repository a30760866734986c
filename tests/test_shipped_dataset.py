"""The dataset that ships with tunecore (datasets/cpu-programs.parquet): what its README promises."""

import os

import pytest

from tunecore.dataset.table import Dataset
from tunecore.workloads import expand_models

SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "datasets", "cpu-programs.parquet")


def test_the_shipped_dataset_covers_every_zoo_network_and_ansors_single_ops():
    assert os.path.getsize(SHIPPED) <= 25 * 2**20
    info = Dataset.load(SHIPPED).info()
    assert set(expand_models(["zoo:all", "op:ansor"])) <= set(info["workloads"])
    primary = next(iter(info["devices"].values()))  # the device with the most measurements
    assert primary["measured"] >= 10_000
    assert primary["device"]["cpu"] and primary["device"]["cores"] >= 1
    further = list(info["devices"].values())[1:]
    assert sum(device["measured"] >= 3_000 for device in further) >= 2


V2 = os.path.join(os.path.dirname(SHIPPED), "cpu-programs-v2.parquet")
HELD_OUT = ("zoo:resnet-18", "zoo:mobilenet-v2", "zoo:bert-tiny")


def _v2_counts():
    """What the dataset-v2 issue asks of the file: clean programs, per held-out network task, per other
    conv/dense/matmul task, per real CPU model."""
    import collections

    from tunecore.dataset.protocol import is_clean
    from tunecore.targets import host_target
    from tunecore.workloads import extract_tasks, has_kernel, load_workload

    dataset = Dataset.load(V2)
    clean_rows = [r for r in dataset.rows if is_clean(r)]
    by_task: dict = collections.defaultdict(set)
    for row in clean_rows:
        by_task[row.task_key, row.device_id].add(row.program_key)
    most = collections.Counter()
    for (key, _), programs in by_task.items():
        most[key] = max(most[key], len(programs))
    # a file holds only the tasks it has rows of: the held-out networks' tasks are extracted here
    # except kernels with fast math (erf, exp, tanh, softmax as polynomials since 2026-11-28), new tasks v2 has not
    # collected yet
    held = {task.workload_hash for model in HELD_OUT for task in extract_tasks(load_workload(model), host_target())
            if "fast_" not in task.name or task.workload_hash in dataset.tasks}
    heavy = {key for key, task in dataset.tasks.items() if key not in held
             and has_kernel(task.kernel_class, ("conv", "dense", "matmul"))}
    exhausted = set().union(*dataset.exhausted.values())
    cpus = collections.Counter()
    for row in clean_rows:
        device = dataset.devices[row.device_id]
        cpus[device.get("cpu"), device.get("family_model")] += 1
    return {"clean_programs": len({(r.task_key, r.program_key) for r in clean_rows}),
            # a task whose whole design space holds fewer programs counts when it has them all
            "held_out_tasks": len(held), "held_out_tasks_128": sum(most[k] >= 128 or k in exhausted for k in held),
            "heavy_tasks_200": sum(most[k] >= 200 for k in heavy), "cpus_5000": sum(n >= 5000 for n in cpus.values())}


def test_the_datasets_fit_in_50_mb():
    directory = os.path.dirname(SHIPPED)
    assert sum(os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory)) <= 50 * 2**20


def test_dataset_v2_takes_every_label_by_the_protocol():
    from tunecore.dataset import protocol

    dataset = Dataset.load(V2)
    ran = [r for r in dataset.rows if r.latency is not None]
    assert len(ran) >= 1000 and all(len(r.run_secs) >= protocol.MIN_REPEATS for r in ran)
    assert all(protocol.ATTEMPTS in r.profile and protocol.FOREIGN_LOAD in r.profile for r in ran)
    assert all(device["cores"] == 1 for device in dataset.devices.values())
    assert len(dataset.anchors) == protocol.ANCHORS
    assert any(c["drift"] for c in dataset.collections)  # a run measured the anchors at its start and its end


@pytest.fixture(scope="module")
def v2_counts():
    return _v2_counts()


def test_dataset_v2_holds_the_programs_and_the_tasks_the_issue_asks(v2_counts):
    assert v2_counts["clean_programs"] >= 30_000
    assert v2_counts["held_out_tasks_128"] == v2_counts["held_out_tasks"] > 0
    assert v2_counts["heavy_tasks_200"] >= 100


def test_dataset_v2_holds_the_cpu_models_the_issue_asks(v2_counts):
    assert v2_counts["cpus_5000"] >= 3


GPU = os.path.join(os.path.dirname(SHIPPED), "gpu-h100.parquet")


def test_the_gpu_dataset_is_checked_h100_programs_with_ncu_profiles():
    """datasets/gpu-h100.parquet (bench/results/gpu.md): measured on a real H100 by the label protocol, every
    program that ran checked against its task's reference on the host CPU, BERT-base's matmuls profiled by ncu."""
    from tunecore_ncu_costmodel.ncu_csv import STUDY_METRICS

    from tunecore.dataset.protocol import is_clean

    dataset = Dataset.load(GPU)
    ((device_id, device),) = dataset.devices.items()
    assert device["kind"] == "cuda" and device["gpu"].startswith("NVIDIA H100") and device["arch"] == "sm_90"
    ran = [r for r in dataset.rows if r.error is None]
    assert len(dataset.rows) >= 2860 and len(ran) >= 2830
    assert all(r.profile["check.max_relative_error"] <= 1e-3 and len(r.run_secs) >= 5 for r in ran)
    assert sum(map(is_clean, dataset.rows)) >= 2080
    # ResNet-18's 2026-11-27 rows were timed while the host compiled CUDA beside them: kept, flagged, not clean
    overlapped = [r for r in ran if "label.build_overlap" in r.profile]
    assert len(overlapped) == 697 and not any(map(is_clean, overlapped))
    profiled = [r for r in ran if "ncu.smsp__inst_executed.sum" in r.profile]
    assert len(profiled) >= 180
    assert all(f"ncu.{m}" in r.profile for r in profiled for m in STUDY_METRICS if not m.startswith("device__"))
    bert = {dataset.tasks[r.task_key].name for r in profiled}
    assert all("matmul" in name for name in bert)


TLM_HELD_OUT = os.path.join(os.path.dirname(SHIPPED), "tlm-programs-heldout.parquet")
TLM_TRAIN = os.path.join(os.path.dirname(SHIPPED), "tlm-programs-train.parquet")


def test_tlms_programs_are_measured_by_the_protocol_and_keep_the_held_out_networks_apart():
    """datasets/tlm-programs-*.parquet (bench/results/tlm_ranker.md): programs the shipped tlm weights wrote, timed
    by the label protocol on a device of dataset v2; the held-out file has every conv/dense/matmul task of the
    held-out networks and nothing else, the training file comes from the other workloads."""
    from tunecore.dataset import protocol

    v2 = Dataset.load(V2)
    held_keys = {key for key, task in v2.tasks.items() if set(task.workloads) & set(HELD_OUT)}
    held, train = Dataset.load(TLM_HELD_OUT), Dataset.load(TLM_TRAIN)
    for dataset in (held, train):
        ran = [r for r in dataset.rows if r.latency is not None]
        assert len(ran) >= 1900 and all(len(r.run_secs) >= protocol.MIN_REPEATS for r in ran)
        assert {r.collected_by for r in dataset.rows} == {"tlm"}
        assert set(dataset.devices) <= set(v2.devices)
    assert {r.task_key for r in held.rows} <= held_keys
    heavy = {key for key in held_keys if any(op in v2.tasks[key].kernel_class for op in ("conv", "dense", "matmul"))}
    assert heavy <= {r.task_key for r in held.rows}
    # collected from the training workloads; a kernel one of them shares with a held-out network is left out of
    # training by the split (`--split workload:...`), as in dataset v2
    assert train.workloads() and not train.workloads() & set(HELD_OUT)
