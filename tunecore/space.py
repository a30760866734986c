"""A task's design space: its sketches (MetaSchedule space generator), postprocessors and samplers."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Collection

import numpy as np

from tunecore.targets import load_tensor_intrinsics
from tunecore.tvmjson import new_schedule

if TYPE_CHECKING:
    from tunecore.data import Task


class DesignSpace:
    """The sketches MetaSchedule's space generator derives for a task on its target, and ways to fill them in.

    A sketch is a trace whose sampling instructions (tile sizes, unroll, compute location...) still
    have to be decided; ``sample`` decides them at random and applies the postprocessors.
    """

    def __init__(self, task: Task, seed: int = 0, space: str = "post-order-apply"):
        from tvm.s_tir import meta_schedule as ms

        from tunecore.blocked_conv import register_rule

        self.task = task
        load_tensor_intrinsics(task.target)
        register_rule()
        self.context = ms.TuneContext(
            mod=task.mod,
            target=task.target,
            space_generator=space,
            task_name=task.name,
            rand_state=_rand_state(seed),
            num_threads=1,
        )
        self.sketches = list(self.context.generate_design_space())
        self.postprocs = list(self.context.space_generator.postprocs)
        self.rng = np.random.default_rng(seed)
        # only a task that reads some index backwards can be miscompiled so (packs_a_reversed_index; printing
        # every candidate would cost ~7% of a conv's sampling time)
        self.reads_backwards = bool(_SUBTRACTED_VARIABLE.search(task.mod.script()))

    def apply_postprocs(self, sch: Any, postprocs: list | None = None) -> bool:
        """Postprocess in place; False if the schedule turned out invalid (or TVM's packing miscompiled it:
        ``packs_a_reversed_index``).

        The trace marks where postprocessing begins (as MetaSchedule's searches do): a replay of it with
        ``remove_postproc=True`` (a mutation, a transfer to another task) postprocesses afresh.
        """
        try:
            sch.enter_postproc()
            return (all(p.apply(sch) for p in (postprocs or self.postprocs))
                    and not (self.reads_backwards and packs_a_reversed_index(sch)))
        except Exception:  # a postprocessor can throw on a schedule it finds malformed: invalid
            return False

    def thread_postprocs(self) -> list:
        """Postprocessors for one worker thread (they may keep state, so threads must not share them)."""
        return [p.clone() for p in self.postprocs]

    def sample(self, sketch_index: int | None = None, seed: int | None = None,
               postprocs: list | None = None) -> Any | None:
        """A random schedule from one sketch (random sketch if None); None if it came out invalid.

        With ``seed`` the result depends on nothing else (safe to call from several threads, each
        with its own ``postprocs``); without, the space's own random stream is used.
        """
        if not self.sketches:
            return None
        rng = self.rng if seed is None else np.random.default_rng(seed)
        if sketch_index is None:
            sketch_index = int(rng.integers(len(self.sketches)))
        return self.apply(self.sketches[sketch_index].trace, keep_decisions=False,
                          seed=int(rng.integers(1, 2**31 - 1)), postprocs=postprocs)

    def sample_new(self, n: int, exclude: Collection[str], origin: str, max_misses: int = 64,
                   max_invalid: int = 3200) -> list[Any]:
        """Up to ``n`` distinct uniform samples as candidates, none whose key is in ``exclude`` (what was measured).
        Fewer when ``max_misses`` valid samples in a row were seen already (the space holds (almost) no more), or
        ``max_invalid`` samples in a row are invalid. Invalid ones are counted apart: on a GPU, 94-97% of a conv's
        samples fail the postprocessors (thread and shared-memory limits), and 64 invalid samples in a row do not
        mean the space is exhausted (ResNet-18's convs for an H100: 3-6% of samples valid, ~11 ms a sample)."""
        from tunecore.data import Candidate

        seen = set(exclude)
        out: list[Candidate] = []
        misses = invalid = 0
        while len(out) < n and misses < max_misses and invalid < max_invalid:
            sch = self.sample()
            if sch is None:
                invalid += 1
                continue
            invalid = 0
            candidate = Candidate.from_schedule(self.task, sch, origin=origin)
            if candidate.key in seen:
                misses += 1
                continue
            misses = 0
            seen.add(candidate.key)
            out.append(candidate)
        return out

    def apply(self, trace: Any, keep_decisions: bool = True, seed: int | None = None,
              postprocs: list | None = None) -> Any | None:
        """Replay a trace (e.g. a mutated or transferred one) on this task with postprocessors; None if invalid."""
        return self.apply_explained(trace, keep_decisions, seed, postprocs)[0]

    def apply_explained(self, trace: Any, keep_decisions: bool = True, seed: int | None = None,
                        postprocs: list | None = None, decision_provider: Any = None) -> tuple[Any | None, str | None]:
        """``apply``, saying why a trace did not give a valid schedule: (schedule, None) or (None, reason).

        ``decision_provider(inst, inputs, attrs, decision) -> decision`` sees every instruction as it
        is replayed (inputs already bound to this schedule's objects) and may change its decision.
        """
        from tvm.s_tir.schedule import Trace

        sch = new_schedule(self.task.mod, seed=seed if seed is not None else int(self.rng.integers(1, 2**31 - 1)))
        trace = self.sketch_part(trace)
        if not keep_decisions:
            trace = Trace(trace.insts, {})
        try:
            if decision_provider is None:
                trace.apply_to_schedule(sch, remove_postproc=True)
            else:
                trace.apply_to_schedule(sch, remove_postproc=True,
                                        decision_provider=lambda *a: decision_provider(sch, *a))
        except Exception as error:  # schedule primitives refuse some decisions: invalid
            from tunecore.errors import error_line

            return None, f"replay: {error_line(error, limit=160)}"
        if not self.apply_postprocs(sch, postprocs):
            return None, "rejected by a postprocessor"
        return sch, None

    def sketch_part(self, trace: Any) -> Any:
        """A trace of this task's, marked where its postprocessing begins (EnterPostproc).

        Traces tunecore stored before it marked postprocessing have it inline: they are cut where the
        sketch they follow ends. Replayed on another task, or after a mutation, the old postprocessing would
        repeat decisions made for other loops and shapes (RewriteLayout's packing of a 1x1 conv's weights
        drops a 3x3 kernel's taps). A trace that follows none of the sketches is returned as it is.
        """
        from tvm.s_tir.schedule import Instruction, InstructionKind, Trace

        kinds = [inst.kind.name for inst in trace.insts]
        if "EnterPostproc" in kinds:
            return trace
        lengths = [len(s.trace.insts) for s in self.sketches
                   if kinds[:len(s.trace.insts)] == [inst.kind.name for inst in s.trace.insts]]
        if not lengths:
            return trace
        insts = list(trace.insts)[: max(lengths)]  # the longest: a sketch may begin like a shorter one
        decisions = {inst: trace.get_decision(inst) for inst in insts if trace.get_decision(inst) is not None}
        return Trace([*insts, Instruction(InstructionKind.get("EnterPostproc"), [], [], [])], decisions)

    def mutate(self, trace: Any, mutator: Any, seed: int, postprocs: list | None = None,
               attempts: int = 4) -> Any | None:
        """A schedule of this task from ``trace`` changed by ``mutator`` (one of ``mutators()``), reproducibly: the
        same trace, mutator and seed give the same schedule. A mutation that fails or gives an invalid program is
        tried again with the next seed, up to ``attempts`` times; None if none worked."""
        from tvm.s_tir.meta_schedule import _ffi_api  # Mutator.apply takes no seed: its random state is global

        for attempt in range(attempts):
            attempt_seed = int((seed + attempt * 7919) % (2**31 - 1)) or 1
            mutated = _ffi_api.MutatorApply(mutator, trace, attempt_seed)
            if mutated is not None:
                sch = self.apply(mutated, seed=attempt_seed, postprocs=postprocs)
                if sch is not None:
                    return sch
        return None

    def mutators(self) -> list[tuple[Any, float]]:
        """The target's mutators (tile size, parallel, unroll, compute location...) with their probabilities."""
        probs = self.context.space_generator.mutator_probs or {}
        return [(m, float(p)) for m, p in probs.items()]


# TVM 0.27's TransformLayout drops the offset of an index read backwards when its map splits that axis: under
# [p // 2, p % 2], A[3 - i] becomes A[i // -2 + 1, i % -2 * -1], which reads other elements. RewriteLayout does this
# to a transposed conv's flipped kernel (weight[.., 3 - kh, 3 - kw]); in dataset v2 every program of dcgan's
# transposed convs with a negative divisor in an index computed wrong outputs (205), and none without one did.
_NEGATIVE_DIVISOR = re.compile(r"(//|%) (T\.int\d+\()?-\d")
_SUBTRACTED_VARIABLE = re.compile(r"-\s+v")  # "T.int64(3) - v_h": block variables are named v...


def packs_a_reversed_index(sch: Any) -> bool:
    """Whether RewriteLayout's packing rewrote an index into a division by a negative number (see above)."""
    if not any(inst.kind.name == "TransformLayout" for inst in sch.trace.insts):
        return False
    return bool(_NEGATIVE_DIVISOR.search(sch.mod.script()))


def _rand_state(seed: int) -> int:
    """MetaSchedule wants a seed in [1, 2^31-1]."""
    return seed % (2**31 - 2) + 1
