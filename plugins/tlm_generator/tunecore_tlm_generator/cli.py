"""``tunecore tlm pretrain|finetune|loop``: pre-train on unlabeled random programs, fine-tune on the best measured
ones, and TLM's own loop of writing, measuring and fine-tuning (tunecore_tlm_generator.loop).

Both are resumable (tunecore_tlm_generator.training): a checkpoint beside the output (``OUT.ckpt``: model,
optimizer, step; and for pre-training the sampled corpus, ``OUT.corpus.npz``) is written every 100 steps and
removed when the weights are written; running the same command again continues from it.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

from tunecore.cli import Parser, add_devices, add_seed, count, duration, names, number, render
from tunecore.interfaces import UsageError
from tunecore_tlm_generator.sentences import OUTER_FIRST, TILE_ORDERS


def add_commands(register: Any) -> None:
    tlm = register("tlm", cmd_tlm, help="pre-train and fine-tune the TLM schedule generator")
    sub = tlm.add_subparsers(dest="tlm_command", required=True, parser_class=Parser)

    pretrain = sub.add_parser("pretrain", help="train on random programs of a dataset's tasks (nothing measured), "
                                               "or on the programs it holds")
    finetune = sub.add_parser("finetune", help="train on the best measured programs per task of a dataset")
    for p in (pretrain, finetune):
        p.add_argument("--dataset", "-d", required=True, help="dataset file (.parquet)")
        p.add_argument("--exclude", type=names, default=[], help="workloads whose kernels stay out of training, "
                                                                 "e.g. zoo:resnet-18,zoo:mobilenet-v2 (held out)")
        p.add_argument("--steps", type=count(1), default=None, help="optimizer steps")
        p.add_argument("--batch-size", type=count(1), default=32, help="sentences per step (default 32)")
        p.add_argument("--lr", type=number(1e-12), default=None, help="peak learning rate")
        add_seed(p, "the initial weights, the programs sampled and the batches")
        p.add_argument("--out", "-o", required=True, help="weights file to write (.pt)")
        p.add_argument("--json", action="store_true")
    pretrain.add_argument("--target", "-t", action="append", default=[],
                          help="also write every task for this device, repeatable, as for `run` (e.g. a CPU the "
                               "dataset measured none of them on: the model learns its programs and its word)")
    pretrain.add_argument("--per-sketch", type=count(1), default=48, help="random programs per sketch (default 48)")
    pretrain.add_argument("--from-dataset", action="store_true",
                          help="learn the programs the dataset holds (every measured one of each task, as TLM learned "
                               "TenSet's) instead of sampling random ones: on a GPU most random decisions exceed its "
                               "thread or shared-memory limits, and a measured program never does")
    pretrain.add_argument("--layers", type=count(1), default=4, help="transformer layers (default 4)")
    pretrain.add_argument("--width", type=count(1), default=128, help="embedding width (default 128)")
    pretrain.add_argument("--tile-order", choices=TILE_ORDERS, default=OUTER_FIRST,
                          help="the order a tile's factors are written in, which fine-tuning and runs keep "
                               "(default outer-first, TVM's; inner-first: the factors that mean the same on every "
                               "shape first)")
    finetune.add_argument("--weights", default="shipped-base",
                          help="pre-trained model: 'shipped-base' or a weights file from `tlm pretrain`")
    finetune.add_argument("--top", type=count(1), default=1, help="best programs per task and device (TLM: 1)")
    add_devices(finetune, "fine-tune only on measurements on")

    loop = sub.add_parser("loop", help="rounds of writing programs for the training tasks, measuring them here and "
                                       "fine-tuning on the best of every sketch (TLM's loop; resumable)")
    loop.add_argument("--dataset", "-d", action="append", required=True, type=names,
                      help="measured programs (repeatable): what the model learns from beside its own, and the "
                           "held-out workloads' best programs the loss is reported on")
    loop.add_argument("--exclude", type=names, required=True,
                      help="held-out workloads, e.g. zoo:resnet-18,zoo:mobilenet-v2,zoo:bert-tiny")
    loop.add_argument("--model", "-m", type=names, default=[],
                      help="training workloads to write programs for (default: the datasets' other workloads)")
    loop.add_argument("--kernels", type=names, default=[], help="only tasks of these operators, e.g. conv,dense")
    loop.add_argument("--teachers", type=names, default=[],
                      help="more dataset files to learn from, e.g. a long ansor run's store written by `tunecore "
                           "dataset export`")
    loop.add_argument("--weights", default="shipped-base",
                      help="the base weights every round is fine-tuned from: 'shipped-base' or a file")
    loop.add_argument("--target", "-t", action="append", default=[],
                      help="a device to write and measure the programs for, repeatable, as for `dataset collect` "
                           "(default: this CPU with one thread; `llvm` for all its cores)")
    loop.add_argument("--rounds", type=count(1), default=4, help="rounds (default 4)")
    loop.add_argument("--per-round", type=count(1), default=16, help="programs written per task and round (default 16)")
    loop.add_argument("--temperature", type=number(1e-3, 10), default=1.0, help="sampling temperature (default 1)")
    loop.add_argument("--top", type=count(1), default=1, help="fastest programs per sketch learned from (default 1)")
    loop.add_argument("--steps", type=count(1), default=None, help="optimizer steps per round (default: 10 epochs)")
    loop.add_argument("--batch-size", type=count(1), default=32, help="sentences per step (default 32)")
    loop.add_argument("--lr", type=number(1e-12), default=3e-4, help="learning rate (default 3e-4)")
    loop.add_argument("--time-limit", type=duration, default=None, metavar="DURATION",
                      help="stop measuring (resumable) after this long: 90m, 2h; a round's training then runs on")
    add_seed(loop, "the programs written and the batches")
    loop.add_argument("--out", "-o", required=True,
                      help="the last round's weights (.pt); each round's, the round log and the measured programs "
                           "are written beside it")
    loop.add_argument("--json", action="store_true")


def cmd_tlm(args: argparse.Namespace) -> int:
    return {"pretrain": _pretrain, "finetune": _finetune, "loop": _loop}[args.tlm_command](args)


def _pairs(args: argparse.Namespace, targets: list[str] = ()) -> tuple[Any, list]:
    from tunecore.dataset import Dataset
    from tunecore_tlm_generator.training import task_targets

    dataset = Dataset.load(args.dataset)
    exclude = args.exclude
    unknown = set(exclude) - dataset.workloads()
    if unknown:
        raise UsageError(f"--exclude: {args.dataset} has no workload {sorted(unknown)[0]}")
    pairs = task_targets(dataset, exclude, targets)
    if not pairs:
        raise UsageError(f"{args.dataset}: no tasks left to train on")
    return dataset, pairs


def _pretrain(args: argparse.Namespace) -> int:
    import torch

    from tunecore.targets import model_threads, physical_cores
    from tunecore_tlm_generator import model as lm
    from tunecore_tlm_generator.sentences import Vocabulary
    from tunecore_tlm_generator.training import (
        CORPUS,
        Sketches,
        best_programs,
        describe,
        encode_all,
        load_corpus,
        random_programs,
        remove_checkpoints,
        resolved_targets,
        save_corpus,
    )

    torch.set_num_threads(model_threads())
    targets = resolved_targets(args.target)
    dataset, pairs = _pairs(args, targets)
    started = time.perf_counter()
    settings = {"dataset": os.path.abspath(args.dataset), "exclude": args.exclude, "per_sketch": args.per_sketch,
                "seed": args.seed, "targets": targets, "tile_order": args.tile_order,
                **({"from_dataset": True} if args.from_dataset else {})}  # (an older corpus names none)
    corpus_path = args.out + CORPUS
    corpus = load_corpus(corpus_path, settings)
    if corpus is None:
        sketches = Sketches()
        if args.from_dataset:
            programs = [(prompt, decisions) for prompt, decisions, _ in
                        best_programs(dataset, sketches, pairs, top=len(dataset.rows))]
        else:
            with render.progress(transient=args.json) as display:
                bar = display.add_task("sampling random programs", total=len(pairs))
                programs = random_programs(sketches, pairs, args.per_sketch, args.seed, physical_cores(),
                                           on_task=lambda: display.advance(bar))
        if not programs:
            raise UsageError(f"{args.dataset}: none of its tasks has a sketch TLM can write")
        vocab = Vocabulary([w for p in {id(p): p for p, _ in programs}.values() for w in p.words if isinstance(w, str)],
                           args.tile_order)
        examples = encode_all(programs, vocab)
        corpus = {"vocabulary": vocab.words, "examples": examples}
        save_corpus(corpus_path, settings, corpus)
    vocab, examples = Vocabulary(corpus["vocabulary"], args.tile_order), corpus["examples"]
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(examples))
    held = [examples[i] for i in order[: max(1, len(examples) // 20)]]  # 5% to report the loss on
    train = [examples[i] for i in order[len(held):]]
    steps = args.steps or max(200, len(train) // args.batch_size)  # one pass: ~20 min on 2 cores for the shipped data
    model = lm.new_model(vocab, args.seed, n_layer=args.layers, n_embd=args.width)
    longest = max(len(ids) for ids, _ in examples)
    if longest > model.config.context:
        raise UsageError(f"a sentence has {longest} tokens, more than the model's context ({model.config.context})")
    before = lm.mean_loss(model, held)
    loss = _train(model, train, steps, args, args.lr or 1e-3, "cosine", settings)
    after = lm.mean_loss(model, held)
    info = {"stage": "pretrained", "trained_on": {**describe(pairs), "dataset": os.path.basename(args.dataset),
                                                  "exclude": args.exclude, "programs": len(examples),
                                                  "steps": steps}}
    lm.save(args.out, model, vocab, info)
    remove_checkpoints(args.out)
    render.fields({"out": args.out, "programs": len(examples), "tasks": describe(pairs)["tasks"],
                  "vocabulary": len(vocab), "parameters": lm.parameters(model), "steps": steps,
                  "tokens_per_program": round(float(np.mean([len(ids) for ids, _ in examples])), 1),
                  "held_out_loss_before": round(before, 4), "held_out_loss": round(after, 4),
                  "train_loss": round(loss, 4), "elapsed_s": round(time.perf_counter() - started, 1)}, args.json)
    return 0


def _finetune(args: argparse.Namespace) -> int:
    import torch

    from tunecore.dataset import device_of
    from tunecore.targets import model_threads
    from tunecore_tlm_generator import model as lm
    from tunecore_tlm_generator.search import SHIPPED_BASE
    from tunecore_tlm_generator.training import Sketches, best_programs, describe, remove_checkpoints

    torch.set_num_threads(model_threads())
    path = SHIPPED_BASE if args.weights == "shipped-base" else args.weights
    try:
        model, vocab, metadata = lm.load(path)
    except UsageError as error:
        raise UsageError(f"--weights: {error}") from None
    dataset, pairs = _pairs(args)
    devices = {device_of(dataset, d) for d in args.devices} if args.devices else None
    started = time.perf_counter()
    with render.progress(transient=True) as display:
        display.add_task("reading the best programs", total=None)
        best = best_programs(dataset, Sketches(), pairs, args.top, devices)
    encoded = [(lm.encode_example(p, d, vocab), ratio) for p, d, ratio in best]
    examples = [e for e, _ in encoded if e is not None and len(e[0]) <= model.config.context]
    if not examples:
        raise UsageError(f"{args.dataset}: no measured program of a sketch TLM can write")
    steps = args.steps or max(100, 10 * len(examples) // args.batch_size)  # TLM: 10 epochs
    before = lm.mean_loss(model, examples)
    settings = {"dataset": os.path.abspath(args.dataset), "exclude": args.exclude, "top": args.top,
                "weights": os.path.abspath(path), "seed": args.seed}
    loss = _train(model, examples, steps, args, args.lr or 3e-4, "constant", settings)
    info = {"stage": "finetuned", "base": metadata.get("trained_on", {}),
            "trained_on": {**describe(pairs), "dataset": os.path.basename(args.dataset), "exclude": args.exclude,
                           "programs": len(examples), "top": args.top, "steps": steps}}
    lm.save(args.out, model, vocab, info)
    remove_checkpoints(args.out)
    render.fields({"out": args.out, "programs": len(examples), "tasks": describe(pairs)["tasks"], "steps": steps,
                  "loss_before": round(before, 4), "loss": round(lm.mean_loss(model, examples), 4),
                  "train_loss": round(loss, 4), "elapsed_s": round(time.perf_counter() - started, 1)}, args.json)
    return 0


def _loop(args: argparse.Namespace) -> int:
    from tunecore_tlm_generator.loop import LoopPlan, run_loop

    for path in [p for group in args.dataset for p in group] + args.teachers:
        if not os.path.exists(path):
            raise UsageError(f"{path}: no such dataset file")
    plan = LoopPlan(datasets=[p for group in args.dataset for p in group], exclude=args.exclude, out=args.out,
                    models=args.model, kernels=args.kernels, teachers=args.teachers, weights=args.weights,
                    rounds=args.rounds, per_round=args.per_round, temperature=args.temperature, top=args.top,
                    steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                    time_limit=args.time_limit, targets=args.target)
    with render.tracker(transient=args.json) as on_progress:
        result = run_loop(plan, on_progress)
    if args.json:
        render.fields(result, True)
        return 0
    for report in result["rounds"]:
        render.fields(report, False)
    print(f"{'done' if result['done'] else 'stopped, run again to continue'}: {len(result['rounds']) - 1} of "
          f"{args.rounds} rounds; programs in {result['programs']}")
    return 0


def _train(model: Any, examples: list, steps: int, args: argparse.Namespace, lr: float, schedule: str,
           settings: dict[str, Any]) -> float:
    """tlm's training loop (training.train) with a progress bar, resuming from and writing ``OUT.ckpt``."""
    from tunecore.interfaces import CHECKPOINT
    from tunecore_tlm_generator.training import train

    with render.tracker(transient=args.json) as on_progress:
        return train(model, examples, steps, batch_size=args.batch_size, lr=lr, schedule=schedule, seed=args.seed,
                     checkpoint=args.out + CHECKPOINT, settings=settings, on_progress=on_progress)
