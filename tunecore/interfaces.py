"""The public names a plugin needs, in one place: the data of the tuning loop, the four roles and option checks.

The definitions live in ``tunecore.data`` (tasks, candidates, results, records), ``tunecore.roles``
(the role base classes) and ``tunecore.options``; this module re-exports them so that plugins and
docs have one stable import path.
"""

from tunecore.data import Candidate, MeasureResult, Record, Task, distinct
from tunecore.options import check_options, is_int, is_number
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

__all__ = [
    "ROLES", "ROLE_LABELS", "Artifact", "Builder", "Candidate", "Component", "CostModel", "MeasureResult", "Measurer",
    "Profiler", "Record", "RecordStore", "Runner", "SearchPolicy", "Task", "TaskContext", "check_options", "distinct",
    "is_int", "is_number",
]
