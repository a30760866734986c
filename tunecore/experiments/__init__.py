"""The experiment layer: what the benchmark scripts under bench/ and ``tunecore bench`` share, above the core.

``runs``: each tuner in a timed child process; ``timing``: timing things together so that the machine's drift
falls on all alike; ``results``: the environment record and the result files; ``matrix``: ``tunecore bench``'s
matrix of workloads x searches x cost models x seeds. The names scripts use are importable from here.
"""

from tunecore.experiments.results import (
    command_line,
    dataset_line,
    dataset_record,
    dataset_target,
    environment,
    environment_line,
    labelled_paths,
    script_parser,
    split_tables,
    write_results,
)
from tunecore.experiments.runs import (
    BUILDER_TIMEOUT_S,
    MADE_ON,
    best_candidates,
    best_programs,
    cached_run,
    remove_sqlite,
    run_metaschedule,
    run_metaschedule_for,
    run_timed,
    run_tunecore,
)
from tunecore.experiments.timing import (
    build_from_store,
    median_call_seconds,
    pass_orders,
    passes_together,
    ratio_bounds,
    ratio_range,
    remeasure_passes,
    remeasure_together,
    time_builds_together,
)

__all__ = [
    "BUILDER_TIMEOUT_S", "MADE_ON", "best_candidates", "best_programs", "build_from_store", "cached_run",
    "command_line", "dataset_line", "dataset_record", "dataset_target", "environment", "environment_line",
    "labelled_paths", "median_call_seconds", "pass_orders", "passes_together", "ratio_bounds", "ratio_range",
    "remeasure_passes", "remeasure_together", "remove_sqlite", "run_metaschedule", "run_metaschedule_for", "run_timed",
    "run_tunecore", "script_parser", "split_tables", "time_builds_together", "write_results",
]
