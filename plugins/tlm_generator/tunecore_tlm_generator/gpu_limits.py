"""A GPU sketch's limits as bounds on its decisions, so that decoding writes programs that can run.

MetaSchedule's GPU sketches (multi-level tiling) bind products of tile factors to ``threadIdx`` and stage tiles of
their operands in shared memory. VerifyGPUCode rejects a program whose threads per block fall outside the range the
sketch annotates (32..1024 for an H100) or whose shared memory exceeds the target's ``max_shared_memory_per_block``
(48 KiB). Uniform samples of an H100's matmul, dense and conv2d spaces break one or the other 95-98% of the time, and
tlm weights learned from the GPU dataset's 28 tasks do not learn the limits for shapes they never saw (0 of 32
programs valid: ``bench/results/tlm_gpu.md``).

Both quantities only grow with the factors that make them, so a factor can be ruled out while decoding: when even
the smallest completion of the decisions not yet written gives too many threads or too much shared memory, or the
largest too few threads. Each limit is checked on its own, so these are necessary conditions, not sufficient ones:
the postprocessors still decide, and a program the limits pass may still be rejected.

A shared buffer's footprint is read from the sketch's trace: ``CacheRead`` into shared memory computed at a loop of
a ``Reorder``ed tiling holds, per buffer dimension, the span of its index over the tile factors inside that loop or
bound to ``threadIdx``/``vthread`` (shared memory is per block, so the threads' tiles add up). Indices that are not
affine in the block's iterators (after folding divisions constant over their ranges) count as their region's extent:
less than the truth, so the bound stays necessary.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any, Sequence

_LOW, _HIGH = "meta_schedule.thread_extent_low_inclusive", "meta_schedule.thread_extent_high_inclusive"
_SHARED = ("shared", "shared.dyn")
_STAGES = "software_pipeline_stage"
_THREADS = ("threadIdx",)
_PER_BLOCK = ("threadIdx", "vthread")  # tiles a shared buffer holds for the whole thread block


@dataclasses.dataclass(frozen=True)
class Factor:
    """The product of some of a slot's numbers (a tile's factors at ``positions``, TVM's order: outermost first; a
    categorical's value at position 0)."""

    slot: int
    positions: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Threads:
    """Threads per block: the product of the factors, within [low, high]."""

    factors: tuple[Factor, ...]
    low: int
    high: int


@dataclasses.dataclass(frozen=True)
class SharedBuffer:
    """One operand's tile in shared memory: per dimension (region extent, dimension size, (coefficient, extent of
    the tile of an iterator) terms), the footprint min(size, extent + sum |c| (E - 1)); ``copies`` of it where a
    software pipeline keeps the next stages' tiles too."""

    element_bytes: int
    dims: tuple[tuple[int, int, tuple[tuple[int, Factor], ...]], ...]
    copies: int = 1


@dataclasses.dataclass(frozen=True)
class Shared:
    """The shared buffers of one thread block, at most ``limit`` bytes together."""

    buffers: tuple[SharedBuffer, ...]
    limit: int


