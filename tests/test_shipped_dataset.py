"""The dataset that ships with tunecore (datasets/cpu-programs.parquet): what its README promises."""

import os

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
