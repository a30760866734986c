"""The tlm_generator plugin: sentences of real tasks and their round trip, constrained decoding, training, the
weights file, and `tlm` as the search policy of a run."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tunecore_tlm_generator import model as lm
from tunecore_tlm_generator.sentences import MAX_NUMBER, TILE_ORDERS, UNK, Slot, Vocabulary
from tunecore_tlm_generator.sketches import apply_decisions, realize, sampled_decisions, trace_decisions
from tunecore_tlm_generator.training import Sketches, task_targets

from tunecore.dataset.table import Dataset
from tunecore.targets import cpu_lineage, physical_cores
from tunecore.testing import SearchPolicyConformance
from tunecore.testing.cli import assert_one_line_exit_2, cli_json, run_cli
from tunecore.tvmjson import schedule_key

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SHIPPED = os.path.join(ROOT, "datasets", "cpu-programs.parquet")


class TestTlmIsASearchPolicy(SearchPolicyConformance):
    name = "tlm"


@pytest.fixture(scope="module")
def shipped() -> Dataset:
    return Dataset.load(SHIPPED)


@pytest.fixture(scope="module")
def sketches() -> Sketches:
    return Sketches()


@pytest.fixture(scope="module")
def diverse(shipped) -> list:
    """(dataset task, target) for a task of every third kernel class of the dataset (and of those with compute
    locations), on the primary device's target: convolutions 1-3d, transposed, depthwise, capsule, matmuls,
    pools, softmax, layer norm, injective ops."""
    classes = sorted({t.kernel_class for t in shipped.tasks.values()})
    wanted = set(classes[::3]) | {"conv2d_transpose_add_relu@4d", "softmax@4d"}
    pairs, seen = [], set()
    for task, target in task_targets(shipped):
        if task.kernel_class in wanted - seen and '"num-cores": 2' in target:
            seen.add(task.kernel_class)
            pairs.append((task, target))
    return pairs


def _decode(prompt, vocab, completion_ids):
    steps = lm.completion_steps(prompt, vocab)
    allowed, _ = next(steps)
    for token in completion_ids:
        assert token in allowed
        try:
            allowed, _ = steps.send(token)
        except StopIteration as done:
            return done.value
    raise AssertionError("the completion did not end")


@pytest.mark.parametrize("tile_order", TILE_ORDERS)
def test_sentences_round_trip_on_real_tasks(shipped, sketches, diverse, tile_order):
    """trace -> tokens -> decisions -> program gives the program the trace was, for random and measured programs,
    whichever order the tiles' factors are written in."""
    vocab, checked, measured_checked = Vocabulary(tile_order=tile_order), 0, 0
    for task, target in diverse:
        space, prompts, _ = sketches.of(task, target)
        for prompt in prompts:
            for seed in (1, 2):
                decisions = sampled_decisions(space, prompt, seed)
                assert decisions is not None
                ids, _ = lm.encode_example(prompt, decisions, vocab)
                completion = ids[ids.index(2) + 1:]  # after [SEP]
                assert _decode(prompt, vocab, completion) == [d if isinstance(d, int) else list(d) for d in decisions]
                sch, why = apply_decisions(space, prompt, decisions, seed=seed)
                again, _ = apply_decisions(space, prompt, _decode(prompt, vocab, completion), seed=seed)
                assert sch is not None, why
                assert again is not None and again.mod.script() == sch.mod.script()
                checked += 1
        rows = [r for r in shipped.rows if r.task_key == task.key and r.target == target and r.latency is not None]
        for row in rows[:8]:  # stored programs: the same decisions back, and sampled ones the same program
            for prompt in (p for p in prompts if p.slots):
                decisions = trace_decisions(row.trace, prompt)
                if decisions is None:
                    continue
                ids, _ = lm.encode_example(prompt, decisions, vocab)
                decoded = _decode(prompt, vocab, ids[ids.index(2) + 1:])
                assert decoded == [d if isinstance(d, int) else list(d) for d in decisions]
                if row.origin.endswith("random"):  # evolved ones may carry postprocessing of a mutated trace
                    sch, _ = apply_decisions(space, prompt, decoded)
                    assert schedule_key(sch) == row.program_key
                    measured_checked += 1
    assert checked >= 2 * len(diverse) and measured_checked >= len(diverse)


