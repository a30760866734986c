"""TLM's sentences over TVM 0.27 MetaSchedule traces: a prompt (the task and its sketch), a completion (the decisions).

A sketch is a trace whose sampling instructions still have to be decided. The *prompt* says what is
tuned: the fused operators, the argument shapes, the target, and the sketch's skeleton (its
scheduling instructions without loop and block look-ups, splits and samples). The *completion*
walks the sketch's decision slots in order; each slot opens with tokens that restate it (forced:
the decoder writes them, the model is not asked to guess them) and then holds the decision:

    TILE <extent> <max innermost> f1 .. fn    SamplePerfectTile: the n factors of a loop (a perfect tiling), in the
                                              weights' ``TILE_ORDERS`` (outermost or innermost first)
    CAT <c1> .. <ck> CHOOSE <value>           SampleCategorical: the chosen candidate's value (not its index)
    LOC [INLINE] AT <position>                SampleComputeLocation: -2 inline, -1 root, 0..63 a loop

A compute location is the index of a loop around the block's first consumer. Which loops qualify
depends on decisions made before it (unit loops do not, and earlier compute-ats move loops), so it is
not known when a batch is decoded; TVM's SampleComputeLocation takes any index and uses the nearest
qualifying loop at or above it (the root when there is none), so every index is a valid decision.
Inlining is offered only where the sketch's block can be inlined.

Numbers are their own tokens below 1024 and two tokens ``H<q> <r>`` (q*1024 + r) up to 2**20, so
every legal tile factor of every loop up to a million iterations can be written, seen in training
or not. Everything else (operator names, dtypes, target and instruction words) is a word of the
vocabulary that training built; a word it never saw reads as ``[UNK]`` in a prompt, which only
conditions the model (a CPU it never saw reads as the nearest CPU of its line that it did, e.g. znver5 as znver3).

Compared with TLM's sentences (every instruction with its variable names, ~170-600 tokens), these
are about 60-150 tokens; ``python bench/tlm.py`` reports their lengths on resnet-50's tasks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Iterator, Sequence

from tunecore.targets import cpu_lineage

BASE = 1024
MAX_NUMBER = BASE * BASE - 1
# A tile's factors, outermost first (TVM's order; the shipped weights') or innermost first: the inner factors (vector
# width, register tile, the reduction's inner part) mean the same on every shape, the outer ones are what is left of
# the loop, so written first they condition the rest on the shape instead.
OUTER_FIRST, INNER_FIRST = TILE_ORDERS = ("outer-first", "inner-first")
MAX_LOCATION = 64  # loop indices a compute location may name (deeper nests do not occur)
SPECIALS = ("[PAD]", "[BOS]", "[SEP]", "[EOS]", "[UNK]")
PAD, BOS, SEP, EOS, UNK = range(len(SPECIALS))
MARKERS = ("TASK", "ARG", "TARGET", "CORES", "SKETCH", "TILE", "CAT", "CHOOSE", "LOC", "INLINE", "AT")
SAMPLING = ("SamplePerfectTile", "SampleCategorical", "SampleComputeLocation")
# Instructions the skeleton leaves out: look-ups, splits (their factors are the tile slots) and samples.
_QUIET = {"GetSBlock", "GetLoops", "GetConsumers", "GetProducers", "GetChildBlocks", "GetOutputBlocks", "Split",
          *SAMPLING}
# The parallel extent is fixed by the sketch here (the model does not choose it); mutated traces that
# changed it still belong to their sketch.
_PARALLEL = "meta_schedule.parallel"


class Unexpressible(ValueError):
    """A sketch these sentences cannot write (a sampling instruction or a number they do not know)."""


@dataclasses.dataclass(frozen=True)
class Slot:
    """One decision of a sketch and what it may be."""

    kind: str  # one of SAMPLING
    extent: int = 0  # tile: the loop's extent
    n: int = 0  # tile: number of factors
    max_innermost: int = 0  # tile: the innermost factor's limit (<= 0: none)
    candidates: tuple[int, ...] = ()  # categorical: candidate values
    inline: bool = False  # compute location: may be inlined (-2)

    def forced_words(self) -> list[str | int]:
        if self.kind == "SamplePerfectTile":
            return ["TILE", self.extent, max(self.max_innermost, 0)]
        if self.kind == "SampleCategorical":
            return ["CAT", *self.candidates, "CHOOSE"]
        return ["LOC", *(["INLINE"] if self.inline else []), "AT"]

    def choices(self, chosen: Sequence[int], inner_first: bool = False) -> list[int]:
        """The values the next number of this slot may take, after ``chosen`` (the numbers written so far; with
        ``inner_first`` a tile's factors are written innermost first)."""
        if self.kind == "SampleCategorical":
            return sorted(set(self.candidates))
        if self.kind == "SampleComputeLocation":
            return ([-2] if self.inline else []) + [-1] + list(range(MAX_LOCATION))
        remaining = self.extent
        for factor in chosen:
            remaining //= factor
        return self.tile_choices(len(chosen), remaining, inner_first)

    def tile_choices(self, i: int, remaining: int, inner_first: bool = False) -> list[int]:
        """A tile's values for its i-th number written, ``remaining`` of the loop left by the numbers before."""
        if i == self.n - 1:
            return [remaining]
        limit = self.max_innermost if self.max_innermost > 0 else remaining
        if inner_first and i == 0:  # the innermost factor comes first: it must respect the limit
            return [d for d in divisors(remaining) if d <= limit]
        if not inner_first and i == self.n - 2:  # the last factor is what is left: it must respect the limit
            return [d for d in divisors(remaining) if remaining // d <= limit]
        return divisors(remaining)

    @property
    def numbers(self) -> int:
        """How many numbers the decision is."""
        return self.n if self.kind == "SamplePerfectTile" else 1

    def to_decision(self, values: Sequence[int], inner_first: bool = False) -> Any:
        """The written numbers as TVM's decision for the instruction."""
        if self.kind == "SamplePerfectTile":
            return [int(v) for v in (values[::-1] if inner_first else values)]
        if self.kind == "SampleCategorical":
            return self.candidates.index(int(values[0]))
        return int(values[0])

    def from_decision(self, decision: Any, inner_first: bool = False) -> list[int]:
        """TVM's decision as the numbers written, in the order they are written."""
        if self.kind == "SamplePerfectTile":
            return [int(v) for v in (decision[::-1] if inner_first else decision)]
        if self.kind == "SampleCategorical":
            return [self.candidates[int(decision)]]
        return [int(decision)]

    def is_valid(self, decision: Any) -> bool:
        """Whether a decision is one of those ``choices`` allows (the property every generated one has)."""
        try:
            values = self.from_decision(decision)
        except (IndexError, TypeError, ValueError):
            return False
        if len(values) != self.numbers:
            return False
        return all(v in self.choices(values[:i]) for i, v in enumerate(values))


@dataclasses.dataclass
class SketchPrompt:
    """A sketch of a task, as the model sees it: prompt words, and its decision slots with the sampling
    instructions (indices in the sketch's trace) they decide."""

    sketch_index: int
    words: list[str | int]
    slots: list[Slot]
    insts: list[int]  # index in the trace of each slot's sampling instruction
    length: int  # the sketch's instructions; a program of it has these first, then its postprocessing's
    skeleton: str  # identity of those instructions: a program of this sketch has the same
    limits: Any = None  # gpu_limits.Limits of a GPU sketch: what decoding may write

    def completion_words(self, decisions: Sequence[Any], inner_first: bool = False) -> list[str | int]:
        out: list[str | int] = []
        for slot, decision in zip(self.slots, decisions):
            out += slot.forced_words() + slot.from_decision(decision, inner_first)
        return out


# The vocabulary


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


class Vocabulary:
    """Token ids: the specials, the numbers (0..1023, -1, -2, H1..H1023) and the words training saw; and the order
    a tile's factors are written in (``TILE_ORDERS``), which the weights learned with the words."""

    def __init__(self, words: Sequence[str] = (), tile_order: str = OUTER_FIRST):
        if tile_order not in TILE_ORDERS:
            raise ValueError(f"tile order {tile_order!r}: expected one of {', '.join(TILE_ORDERS)}")
        fixed = [*SPECIALS, *MARKERS, *(str(i) for i in range(BASE)), "-1", "-2", *(f"H{q}" for q in range(1, BASE))]
        self.words = sorted(set(words) - set(fixed))
        self.tokens = fixed + self.words
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.tile_order = tile_order

    @property
    def inner_first(self) -> bool:
        return self.tile_order == INNER_FIRST

    def __len__(self) -> int:
        return len(self.tokens)

    def fingerprint(self) -> str:  # outer-first files made before the order was a choice keep their fingerprint
        return hashlib.sha256("\n".join(self.tokens + ([f"tile order {self.tile_order}"] if self.inner_first else []))
                              .encode()).hexdigest()[:16]

    def number(self, value: int) -> list[int]:
        if not -2 <= value <= MAX_NUMBER:
            raise Unexpressible(f"the number {value} is outside what the vocabulary writes (-2 .. {MAX_NUMBER})")
        if value < BASE:
            return [self.ids[str(value)]]
        return [self.ids[f"H{value // BASE}"], self.ids[str(value % BASE)]]

    def encode(self, words: Sequence[str | int]) -> list[int]:
        out: list[int] = []
        for w in words:
            if isinstance(w, int):
                out += self.number(w)
            else:  # a CPU newer than the training data reads as its nearest predecessor the vocabulary knows
                out.append(next((self.ids[c] for c in cpu_lineage(w) if c in self.ids), UNK))
        return out

    def decode_numbers(self, ids: Sequence[int]) -> list[int]:
        """Numbers from their tokens (the inverse of ``number`` over a run of numbers)."""
        out, high = [], None
        for i in ids:
            token = self.tokens[i]
            if token.startswith("H"):
                high = int(token[1:])
                continue
            value = int(token)
            out.append(value + BASE * high if high is not None else value)
            high = None
        return out

    def number_steps(self, values: Sequence[int]) -> tuple[list[int], dict[int, list[int]]]:
        """For a set of allowed numbers: the allowed first tokens, and for each high token the allowed low ones."""
        first, second = set(), {}
        for v in values:
            ids = self.number(v)
            first.add(ids[0])
            if len(ids) == 2:
                second.setdefault(ids[0], []).append(ids[1])
        return sorted(first), second

    def to_json(self) -> str:
        return json.dumps(self.words)

    @classmethod
    def from_json(cls, text: str) -> Vocabulary:
        return cls(json.loads(text))


# Prompts


def task_words(task: Any) -> list[str | int]:
    """The task part of a prompt: operators, argument dtypes and shapes, the target."""
    words: list[str | int] = ["TASK", *[w for w in task.kernel_class.replace("@", "_").split("_") if w]]
    for arg in task.args:
        words += ["ARG", str(arg[1]), *[int(d) for d in arg[2]]]
    target = json.loads(task.target_json)
    words += ["TARGET", target["kind"], *([target["mcpu"]] if target.get("mcpu") else []),
              "CORES", int(target.get("num-cores", 1))]
    return words


def skeleton_words(insts_json: Sequence[Any]) -> list[str | int]:
    """The scheduling instructions of a trace (JSON, up to postprocessing) that say which sketch it is."""
    words: list[str | int] = []
    for kind, inputs, attrs, _ in insts_json:
        if kind == "EnterPostproc":
            break
        if kind in _QUIET:
            continue
        words.append(kind)
        if kind == "Reorder":  # the order follows from the tiling structure annotated before it
            continue
        parallel = kind == "Annotate" and attrs and attrs[0] == _PARALLEL
        for a in attrs:
            words += _literal(a)
        for i, x in enumerate(inputs):
            if isinstance(x, str) and x[:1] == "l" and x[1:].isdigit():
                words.append(int(x[1:]))  # a loop: its variable number, the same for sketches of one structure
            elif not (isinstance(x, str) and x[:1] in "bv" and x[1:].isdigit()) and not (parallel and i == 1):
                words += _literal(x)
    return words


def _literal(x: Any) -> list[str | int]:
    if isinstance(x, bool):
        return [str(x)]
    if isinstance(x, int):
        return [x] if -2 <= x <= MAX_NUMBER else ["BIGINT"]
    if isinstance(x, str):
        return [x.strip('"')]
    if isinstance(x, float):
        return []
    if isinstance(x, list):
        return [w for y in x for w in _literal(y)]
    return []


def sketch_insts(trace_json: Sequence[Any]) -> list[Any]:
    """The instructions of a trace JSON up to postprocessing (stored traces have their postprocessing
    inlined, without the marker: ``decisions_in`` compares only a sketch's length of them)."""
    insts = trace_json[0]
    for i, inst in enumerate(insts):
        if inst[0] == "EnterPostproc":
            return insts[:i]
    return insts


def decisions_in(trace_json: Sequence[Any], prompt: SketchPrompt) -> list[Any] | None:
    """A measured (or sampled) trace's decisions for the slots of ``prompt``; None if it is not of that sketch."""
    insts = sketch_insts(trace_json)[: prompt.length]
    if skeleton_id(insts) != prompt.skeleton:
        return None
    by_inst = {int(i): d for i, d in trace_json[1]}
    sampled = [i for i, inst in enumerate(insts) if inst[0] in SAMPLING]
    if len(sampled) != len(prompt.slots) or any(i not in by_inst for i in sampled):
        return None
    return [by_inst[i] for i in sampled]


def skeleton_id(insts_json: Sequence[Any]) -> str:
    kinds = [inst[0] for inst in insts_json]
    return hashlib.sha256(json.dumps([kinds, skeleton_words(insts_json)]).encode()).hexdigest()[:16]


def iter_sampling(insts_json: Sequence[Any]) -> Iterator[tuple[int, Any]]:
    for i, inst in enumerate(insts_json):
        if inst[0] in SAMPLING:
            yield i, inst
