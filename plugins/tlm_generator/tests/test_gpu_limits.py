"""A GPU sketch's limits (threads per block, shared memory) read from its trace, checked against MetaSchedule's GPU
postprocessors, and decoding within them."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tunecore_tlm_generator import model as lm
from tunecore_tlm_generator.gpu_limits import Dim, Factor, Limits, Shared, SharedBuffer, Threads
from tunecore_tlm_generator.sentences import Slot, Vocabulary
from tunecore_tlm_generator.sketches import apply_decisions, probe, realize, sampled_decisions

# bench/results/gpu.json's H100 target, as the GPU dataset holds it
H100 = {"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 1024, "max_shared_memory_per_block": 49152,
        "thread_warp_size": 32, "registers_per_block": 65536, "max_num_threads": 1024}


@pytest.fixture(scope="module", params=["matmul-1024", "conv2d-resnet50-c2"])
def gpu_space(request):
    from tunecore.space import DesignSpace
    from tunecore.targets import resolve_target
    from tunecore.testing import tiny_task

    space = DesignSpace(tiny_task(request.param, resolve_target(json.dumps(H100))))
    return space, [probe(space, i) for i in range(len(space.sketches))]


def test_the_limits_reject_only_programs_the_gpu_checks_reject(gpu_space):
    """Uniform samples: every program the limits rule out fails the postprocessors (VerifyGPUCode), and on these
    multi-level tiling sketches (three per task: one copy of the shared tiles, and three or four where a software
    pipeline keeps the next stages') the programs they let through pass, so their count is the valid share (3-11% of
    uniform samples)."""
    space, prompts = gpu_space
    assert all(p.limits and p.limits.threads and p.limits.shared for p in prompts)
    counts = {(True, True): 0, (True, False): 0, (False, True): 0, (False, False): 0}
    for seed in range(1, 91):
        prompt = prompts[seed % len(prompts)]
        decisions = sampled_decisions(space, prompt, seed)
        written = [slot.from_decision(d) for slot, d in zip(prompt.slots, decisions)]
        sch, _ = apply_decisions(space, prompt, decisions, seed=1, postprocs=space.thread_postprocs())
        counts[(prompt.limits.satisfied(written, False), sch is not None)] += 1
    assert counts[(False, True)] == 0  # never a valid program ruled out
    assert counts[(True, True)] >= 3 and counts[(True, False)] == 0, counts
    assert counts[(False, False)] >= 70


@pytest.mark.parametrize("inner_first", [False, True])
def test_decoding_within_the_limits_writes_programs_the_gpu_accepts(gpu_space, inner_first):
    """An untrained model, masked by the legal factors alone, writes programs MetaSchedule's GPU checks reject
    nearly always (as uniform samples are); within the limits nearly all of its programs pass."""
    space, prompts = gpu_space
    vocab = Vocabulary([w for p in prompts for w in p.words if isinstance(w, str)],
                       "inner-first" if inner_first else "outer-first")
    model = lm.new_model(vocab, seed=0, n_layer=1, n_embd=32)
    valid = {}
    for limited in (False, True):
        generator, written = torch.Generator().manual_seed(0), 0
        valid[limited] = 0
        for prompt in prompts:
            for sample in lm.generate(model, vocab, prompt, 16, 1.0, generator, True, limited=limited):
                assert all(s.is_valid(d) for s, d in zip(prompt.slots, sample.decisions))
                sch, _ = realize(space, prompt, sample, seed=3, postprocs=space.thread_postprocs())
                valid[limited] += sch is not None
                written += 1
        assert written == 16 * len(prompts)
    assert valid[False] <= 0.25 * written and valid[True] >= 0.9 * written, valid


def test_a_cpu_sketch_has_no_limits():
    from tunecore.space import DesignSpace
    from tunecore.testing import tiny_task

    space = DesignSpace(tiny_task("matmul-64"))
    assert all(probe(space, i).limits is None for i in range(len(space.sketches)))


_SLOTS = [Slot("SamplePerfectTile", extent=24, n=3, max_innermost=8),
          Slot("SamplePerfectTile", extent=36, n=3, max_innermost=0),
          Slot("SampleCategorical", candidates=(1, 2, 4, 8))]
_THREADS = (Factor(0, (1,)), Factor(1, (1, 2)), Factor(2, (0,)))  # within [8, 64]
_A = SharedBuffer(32, (Dim(1, 24, ((1, Factor(0, (1, 2))),)), Dim(2, 40, ((3, Factor(1, (2,))),))))
_B = SharedBuffer(16, (Dim(1, 36, ((1, Factor(1, (1, 2))),)),), copies=2)
_LIMITS = Limits(_SLOTS, [Threads(_THREADS, low=8, high=64)], [Shared((_A, _B), limit=900)])


def _meets(written: list[list[int]], inner_first: bool) -> bool:
    """The limits above, computed from TVM's decisions (an oracle apart from ``Limits``)."""
    decisions = [slot.to_decision(values, inner_first) for slot, values in zip(_SLOTS, written)]
    decisions[2] = _SLOTS[2].candidates[decisions[2]]
    i, j, unroll = decisions
    threads = i[1] * j[1] * j[2] * unroll
    a = 4 * min(24, 1 + i[1] * i[2] - 1) * min(40, 2 + 3 * (j[2] - 1))
    b = 2 * 2 * min(36, 1 + j[1] * j[2] - 1)
    return 8 <= threads <= 64 and a + b <= 900