def test_sentences_are_compact(sketches, diverse):
    vocab = Vocabulary()
    lengths = []
    for task, target in diverse:
        space, prompts, _ = sketches.of(task, target)
        for prompt in prompts:
            ids, _ = lm.encode_example(prompt, sampled_decisions(space, prompt, 1), vocab)
            lengths.append(len(ids))
    assert max(lengths) <= lm.Config(vocab_size=1).context


@given(st.integers(1, 5000), st.integers(1, 5), st.sampled_from([0, 16, 64]), st.booleans(),
       st.randoms(use_true_random=False))
@settings(max_examples=300, deadline=None)
def test_every_path_through_a_tile_slot_is_a_perfect_tiling(extent, n, max_innermost, inner_first, random):
    slot = Slot("SamplePerfectTile", extent=extent, n=n, max_innermost=max_innermost)
    if n == 1 and 0 < max_innermost < extent:
        return  # no such sketch: MetaSchedule splits a loop in one only without a limit
    values: list[int] = []
    for _ in range(n):
        choices = slot.choices(values, inner_first)
        assert choices, (extent, n, max_innermost, values)
        values.append(random.choice(choices))
    decision = slot.to_decision(values, inner_first)
    assert math.prod(decision) == extent
    assert max_innermost <= 0 or decision[-1] <= max_innermost
    assert slot.is_valid(decision)
    assert slot.from_decision(decision, inner_first) == values


@given(st.integers(-2, MAX_NUMBER))
def test_every_number_is_written_and_read_back(value):
    vocab = Vocabulary()
    assert vocab.decode_numbers(vocab.number(value)) == [value]


def test_a_cpu_newer_than_the_vocabulary_reads_as_its_nearest_known_predecessor():
    vocab = Vocabulary(["znver3", "conv2d", "float32"])
    assert vocab.encode(["TARGET", "llvm", "znver5"])[2] == vocab.ids["znver3"]  # not [UNK]: znver4 is unknown too
    assert vocab.encode(["znver3", "sapphirerapids", "nchw"]) == [vocab.ids["znver3"], UNK, UNK]
    assert cpu_lineage("znver5") == ["znver5", "znver4", "znver3", "znver2", "znver1"]
    assert cpu_lineage("x86-64-v3") == ["x86-64-v3"]


def test_constrained_decoding_writes_only_valid_programs(sketches, diverse):
    """An untrained model samples almost anything the masks allow: every decision must still be legal, and every
    sample must give a program that replays and passes the postprocessors (a compute location that makes a
    dynamic loop moves to the next one the model ranked, which only happens in sketches that have one)."""
    vocab = Vocabulary([w for t, target in diverse for p in sketches.of(t, target)[1] for w in p.words
                        if isinstance(w, str)])
    model = lm.new_model(vocab, seed=0, n_layer=1, n_embd=32)
    generator = torch.Generator().manual_seed(0)
    total = relocated = 0
    for task, target in diverse:
        space, prompts, _ = sketches.of(task, target)
        for prompt in prompts:
            for sample in lm.generate(model, vocab, prompt, 12, 1.5, generator, True):
                assert all(s.is_valid(d) for s, d in zip(prompt.slots, sample.decisions))
                sch, moved = realize(space, prompt, sample, seed=3)
                assert sch is not None, task.name
                assert not moved or any(s.kind == "SampleComputeLocation" for s in prompt.slots)
                total += 1
                relocated += moved
    assert total == 12 * sum(len(sketches.of(t, target)[1]) for t, target in diverse)
    assert relocated < total / 10


