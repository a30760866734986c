"""TLM's own loop (``tunecore tlm loop``): rounds of generate, measure, fine-tune on the best of every sketch.

Each round the weights of the round before (the base weights in the first) write ``per_round`` new programs
for every task of the training workloads, measured on this machine by the label protocol into the loop's
own dataset file (``tunecore dataset collect --search tlm --cost-model none``, the model not learning while it
writes). Then the base weights are fine-tuned afresh, as TLM restarts from its base model each round, on the
fastest program of every sketch of every training task in everything measured so far: the loop's programs,
the given datasets' and the teachers' (datasets, e.g. a long ansor run's store written as one by `tunecore
dataset export`).

After each round, and for the base weights before the first, the loss on the held-out workloads' best
programs (the fastest of each of their (task, device) in the datasets) is reported: teacher-forced, and over
the tokens the decoder may choose beside a uniform choice among them. A loop that teaches the model what
fast programs look like makes it fall.

Round r fills every training task up to r x ``per_round`` usable programs on this device (a round that wrote
fewer, or noisy ones, is made up by the next). Resumable: round r's weights are ``OUT.round<r>.pt``, its start
and its report lines of ``OUT.rounds.jsonl``, whose first line holds the loop's settings (another loop's log is
an error); a round with its weights is done, a collection that was stopped (``time_limit``, which bounds the
measuring: training a round takes minutes more) continues where it stopped, and training from its checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from typing import Any, Callable, Sequence

from tunecore.dataset import CollectPlan, Dataset, collect
from tunecore.interfaces import CHECKPOINT, Progress, UsageError, has_kernel
from tunecore_tlm_generator import model as lm
from tunecore_tlm_generator.search import SHIPPED_BASE
from tunecore_tlm_generator.training import (
    Sketches,
    best_programs,
    remove_checkpoints,
    resolved_targets,
    task_targets,
    train,
)

ROUNDS_LOG = ".rounds.jsonl"


@dataclasses.dataclass
class LoopPlan:
    datasets: Sequence[str]  # measured programs: teachers of the training tasks, the held-out workloads' best
    exclude: Sequence[str]  # held-out workloads: none of their kernels (in the datasets) is written or learned
    out: str  # the last round's weights; OUT.round<r>.pt, OUT.rounds.jsonl and the programs file beside it
    models: Sequence[str] = ()  # training workloads the model writes programs for (default: the datasets' others)
    kernels: Sequence[str] = ()  # only tasks of these operators (as for collect --kernels)
    teachers: Sequence[str] = ()  # more programs to learn from, not evaluated: dataset files
    weights: str = "shipped-base"
    rounds: int = 4
    per_round: int = 16  # programs per task and round: round r fills each task up to r x per_round usable ones
    temperature: float = 1.0
    top: int = 1  # fastest programs per sketch learned from
    steps: int | None = None  # optimizer steps per round (default: 10 epochs, at least 100)
    batch_size: int = 32
    lr: float = 3e-4
    seed: int = 0
    time_limit: float | None = None  # seconds of measuring in this invocation (resumable); a round's training runs on
    programs: str | None = None  # the loop's dataset file (default: OUT.programs.parquet)
    targets: Sequence[str] = ()  # devices the programs are written for and measured on (default: as collect's)


def run_loop(plan: LoopPlan, on_progress: Callable[[Progress], None] | None = None) -> dict[str, Any]:
    """The rounds ``plan`` asks for that are not done yet; returns every round's report."""
    started = time.time()
    base = SHIPPED_BASE if plan.weights == "shipped-base" else plan.weights
    _, vocab, _ = lm.load(base)
    programs_path = plan.programs or plan.out + ".programs.parquet"
    datasets = [Dataset.load(path) for path in plan.datasets]
    known = set().union(*(d.workloads() for d in datasets))
    unknown = sorted(set(plan.exclude) - known)
    if unknown:
        raise UsageError(f"--exclude {unknown[0]}: no dataset has it, so nothing would be held out")
    models = list(plan.models) or sorted(known - set(plan.exclude))
    if not models:
        raise UsageError("no training workload: the datasets hold only held-out ones (--exclude); name --model")
    if set(models) & set(plan.exclude):
        raise UsageError(f"--model {sorted(set(models) & set(plan.exclude))[0]} is held out (--exclude)")
    sketches = Sketches()
    held_out = _held_out_programs(datasets, plan, sketches)
    if not held_out:
        raise UsageError("no measured program of the held-out workloads (--exclude) to report the loss on")
    # every kernel a held-out workload has is neither written nor measured, also where a training workload shares it
    held_keys = frozenset(key for d in datasets for key, t in d.tasks.items() if set(plan.exclude) & set(t.workloads))
    log_path = plan.out + ROUNDS_LOG
    targets = resolved_targets(plan.targets)  # `llvm` on another CPU is another device: another loop's log
    settings = _settings(plan, base, models, targets)
    done, round_starts = _read_log(log_path, settings)
    if 0 not in done:
        done[0] = {"round": 0, "weights": base, "settings": settings, **_held_out_losses(lm.load(base)[0], vocab,
                                                                                         held_out)}
        _append_log(log_path, done[0])
    for round_ in range(1, plan.rounds + 1):
        if round_ in done:
            continue
        left = None if plan.time_limit is None else plan.time_limit - (time.time() - started)
        if left is not None and left <= 0:
            break
        if round_ not in round_starts:
            round_starts[round_] = time.time()
            _append_log(log_path, {"round": round_, "started_at": round_starts[round_]})
        # a seed of its own for each invocation of the round: a resumed one writes new programs, not the same again
        already = len(Dataset.load(programs_path).rows) if os.path.exists(programs_path) else 0
        collected = collect(programs_path, CollectPlan(
            models, targets=targets or None, per_task=round_ * plan.per_round, random_fraction=0.0, search="tlm",
            cost_model="none",
            options={"search": {"weights": done[round_ - 1]["weights"], "online": False,
                                "temperature": plan.temperature}},
            seed=plan.seed + 7919 * round_ + already, time_limit=left, anchors=0, kernels=tuple(plan.kernels),
            skip=held_keys), on_progress=on_progress)
        if any(device["stopped"] for device in collected["devices"]):
            break  # the time limit: the collection resumes next time
        done[round_] = _round(plan, round_, base, vocab, datasets, programs_path, sketches, models, held_out,
                              round_starts[round_], on_progress)
        _append_log(log_path, done[round_])
    reports = [done[r] for r in sorted(done)]
    if reports[-1]["round"] > 0:
        shutil.copyfile(reports[-1]["weights"], plan.out)
    return {"rounds": reports, "done": all(r in done for r in range(plan.rounds + 1)), "programs": programs_path,
            "workloads": models, "held_out_programs": len(held_out), "elapsed_s": round(time.time() - started, 1)}


