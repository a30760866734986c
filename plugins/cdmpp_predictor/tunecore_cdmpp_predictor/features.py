"""What CDMPP sees of a program and of a device.

A program is its **compact AST**: the loop tree of its scheduled TIR, whose internal nodes are loops
and whose leaves are buffer stores. Each leaf carries MetaSchedule's 164 per-store features (the
C++ extractor, shared with ``xgb``) and its position: the index of the leaf in the tree serialized in
pre-order with an end marker after each node's children (CDMPP's serialization), so that two programs
with the same stores in different loop nests get different positions.

PerStoreFeature writes one row per *written buffer*, in the order of the first store to it, skips
stores of constants (reduction inits) and layout-rewrite blocks; the walk below follows the same
rules on the scheduled module, so leaf i's position belongs to row i. Where the counts still differ
(an IR the two walks see differently) the leaves get their row index as position, and
``CompactAST.aligned`` says so.

A device is a short vector made from its description (``Measurer.device()``): clock, cores, vector
width, FMA, cache sizes, peak FLOP/s, GPU SMs and memory, log-scaled to about [0, 1].
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from tunecore.interfaces import Candidate, PerStoreFeatures, Task

_LAYOUT_REWRITE = "meta_schedule.layout_rewrite_preproc"
_CONSTANTS = ("IntImm", "FloatImm")


@dataclasses.dataclass
class CompactAST:
    features: np.ndarray  # (leaves, 164) float32, PerStoreFeature rows
    positions: np.ndarray  # (leaves,) int32, index of each leaf in the serialized tree
    flops: float  # of the task (every program of a task computes the same)
    aligned: bool = True  # False: the tree walk found another number of leaves, positions are row indices


class CompactASTs:
    """Compact ASTs of candidates, cached by program key."""

    def __init__(self, threads: int, cache_size: int = 50_000):
        self.rows = PerStoreFeatures(threads, cache_size)
        self.positions: dict[str, np.ndarray | None] = {}

    def __call__(self, task: Task, candidates: Sequence[Candidate]) -> list[CompactAST | None]:
        out: list[CompactAST | None] = []
        for c, rows in zip(candidates, self.rows(task, candidates)):
            if rows is None or not len(rows):
                out.append(None)
                continue
            positions = self.positions.get(c.key)
            if positions is None:
                positions = leaf_positions(c.sch.mod)
                if len(self.positions) >= self.rows.cache_size:
                    self.positions.pop(next(iter(self.positions)))
                self.positions[c.key] = positions
            aligned = len(positions) == len(rows)
            if not aligned:
                positions = np.arange(1, 2 * len(rows), 2, dtype=np.int32)
            out.append(CompactAST(rows, positions, task.flops, aligned))
        return out


def leaf_positions(mod: Any) -> np.ndarray:
    """Per written buffer (in the order of its first store), the serialized-tree index of its last store."""
    func = mod["main"]
    position: dict[str, int] = {}  # buffer name -> index; a dict keeps first-store order
    cursor = 1  # index 0 is the root

    def visit(node: Any) -> None:
        nonlocal cursor
        kind = type(node).__name__
        if kind == "For":
            cursor += 1
            visit(node.body)
            cursor += 1  # end marker
        elif kind == "BufferStore":
            if type(node.value).__name__ not in _CONSTANTS:
                position[node.buffer.name] = cursor
            cursor += 2  # the leaf and its end marker
        elif kind == "SeqStmt":
            for stmt in node.seq:
                visit(stmt)
        elif kind == "SBlockRealize":
            visit(node.block)
        elif kind == "SBlock":
            if _LAYOUT_REWRITE not in node.annotations:
                visit(node.body)  # its init is a store of a constant
        elif kind == "IfThenElse":
            visit(node.then_case)
            if node.else_case is not None:
                visit(node.else_case)
        elif hasattr(node, "body"):
            visit(node.body)

    visit(func.body)
    return np.fromiter(position.values(), dtype=np.int32, count=len(position))


def positional_encoding(positions: np.ndarray, width: int) -> np.ndarray:
    """Sinusoidal encoding of integer positions: (n,) -> (n, width), as in the Transformer paper."""
    i = np.arange(width)
    angle = positions[:, None] / np.power(10_000.0, (i - i % 2) / width)[None, :]
    return np.where(i % 2 == 0, np.sin(angle), np.cos(angle)).astype(np.float32)


