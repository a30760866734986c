"""A task's sketches as TLM prompts, and decisions applied back to them (needs TVM, not torch).

What each decision slot may be is read from the schedule while the sketch is replayed: the loop a
tile splits, the candidates of a categorical, whether a block can be inlined. Applying decisions
checks the tiled loops again, so a program never silently comes from a sketch whose slots differ
from those the model was asked to fill.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from tunecore.interfaces import to_plain
from tunecore_tlm_generator.gpu_limits import Limits, derive
from tunecore_tlm_generator.sentences import (
    SAMPLING,
    SketchPrompt,
    Slot,
    Unexpressible,
    Vocabulary,
    decisions_in,
    skeleton_id,
    skeleton_words,
    sketch_insts,
    task_words,
)


def sketch_json(sketch: Any) -> list:
    return to_plain(sketch.trace.as_json(remove_postproc=True))


def probe(space: Any, index: int) -> SketchPrompt:
    """The prompt and decision slots of sketch ``index`` of a DesignSpace (a sketch without decisions is one
    program and has none); Unexpressible if the sentences cannot write it."""
    trace = space.sketches[index].trace
    insts = sketch_insts(sketch_json(space.sketches[index]))
    kinds = {inst[0] for inst in insts if inst[0].startswith("Sample")}
    if kinds - set(SAMPLING):
        raise Unexpressible(f"sketch {index} samples with {sorted(kinds - set(SAMPLING))}")
    slots: list[Slot] = []
    read_at_cache: dict[int, str] = {}  # a CacheRead's index -> the region its block reads then (gpu_limits)
    replayed = iter(range(len(insts)))

    def provider(sch: Any, inst: Any, inputs: Any, attrs: Any, decision: Any) -> Any:
        kind, index = inst.kind.name, next(replayed, -1)
        if kind in SAMPLING:
            slots.append(_slot(sch, kind, inputs, attrs))
        elif kind == "CacheRead" and int(attrs[0]) < len(sch.get(inputs[0]).reads):
            read_at_cache[index] = str(sch.get(inputs[0]).reads[int(attrs[0])])
        return decision

    sch, reason = space.apply_explained(trace, keep_decisions=True, postprocs=[_NoPostproc()],
                                        decision_provider=provider)
    if sch is None:
        raise Unexpressible(f"sketch {index} does not replay: {reason}")
    sampled = [i for i, inst in enumerate(insts) if inst[0] in SAMPLING]
    numbers = Vocabulary()
    for slot in slots:  # raises for a number the vocabulary cannot write
        numbers.encode(slot.forced_words())
    words = task_words(space.task) + ["SKETCH"] + skeleton_words(insts)
    threads, shared = derive(space.task, insts, {inst: slot for slot, inst in enumerate(sampled)}, read_at_cache)
    return SketchPrompt(index, words, slots, sampled, len(insts), skeleton_id(insts),
                        Limits(slots, threads, shared) if threads or shared else None)


def _slot(sch: Any, kind: str, inputs: Any, attrs: Any) -> Slot:
    if kind == "SamplePerfectTile":
        extent = getattr(sch.get(inputs[0]).extent, "value", None)
        if not isinstance(extent, int):
            raise Unexpressible("a tiled loop has a symbolic extent")
        return Slot(kind, extent=extent, n=int(attrs[0]), max_innermost=int(attrs[1]))
    if kind == "SampleCategorical":
        return Slot(kind, candidates=tuple(int(c) for c in attrs[0]))
    try:
        sch.copy().compute_inline(inputs[0])  # on a copy: the replayed trace must not change
        inline = True
    except Exception:  # TVM says why a block cannot be inlined by raising
        inline = False
    return Slot(kind, inline=inline)


class _NoPostproc:
    """Probing needs the sketch's instructions, not a postprocessed program."""

    def apply(self, sch: Any) -> bool:
        return True


def apply_decisions(space: Any, prompt: SketchPrompt, decisions: Sequence[Any], seed: int | None = None,
                    postprocs: list | None = None) -> tuple[Any | None, str | None]:
    """The sketch with these decisions, postprocessed: (schedule, None), or (None, why it is not a program)."""
    trace = space.sketches[prompt.sketch_index].trace
    queue = list(zip(prompt.slots, decisions))
    mismatch: list[str] = []

    def provider(sch: Any, inst: Any, inputs: Any, attrs: Any, decision: Any) -> Any:
        if inst.kind.name not in SAMPLING:
            return decision
        slot, chosen = queue.pop(0)
        if inst.kind.name == "SamplePerfectTile" and sch.get(inputs[0]).extent.value != slot.extent:
            mismatch.append(f"a tiled loop has extent {sch.get(inputs[0]).extent.value}, not {slot.extent}")
        return chosen

    sch, reason = space.apply_explained(trace, keep_decisions=False, seed=seed, postprocs=postprocs,
                                        decision_provider=provider)
    if mismatch:
        return None, mismatch[0]
    return sch, reason


def sampled_decisions(space: Any, prompt: SketchPrompt, seed: int) -> list[Any] | None:
    """Decisions TVM's own samplers make for the sketch (an unlabeled random program), without postprocessing."""
    sch, _ = space.apply_explained(space.sketches[prompt.sketch_index].trace, keep_decisions=False, seed=seed,
                                   postprocs=[_NoPostproc()])
    if sch is None:
        return None
    decisions = decisions_in(to_plain(sch.trace.as_json(remove_postproc=True)), prompt)
    if decisions is None or not all(s.is_valid(d) for s, d in zip(prompt.slots, decisions)):
        return None
    return decisions


def trace_decisions(trace_json: str, prompt: SketchPrompt) -> list[Any] | None:
    """A stored trace's decisions for ``prompt``'s slots, or None if the trace is of another sketch."""
    decisions = decisions_in(json.loads(trace_json), prompt)
    if decisions is None or not all(s.is_valid(d) for s, d in zip(prompt.slots, decisions)):
        return None
    return decisions


def realize(space: Any, prompt: SketchPrompt, sample: Any, seed: int | None = None, postprocs: list | None = None,
            tries: int = 8) -> tuple[Any | None, bool]:
    """The program of a generated sample: (schedule or None, whether a compute location had to change).

    A compute location can make a loop whose extent depends on another (MetaSchedule's
    DisallowDynamicLoop rejects the program; TVM's own sampler has the same problem). Then the
    locations are tried again in the order the model ranked them, last slot first, up to ``tries``
    programs, and finally at the root, which is always static: a sample always gives a program.
    """
    sch, _ = apply_decisions(space, prompt, sample.decisions, seed, postprocs)
    if sch is not None or not sample.locations:
        return sch, False
    decisions = list(sample.decisions)
    attempts = 0
    for slot in sorted(sample.locations, reverse=True):
        for value in sample.locations[slot]:
            if attempts >= tries:
                break
            attempts += 1
            trial = decisions[:slot] + [value] + decisions[slot + 1:]
            sch, _ = apply_decisions(space, prompt, trial, seed, postprocs)
            if sch is not None:
                return sch, True
    at_root = [-1 if s.kind == "SampleComputeLocation" else d for s, d in zip(prompt.slots, decisions)]
    sch, _ = apply_decisions(space, prompt, at_root, seed, postprocs)
    return sch, True
