"""The `tlm` search policy: a language model writes the decisions of each sketch; any cost model may rank them.

Per round and task: the model samples decisions for sketches drawn uniformly (TLM samples prompts
uniformly too), decoding under masks so every decision is legal; the programs are replayed and
postprocessed, those measured before dropped, and up to five rounds of sampling fill the batch
(TLM's retries). On a GPU the masks also keep each sketch's threads per block and shared memory within
the target's limits (``gpu_limits``; ``limits=false`` writes without them, as TLM does). With ``--cost-model none``
the samples are measured as they come; with a cost model that learns, ``oversample`` times as many are generated
and the best-scored measured. With ``rewrite``, that share of a task's programs (0.5), once it has measured ones,
keeps all but 1-3 decisions of one of its fastest and lets the model write those anew (a mutation whose new
values the model picks). With ``explore``, that share of every round's programs is TVM's uniform samples instead,
learned from and rewritten like the model's own.

The model keeps learning during a run (``online``): after every ``online_every`` measurements it
takes ``online_steps`` steps on the fastest programs of each task measured so far (TLM's fine-tuning
on the best, done in place rather than restarting from the base model each round). A task none of
whose sketches the sentences can write is searched at random (with a cost model, the best-scored of
``oversample`` times as many samples), which its row of the run report says.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from tunecore.interfaces import (
    Candidate,
    MeasureResult,
    SearchPolicy,
    Task,
    TaskContext,
    UsageError,
    check_options,
    is_int,
    is_number,
)

_WEIGHTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights")
SHIPPED = os.path.join(_WEIGHTS, "tlm-cpu.pt")
SHIPPED_BASE = os.path.join(_WEIGHTS, "tlm-base.pt")
_RETRIES = 5
_BEST_PER_TASK = 4  # measured programs per task that online fine-tuning learns from


class _TaskState:
    def __init__(self, context: TaskContext):
        self.context = context
        self.measured = set(context.measured)
        self.prompts: list = []
        self.fallback: str | None = None
        self.made: dict[str, tuple[Any, list[Any]]] = {}  # program key -> (prompt, decisions) it came from
        self.best: list[tuple[float, Any, list[Any]]] = []  # (latency, prompt, decisions), fastest first
        self.generated = self.invalid = self.relocated = self.sampled = self.rewritten = 0
        self.postprocs = context.space.thread_postprocs()


class TLMSearch(SearchPolicy):
    name = "tlm"

    def __init__(self, *, weights: str = "shipped", temperature: float = 1.0, uniform_fallback: bool = True,
                 oversample: int = 4, rewrite: float = 0.5, explore: float = 0.0, online: bool = True,
                 online_every: int = 32, online_steps: int = 8, lr: float = 1e-4, batch_size: int = 16,
                 threads: int | None = None, limits: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        check_options(
            weights=(weights, isinstance(weights, str) and bool(weights), "'shipped', 'shipped-base' or a file"),
            temperature=(temperature, is_number(temperature, 1e-3, 10), "between 0.001 and 10"),
            uniform_fallback=(uniform_fallback, isinstance(uniform_fallback, bool), "true or false"),
            oversample=(oversample, is_int(oversample, 1), "an integer >= 1"),
            rewrite=(rewrite, is_number(rewrite, 0, 1), "between 0 and 1"),
            explore=(explore, is_number(explore, 0, 1), "between 0 and 1"),
            online=(online, isinstance(online, bool), "true or false"),
            online_every=(online_every, is_int(online_every, 1), "an integer >= 1"),
            online_steps=(online_steps, is_int(online_steps, 0), "an integer >= 0"),
            lr=(lr, is_number(lr, 1e-9), "a positive number"),
            batch_size=(batch_size, is_int(batch_size, 1), "an integer >= 1"),
            threads=(threads, threads is None or is_int(threads, 1), "an integer >= 1"),
            limits=(limits, isinstance(limits, bool), "true or false"),
        )
        import torch

        from tunecore.targets import model_threads
        from tunecore_tlm_generator import model as lm

        torch.set_num_threads(threads or model_threads())
        path = {"shipped": SHIPPED, "shipped-base": SHIPPED_BASE}.get(weights, weights)
        try:
            self.model, self.vocab, self.metadata = lm.load(path)
        except UsageError as error:
            raise UsageError(f"search 'tlm': {error}") from None
        self.temperature, self.uniform_fallback, self.oversample = temperature, uniform_fallback, oversample
        self.rewrite, self.explore = rewrite, explore
        self.online, self.online_every, self.online_steps = online, online_every, online_steps
        self.lr, self.batch_size, self.limits = lr, batch_size, limits
        self.optimizer = None
        self.generator = torch.Generator().manual_seed(self.seed)
        self.rng = np.random.default_rng(self.seed)
        self.tasks: dict[str, _TaskState] = {}
        self.unlearned = 0  # measurements since the model last learned
        self.online_updates = 0

    def start_task(self, context: TaskContext) -> None:
        from tunecore_tlm_generator.sentences import Unexpressible
        from tunecore_tlm_generator.sketches import probe, trace_decisions

        state = self.tasks[context.task.task_id] = _TaskState(context)
        reasons = []
        for i in range(len(context.space.sketches)):
            try:
                prompt = probe(context.space, i)
            except Unexpressible as error:
                reasons.append(str(error))
                continue
            longest = 3 + len(self.vocab.encode(prompt.words)) + sum(  # [BOS] [SEP] .. [EOS]; a number is <= 2 tokens
                len(self.vocab.encode(slot.forced_words())) + 2 * slot.numbers for slot in prompt.slots)
            if longest > self.model.config.context:
                reasons.append(f"sketch {i}'s prompt is longer than the model's context")
                continue
            state.prompts.append(prompt)
        if not any(p.slots for p in state.prompts):
            state.fallback = reasons[0] if reasons else "no decisions to make"
            return
        for record in context.history:
            if record.latency is None:
                continue
            for prompt in state.prompts:
                decisions = trace_decisions(record.trace_json, prompt)
                if decisions is not None:
                    state.best.append((record.latency, prompt, decisions))
                    break
        state.best = sorted(state.best, key=lambda b: b[0])[:_BEST_PER_TASK]

    def propose(self, task: Task, n: int) -> list[Candidate]:
        state = self.tasks[task.task_id]
        want = n * self.oversample if self.cost_model.name != "none" else n
        if state.fallback is not None:  # what it cannot write, it samples; a cost model picks among more samples
            return self._best_scored(task, state.context.space.sample_new(want, state.context.measured,
                                                                          origin="random"), n)
        found: dict[str, Candidate] = {}
        if self.explore:  # no random draw without it: explore=0 keeps the stream of the runs before it
            found.update((c.key, c) for c in self._sampled(state, self._share(want, self.explore), found))
        rewrites = self._share(want, self.rewrite) if state.best else 0
        for make, target in ((self._rewrite, min(want, len(found) + rewrites)), (self._generate, want)):
            for _ in range(_RETRIES):
                before = len(found)
                if len(found) < target:
                    make(state, task, target - len(found), found)
                if len(found) >= target or len(found) == before:  # a round that wrote nothing valid: more will not
                    break
        candidates = self._best_scored(task, list(found.values()), n)
        if len(candidates) < n:
            candidates += self._sampled(state, n - len(candidates), found)
        state.made = {c.key: state.made[c.key] for c in candidates if c.key in state.made}  # the rest is forgotten
        return candidates

    def _share(self, count: int, share: float) -> int:
        """``share`` of ``count`` as a whole number, the fraction rounded up at random (0.5 of 1: every other time)."""
        exact = count * share
        return int(exact) + int(exact % 1 > 0 and self.rng.random() < exact % 1)

    def _best_scored(self, task: Task, candidates: list[Candidate], n: int) -> list[Candidate]:
        if len(candidates) <= n:
            return candidates
        scores = np.asarray(self.cost_model.predict(task, candidates), dtype=np.float64)
        return [candidates[i] for i in np.argsort(-scores, kind="stable")[:n]]

    def _sampled(self, state: _TaskState, count: int, found: dict[str, Candidate]) -> list[Candidate]:
        """Uniform samples: the ``explore`` share, and where the model wrote too few valid programs (weights that
        never saw this target: the shipped ones, learned on CPU programs, tile CUDA kernels beyond the GPU's thread
        and shared-memory limits, and MetaSchedule's GPU check rejects them all), kept learnable: online
        fine-tuning learns from the valid ones that measure fastest, and rewrites start from them."""
        from tunecore_tlm_generator.sketches import trace_decisions

        sampled = state.context.space.sample_new(count, state.measured | set(found), origin="random")
        for candidate in sampled:
            for prompt in state.prompts:
                decisions = trace_decisions(candidate.trace_json, prompt)
                if decisions is not None:
                    state.made[candidate.key] = (prompt, decisions)
                    break
        state.sampled += len(sampled)
        return sampled

    def _generate(self, state: _TaskState, task: Task, count: int, found: dict[str, Candidate]) -> None:
        per_prompt = np.bincount(self.rng.integers(len(state.prompts), size=count), minlength=len(state.prompts))
        for prompt, k in zip(state.prompts, per_prompt):
            if k:
                self._write(state, task, prompt, int(k), None, found)

    def _rewrite(self, state: _TaskState, task: Task, count: int, found: dict[str, Candidate]) -> None:
        """Programs near the task's fastest: one of them (``state.best``) with 1-3 of its decisions written anew by
        the model after the decisions before them (a mutation whose values the model picks; Ansor's are uniform)."""
        from tunecore_tlm_generator import model as lm

        by_prompt: dict[int, tuple[Any, list]] = {}
        for parent in self.rng.integers(len(state.best), size=count):
            _, prompt, decisions = state.best[parent]
            tokens = lm.slot_tokens(prompt, decisions, self.vocab)
            if not tokens:
                continue
            choices = sorted(tokens)
            for slot in self.rng.choice(choices, size=min(len(choices), int(self.rng.integers(1, 4))), replace=False):
                del tokens[slot]
            by_prompt.setdefault(id(prompt), (prompt, []))[1].append(tokens)
        for prompt, kept in by_prompt.values():
            state.rewritten += len(kept)
            self._write(state, task, prompt, len(kept), kept, found)

    def _write(self, state: _TaskState, task: Task, prompt: Any, count: int, kept: list | None,
               found: dict[str, Candidate]) -> None:
        from tunecore_tlm_generator import model as lm
        from tunecore_tlm_generator.sketches import realize

        for sample in lm.generate(self.model, self.vocab, prompt, count, self.temperature, self.generator,
                                  self.uniform_fallback, kept, self.limits):
            state.generated += 1
            sch, relocated = realize(state.context.space, prompt, sample,
                                     seed=int(self.rng.integers(1, 2**31 - 1)), postprocs=state.postprocs)
            state.relocated += relocated
            if sch is None:
                state.invalid += 1
                continue
            candidate = Candidate.from_schedule(task, sch, origin=self.name)
            if candidate.key in state.measured or candidate.key in found:
                continue
            found[candidate.key] = candidate
            state.made[candidate.key] = (prompt, _decisions_of(sch, prompt, sample.decisions))

    def observe(self, task: Task, candidates: Sequence[Candidate], results: Sequence[MeasureResult]) -> None:
        state = self.tasks[task.task_id]
        for candidate, result in zip(candidates, results):
            state.measured.add(candidate.key)
            made = state.made.pop(candidate.key, None)
            if result.latency is not None and made is not None:
                state.best.append((result.latency, *made))
        state.best = sorted(state.best, key=lambda b: b[0])[:_BEST_PER_TASK]
        self.unlearned += len(results)
        if self.online and self.online_steps and self.unlearned >= self.online_every:
            self._learn()
            self.unlearned = 0

    def _learn(self) -> None:
        """A few steps on the fastest programs of every task so far, the fastest weighted most."""
        import torch

        from tunecore_tlm_generator import model as lm

        examples, weights = [], []
        for state in self.tasks.values():
            if not state.best:
                continue
            fastest = state.best[0][0]
            for latency, prompt, decisions in state.best:
                example = lm.encode_example(prompt, decisions, self.vocab)
                if example is not None:
                    examples.append(example)
                    weights.append(fastest / latency)
        if not examples:
            return
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=0.0)
        lm.train_steps(self.model, self.optimizer, examples, self.online_steps, self.batch_size, self.rng,
                       weights=weights)
        self.online_updates += 1

    def task_report(self, task: Task) -> dict[str, Any]:
        state = self.tasks.get(task.task_id)
        if state is None:
            return {}
        if state.fallback is not None:
            return {"tlm": f"random ({state.fallback})"}
        return {"tlm": f"{len(state.prompts)} sketches", "generated": state.generated, "invalid": state.invalid,
                "relocated": state.relocated, "sampled": state.sampled, "rewritten": state.rewritten}


def _decisions_of(sch: Any, prompt: Any, written: list[Any]) -> list[Any]:
    """The decisions the program was made with (a relocated compute location differs from what was written)."""
    from tunecore.interfaces import to_plain
    from tunecore_tlm_generator.sentences import decisions_in

    return decisions_in(to_plain(sch.trace.as_json(remove_postproc=True)), prompt) or written
