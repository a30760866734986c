"""Test helpers for plugin authors: conformance suites to subclass, and tiny real tasks.

    # tests/test_my_plugin.py of a third-party plugin
    from tunecore.testing import SearchPolicyConformance

    class TestMySearch(SearchPolicyConformance):
        name = "my-search"          # as registered through the tunecore entry point

Every suite runs real TVM on a 64x64 matmul (builds in well under a second with a warm pool).
"""

from tunecore.testing.conformance import (
    BuilderConformance,
    CostModelConformance,
    MeasurerConformance,
    RecordStoreConformance,
    RunnerConformance,
    SearchPolicyConformance,
)
from tunecore.testing.helpers import (
    ArtifactSizeProfiler,
    InstantMeasurer,
    WrongProgramSearch,
    hashed_latency,
    sample_candidates,
    tiled_latency,
    tiny_task,
    wrong_candidates,
)

__all__ = [
    "ArtifactSizeProfiler",
    "BuilderConformance",
    "CostModelConformance",
    "InstantMeasurer",
    "MeasurerConformance",
    "RecordStoreConformance",
    "RunnerConformance",
    "SearchPolicyConformance",
    "hashed_latency",
    "sample_candidates",
    "tiled_latency",
    "tiny_task",
    "wrong_candidates",
    "WrongProgramSearch",
]