def test_uniform_fallback_spreads_what_the_model_gives_illegal_tokens_over_the_legal_ones(matmul_task):
    """On SqueezeNet's 55x55 convs the shipped weights wrote the whole extent innermost in every sample: their
    favourite factors (divisors of 56, 28, 14) are illegal there, and renormalizing over the legal tokens picks
    the least unlikely one every time. With ``uniform_fallback`` that mass goes to every legal factor alike."""
    import types

    from tunecore_tlm_generator.sketches import probe

    from tunecore.space import DesignSpace

    space = DesignSpace(matmul_task)
    prompt = next(p for p in (probe(space, i) for i in range(len(space.sketches)))
                  if any(s.kind == "SamplePerfectTile" for s in p.slots))
    tile = next(i for i, s in enumerate(prompt.slots) if s.kind == "SamplePerfectTile")
    assert prompt.slots[tile].extent == 64
    vocab = Vocabulary([w for w in prompt.words if isinstance(w, str)])

    class Favourite(torch.nn.Module):
        """Every position: the illegal factor 3 far ahead, then the legal factor 1."""

        config = types.SimpleNamespace(context=4096)

        def forward(self, ids, caches=None, start=0):
            logits = torch.zeros(len(vocab))
            logits[vocab.number(3)[0]], logits[vocab.number(1)[0]] = 30.0, 8.0
            return logits.expand(ids.shape[0], ids.shape[1], -1), []

    def first_factors(uniform_fallback: bool) -> list[int]:
        samples = lm.generate(Favourite(), vocab, prompt, 64, 1.0, torch.Generator().manual_seed(0), uniform_fallback)
        assert len(samples) == 64 and all(s.is_valid(d) for x in samples for s, d in zip(prompt.slots, x.decisions))
        return [x.decisions[tile][0] for x in samples]

    assert first_factors(False).count(1) >= 60  # renormalized: the legal favourite nearly always
    spread = first_factors(True)
    assert spread.count(1) <= 24 and len(set(spread)) >= 5  # 7 divisors of 64, about 1/7 each


@pytest.fixture(scope="module")
def bert_tiny(shipped, tmp_path_factory) -> str:
    """The primary device's programs of bert-tiny's and dcgan's tasks, as a dataset file."""
    primary = max(shipped.devices, key=lambda d: sum(r.device_id == d for r in shipped.rows))
    part = Dataset()
    for key, task in shipped.tasks.items():
        if {"zoo:bert-tiny", "zoo:dcgan"} & set(task.workloads):
            part.add_task(task)
            part.add_device(shipped.devices[primary])
            for row in shipped.rows_of(key, primary):
                part.add(row)
    path = str(tmp_path_factory.mktemp("tlm") / "slice.parquet")
    part.save(path)
    return path


def test_pretrain_lowers_the_loss_and_finetune_learns_the_best(bert_tiny, tmp_path):
    base, tuned = str(tmp_path / "base.pt"), str(tmp_path / "tuned.pt")
    avx2 = '{"kind": "llvm", "mcpu": "znver3", "num-cores": 2}'  # a CPU the slice has no programs of
    out = cli_json(run_cli("tlm", "pretrain", "-d", bert_tiny, "--exclude", "zoo:dcgan", "--per-sketch", "6",
                           "--target", avx2, "--steps", "40", "--layers", "1", "--width", "64",
                           "--tile-order", "inner-first", "-o", base, "--json"))
    assert out["held_out_loss"] < 0.7 * out["held_out_loss_before"]
    assert not os.path.exists(base + ".ckpt") and not os.path.exists(base + ".corpus.npz")
    model, vocab, metadata = lm.load(base)
    assert metadata["stage"] == "pretrained"
    assert metadata["trained_on"]["workloads"] == ["zoo:bert-base", "zoo:bert-tiny"]
    measured_on = {json.loads(Dataset.load(bert_tiny).rows[0].target)["mcpu"]}
    assert metadata["trained_on"]["targets"] == sorted(measured_on | {"znver3"}) and "znver3" in vocab.words
    assert_one_line_exit_2(run_cli("tlm", "pretrain", "-d", bert_tiny, "--target", "{not json", "-o", base),
                           "--target: not valid JSON")
    out = cli_json(run_cli("tlm", "finetune", "-d", bert_tiny, "--weights", base, "--steps", "30", "-o", tuned,
                           "--json"))
    assert out["programs"] > 5 and out["loss"] < out["loss_before"]
    blob = torch.load(tuned, weights_only=True)  # what users load: no pickle
    assert json.loads(blob["metadata"])["stage"] == "finetuned"
    assert metadata["tile_order"] == lm.load(tuned)[1].tile_order == "inner-first"  # fine-tuning writes as it learned


