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

Resumable: round r's weights are ``OUT.round<r>.pt``, its start and its report lines of ``OUT.rounds.jsonl``; a
round with both is done, a collection that was stopped continues where it stopped (tunecore.dataset's
collect), and training continues from its checkpoint.
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
from tunecore.interfaces import Progress, UsageError
from tunecore_tlm_generator import model as lm
from tunecore_tlm_generator.search import SHIPPED_BASE
from tunecore_tlm_generator.training import (
    CHECKPOINT,
    Sketches,
    best_programs,
    remove_checkpoints,
    task_targets,
    train,
)

ROUNDS_LOG = ".rounds.jsonl"


@dataclasses.dataclass
class LoopPlan:
    datasets: Sequence[str]  # measured programs: teachers of the training tasks, the held-out workloads' best
    exclude: Sequence[str]  # held-out workloads: none of their kernels is written, measured or learned from
    out: str  # the last round's weights; OUT.round<r>.pt, OUT.rounds.jsonl and the programs file beside it
    models: Sequence[str] = ()  # training workloads the model writes programs for (default: the datasets' others)
    kernels: Sequence[str] = ()  # only tasks of these operators (as for collect --kernels)
    teachers: Sequence[str] = ()  # more programs to learn from, not evaluated: dataset files
    weights: str = "shipped-base"
    rounds: int = 4
    per_round: int = 16  # programs written per task and round
    temperature: float = 1.0
    top: int = 1  # fastest programs per sketch learned from
    steps: int | None = None  # optimizer steps per round (default: 10 epochs, at least 100)
    batch_size: int = 32
    lr: float = 3e-4
    seed: int = 0
    time_limit: float | None = None  # seconds for this invocation; stops between or inside rounds, resumable
    programs: str | None = None  # the loop's dataset file (default: OUT.programs.parquet)


