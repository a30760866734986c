"""The language model: a small GPT (pre-norm decoder, learned positions, tied embeddings) with a KV cache,
its weights file, teacher-forced training on completion tokens, and constrained sampling.

Why our own ~80 lines rather than Hugging Face's GPT2LMHeadModel: the model is tiny (4 layers, width
128, ~1M parameters, so a few thousand tokens a second train on 2 CPU cores), decoding needs a
different mask on every step for every sample, and `transformers` would add a large dependency whose
cache API changes between releases for what ``scaled_dot_product_attention`` already does.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Generator, Iterable, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from tunecore.interfaces import UsageError, load_model_torch, save_model_torch
from tunecore_tlm_generator.sentences import BOS, EOS, OUTER_FIRST, PAD, SEP, SketchPrompt, Vocabulary

FORMAT_VERSION = 1


@dataclasses.dataclass
class Config:
    vocab_size: int
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    context: int = 384  # tokens: prompt and completion together


class Block(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.n_head = config.n_head
        self.ln1, self.ln2 = nn.LayerNorm(config.n_embd), nn.LayerNorm(config.n_embd)
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.mlp = nn.Sequential(nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(),
                                 nn.Linear(4 * config.n_embd, config.n_embd))

    def forward(self, x: torch.Tensor, cache: tuple | None = None) -> tuple[torch.Tensor, tuple]:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        # with a cache, the new tokens see all cached ones; a whole sequence sees its past only
        y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None and t > 1)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x)), (k, v)


class GPT(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.tok = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos = nn.Embedding(config.context, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln = nn.LayerNorm(config.n_embd)
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, ids: torch.Tensor, caches: list | None = None, start: int = 0) -> tuple[torch.Tensor, list]:
        positions = torch.arange(start, start + ids.shape[1])
        x = self.tok(ids) + self.pos(positions)
        new = []
        for i, block in enumerate(self.blocks):
            x, cache = block(x, None if caches is None else caches[i])
            new.append(cache)
        return self.ln(x) @ self.tok.weight.T, new


# Sentences as tensors


def completion_steps(prompt: SketchPrompt, vocab: Vocabulary,
                     limited: bool = False) -> Generator[tuple[list[int], int], int, list[Any]]:
    """The completion as a machine: yields (the token ids allowed next, the slot they belong to), is sent the
    chosen id, returns the decisions.

    A single allowed id is a forced token (a slot's restatement, EOS). Every path through it is a legal
    decision for every slot: tile factors that divide what is left of the loop with the innermost
    within its limit, a categorical's candidates, a compute location's loop indices. ``limited``: also within
    the sketch's GPU limits (``prompt.limits``: threads per block, shared memory), as far as the decisions before
    leave a way to meet them (decoding; a measured program is written as it is).
    """
    limits = prompt.limits if limited else None
    decisions, written = [], []
    for i, slot in enumerate(prompt.slots):
        for forced in vocab.encode(slot.forced_words()):
            yield [forced], i
        values: list[int] = []
        for _ in range(slot.numbers):
            choices = slot.choices(values, vocab.inner_first)
            if limits:
                choices = limits.allowed(written, values, choices, vocab.inner_first)
            first, second = vocab.number_steps(choices)
            token = yield first, i
            ids = [token, (yield second[token], i)] if token in second else [token]
            values.append(vocab.decode_numbers(ids)[0])
        written.append(values)
        decisions.append(slot.to_decision(values, vocab.inner_first))
    yield [EOS], len(prompt.slots)
    return decisions


def _written(prompt: SketchPrompt, decisions: Sequence[Any], vocab: Vocabulary) -> list[tuple[int, bool, int]] | None:
    """(token, whether the decoder has a choice there, its slot) for each completion token that writes
    ``decisions``; None if a decision is not one the decoder could write."""
    steps = completion_steps(prompt, vocab)
    allowed, slot = next(steps)
    out = []
    for token in vocab.encode(prompt.completion_words(decisions, vocab.inner_first)) + [EOS]:
        if token not in allowed:
            return None
        out.append((token, len(allowed) > 1, slot))
        try:
            allowed, slot = steps.send(token)
        except StopIteration:
            break
    return out


def encode_example(prompt: SketchPrompt, decisions: Sequence[Any], vocab: Vocabulary,
                   prompt_ids: list[int] | None = None) -> tuple[list[int], list[bool]] | None:
    """Token ids of prompt + completion and which of them the loss counts (the decisions); None if a
    decision is not one the decoder could write."""
    written = _written(prompt, decisions, vocab)
    if written is None:
        return None
    ids = [BOS, *(prompt_ids if prompt_ids is not None else vocab.encode(prompt.words)), SEP]
    return ids + [token for token, _, _ in written], [False] * len(ids) + [choice for _, choice, _ in written]


def slot_tokens(prompt: SketchPrompt, decisions: Sequence[Any], vocab: Vocabulary) -> dict[int, list[int]] | None:
    """The tokens the decoder chooses (where it has a choice) to write ``decisions``, per slot; None if it could
    not write them."""
    written = _written(prompt, decisions, vocab)
    if written is None:
        return None
    chosen: dict[int, list[int]] = {}
    for token, choice, slot in written:
        if choice:
            chosen.setdefault(slot, []).append(token)
    return chosen


def batches(examples: Sequence[tuple[list[int], list[bool]]], batch_size: int, rng: np.random.Generator,
            weights: Sequence[float] | None = None) -> Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """One pass over the examples in random order, as padded (inputs, next tokens, loss weights)."""
    order = rng.permutation(len(examples))
    for start in range(0, len(order), batch_size):
        chunk = [examples[i] for i in order[start:start + batch_size]]
        width = max(len(ids) for ids, _ in chunk) - 1
        x = torch.full((len(chunk), width), PAD, dtype=torch.long)
        y = torch.full((len(chunk), width), PAD, dtype=torch.long)
        w = torch.zeros((len(chunk), width))
        for row, (ids, counted) in enumerate(chunk):
            n = len(ids) - 1
            x[row, :n] = torch.tensor(ids[:-1])
            y[row, :n] = torch.tensor(ids[1:])
            w[row, :n] = torch.tensor(counted[1:], dtype=torch.float32)
            if weights is not None:
                w[row] *= float(weights[order[start + row]])
        yield x, y, w


def loss_of(model: GPT, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    logits, _ = model(x)
    per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
    return (per_token * w.reshape(-1)).sum() / w.sum().clamp(min=1e-9)


def train_steps(model: GPT, optimizer: torch.optim.Optimizer, examples: Sequence[tuple[list[int], list[bool]]],
                steps: int, batch_size: int, rng: np.random.Generator,
                on_step: Callable[[int, float], None] | None = None, weights: Sequence[float] | None = None) -> float:
    """``steps`` optimizer steps over the examples (as many passes as that takes); the last loss."""
    model.train()
    done, loss_value = 0, float("nan")
    while done < steps and examples:
        for x, y, w in batches(examples, batch_size, rng, weights):
            loss = loss_of(model, x, y, w)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            loss_value = float(loss.detach())
            done += 1
            if on_step:
                on_step(done, loss_value)
            if done >= steps:
                break
    model.eval()
    return loss_value


@torch.no_grad()
def mean_loss(model: GPT, examples: Sequence[tuple[list[int], list[bool]]], batch_size: int = 64) -> float:
    """Loss per counted token over the examples (teacher-forced), for reports."""
    model.eval()
    total, count = 0.0, 0.0
    for x, y, w in batches(examples, batch_size, np.random.default_rng(0)):
        logits, _ = model(x)
        per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
        total += float((per_token * w.reshape(-1)).sum())
        count += float(w.sum())
    return total / max(count, 1e-9)


@torch.no_grad()
def choice_steps(model: GPT, vocab: Vocabulary, prompt: SketchPrompt, decisions: Sequence[Any],
                 temperature: float = 1.0) -> list[tuple[int, float, float]] | None:
    """Per decision token where the decoder has a choice (``completion_steps``): its slot, the log-probability the
    model gives it among the tokens allowed there when sampling at ``temperature``, and that of choosing uniformly
    among them; None when the decoder cannot write the decisions."""
    example = encode_example(prompt, decisions, vocab)
    if example is None or len(example[0]) > model.config.context:
        return None
    ids = example[0]
    model.eval()
    logits, _ = model(torch.tensor([ids[:-1]]))
    log_p = F.log_softmax(logits[0] / temperature, dim=-1)
    steps = completion_steps(prompt, vocab)
    allowed, slot = next(steps)
    out = []
    for position in range(ids.index(SEP) + 1, len(ids)):
        token = ids[position]
        if len(allowed) > 1:
            out.append((slot, float(log_p[position - 1, token] - torch.logsumexp(log_p[position - 1, allowed], dim=0)),
                        -float(np.log(len(allowed)))))
        try:
            allowed, slot = steps.send(token)
        except StopIteration:
            break
    return out


def choice_log_probs(model: GPT, vocab: Vocabulary, prompt: SketchPrompt, decisions: Sequence[Any],
                     temperature: float = 1.0) -> tuple[float, float, int] | None:
    """Log-probability of a program's decisions as the decoder samples them (each decision token among the tokens
    allowed at that step, ``completion_steps``), that of choosing uniformly among those tokens, and how many
    tokens were choices; None when the decoder cannot write them."""
    steps = choice_steps(model, vocab, prompt, decisions, temperature)
    if steps is None:
        return None
    return sum(c for _, c, _ in steps), sum(u for _, _, u in steps), len(steps)


def choice_loss(model: GPT, vocab: Vocabulary, programs: Sequence[tuple[SketchPrompt, Sequence[Any]]],
                temperature: float = 1.0) -> dict[str, float]:
    """How well the model predicts given programs' decisions, as the decoder samples them at ``temperature``: the
    teacher-forced loss per decision token over the tokens allowed at that step, beside the loss of choosing
    uniformly among those tokens (a sampler that knows only what is legal). Programs whose decisions the decoder
    cannot write are left out; ``programs`` counts the others."""
    scored = [s for prompt, decisions in programs
              if (s := choice_log_probs(model, vocab, prompt, decisions, temperature))]
    count = max(sum(n for _, _, n in scored), 1)
    return {"loss": -sum(c for c, _, _ in scored) / count, "uniform_loss": -sum(u for _, u, _ in scored) / count,
            "programs": len(scored)}


@dataclasses.dataclass
class Sample:
    """Decisions the model wrote, and for each compute location it chose, the other values it allowed, most
    probable first: which location gives a valid program depends on the loops the other decisions made,
    which only TVM knows (see ``sketches.realize``)."""

    decisions: list[Any]
    locations: dict[int, list[int]]


@torch.no_grad()
def generate(model: GPT, vocab: Vocabulary, prompt: SketchPrompt, count: int, temperature: float,
             generator: torch.Generator, uniform_fallback: bool,
             kept: Sequence[dict[int, list[int]]] | None = None, limited: bool = True) -> list[Sample]:
    """``count`` samples for one sketch, written token by token with every illegal token masked; with ``kept``
    (per sample, ``slot_tokens`` of the slots it keeps) sample i writes those slots as given and the model writes
    the others, each after every decision before it, kept or written; ``limited``: within the sketch's GPU limits
    (``completion_steps``).

    The probability the model gives to illegal tokens is renormalized over the legal ones in proportion to
    the model's, or with ``uniform_fallback`` spread over them alike: where the model's favourites are all
    illegal (a loop extent whose divisors it never saw, e.g. 55 = 5 x 11 after training on 56, 28, 14), the
    choice falls back toward a uniform one, as TVM's sampler makes, instead of the least unlikely token."""
    model.eval()
    prompt_ids = [BOS, *vocab.encode(prompt.words), SEP]
    logits, caches = model(torch.tensor([prompt_ids]))
    caches = [(k.expand(count, -1, -1, -1), v.expand(count, -1, -1, -1)) for k, v in caches]
    last = logits[:, -1, :].expand(count, -1)
    kept = [{slot: list(tokens) for slot, tokens in k.items()} for k in kept] if kept else [{} for _ in range(count)]
    machines = [completion_steps(prompt, vocab, limited) for _ in range(count)]
    steps: list[tuple[list[int], int] | None] = [next(m) for m in machines]
    locations: list[dict[int, list[int]]] = [{} for _ in range(count)]
    results: list[list[Any] | None] = [None] * count
    position = len(prompt_ids)
    while any(step is not None for step in steps):
        if position >= model.config.context:
            raise ValueError(f"a completion is longer than the model's context ({model.config.context} tokens)")
        mask = torch.full((count, len(vocab)), float("-inf"))
        for i, step in enumerate(steps):
            mask[i, step[0] if step is not None else [PAD]] = 0.0
        scaled = last / max(temperature, 1e-6)
        if uniform_fallback:
            model_probs, legal = torch.softmax(scaled, dim=-1), torch.isfinite(mask)
            illegal_mass = (model_probs * ~legal).sum(dim=-1, keepdim=True)
            probs = torch.where(legal, model_probs + illegal_mass / legal.sum(dim=-1, keepdim=True), 0.0)
        else:
            probs = torch.softmax(scaled + mask, dim=-1)
        chosen = torch.multinomial(probs, 1, generator=generator).squeeze(1).tolist()
        for i, machine in enumerate(machines):
            step = steps[i]
            if step is None:
                continue
            allowed, slot = step
            if len(allowed) > 1 and kept[i].get(slot):
                if kept[i][slot][0] in allowed:
                    chosen[i] = kept[i][slot].pop(0)
                else:  # the GPU's limits rule out what the slot kept, after the rewritten ones: the model writes it
                    del kept[i][slot]
            if len(allowed) > 1 and slot < len(prompt.slots) and prompt.slots[slot].kind == "SampleComputeLocation":
                ranked = sorted(allowed, key=lambda t: -float(probs[i, t]))
                locations[i][slot] = vocab.decode_numbers([t for t in ranked if t != chosen[i]])
            try:
                steps[i] = machine.send(chosen[i])
            except StopIteration as done:
                results[i], steps[i] = done.value, None
        logits, caches = model(torch.tensor(chosen).unsqueeze(1), caches, start=position)
        last = logits[:, -1, :]
        position += 1
    return [Sample(r, loc) for r, loc in zip(results, locations) if r is not None]