def test_pretrain_from_the_dataset_learns_every_measured_program_it_can_write(bert_tiny, tmp_path):
    """--from-dataset: the dataset's own programs (measured, so valid on their device) instead of random samples."""
    out = cli_json(run_cli("tlm", "pretrain", "-d", bert_tiny, "--exclude", "zoo:dcgan", "--from-dataset",
                           "--steps", "20", "--layers", "1", "--width", "32", "-o", str(tmp_path / "b.pt"), "--json"))
    from tunecore_tlm_generator.training import best_programs

    dataset = Dataset.load(bert_tiny)
    pairs = task_targets(dataset, ["zoo:dcgan"])
    measured = sum(r.latency is not None and not {"zoo:dcgan"} & set(dataset.tasks[r.task_key].workloads)
                   for r in dataset.rows)
    writable = len(best_programs(dataset, Sketches(), pairs, top=len(dataset.rows)))
    assert out["programs"] == writable and measured * 0.9 <= writable <= measured
    assert out["held_out_loss"] < out["held_out_loss_before"]


def test_pretrain_resumes_from_its_checkpoint(bert_tiny, tmp_path):
    out = str(tmp_path / "base.pt")
    args = ["tlm", "pretrain", "-d", bert_tiny, "--exclude", "zoo:dcgan", "--per-sketch", "3", "--layers", "1",
            "--width", "32", "-o", out, "--json"]
    first = cli_json(run_cli(*args, "--steps", "120"))
    first_model = lm.load(out)[0]
    # a run stopped after its first 100 steps leaves the checkpoint and the corpus; the same command continues
    from tunecore_tlm_generator import cli as tlm_cli

    calls = []
    original = lm.train_steps
    try:
        def stop_after_first_chunk(*a, **k):
            calls.append(a[3])
            if len(calls) > 1:
                raise KeyboardInterrupt
            return original(*a, **k)
        lm.train_steps = stop_after_first_chunk
        with pytest.raises(KeyboardInterrupt):
            tlm_cli.cmd_tlm(tlm_cli_args(args + ["--steps", "120"]))
    finally:
        lm.train_steps = original
    assert os.path.exists(out + ".ckpt") and os.path.exists(out + ".corpus.npz")
    assert json.loads(torch.load(out + ".ckpt", weights_only=True)["metadata"])["step"] == 100
    from tunecore.cli import _what_is_kept  # what the stopped command tells the user

    assert f"training's state at step 100 is kept in {out}.ckpt" in _what_is_kept()
    resumed = cli_json(run_cli(*args, "--steps", "120"))
    assert resumed["held_out_loss"] == pytest.approx(first["held_out_loss"], rel=1e-4)
    # the weights of a run that was never stopped: the same batches, the same dropout
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6)
               for a, b in zip(lm.load(out)[0].state_dict().values(), first_model.state_dict().values()))
    assert not os.path.exists(out + ".ckpt")
    assert _what_is_kept() == "every committed round is saved"  # nothing of a finished training is left


def tlm_cli_args(args: list[str]):
    import argparse

    from tunecore_tlm_generator.cli import add_commands

    from tunecore.cli import Parser

    parser = Parser(prog="tunecore")
    sub = parser.add_subparsers(dest="command", parser_class=Parser)
    add_commands(lambda name, handler, help: sub.add_parser(name, help=help))
    parsed = parser.parse_args(args)
    assert isinstance(parsed, argparse.Namespace)
    return parsed