class Limits:
    """A sketch's limits over its slots (``sentences.Slot``), checked while its decisions are written."""

    def __init__(self, slots: Sequence[Any], threads: Sequence[Threads], shared: Sequence[Shared]):
        self.slots, self.threads, self.shared = list(slots), list(threads), list(shared)

    def __bool__(self) -> bool:
        return bool(self.threads or self.shared)

    def allowed(self, decided: Sequence[Sequence[int]], prefix: Sequence[int], values: Sequence[int],
                inner_first: bool) -> list[int]:
        """Of ``values`` (the next number of slot ``len(decided)``, after ``prefix`` of it), those with which every
        limit can still be met; all of them if none can (the limits are necessary, the postprocessors decide)."""
        current = len(decided)
        ok = [v for v in values if self._feasible(decided, (current, (*prefix, v)), inner_first)]
        return ok or list(values)

    def satisfied(self, written: Sequence[Sequence[int]], inner_first: bool) -> bool:
        """Whether whole decisions (each slot's numbers as written) meet every limit."""
        return self._feasible(written, (len(written), ()), inner_first)

    def _feasible(self, decided: Sequence[Sequence[int]], partial: tuple[int, tuple[int, ...]],
                  inner_first: bool) -> bool:
        def bounds(factor: Factor) -> tuple[int, int]:
            if factor.slot < len(decided):
                return _range(self.slots[factor.slot], tuple(decided[factor.slot]), factor.positions, inner_first)
            prefix = partial[1] if factor.slot == partial[0] else ()
            return _range(self.slots[factor.slot], prefix, factor.positions, inner_first)

        for limit in self.threads:
            ranges = [bounds(f) for f in limit.factors]
            if math.prod(lo for lo, _ in ranges) > limit.high or math.prod(hi for _, hi in ranges) < limit.low:
                return False
        for limit in self.shared:
            smallest = sum(buffer.copies * buffer.element_bytes * math.prod(
                min(size, extent + sum(abs(c) * (bounds(f)[0] - 1) for c, f in terms))
                for extent, size, terms in buffer.dims) for buffer in limit.buffers)
            if smallest > limit.limit:
                return False
        return True


@functools.lru_cache(maxsize=65536)
def _range(slot: Any, prefix: tuple[int, ...], positions: tuple[int, ...], inner_first: bool) -> tuple[int, int]:
    """The smallest and largest product of ``positions`` over the slot's decisions that begin with ``prefix`` (its
    numbers in the order written)."""
    products = [math.prod(_at(slot, full, p, inner_first) for p in positions)
                for full in _completions(slot, prefix, inner_first)]
    return (min(products), max(products)) if products else (1, 1)


def _at(slot: Any, written: Sequence[int], position: int, inner_first: bool) -> int:
    if slot.kind == "SamplePerfectTile" and inner_first:
        return written[slot.n - 1 - position]
    return written[position]


@functools.lru_cache(maxsize=4096)
def _completions(slot: Any, prefix: tuple[int, ...], inner_first: bool) -> list[tuple[int, ...]]:
    if len(prefix) == slot.numbers:
        return [prefix]
    return [full for v in slot.choices(list(prefix), inner_first)
            for full in _completions(slot, (*prefix, v), inner_first)]


# Reading them from a sketch (needs TVM)