def _round(plan: LoopPlan, round_: int, base: str, vocab: Any, datasets: list, programs_path: str, sketches: Any,
           models: list[str], held_out: list, started_at: float,
           on_progress: Callable[[Progress], None] | None) -> dict[str, Any]:
    """Fine-tune the base weights on the best program of every sketch of the training tasks measured so far."""
    weights = f"{plan.out}.round{round_}.pt"
    loop_programs = Dataset.load(programs_path)
    teachers = _merged([*datasets, *(Dataset.load(path) for path in plan.teachers), loop_programs])
    best = best_programs(teachers, sketches, _wanted(task_targets(teachers, plan.exclude), plan.kernels), plan.top,
                         per_sketch=True)
    model, _, base_metadata = lm.load(base)
    examples = _encoded([(p, d) for p, d, _ in best], vocab, model)
    if not examples:
        raise UsageError("no measured program of a sketch TLM can write to learn from")
    steps = plan.steps or max(100, 10 * len(examples) // plan.batch_size)
    settings = {"base": os.path.abspath(base), "round": round_, "examples": len(examples), "seed": plan.seed}
    train(model, examples, steps, batch_size=plan.batch_size, lr=plan.lr, schedule="constant",
          seed=plan.seed + round_, checkpoint=weights + CHECKPOINT, settings=settings, on_progress=on_progress)
    trained_on = {"datasets": [os.path.basename(p) for p in plan.datasets], "exclude": sorted(plan.exclude),
                  "teachers": [os.path.basename(p) for p in plan.teachers],
                  "workloads": models, "programs": len(examples), "steps": steps}
    lm.save(weights, model, vocab, {"stage": "loop", "round": round_, "base": base_metadata.get("trained_on", {}),
                                    "trained_on": trained_on})
    remove_checkpoints(weights)
    return {"round": round_, "weights": weights, **_round_programs(loop_programs, started_at),
            "examples": len(examples), "steps": steps, **_held_out_losses(model, vocab, held_out)}


def _settings(plan: LoopPlan, base: str, models: list[str], targets: list[str]) -> dict[str, Any]:
    """What a loop's rounds depend on: a log written with other settings is another loop's. (Logs of loops
    on the default device have no targets.)"""
    return {"weights": os.path.abspath(base), "datasets": [os.path.abspath(p) for p in plan.datasets],
            "exclude": sorted(plan.exclude), "models": models, "kernels": sorted(plan.kernels),
            "teachers": [os.path.abspath(p) for p in plan.teachers], "per_round": plan.per_round,
            "temperature": plan.temperature, "top": plan.top, **({"targets": targets} if targets else {})}


def _wanted(pairs: list, kernels: Sequence[str]) -> list:
    return [(task, target) for task, target in pairs
            if not kernels or has_kernel(task.kernel_class, kernels)]


def _held_out_programs(datasets: Sequence[Any], plan: LoopPlan, sketches: Any) -> list:
    """(prompt, decisions) of the fastest measured program of every held-out (task, target, device) (of the
    ``kernels`` the loop learns, if it names some)."""
    held = []
    for dataset in datasets:
        pairs = [(task, target) for task, target in task_targets(dataset) if set(plan.exclude) & set(task.workloads)]
        held += [(p, d) for p, d, _ in best_programs(dataset, sketches, _wanted(pairs, plan.kernels), top=1)]
    return held


def _held_out_losses(model: Any, vocab: Any, held_out: list) -> dict[str, Any]:
    """The held-out losses (None where no program could be scored) and how many programs they are over."""
    choice = lm.choice_loss(model, vocab, held_out)
    examples = _encoded(held_out, vocab, model)
    return {"held_out_programs": choice["programs"],
            "held_out_loss": round(lm.mean_loss(model, examples), 4) if examples else None,
            "held_out_choice_loss": round(choice["loss"], 4) if choice["programs"] else None,
            "uniform_choice_loss": round(choice["uniform_loss"], 4) if choice["programs"] else None}


def _encoded(programs: list, vocab: Any, model: Any) -> list:
    """Training examples of (prompt, decisions) programs that encode within the model's context."""
    return [e for p, d in programs if (e := lm.encode_example(p, d, vocab)) and len(e[0]) <= model.config.context]


def _round_programs(programs: Any, since: float) -> dict[str, Any]:
    """What the round (measured since ``since``) measured, how many of those the model wrote (the rest are uniform
    samples filling in where it wrote too few new valid ones), and how its fastest program of each task compares
    with the earlier rounds' (geometric mean of round best / best before it; below 1: the round found faster)."""
    rows = [r for r in programs.rows if r.measured_at >= since]
    groups: dict[tuple, tuple[list, list]] = {}
    for row in programs.rows:
        if row.latency is not None:
            groups.setdefault((row.task_key, row.device_id), ([], []))[row.measured_at >= since].append(row.latency)
    ratios = [min(now) / min(before) for before, now in groups.values() if before and now]
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    return {"measured": len(rows), "written_by_the_model": sum(r.origin == "tlm" for r in rows),
            "failed": sum(r.latency is None for r in rows),
            "best_vs_earlier_rounds": round(geomean, 4) if geomean is not None else None}


def _merged(datasets: Sequence[Any]) -> Any:
    merged = Dataset()
    for dataset in datasets:
        merged.merge(dataset)
    return merged


def _read_log(path: str, settings: dict[str, Any]) -> tuple[dict[int, dict[str, Any]], dict[int, float]]:
    """The reports of the rounds done (round 0 and those whose weights exist), and when each round began; a log of
    a loop with other settings is a one-line error. A line cut short (a kill while writing) is skipped."""
    if not os.path.exists(path):
        return {}, {}
    lines = []
    with open(path) as f:
        for text in f:
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError:
                continue
    starts = {line["round"]: line["started_at"] for line in lines if "started_at" in line}
    done = {line["round"]: line for line in lines
            if "weights" in line and (line["round"] == 0 or os.path.exists(line["weights"]))}
    if 0 in done and done[0].get("settings") != settings:
        raise UsageError(f"{path} is the log of a loop with other settings (weights, datasets, --exclude, --model, "
                         "--kernels, --teachers, --per-round, --temperature or --top): use another --out")
    return done, starts


def _append_log(path: str, report: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(report) + "\n")