def test_bad_weights_are_one_line_exit_2(tmp_path):
    text = tmp_path / "notes.pt"
    text.write_text("not weights")
    result = run_cli("run", "--model", "op:matmul-64", "--search", "tlm", "-O", f"search.weights={text}",
                     "--trials", "4", "--store", str(tmp_path / "s.db"))
    assert_one_line_exit_2(result, "not a tunecore tlm model file")
    model, vocab, metadata = lm.load(os.path.join(os.path.dirname(lm.__file__), "weights", "tlm-cpu.pt"))
    other = tmp_path / "other.pt"
    lm.save(str(other), model, vocab, {})
    blob = torch.load(other, weights_only=True)
    meta = json.loads(blob["metadata"])
    meta["fingerprint"] = "0" * 16
    torch.save({"metadata": json.dumps(meta), "state_dict": blob["state_dict"]}, other)
    result = run_cli("tlm", "finetune", "-d", SHIPPED, "--weights", str(other), "-o", str(tmp_path / "x.pt"))
    assert_one_line_exit_2(result, "another vocabulary")
    meta["tile_order"] = "sideways"
    torch.save({"metadata": json.dumps(meta), "state_dict": blob["state_dict"]}, other)
    result = run_cli("tlm", "finetune", "-d", SHIPPED, "--weights", str(other), "-o", str(tmp_path / "x.pt"))
    assert_one_line_exit_2(result, "tile order 'sideways': expected one of outer-first, inner-first")
    result = run_cli("tlm", "pretrain", "-d", SHIPPED, "--exclude", "zoo:nothing", "-o", str(tmp_path / "y.pt"))
    assert_one_line_exit_2(result, "no workload zoo:nothing")
    result = run_cli("tlm", "pretrain", "-d", SHIPPED, "--steps", "0", "-o", str(tmp_path / "y.pt"))
    assert_one_line_exit_2(result, "argument --steps: expected an integer >= 1, not '0'")  # tunecore.cli's kit


@pytest.mark.parametrize("cost_model", ["none", "xgb"])
def test_tlm_guides_a_run_with_any_cost_model(tmp_path, cost_model):
    store = str(tmp_path / "s.db")
    result = run_cli("run", "--model", "op:matmul-128", "--search", "tlm", "--cost-model", cost_model,
                     "-O", "search.online_every=8", "--trials", "24", "--store", store, "--json")
    summary = cli_json(result)
    assert summary["trials_measured"] == 24 and summary["errors"] == 0
    (task,) = summary["tasks"]
    assert task["search_report"]["tlm"].endswith("sketches") and task["search_report"]["invalid"] == 0


def test_a_task_the_model_cannot_write_falls_back_to_random_and_says_so(matmul_task):
    from tunecore.interfaces import TaskContext
    from tunecore.registry import Registry
    from tunecore.space import DesignSpace
    from tunecore.store.sqlite import MemoryStore

    registry = Registry()
    policy = registry.get("search", "tlm")(cost_model=registry.get("cost_model", "none")(), store=MemoryStore())
    policy.model.config.context = 8  # no prompt fits: every sketch is beyond what the model can write
    policy.start_task(TaskContext(matmul_task, DesignSpace(matmul_task), 0, set(), []))
    assert len(policy.propose(matmul_task, 4)) == 4
    assert policy.task_report(matmul_task)["tlm"].startswith("random (")

    # with a cost model, the samples it measures are the best-scored of `oversample` times as many
    import numpy as np

    from tunecore.interfaces import CostModel

    class LongTraces(CostModel):
        name = "long-traces"
        asked: list = []

        def predict(self, task, candidates):
            self.asked.append(sorted(len(c.trace_json) for c in candidates))
            return np.array([len(c.trace_json) for c in candidates], dtype=float)

        def update(self, task, candidates, results):
            pass

    model = LongTraces()
    policy = registry.get("search", "tlm")(cost_model=model, store=MemoryStore(), oversample=4)
    policy.model.config.context = 8
    policy.start_task(TaskContext(matmul_task, DesignSpace(matmul_task), 0, set(), []))
    chosen = policy.propose(matmul_task, 4)
    (scored,) = model.asked
    assert len(chosen) == 4 and len(scored) == 16
    assert sorted(len(c.trace_json) for c in chosen) == scored[-4:]


