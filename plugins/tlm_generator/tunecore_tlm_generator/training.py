"""Training data from a dataset: the sketches of its tasks as prompts, random programs for pre-training
(TVM's own samplers, nothing measured), the best measured programs for fine-tuning."""

from __future__ import annotations

import collections
import concurrent.futures
import json
from typing import Any, Callable, Sequence

from tunecore_tlm_generator.sentences import SketchPrompt, Unexpressible


def task_targets(dataset: Any, exclude: Sequence[str] = ()) -> list[tuple[Any, str]]:
    """(dataset task, target JSON) for every task measured on a target, without the tasks of ``exclude``d workloads.

    A kernel that also occurs in an excluded workload is excluded with it (TLM's hold-out): a network
    held out for evaluation must not have any of its kernels in training.
    """
    excluded = set(exclude)
    pairs = {(row.task_key, row.target) for row in dataset.rows}
    return [(dataset.tasks[key], target) for key, target in sorted(pairs)
            if not excluded & set(dataset.tasks[key].workloads)]


class Sketches:
    """The prompts of a task's sketches on a target (probed once, cached), with the task's design space."""

    def __init__(self) -> None:
        self.cache: dict[tuple[str, str], tuple[Any, list[SketchPrompt], list[str]]] = {}

    def of(self, dataset_task: Any, target_json: str) -> tuple[Any, list[SketchPrompt], list[str]]:
        """(design space, prompts, why the other sketches cannot be written)."""
        from tunecore.interfaces import DesignSpace
        from tunecore_tlm_generator.sketches import probe

        key = (dataset_task.key, target_json)
        if key not in self.cache:
            space = DesignSpace(dataset_task.for_target(target_json))
            prompts, skipped = [], []
            for i in range(len(space.sketches)):
                try:
                    prompts.append(probe(space, i))
                except Unexpressible as error:
                    skipped.append(str(error))
            self.cache[key] = (space, prompts, skipped)
        return self.cache[key]


def random_programs(sketches: Sketches, pairs: Sequence[tuple[Any, str]], per_sketch: int, seed: int,
                    threads: int, on_task: Callable[[], None] | None = None) -> list[tuple[SketchPrompt, list[Any]]]:
    """``per_sketch`` unlabeled programs (decisions TVM's samplers made) of every sketch of every task."""
    from tunecore.interfaces import derive_seed
    from tunecore_tlm_generator.sketches import sampled_decisions

    out: list[tuple[SketchPrompt, list[Any]]] = []
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:  # TVM releases the GIL while it replays
        for dataset_task, target in pairs:
            space, prompts, _ = sketches.of(dataset_task, target)
            jobs = [(p, derive_seed(seed, dataset_task.key, target, p.sketch_index, i))
                    for p in prompts if p.slots for i in range(per_sketch)]  # one program: nothing to learn
            for prompt, decisions in zip([p for p, _ in jobs],
                                         pool.map(lambda job: sampled_decisions(space, job[0], job[1]), jobs)):
                if decisions is not None:
                    out.append((prompt, decisions))
            if on_task:
                on_task()
    return out


def best_programs(dataset: Any, sketches: Sketches, pairs: Sequence[tuple[Any, str]], top: int,
                  device_ids: set[str] | None = None) -> list[tuple[SketchPrompt, list[Any], float]]:
    """The ``top`` fastest measured programs of each (task, device), as (prompt, decisions, latency / best).

    Programs whose trace is of none of the task's writable sketches (another TVM's, or a sketch the
    sentences cannot express) are left out.
    """
    from tunecore_tlm_generator.sketches import trace_decisions

    wanted = {(t.key, target) for t, target in pairs}
    rows = collections.defaultdict(list)
    for row in dataset.rows:
        if row.latency is not None and (row.task_key, row.target) in wanted and \
                (device_ids is None or row.device_id in device_ids):
            rows[(row.task_key, row.target, row.device_id)].append(row)
    out = []
    for (key, target, _), measured in sorted(rows.items()):
        _, prompts, _ = sketches.of(dataset.tasks[key], target)
        kept = []
        measured.sort(key=lambda r: r.latency)
        for row in measured:
            for prompt in (p for p in prompts if p.slots):
                decisions = trace_decisions(row.trace, prompt)
                if decisions is not None:
                    kept.append((prompt, decisions, row.latency / measured[0].latency))
                    break
            if len(kept) >= top:
                break
        out += kept
    return out


def describe(pairs: Sequence[tuple[Any, str]]) -> dict[str, Any]:
    workloads = sorted({w for t, _ in pairs for w in t.workloads})
    targets = sorted({json.loads(t).get("mcpu", json.loads(t)["kind"]) for _, t in pairs})
    return {"tasks": len({t.key for t, _ in pairs}), "workloads": workloads, "targets": targets}