# The weights file


def save(path: str, model: GPT, vocab: Vocabulary, info: dict[str, Any]) -> None:
    """Half-precision weights and JSON metadata; loads with ``torch.load(weights_only=True)``."""
    metadata = {"config": dataclasses.asdict(model.config), "vocabulary": vocab.words,
                "tile_order": vocab.tile_order, "fingerprint": vocab.fingerprint(), **info}
    state = {k: v.detach().to(torch.float16) for k, v in model.state_dict().items()}
    save_model_torch(path, "tlm", FORMAT_VERSION, metadata, state)


def load(path: str) -> tuple[GPT, Vocabulary, dict[str, Any]]:
    """A model written by ``save``; a UsageError (one line) for anything else."""
    metadata, state_dict = load_model_torch(path, "tlm", FORMAT_VERSION)
    try:
        vocab = Vocabulary(metadata["vocabulary"], metadata.get("tile_order", OUTER_FIRST))
    except ValueError as error:
        raise UsageError(f"{path}: {error}") from None
    if vocab.fingerprint() != metadata.get("fingerprint"):
        raise UsageError(f"{path}: weights for another vocabulary (its numbers or markers differ from this plugin's)")
    config = Config(**metadata["config"])
    if config.vocab_size != len(vocab):
        raise UsageError(f"{path}: the model has {config.vocab_size} tokens, its vocabulary {len(vocab)}")
    model = GPT(config)
    try:
        model.load_state_dict({k: v.to(torch.float32) for k, v in state_dict.items()})
    except RuntimeError as error:
        raise UsageError(f"{path}: weights do not fit the model they describe ({str(error)[:120]})") from None
    model.eval()
    return model, vocab, metadata


def held_out_workloads(metadata: dict[str, Any]) -> list[str]:
    """The workloads weights were trained without (``--exclude``); files of 2026-11-24 hold them comma-joined."""
    exclude = metadata.get("trained_on", {}).get("exclude") or []
    return sorted(w for w in (exclude.split(",") if isinstance(exclude, str) else exclude) if w)


def new_model(vocab: Vocabulary, seed: int, **sizes: int) -> GPT:
    torch.manual_seed(seed)
    return GPT(Config(vocab_size=len(vocab), **sizes))


def parameters(model: GPT) -> int:
    return sum(p.numel() for p in model.parameters())


def warmup_cosine(step: int, total: int, warmup: int = 50) -> float:
    """Learning-rate factor: linear warm-up, then cosine down to a tenth."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
