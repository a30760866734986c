"""Program datasets (TenSet's role): measured programs of many workloads' tasks on several devices.

``table``: the in-memory dataset and its file format; ``collect``: measuring programs into it;
``split``: train/test splits; ``evaluate``: the yardstick every cost model is judged by; ``batch``: programs
built here for a machine without TVM's compiler (tunecore.measure.batch times them there), and its files.
This package is public (see tunecore.interfaces): plugins import what ``__all__`` lists from it, not from its modules.
"""

from tunecore.dataset.collect import CollectPlan, collect, remeasure
from tunecore.dataset.evaluate import held_out_metrics, measured_groups
from tunecore.dataset.split import device_of, filtered, selected, split, train_and_test
from tunecore.dataset.table import Dataset, Measurement, changing
from tunecore.measure.batch import MANIFEST as BATCH_MANIFEST
from tunecore.measure.batch import PROFILES as BATCH_PROFILES
from tunecore.measure.batch import batch_cubins

__all__ = ["BATCH_MANIFEST", "BATCH_PROFILES", "CollectPlan", "Dataset", "Measurement", "batch_cubins", "changing",
           "collect", "device_of", "filtered", "held_out_metrics", "measured_groups", "remeasure", "selected",
           "split", "train_and_test"]
