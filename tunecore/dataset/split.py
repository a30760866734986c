"""Train/test splits of a dataset, named on the command line as ``KIND:VALUES``.

- ``workload:zoo:resnet-18,zoo:mobilenet-v2`` -- cross-model: every task that occurs in a held-out
  workload is tested, so a kernel two networks share is never on both sides;
- ``device:ID[,ID]`` -- cross-device: measurements on those devices (ids or unique prefixes) are tested,
  the other devices' are trained on;
- ``task:FRACTION`` -- that fraction of the tasks, chosen by seed, is tested; ``task:NAME[,NAME]`` -- the tasks of
  those names (as ``tunecore dataset info`` lists them) are tested;
- ``random:FRACTION`` -- that fraction of the measurements, chosen by seed, is tested;
- ``cdmpp:N`` -- CDMPP's split: the programs of each task on each device, sorted by latency, every Nth is
  tested (the 5th, 10th, ... fastest for N = 5), the rest trained on; every task and device is on both sides,
  so it measures how a model places programs among their task's others, not networks it never saw.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from tunecore.dataset.table import Dataset, Measurement
from tunecore.errors import UsageError

KINDS = ("workload", "device", "task", "random", "cdmpp")
# CDMPP's published protocol (its 14.03% cross-model MAPE): every 5th program of a task by latency tested,
# programs whose timings spread over 1% and tasks with fewer than 48 programs left out; ``split(**CDMPP_PROTOCOL)``
CDMPP_PROTOCOL = {"spec": "cdmpp:5", "max_spread": 0.01, "min_programs": 48}


def ranking_group_size(spec: str, group_size: int | None) -> int | None:
    """Rank in groups of ``group_size`` programs of a task (None or 0: whole tasks), except on CDMPP's split, whose
    test side holds a fifth of each task's programs: whole tasks there, as the paper."""
    return None if spec.startswith("cdmpp:") else group_size or None


@dataclasses.dataclass
class Split:
    spec: str
    train: list[Measurement]
    test: list[Measurement]
    weights: dict[str, int]  # task key -> calls per inference of the tested workloads (1 if not split by workload)


def split(dataset: Dataset, spec: str, seed: int = 0, devices: list[str] | None = None,
          max_spread: float | None = None, min_programs: int | None = None) -> Split:
    """Split ``dataset`` as ``spec`` says, after keeping only ``devices`` (ids or prefixes) if given, then only
    measured programs whose timings spread at most ``max_spread`` (std / mean; failed programs stay, as
    training data), then only (task, device) groups with at least ``min_programs`` measured programs."""
    kind, _, value = spec.partition(":")
    if kind not in KINDS or not value:
        raise UsageError(f"--split {spec}: expected KIND:VALUES with KIND one of {', '.join(KINDS)}")
    rows = selected(dataset, devices, max_spread, min_programs)
    weights = {key: sum(task.workloads.values()) or 1 for key, task in dataset.tasks.items()}
    if kind == "workload":
        held = [w.strip() for w in value.split(",") if w.strip()]
        known = dataset.workloads()
        for workload in held:
            if workload not in known:
                raise UsageError(f"--split {spec}: workload {workload} is not in the dataset "
                                 f"(it has: {', '.join(sorted(known))})")
        weights = {key: sum(task.workloads.get(w, 0) for w in held) for key, task in dataset.tasks.items()}
        tested = {key for key, weight in weights.items() if weight}
        in_test = [r.task_key in tested for r in rows]
    elif kind == "cdmpp":
        every = _every(spec, value)
        groups: dict[tuple[str, str], list[int]] = {}
        for i, row in enumerate(rows):
            if row.latency is not None:  # a failed program is training data
                groups.setdefault((row.task_key, row.device_id), []).append(i)
        tested = {i for members in groups.values()
                  for rank, i in enumerate(sorted(members, key=lambda i: rows[i].latency)) if rank % every == every - 1}
        in_test = [i in tested for i in range(len(rows))]
    elif kind == "device":
        held_devices = {device_of(dataset, d.strip()) for d in value.split(",") if d.strip()}
        in_test = [r.device_id in held_devices for r in rows]
    elif kind == "task" and not _is_number(value):
        named = {n.strip() for n in value.split(",") if n.strip()}
        known = {dataset.tasks[r.task_key].name for r in rows}
        for name in sorted(named):
            if name not in known:
                raise UsageError(f"--split {spec}: task {name} is not in the dataset (it has {len(known)} tasks, "
                                 f"such as {', '.join(sorted(known)[:5])})")
        in_test = [dataset.tasks[r.task_key].name in named for r in rows]
    else:
        fraction = _fraction(spec, value)
        rng = np.random.default_rng(seed)
        if kind == "task":
            keys = sorted({r.task_key for r in rows})
            tested = {keys[i] for i in rng.permutation(len(keys))[:max(1, round(fraction * len(keys)))]}
            in_test = [r.task_key in tested for r in rows]
        else:
            in_test = list(rng.random(len(rows)) < fraction)
    filters = (f"+max-spread:{max_spread:g}" if max_spread is not None else "") + \
        (f"+min-programs:{min_programs}" if min_programs is not None else "")
    result = Split(spec + filters, [r for r, t in zip(rows, in_test) if not t], [r for r, t in zip(rows, in_test) if t],
                   weights)
    for side in ("train", "test"):
        if not getattr(result, side):
            raise UsageError(f"--split {spec}: the {side} side is empty")
    return result