def test_where_the_weights_write_no_valid_program_uniform_samples_fill_the_batch():
    """On an H100 the shipped (CPU-trained) weights wrote no CUDA matmul program that passes MetaSchedule's GPU
    check, and tlm measured nothing in 128 trials (bench/results/gpu.md): the batch is now filled with uniform
    samples, which online fine-tuning can learn from. (Decoding within the GPU's limits, test_gpu_limits.py, now
    writes valid programs there; without them, as then, the weights write none.)"""
    from tunecore.interfaces import TaskContext
    from tunecore.registry import Registry
    from tunecore.space import DesignSpace
    from tunecore.store.sqlite import MemoryStore
    from tunecore.targets import resolve_target
    from tunecore.testing import tiny_task

    target = resolve_target(json.dumps({"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 1024,
                                        "max_shared_memory_per_block": 49152, "thread_warp_size": 32}))
    task = tiny_task("matmul-1024", target)
    registry = Registry()
    policy = registry.get("search", "tlm")(cost_model=registry.get("cost_model", "none")(), store=MemoryStore(),
                                           limits=False)
    policy.start_task(TaskContext(task, DesignSpace(task), 0, set(), []))
    candidates = policy.propose(task, 6)
    assert len(candidates) == 6 and len({c.key for c in candidates}) == 6
    report = policy.task_report(task)
    assert report["sampled"] >= 1 and report["sampled"] + sum(c.origin == "tlm" for c in candidates) == 6
    assert all(c.key in policy.tasks[task.task_id].made for c in candidates)  # learnable once measured


def test_online_fine_tuning_learns_from_the_fastest_measured():
    from tunecore.registry import Registry
    from tunecore.store.sqlite import MemoryStore
    from tunecore.testing import InstantMeasurer, tiled_latency
    from tunecore.testing.helpers import tiny_task
    from tunecore.tuner import Tuner

    task = tiny_task("matmul-128")
    registry = Registry()
    store = MemoryStore()
    policy = registry.get("search", "tlm")(cost_model=registry.get("cost_model", "none")(), store=store,
                                           online_every=8, online_steps=4)
    before = [p.detach().clone() for p in policy.model.parameters()]
    tuner = Tuner(search=policy, cost_model=policy.cost_model, store=store,
                  measurer=InstantMeasurer(task.target, latency=tiled_latency), round_size=8)
    tuner.tune([task], 24, {"model": task.model})
    assert policy.online_updates == 3
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))
    (state,) = policy.tasks.values()
    assert [b[0] for b in state.best] == sorted(r.latency for r in store.best(task.task_id, 4))


def _plain(decisions):
    return [d if isinstance(d, int) else list(d) for d in decisions]


def test_a_rewrite_keeps_the_decisions_it_keeps_and_the_model_writes_the_others(sketches, diverse):
    from tunecore_tlm_generator.search import SHIPPED as WEIGHTS

    model, vocab, _ = lm.load(WEIGHTS)
    generator, rewritten, changed = torch.Generator().manual_seed(0), 0, 0
    for task, target in diverse[:4]:
        space, prompts, _ = sketches.of(task, target)
        for prompt in (p for p in prompts if p.slots):
            decisions = _plain(sampled_decisions(space, prompt, 3))
            tokens = lm.slot_tokens(prompt, decisions, vocab)
            everything = lm.generate(model, vocab, prompt, 3, 1.0, generator, True, [tokens] * 3)
            assert [_plain(s.decisions) for s in everything] == [decisions] * 3
            for slot in tokens:  # each slot with a choice written anew, the rest kept
                kept = {k: v for k, v in tokens.items() if k != slot}
                for sample in lm.generate(model, vocab, prompt, 4, 1.0, generator, True, [kept] * 4):
                    written = _plain(sample.decisions)
                    assert written[:slot] + written[slot + 1:] == decisions[:slot] + decisions[slot + 1:]
                    assert prompt.slots[slot].is_valid(sample.decisions[slot])
                    rewritten, changed = rewritten + 1, changed + (written[slot] != decisions[slot])
    assert rewritten >= 40 and changed >= rewritten // 4


