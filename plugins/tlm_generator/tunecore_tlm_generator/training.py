"""Training data from a dataset: the sketches of its tasks as prompts, random programs for pre-training
(TVM's own samplers, nothing measured), the best measured programs for fine-tuning."""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
from typing import Any, Callable, Sequence

import numpy as np

from tunecore.interfaces import Progress
from tunecore_tlm_generator.sentences import SketchPrompt, Unexpressible


def resolved_targets(specs: Sequence[str]) -> list[str]:
    """The target JSONs of devices given as for `run` (`llvm`, a tag, JSON), sorted, each once: a setting that
    names this CPU as `llvm` names it exactly, so another CPU's `llvm` is another setting."""
    from tunecore.interfaces import target_to_json
    from tunecore.targets import resolve_target

    return sorted({target_to_json(resolve_target(spec)) for spec in specs})


def task_targets(dataset: Any, exclude: Sequence[str] = (), targets: Sequence[str] = ()) -> list[tuple[Any, str]]:
    """(dataset task, target JSON) for every task measured on a target, and for every task on each of ``targets``
    (target JSONs), without the tasks of ``exclude``d workloads.

    A kernel that also occurs in an excluded workload is excluded with it (TLM's hold-out): a network
    held out for evaluation must not have any of its kernels in training.
    """
    excluded = set(exclude)
    pairs = {(row.task_key, row.target) for row in dataset.rows}
    pairs |= {(key, target) for key in {key for key, _ in pairs} for target in targets}
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
                  device_ids: set[str] | None = None,
                  per_sketch: bool = False) -> list[tuple[SketchPrompt, list[Any], float]]:
    """The ``top`` fastest measured programs of each (task, device), or with ``per_sketch`` of each (task, device,
    sketch) (TLM's fine-tuning set on GPUs: the best of every sketch), as (prompt, decisions, latency / best).

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
        kept: dict[int, list] = collections.defaultdict(list)  # by sketch, or all under 0
        writable = sum(1 for p in prompts if p.slots) if per_sketch else 1
        measured.sort(key=lambda r: r.latency)
        for row in measured:
            if len(kept) == writable and all(len(programs) >= top for programs in kept.values()):
                break
            for prompt in (p for p in prompts if p.slots):
                decisions = trace_decisions(row.trace, prompt)
                if decisions is not None:
                    chosen = kept[prompt.sketch_index if per_sketch else 0]
                    if len(chosen) < top:
                        chosen.append((prompt, decisions, row.latency / measured[0].latency))
                    break
        out += [program for programs in kept.values() for program in programs]
    return out


def describe(pairs: Sequence[tuple[Any, str]]) -> dict[str, Any]:
    workloads = sorted({w for t, _ in pairs for w in t.workloads})
    targets = sorted({json.loads(t).get("mcpu", json.loads(t)["kind"]) for _, t in pairs})
    return {"tasks": len({t.key for t, _ in pairs}), "workloads": workloads, "targets": targets}


# The training loop and its files, as nanoGPT keeps them with the model: a checkpoint beside the output (model,
# optimizer, step; tunecore's CHECKPOINT) every CHECKPOINT_EVERY steps, and pre-training's sampled corpus, both
# removed once the weights are written, so that running the same command again continues where it stopped.
CORPUS = ".corpus.npz"
CHECKPOINT_EVERY = 100


def train(model: Any, examples: list, steps: int, *, batch_size: int, lr: float, schedule: str, seed: int,
          checkpoint: str | None = None, settings: dict[str, Any] | None = None,
          on_progress: Callable[[Progress], None] | None = None) -> float:
    """Train with AdamW for ``steps`` (``schedule``: "cosine" with warm-up, or "constant"), resuming from
    ``checkpoint`` when it was written with the same ``settings`` and writing it every CHECKPOINT_EVERY steps;
    reporting each step to ``on_progress`` (stage "training"). Returns the last step's loss."""
    import torch

    from tunecore.interfaces import load_checkpoint, save_checkpoint
    from tunecore_tlm_generator import model as lm

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    factor = (lambda s: lm.warmup_cosine(s, steps)) if schedule == "cosine" else (lambda s: 1.0)
    settings = {**(settings or {}), "steps": steps, "batch_size": batch_size, "lr": lr}
    done = 0
    rng = np.random.default_rng(seed)
    resumed = load_checkpoint(checkpoint, "tlm", settings) if checkpoint else None
    if resumed:
        done, state = resumed
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        rng.bit_generator.state = state["rng"]  # the batches (and dropout) an uninterrupted run would have next
        torch.set_rng_state(state["torch_rng"])
    loss = float("nan")
    while done < steps:
        chunk = min(CHECKPOINT_EVERY, steps - done)

        def step(i: int, value: float, base: int = done) -> None:
            for group in optimizer.param_groups:
                group["lr"] = lr * factor(base + i)
            if on_progress:
                on_progress(Progress("training", base + i, steps, loss=value))

        loss = lm.train_steps(model, optimizer, examples, chunk, batch_size, rng, step)
        done += chunk
        if checkpoint:
            save_checkpoint(checkpoint, "tlm", settings, done,
                            {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state()})
    return loss


def encode_all(programs: list, vocab: Any) -> list:
    """(token ids, counted mask) of every (prompt, decisions) program; those that do not encode are left out."""
    from tunecore_tlm_generator import model as lm

    cache: dict[int, list[int]] = {}
    out = []
    for prompt, decisions in programs:
        ids = cache.setdefault(id(prompt), vocab.encode(prompt.words))
        example = lm.encode_example(prompt, decisions, vocab, ids)
        if example is not None:
            out.append(example)
    return out


def save_corpus(path: str, settings: dict[str, Any], corpus: dict[str, Any]) -> None:
    ids = np.concatenate([np.asarray(i, dtype=np.int32) for i, _ in corpus["examples"]])
    counted = np.concatenate([np.asarray(c, dtype=bool) for _, c in corpus["examples"]])
    lengths = np.asarray([len(i) for i, _ in corpus["examples"]], dtype=np.int32)
    header = json.dumps({"settings": settings, "vocabulary": corpus["vocabulary"]})
    np.savez(path, header=np.asarray(header), ids=ids, counted=counted, lengths=lengths)


def load_corpus(path: str, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The corpus ``save_corpus`` wrote with the same ``settings``; None if there is none."""
    if not os.path.exists(path):
        return None
    with np.load(path, allow_pickle=False) as blob:
        header = json.loads(str(blob["header"]))
        if header["settings"] != settings:
            return None
        ends = np.cumsum(blob["lengths"])
        ids, counted = np.split(blob["ids"], ends[:-1]), np.split(blob["counted"], ends[:-1])
    return {"vocabulary": header["vocabulary"],
            "examples": [(i.tolist(), c.tolist()) for i, c in zip(ids, counted)]}


def remove_checkpoints(out: str) -> None:
    """The checkpoint and corpus of the weights ``out``, once they are written."""
    from tunecore.interfaces import CHECKPOINT

    for leftover in (out + CHECKPOINT, out + CORPUS):
        if os.path.exists(leftover):
            os.remove(leftover)