def train_and_test(dataset: Dataset, spec: str | None, seed: int = 0, devices: list[str] | None = None,
                   max_spread: float | None = None, min_programs: int | None = None) -> Split:
    """``split`` by ``spec``; without one, every ``selected`` measurement is on the training side, none tested."""
    if spec:
        return split(dataset, spec, seed, devices, max_spread=max_spread, min_programs=min_programs)
    return Split("", selected(dataset, devices, max_spread, min_programs), [], {})


def selected(dataset: Dataset, devices: list[str] | None = None, max_spread: float | None = None,
             min_programs: int | None = None) -> list[Measurement]:
    """The dataset's measurements on ``devices`` (ids or prefixes; all if None), ``filtered``."""
    rows = dataset.rows
    if devices:
        keep = {device_of(dataset, d) for d in devices}
        rows = [r for r in rows if r.device_id in keep]
    return filtered(rows, max_spread, min_programs)


def filtered(rows: list[Measurement], max_spread: float | None, min_programs: int | None) -> list[Measurement]:
    """``rows`` without measured programs whose timings spread over ``max_spread`` (failed ones stay, as training
    data), then without (task, device) groups of fewer than ``min_programs`` measured programs."""
    if max_spread is not None:
        if max_spread < 0:
            raise UsageError(f"max_spread {max_spread}: expected a spread (std / mean) >= 0, e.g. 0.02")
        if not any(r.spread is not None for r in rows):
            raise UsageError("--max-spread: no program of this dataset has repeated timings, so none has a spread "
                             "(measure with repeats: tunecore dataset remeasure)")
        rows = [r for r in rows if r.latency is None or (r.spread is not None and r.spread <= max_spread)]
    if min_programs is not None:
        if min_programs < 1:
            raise UsageError(f"min_programs {min_programs}: expected an integer >= 1")
        counts = collections.Counter((r.task_key, r.device_id) for r in rows if r.latency is not None)
        rows = [r for r in rows if counts[r.task_key, r.device_id] >= min_programs]
    return rows


def _every(spec: str, value: str) -> int:
    try:
        every = int(value)
    except ValueError:
        every = 0
    if every < 2:
        raise UsageError(f"split {spec}: expected cdmpp:N with N an integer >= 2 (every Nth program tested)")
    return every


def with_fine_tuning(split: Split, task_keys: list[str], per_task: int, seed: int = 0) -> Split:
    """A cross-device split whose training side also gets, on the tested devices, up to ``per_task``
    measured programs (chosen by seed) of each task in ``task_keys``: what a user measures on a new
    device to fine-tune for it. Those tasks leave the test side."""
    chosen = set(task_keys)
    rng = np.random.default_rng(seed)
    moved: list[Measurement] = []
    for key in task_keys:
        rows = [r for r in split.test if r.task_key == key and r.latency is not None]
        moved += [rows[i] for i in sorted(rng.permutation(len(rows))[:per_task])]
    test = [r for r in split.test if r.task_key not in chosen]
    if not test:
        raise UsageError(f"--split {split.spec}: fine-tuning on {len(chosen)} tasks leaves nothing to test")
    return Split(f"{split.spec}+finetune:{len(chosen)}x{per_task}", split.train + moved, test, split.weights)


def device_of(dataset: Dataset, text: str) -> str:
    """The device id ``text`` names: an id, or a prefix of exactly one."""
    if text in dataset.devices:
        return text
    matches = [d for d in dataset.devices if d.startswith(text)]
    if len(matches) != 1:
        raise UsageError(f"device {text}: not one of the dataset's devices ({', '.join(dataset.devices) or 'none'})")
    return matches[0]


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _fraction(spec: str, value: str) -> float:
    fraction = float(value) if _is_number(value) else -1.0
    if not 0 < fraction < 1:
        raise UsageError(f"split {spec}: the fraction must be a number between 0 and 1")
    return fraction