def test_rewrites_start_from_the_fastest_programs_of_the_task():
    """``rewrite``: that share of a round's programs is one of the task's fastest with 1-3 decisions written anew."""
    from tunecore.registry import Registry
    from tunecore.store.sqlite import MemoryStore
    from tunecore.testing import InstantMeasurer, tiled_latency
    from tunecore.testing.helpers import tiny_task
    from tunecore.tuner import Tuner

    task = tiny_task("matmul-128")
    registry = Registry()
    store = MemoryStore()
    policy = registry.get("search", "tlm")(cost_model=registry.get("cost_model", "none")(), store=store, rewrite=1.0,
                                           online=False)
    tuner = Tuner(search=policy, cost_model=policy.cost_model, store=store,
                  measurer=InstantMeasurer(task.target, latency=tiled_latency), round_size=8)
    tuner.tune([task], 8, {"model": task.model})
    (state,) = policy.tasks.values()
    assert state.rewritten == 0  # nothing measured yet: the first round is written from scratch
    parents = [(prompt, _plain(decisions)) for _, prompt, decisions in state.best]
    candidates = policy.propose(task, 8)
    assert len(candidates) == 8 and state.rewritten >= 8
    for candidate in candidates:
        prompt, decisions = state.made[candidate.key]
        assert any(prompt is p and 1 <= sum(a != b for a, b in zip(_plain(decisions), d)) <= 3 for p, d in parents)
    assert policy.task_report(task)["rewritten"] == state.rewritten


def test_explore_takes_its_share_of_every_round_from_tvms_sampler():
    """``explore``: that share of a round's programs is TVM's uniform samples, learnable like the model's own."""
    from tunecore.registry import Registry
    from tunecore.store.sqlite import MemoryStore
    from tunecore.testing import InstantMeasurer, tiled_latency
    from tunecore.testing.helpers import tiny_task
    from tunecore.tuner import Tuner

    task = tiny_task("matmul-128")
    registry = Registry()
    for explore, sampled in ((1.0, 8), (0.25, 2), (0.0, 0)):
        store = MemoryStore()
        policy = registry.get("search", "tlm")(cost_model=registry.get("cost_model", "none")(), store=store,
                                               explore=explore, online=False)
        tuner = Tuner(search=policy, cost_model=policy.cost_model, store=store,
                      measurer=InstantMeasurer(task.target, latency=tiled_latency), round_size=8)
        tuner.tune([task], 8, {"model": task.model})
        (state,) = policy.tasks.values()
        assert state.sampled == sampled  # 8 x 0.25 is a whole number: no rounding at random
        candidates = policy.propose(task, 8)
        assert len(candidates) == 8 and sum(c.origin == "random" for c in candidates) == sampled
        assert state.sampled == 2 * sampled and all(c.key in state.made for c in candidates)
        assert len(state.best) == 4 and (state.rewritten == 0) == (explore == 1.0)  # explore 1: nothing left to rewrite
    assert_one_line_exit_2(run_cli("run", "--model", "op:matmul-64", "--search", "tlm", "-O", "search.explore=2",
                                   "--trials", "1"), "explore must be between 0 and 1")