def derive(task: Any, insts: Sequence[Any], slot_of: dict[int, int]) -> tuple[list[Threads], list[Shared]]:
    """The thread and shared-memory limits of a sketch's instructions (JSON, up to postprocessing) for a GPU task;
    ``slot_of`` maps a sampling instruction's index to its slot. Nothing for another target, or for what the trace
    does not say plainly (then decoding is as without limits)."""
    target = task.target
    if "gpu" not in [str(k) for k in target.keys]:
        return [], []
    max_threads = int(target.attrs.get("max_threads_per_block", 1024))
    max_shared = int(target.attrs.get("max_shared_memory_per_block", 48 * 1024))
    block_of: dict[str, str] = {}  # block RV -> its name in the task
    original: dict[str, tuple[str, int]] = {}  # loop RV -> (block, index among the block's loops)
    variable: dict[str, Factor] = {}  # a sampled variable -> the number it is
    split: dict[str, tuple[str, int, Factor]] = {}  # a split's loop -> (block, original loop index, its factor)
    members: dict[str, list[str]] = {}  # a fused loop -> the loops in it
    orders: list[list[str]] = []
    bound: list[tuple[str, list[str]]] = []  # (thread kind, loops)
    annotations: dict[tuple[str, str], int] = {}
    caches: dict[str, tuple[str, int]] = {}  # a shared cache block RV -> (block read, its read index)
    computed_at: list[tuple[str, str]] = []
    stages: dict[str, list[int]] = {}  # a pipelined (fused) loop's innermost -> the stage of each block in it
    looped: set[str] = set()
    for i, (kind, inputs, attrs, outputs) in enumerate(insts):
        if kind == "GetSBlock":
            block_of[outputs[0]] = attrs[0]
        elif kind == "GetLoops" and inputs[0] in block_of and block_of[inputs[0]] not in looped:
            looped.add(block_of[inputs[0]])
            original.update((loop, (block_of[inputs[0]], k)) for k, loop in enumerate(outputs))
        elif kind == "SamplePerfectTile" and i in slot_of:
            variable.update((v, Factor(slot_of[i], (p,))) for p, v in enumerate(outputs))
        elif kind == "SampleCategorical" and i in slot_of:
            variable[outputs[0]] = Factor(slot_of[i], (0,))
        elif kind == "Split" and inputs[0] in original:
            block, k = original[inputs[0]]
            for loop, v in zip(outputs, inputs[1:]):
                if v in variable:
                    split[loop] = (block, k, variable[v])
        elif kind == "Fuse":
            members[outputs[0]] = [m for x in inputs for m in members.get(x, [x])]
        elif kind == "Reorder":
            orders.append(list(inputs))
        elif kind == "Bind":
            bound.append((attrs[0].split(".")[0], members.get(inputs[0], [inputs[0]])))
        elif kind == "Annotate" and attrs and attrs[0] in (_LOW, _HIGH) and inputs[0] in block_of:
            annotations[(block_of[inputs[0]], attrs[0])] = int(inputs[1])
        elif kind == "Annotate" and attrs and attrs[0] == _STAGES and inputs[0] in members:
            stages[members[inputs[0]][-1]] = [int(x) for x in inputs[1]]  # the blocks sit in the innermost loop
        elif kind == "CacheRead" and attrs[1] in _SHARED and inputs[0] in block_of:
            caches[outputs[0]] = (block_of[inputs[0]], int(attrs[0]))
        elif kind == "ComputeAt" and inputs[0] in caches:
            computed_at.append((inputs[0], inputs[1]))

    threads = []
    by_block: dict[str, list[str]] = {}
    for kind, loops in bound:
        if kind in _THREADS:
            for loop in loops:
                by_block.setdefault(split[loop][0] if loop in split else "", []).append(loop)
    for block, loops in by_block.items():
        if block:  # "": a thread loop of unknown extent and block, which may add threads to any: no lower bound then
            low = annotations.get((block, _LOW), 1) if "" not in by_block else 1
            threads.append(Threads(_merged([split[loop][2] for loop in loops]), low,
                                   min(annotations.get((block, _HIGH), max_threads), max_threads)))

    shared: dict[str, list[SharedBuffer]] = {}
    per_block = [loop for kind, loops in bound if kind in _PER_BLOCK for loop in loops if loop in split]
    for cache, at in computed_at:
        block, read = caches[cache]
        order = next((o for o in orders if at in o), None)
        if order is None or at not in split or split[at][0] != block:
            continue
        inside = [split[loop] for loop in order[order.index(at) + 1:] + per_block if loop in split]
        tiles = {k: _merged([f for b, j, f in inside if b == block and j == k])
                 for k in {j for b, j, _ in inside if b == block}}
        buffer = _footprint(task, block, read, {k: factors[0] for k, factors in tiles.items() if len(factors) == 1})
        at_loop = [c for c, loop in computed_at if loop == at]
        pipeline = stages.get(at, [])
        if buffer is not None and len(pipeline) == len(at_loop) + 1:  # the caches, then the block they feed
            # a tile written in stage s is kept until the last stage reads it (TVM's InjectSoftwarePipeline)
            buffer = dataclasses.replace(buffer, copies=max(pipeline) - pipeline[at_loop.index(cache)] + 1)
        if buffer is not None:
            shared.setdefault(block, []).append(buffer)
    return threads, [Shared(tuple(buffers), max_shared) for buffers in shared.values()]