def run_loop(plan: LoopPlan, on_progress: Callable[[Progress], None] | None = None) -> dict[str, Any]:
    """The rounds ``plan`` asks for that are not done yet; returns every round's report."""
    started = time.time()
    base = SHIPPED_BASE if plan.weights == "shipped-base" else plan.weights
    _, vocab, _ = lm.load(base)
    programs_path = plan.programs or plan.out + ".programs.parquet"
    datasets = [Dataset.load(path) for path in plan.datasets]
    models = list(plan.models) or _training_workloads(datasets, plan.exclude)
    if not models:
        raise UsageError("no training workload: the datasets hold only held-out ones (--exclude); name --model")
    if set(models) & set(plan.exclude):
        raise UsageError(f"--model {sorted(set(models) & set(plan.exclude))[0]} is held out (--exclude)")
    sketches = Sketches()
    held_out = _held_out_programs(datasets, plan.exclude, sketches)
    log_path = plan.out + ROUNDS_LOG
    reports, round_starts = _read_log(log_path)
    if not reports:
        reports = [{"round": 0, "weights": base, **_held_out_losses(lm.load(base)[0], vocab, held_out)}]
        _append_log(log_path, reports[0])
    for round_ in range(len(reports), plan.rounds + 1):
        weights = f"{plan.out}.round{round_}.pt"
        previous = reports[-1]["weights"]
        left = None if plan.time_limit is None else plan.time_limit - (time.time() - started)
        if left is not None and left <= 0:
            break
        if round_ not in round_starts:
            round_starts[round_] = time.time()
            _append_log(log_path, {"round": round_, "started_at": round_starts[round_]})
        collected = collect(programs_path, CollectPlan(
            models, per_task=round_ * plan.per_round, random_fraction=0.0, search="tlm", cost_model="none",
            options={"search": {"weights": previous, "online": False, "temperature": plan.temperature}},
            seed=plan.seed + round_, time_limit=left, anchors=0, kernels=tuple(plan.kernels)), on_progress=on_progress)
        if any(device["stopped"] for device in collected["devices"]):
            break  # the time limit: the collection resumes next time
        loop_programs = Dataset.load(programs_path)
        teachers = _merged([*datasets, *(Dataset.load(path) for path in plan.teachers), loop_programs])
        best = best_programs(teachers, sketches, task_targets(teachers, plan.exclude), plan.top, per_sketch=True)
        model, _, _ = lm.load(base)
        examples = _encoded([(p, d) for p, d, _ in best], vocab, model)
        if not examples:
            raise UsageError("no measured program of a sketch TLM can write to learn from")
        steps = plan.steps or max(100, 10 * len(examples) // plan.batch_size)
        settings = {"base": os.path.abspath(base), "round": round_, "examples": len(examples), "seed": plan.seed}
        train(model, examples, steps, batch_size=plan.batch_size, lr=plan.lr, schedule="constant",
              seed=plan.seed + round_, checkpoint=weights + CHECKPOINT, settings=settings, on_progress=on_progress)
        lm.save(weights, model, vocab, {"stage": "loop", "round": round_, "trained_on": {
            "datasets": [os.path.basename(p) for p in plan.datasets], "exclude": ",".join(plan.exclude),
            "workloads": models, "programs": len(examples), "steps": steps}})
        remove_checkpoints(weights)
        report = {"round": round_, "weights": weights, **_round_programs(loop_programs, round_starts[round_]),
                  "examples": len(examples), "steps": steps, **_held_out_losses(model, vocab, held_out)}
        _append_log(log_path, report)
        reports.append(report)
    if reports[-1]["round"] > 0:
        shutil.copyfile(reports[-1]["weights"], plan.out)
    return {"rounds": reports, "done": reports[-1]["round"] >= plan.rounds, "programs": programs_path,
            "workloads": models, "held_out_programs": len(held_out), "elapsed_s": round(time.time() - started, 1)}


def _training_workloads(datasets: Sequence[Any], exclude: Sequence[str]) -> list[str]:
    workloads = {w for d in datasets for t in d.tasks.values() for w in t.workloads}
    return sorted(workloads - set(exclude))


def _held_out_programs(datasets: Sequence[Any], exclude: Sequence[str], sketches: Any) -> list:
    """(prompt, decisions) of the fastest measured program of every held-out (task, target, device)."""
    held = []
    for dataset in datasets:
        pairs = [(task, target) for task, target in task_targets(dataset) if set(exclude) & set(task.workloads)]
        held += [(p, d) for p, d, _ in best_programs(dataset, sketches, pairs, top=1)]
    return held


def _held_out_losses(model: Any, vocab: Any, held_out: list) -> dict[str, Any]:
    if not held_out:
        return {}
    choice = lm.choice_loss(model, vocab, held_out)
    return {"held_out_loss": round(lm.mean_loss(model, _encoded(held_out, vocab, model)), 4),
            "held_out_choice_loss": round(choice["loss"], 4),
            "uniform_choice_loss": round(choice["uniform_loss"], 4)}


def _encoded(programs: list, vocab: Any, model: Any) -> list:
    """Training examples of (prompt, decisions) programs that encode within the model's context."""
    return [e for p, d in programs if (e := lm.encode_example(p, d, vocab)) and len(e[0]) <= model.config.context]


def _round_programs(programs: Any, since: float) -> dict[str, Any]:
    """What the round (measured since ``since``) wrote, and how its fastest program of each task compares with the
    earlier rounds' (geometric mean of round best / best before it; below 1: the round found faster programs)."""
    rows = [r for r in programs.rows if r.measured_at >= since]
    groups: dict[tuple, tuple[list, list]] = {}
    for row in programs.rows:
        if row.latency is not None:
            groups.setdefault((row.task_key, row.device_id), ([], []))[row.measured_at >= since].append(row.latency)
    ratios = [min(now) / min(before) for before, now in groups.values() if before and now]
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    return {"measured": len(rows), "failed": sum(r.latency is None for r in rows),
            "best_vs_earlier_rounds": round(geomean, 4) if geomean is not None else None}


def _merged(datasets: Sequence[Any]) -> Any:
    merged = Dataset()
    for dataset in datasets:
        merged.merge(dataset)
    return merged


def _read_log(path: str) -> tuple[list[dict[str, Any]], dict[int, float]]:
    """The reports of the rounds done (their weights written), and when each round began."""
    if not os.path.exists(path):
        return [], {}
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    starts = {line["round"]: line["started_at"] for line in lines if "started_at" in line}
    done = [line for line in lines if "weights" in line and (line["round"] == 0 or os.path.exists(line["weights"]))]
    return done, starts


def _append_log(path: str, report: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(report) + "\n")