def _whole_decisions(prefix: list[list[int]], inner_first: bool) -> list[list[list[int]]]:
    """Every whole decision (each slot's numbers as written) that begins with ``prefix`` (a list per slot)."""
    def of(slot, start):
        if len(start) == slot.numbers:
            return [list(start)]
        return [full for v in slot.choices(list(start), inner_first) for full in of(slot, [*start, v])]

    options = [of(slot, prefix[i] if i < len(prefix) else []) for i, slot in enumerate(_SLOTS)]
    return [list(c) for c in itertools.product(*options)]


def test_the_limits_compute_what_they_describe():
    """``satisfied`` agrees with the oracle on every whole decision, in both tile orders; about a third fit."""
    for inner_first in (False, True):
        every = _whole_decisions([], inner_first)
        assert all(_LIMITS.satisfied(w, inner_first) == _meets(w, inner_first) for w in every)
        assert 0 < sum(_meets(w, inner_first) for w in every) < len(every) / 2


@given(st.booleans(), st.randoms(use_true_random=False))
@settings(max_examples=60, deadline=None)
def test_a_number_the_limits_rule_out_has_no_completion_within_them(inner_first, random):
    """Soundness: decoding never loses a program that meets the limits (a number is ruled out only when no way to
    complete the decisions meets them); with the other slots decided, exactly those that lead to one are kept."""
    decided: list[list[int]] = []
    for i, slot in enumerate(_SLOTS):
        values: list[int] = []
        for _ in range(slot.numbers):
            choices = slot.choices(values, inner_first)
            kept = _LIMITS.allowed(decided, values, choices, inner_first)
            feasible = {v: any(_meets(w, inner_first) for w in _whole_decisions([*decided, [*values, v]], inner_first))
                        for v in choices}
            if any(feasible.values()):
                assert all(v in kept for v in choices if feasible[v]), (decided, values)
                if i == len(_SLOTS) - 1:  # the other slots decided: exact
                    assert kept == [v for v in choices if feasible[v]]
            else:  # nothing meets them: the limits step aside (the postprocessors decide)
                assert kept == choices
            values.append(random.choice(kept))
        decided.append(values)


def test_with_the_other_slots_decided_the_limits_keep_exactly_what_fits():
    decided = [[1, 4, 6], [1, 2, 18]]  # threads 4 * 2 * 18 = 144 > 64 already: nothing fits
    assert _LIMITS.allowed(decided, [], [1, 2, 4, 8], False) == [1, 2, 4, 8]
    decided = [[3, 2, 4], [6, 2, 3]]  # threads 2 * 2 * 3 * unroll: 1, 2 and 4 fit 64, 8 does not
    kept = _LIMITS.allowed(decided, [], [1, 2, 4, 8], False)
    assert kept == [v for v in [1, 2, 4, 8] if _meets([*decided, [v]], False)] and len(kept) < 4


def test_a_rewrite_keeps_a_kept_slot_unless_the_limits_rule_it_out():
    """A rewrite keeps some slots of a program and lets the model write the others; when what it wrote leaves a kept
    slot outside the limits, the model writes that slot (the kept tokens had gone to its later numbers instead)."""
    from tunecore_tlm_generator.sentences import SketchPrompt

    slots = [Slot("SamplePerfectTile", extent=64, n=3), Slot("SamplePerfectTile", extent=64, n=3)]
    limits = Limits(slots, [Threads((Factor(0, (2,)), Factor(1, (0,))), low=32, high=64)], [])
    prompt = SketchPrompt(0, ["TASK", "x"], slots, [0, 1], 2, "s", limits)
    vocab = Vocabulary(["x"])
    kept = lm.slot_tokens(prompt, [[1, 4, 16], [4, 2, 8]], vocab)[1]
    model = lm.new_model(vocab, seed=0, n_layer=1, n_embd=32)
    samples = lm.generate(model, vocab, prompt, 128, 1.0, torch.Generator().manual_seed(0), True,
                          kept=[{1: kept}] * 128)
    assert len(samples) == 128
    for sample in samples:
        assert 32 <= sample.decisions[0][2] * sample.decisions[1][0] <= 64
        fits = 32 <= sample.decisions[0][2] * 4 <= 64
        assert (sample.decisions[1] == [4, 2, 8]) == fits
    written = [s.decisions[1][1] for s in samples if s.decisions[1][0] <= 16 and s.decisions[1] != [4, 2, 8]]
    assert len(written) >= 8 and set(written) != {4}  # the model's own, not the kept first number again