def _footprint(task: Any, block_name: str, read: int, tiles: dict[int, Factor]) -> SharedBuffer | None:
    """The shared tile of the block's ``read``-th operand, given the tile (the factors inside) of each of its loops."""
    from tunecore.tvmjson import new_schedule

    sch = new_schedule(task.mod, seed=1)
    try:
        block_rv = sch.get_sblock(block_name)
    except Exception:  # TVM raises for a name the task does not have
        return None
    loops = sch.get_loops(block_rv)
    realize = sch.get(loops[-1]).body if loops else None
    block = sch.get(block_rv)
    if realize is None or not hasattr(realize, "iter_values") or read >= len(block.reads):
        return None
    loop_vars = [sch.get(loop).loop_var.name for loop in loops]
    loop_index: dict[str, int] = {}  # by name: a TVM variable's == builds an expression
    domains: dict[str, tuple[int, int]] = {}
    for iter_var, value in zip(block.iter_vars, realize.iter_values):
        name, start = iter_var.var.name, int(iter_var.dom.min)
        domains[name] = (start, start + int(iter_var.dom.extent) - 1)
        if type(value).__name__ == "Var" and value.name in loop_vars:
            loop_index[name] = loop_vars.index(value.name)
    region = block.reads[read]
    bits = re.search(r"(\d+)$", str(region.source.dtype))
    dims = []
    for r, size in zip(region.region, region.source.shape):
        extent = int(r.extent) if _is_int(r.extent) else 1
        affine = _affine(r.min, domains)
        terms = [(c, tiles[loop_index[v]]) for v, c in (affine[0].items() if affine else ())
                 if c and v in loop_index and loop_index[v] in tiles]
        dims.append((extent, int(size), tuple(terms)))
    return SharedBuffer(max(int(bits.group(1)) // 8, 1) if bits else 4, tuple(dims))


def _merged(factors: Sequence[Factor]) -> tuple[Factor, ...]:
    """One factor per slot: the product of a slot's positions is bounded as one (tighter than each apart)."""
    positions: dict[int, list[int]] = {}
    for f in factors:
        positions.setdefault(f.slot, []).extend(f.positions)
    return tuple(Factor(slot, tuple(sorted(p))) for slot, p in positions.items())


def _is_int(expr: Any) -> bool:
    return type(expr).__name__ == "IntImm" or isinstance(expr, int)


def _affine(expr: Any, domains: dict[str, tuple[int, int]]) -> tuple[dict[str, int], int] | None:
    """``expr`` as (coefficient per variable, constant) when it is affine in the block's iterators (a division or
    remainder constant over their ranges folds); None otherwise."""
    name = type(expr).__name__
    if _is_int(expr):
        return {}, int(expr)
    if name == "Var":
        return {expr.name: 1}, 0
    if name in ("Add", "Sub"):
        a, b = _affine(expr.a, domains), _affine(expr.b, domains)
        if a is None or b is None:
            return None
        sign = 1 if name == "Add" else -1
        coefficients = dict(a[0])
        for var, c in b[0].items():
            coefficients[var] = coefficients.get(var, 0) + sign * c
        return coefficients, a[1] + sign * b[1]
    if name == "Mul":
        a, b = _affine(expr.a, domains), _affine(expr.b, domains)
        if a is None or b is None or (a[0] and b[0]):
            return None
        (terms, constant), scale = (a, b[1]) if not b[0] else (b, a[1])
        return {v: c * scale for v, c in terms.items()}, constant * scale
    if name in ("FloorDiv", "FloorMod") and _is_int(expr.b) and int(expr.b) > 0:
        a = _affine(expr.a, domains)
        if a is None or any(v not in domains for v in a[0]):
            return None
        lo = a[1] + sum(c * domains[v][0 if c > 0 else 1] for v, c in a[0].items())
        hi = a[1] + sum(c * domains[v][1 if c > 0 else 0] for v, c in a[0].items())
        d = int(expr.b)
        if lo // d != hi // d:
            return None
        if name == "FloorDiv":
            return {}, lo // d
        return a[0], a[1] - d * (lo // d)
    return None
