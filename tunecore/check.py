"""Whether a program computes what it should: seeded inputs, tolerances by dtype, the comparison.

One definition for the measurers' check (each candidate's outputs against its task's unscheduled program's,
on the same seeded inputs) and for ``tunecore compile`` (the tuned build against the untuned one).
A schedule only reorders and regroups the task's arithmetic, so float results may differ in rounding and
nothing else; integer results must be equal.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

# Largest difference allowed, relative to the largest magnitude of the expected output: reordered fp32
# reductions differ in the last bits (1e-6 here), a wrong program by far more than 1e-3
RELATIVE_TOLERANCES = {"float64": 1e-6, "float32": 1e-3, "float16": 1e-2, "bfloat16": 5e-2}
SEED = 0  # the inputs every check uses, so a reference is made once per task
CHECKED = "check.max_relative_error"  # the profile entry of a result whose outputs were checked


def tolerance(dtype: str) -> float:
    """The relative tolerance for outputs of ``dtype``: 0 (equal) for integers and booleans."""
    return RELATIVE_TOLERANCES.get(str(dtype), 0.0 if not str(dtype).startswith("float") else 1e-3)


def relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    """Largest difference between two arrays, relative to the expected one's largest magnitude. Non-finite
    values must match exactly (a NaN where NaN is expected is no error); one that does not counts as inf."""
    if expected.size == 0:
        return 0.0
    if got.shape != expected.shape:
        return float("inf")
    g, e = got.astype(np.float64), expected.astype(np.float64)
    finite = np.isfinite(e)
    same = (g == e) | (np.isnan(g) & np.isnan(e))
    if not np.all(same | (finite & np.isfinite(g))):
        return float("inf")
    if not finite.any():
        return 0.0
    scale = max(1e-6, float(np.max(np.abs(e[finite]))))
    return float(np.max(np.abs(np.where(finite, g - e, 0.0)))) / scale


def max_relative_error(got: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> float:
    """The largest ``relative_error`` over pairs of outputs."""
    return max((relative_error(g, e) for g, e in zip(got, expected)), default=0.0)


def mismatch(got: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> tuple[float, str | None]:
    """(max relative error, None) when every output is within its dtype's tolerance, else (error, the reason)."""
    errors = [(relative_error(g, e), str(e.dtype)) for g, e in zip(got, expected)]
    worst = max((error for error, _ in errors), default=0.0)
    failed = [dtype for error, dtype in errors if not error <= tolerance(dtype)]
    if not failed:
        return worst, None
    return worst, f"wrong output: max relative error {worst:.3g} ({failed[0]} tolerance {tolerance(failed[0]):g})"


def random_array(shape: Sequence[int], dtype: str, rng: np.random.Generator, *, weight: bool = False,
                 integers: tuple[int, int] = (0, 1)) -> np.ndarray:
    """A test input: floats uniform in [-1, 1), a weight's scaled by its fan-in as trained weights are
    (unscaled, activations grow layer by layer until relu6 saturates and outputs become sums that cancel,
    where a reordered reduction moves them far more than rounding); integers uniform in ``integers``
    (the measurers' default (0, 1) gives zeros: integer inputs are often indices, and 0 is valid on any
    non-empty axis)."""
    shape = tuple(int(d) for d in shape)
    if "int" in str(dtype) or str(dtype) == "bool":
        return rng.integers(integers[0], integers[1], size=shape).astype(dtype)
    values = rng.uniform(-1.0, 1.0, size=shape)
    if weight and len(shape) >= 2:
        values *= np.sqrt(3.0 / max(1, int(np.prod(shape[1:]))))
    return values.astype(dtype)


def task_inputs(args_info: Sequence[Any], weights: Sequence[int], seed: int = SEED) -> list[np.ndarray]:
    """Every argument of a task's function (ArgInfo JSON: ["TENSOR", dtype, shape]), seeded; ``weights``
    are the positions of its weights (the function's ``layout_free_buffers``)."""
    rng = np.random.default_rng(seed)
    return [random_array(a[2], a[1], rng, weight=i in weights) for i, a in enumerate(args_info)]


def written_arguments(mod: Any) -> list[int]:
    """Positions of the arguments a task's function writes (its outputs): what a check compares."""
    from tunecore.tvmjson import new_schedule

    func = mod["main"]
    sch = new_schedule(mod)
    written: set[int] = set()
    pending = list(sch.get_child_blocks(sch.get_sblock("root")))
    while pending:
        block = pending.pop()
        written.update(i for region in sch.get(block).writes for i, p in enumerate(func.params)
                       if region.source.same_as(p))
        pending.extend(sch.get_child_blocks(block))
    return sorted(written) or [len(func.params) - 1]


def weight_arguments(mod: Any) -> list[int]:
    """Positions of a task's weights (marked layout-free when it was extracted from a model)."""
    attrs = mod["main"].attrs
    return [int(i) for i in attrs["layout_free_buffers"]] if attrs and "layout_free_buffers" in attrs else []


def verify_best(store: Any, task: Any, measurer: Any, *, recheck: bool = False, batch: int = 4) -> dict[str, Any]:
    """Make sure the task's best record computes the task: its best records, fastest first, are checked by
    ``measurer`` (those checked when they were measured are trusted unless ``recheck``) until one passes; each
    that computes something else is marked failed in the store.

    Returns {"best": the key of the best correct record or None, "best_latency_s": its latency, "checked": records
    checked now, "wrong": [(key, error)], "unverified": [(key, why)]} (records that could not be checked now, left
    as they are).
    """
    report: dict[str, Any] = {"best": None, "best_latency_s": None, "checked": 0, "wrong": [], "unverified": []}
    passed: set[str] = set()
    skipped: set[str] = set()
    while True:
        ranked = [r for r in store.best(task.task_id, k=batch + len(skipped) + len(passed)) if r.key not in skipped]
        if not ranked:
            return report
        if ranked[0].key in passed or (CHECKED in ranked[0].profile and not recheck):
            report["best"], report["best_latency_s"] = ranked[0].key, ranked[0].latency
            return report
        pending = []
        for record in ranked:
            if record.key in passed or (CHECKED in record.profile and not recheck):
                break
            pending.append(record)
        results = measurer.measure(task, [r.candidate(task) for r in pending])
        report["checked"] += len(pending)
        for record, result in zip(pending, results):
            if result.error is not None and result.error.startswith("wrong output"):
                store.mark_failed(task.task_id, record.key, result.error, {CHECKED: result.profile[CHECKED]})
                report["wrong"].append((record.key, result.error))
            elif CHECKED in result.profile:
                passed.add(record.key)
            else:
                why = result.error or "the measurer did not check it"
                report["unverified"].append((record.key, why))
                skipped.add(record.key)