def test_the_loop_writes_measures_and_fine_tunes_in_rounds_and_resumes(tmp_path):
    """`tlm loop`: each round the last round's weights write programs of the training task, measured into the
    loop's dataset, and the base weights are fine-tuned on the best of every sketch; the held-out workload's
    best programs only give the reported loss. Running it again measures nothing more."""
    data, out = str(tmp_path / "d.parquet"), str(tmp_path / "loop.pt")
    cli_json(run_cli("dataset", "collect", "--model", "op:matmul-64,op:matmul-128", "--per-task", "3",
                     "--random-fraction", "1", "--anchors", "0", "--out", data, "--json"))
    # for this CPU with all its cores: the dataset's programs are for one thread (collect's default)
    args = ["tlm", "loop", "-d", data, "--exclude", "op:matmul-128", "--rounds", "2", "--per-round", "3",
            "--steps", "4", "--batch-size", "4", "--teachers", data, "--target", "llvm", "-o", out, "--json"]
    stopped = cli_json(run_cli(*args, "--time-limit", "0.1"))  # stops after its first measurements
    assert not stopped["done"] and [r["round"] for r in stopped["rounds"]] == [0]
    result = cli_json(run_cli(*args))  # resumes
    assert result["done"] and result["workloads"] == ["op:matmul-64"] and result["held_out_programs"] == 1
    rounds = result["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2] and rounds[0] == stopped["rounds"][0]
    assert all(r["held_out_programs"] == 1 and r["held_out_choice_loss"] > 0 for r in rounds)
    assert all(r["measured"] >= 3 and r["written_by_the_model"] >= 1 and r["failed"] == 0 and r["examples"] >= 1
               for r in rounds[1:])
    assert rounds[2]["best_vs_earlier_rounds"] is not None
    programs = Dataset.load(result["programs"])
    assert {w for t in programs.tasks.values() for w in t.workloads} == {"op:matmul-64"}
    assert len(programs.rows) >= 6 and {r.collected_by for r in programs.rows} == {"tlm"}
    assert {json.loads(r.target)["num-cores"] for r in programs.rows} == {physical_cores()}
    _, _, metadata = lm.load(out)
    assert metadata["stage"] == "loop" and metadata["round"] == 2 and os.path.exists(out + ".round1.pt")
    assert lm.held_out_workloads(metadata) == ["op:matmul-128"] and metadata["base"]["tasks"] > 0  # what it came from
    assert metadata["trained_on"]["teachers"] == ["d.parquet"]  # a dataset of teachers is named in the weights
    again = cli_json(run_cli(*args))
    assert again["rounds"] == rounds and len(Dataset.load(result["programs"]).rows) == len(programs.rows)
    keys = [(r.task_key, r.program_key) for r in programs.rows]
    assert len(keys) == len(set(keys))  # the resumed round wrote new programs, not the same again
    assert_one_line_exit_2(run_cli(*args, "--per-round", "4"), "a loop with other settings")
    assert_one_line_exit_2(run_cli(*[a for a in args if a not in ("--target", "llvm")]), "a loop with other settings")
    assert_one_line_exit_2(run_cli(*args, "--target", "{bad"), "--target", "not valid JSON")
    assert_one_line_exit_2(run_cli("tlm", "loop", "-d", data, "--exclude", "op:matmul-64,op:matmul-128",
                                   "-o", out), "no training workload")
    assert_one_line_exit_2(run_cli("tlm", "loop", "-d", data, "--exclude", "zoo:resnet18", "-o", out),
                           "--exclude zoo:resnet18: no dataset has it")
    assert_one_line_exit_2(run_cli("tlm", "loop", "-d", str(tmp_path / "none.parquet"), "--exclude", "op:x",
                                   "-o", out), "no such dataset file")


def test_a_batch_of_the_programs_tlm_writes_is_exported_with_its_report(tmp_path):
    """`dataset export-batch --search tlm`: tlm's first batch with nothing measured, built for timing elsewhere (a
    GPU without TVM's compiler), with what it wrote and how much of it was valid."""
    out = cli_json(run_cli("dataset", "export-batch", "--model", "op:matmul-64", "--target", "llvm", "--per-task", "4",
                           "--search", "tlm", "-O", "search.rewrite=0", "--out", str(tmp_path / "b"), "--json"))
    assert out["programs"] == out["built"] == 4 and out["search"] == "tlm"
    (report,) = out["written"].values()
    assert report["generated"] >= 4 - report["sampled"] and report["invalid"] <= report["generated"]
    origins = [p["origin"] for p in json.load(open(tmp_path / "b" / "manifest.json"))["programs"]]
    assert origins.count("tlm") == 4 - report["sampled"] > 0
    assert_one_line_exit_2(run_cli("dataset", "export-batch", "--model", "op:matmul-64", "--target", "llvm",
                                   "--per-task", "1", "--search", "nosuch", "--out", str(tmp_path / "c")),
                           "--search nosuch: not installed")
    assert_one_line_exit_2(run_cli("dataset", "export-batch", "--model", "op:matmul-64", "--target", "llvm",
                                   "--per-task", "1", "--search", "tlm", "-O", "search.nosuch=1",
                                   "--out", str(tmp_path / "d")), "nosuch")
