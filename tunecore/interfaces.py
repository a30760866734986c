"""What a plugin may import from tunecore's core, besides ``tunecore.hookimpl``: the data of the tuning loop, the
roles, the design space, option checks, seeds, errors, program features, model files and TVM helpers.

Plugins import from five public modules only: ``tunecore`` (``hookimpl``), this one, ``tunecore.targets`` (device
identity and descriptors), ``tunecore.dataset`` (program datasets and the yardstick) and ``tunecore.cli`` (a
plugin's own commands). Every other module is internal and may change between versions; ``tests/test_imports.py``
fails when a shipped plugin imports one, or a name a public module does not list in its ``__all__``.
"""

from tunecore.check import task_inputs
from tunecore.data import Candidate, MeasureResult, Record, Task, distinct
from tunecore.errors import MeasurerUnavailable, UsageError, error_line, first_line
from tunecore.features import N_DEVICE_FEATURES, N_FEATURES, PerStoreFeatures, device_features, program_row
from tunecore.measure.local import LocalBuilder, OutputCheck
from tunecore.measure.worker import PACK, checked_arguments, compare_outputs
from tunecore.measure.worker import build as build_library
from tunecore.modelfile import (
    CHECKPOINT,
    load_checkpoint,
    load_model_json,
    load_model_torch,
    save_checkpoint,
    save_model_json,
    save_model_torch,
)
from tunecore.options import check_options, is_int, is_number
from tunecore.progress import Progress
from tunecore.roles import (
    ROLE_LABELS,
    ROLES,
    Artifact,
    Builder,
    Component,
    CostModel,
    Measurer,
    Profiler,
    RecordStore,
    Runner,
    SearchPolicy,
    TaskContext,
)
from tunecore.space import DesignSpace
from tunecore.tuner import derive_seed
from tunecore.tvmjson import new_schedule, replay_trace_json, target_from_json, target_to_json, to_plain
from tunecore.workloads import has_kernel

__all__ = [
    "Artifact", "Builder", "CHECKPOINT", "Candidate", "Component", "CostModel", "DesignSpace", "LocalBuilder",
    "MeasureResult", "Measurer", "MeasurerUnavailable", "N_DEVICE_FEATURES", "N_FEATURES", "OutputCheck", "PACK",
    "PerStoreFeatures", "Profiler", "Progress", "ROLES", "ROLE_LABELS", "Record", "RecordStore", "Runner",
    "SearchPolicy", "Task", "TaskContext", "UsageError", "build_library", "check_options", "checked_arguments",
    "compare_outputs", "derive_seed", "device_features", "distinct", "error_line", "first_line", "has_kernel", "is_int",
    "is_number", "load_checkpoint", "load_model_json", "load_model_torch", "new_schedule", "program_row",
    "replay_trace_json", "save_checkpoint", "save_model_json", "save_model_torch", "target_from_json",
    "target_to_json", "task_inputs", "to_plain",
]
