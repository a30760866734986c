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
from typing import Any, Callable, NamedTuple, Sequence

_LOW, _HIGH = "meta_schedule.thread_extent_low_inclusive", "meta_schedule.thread_extent_high_inclusive"
_SHARED = ("shared", "shared.dyn")
_STAGES = "software_pipeline_stage"
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


class Dim(NamedTuple):
    """A shared tile's dimension: min(size, extent + sum |c| (E - 1)) over (c, the tile E of an iterator) terms."""

    extent: int
    size: int
    terms: tuple[tuple[int, Factor], ...]


@dataclasses.dataclass(frozen=True)
class SharedBuffer:
    """One operand's tile in shared memory; ``copies`` of it where a software pipeline keeps the next stages'."""

    element_bits: int
    dims: tuple[Dim, ...]
    copies: int = 1

    def smallest(self, bounds: Callable[[Factor], tuple[int, int]]) -> int:
        """Its bytes with every tile at its smallest (a dimension only grows with its tiles)."""
        return self.copies * self.element_bits * math.prod(
            min(d.size, d.extent + sum(abs(c) * (bounds(f)[0] - 1) for c, f in d.terms)) for d in self.dims) // 8


@dataclasses.dataclass(frozen=True)
class Shared:
    """The shared buffers of one thread block, at most ``limit`` bytes together."""

    buffers: tuple[SharedBuffer, ...]
    limit: int


class Limits:
    """A sketch's limits over its slots (``sentences.Slot``), checked while its decisions are written."""

    def __init__(self, slots: Sequence[Any], threads: Sequence[Threads], shared: Sequence[Shared]):
        self.slots, self.threads, self.shared = list(slots), list(threads), list(shared)
        self.bounded = {f.slot for t in self.threads for f in t.factors} | {
            f.slot for s in self.shared for b in s.buffers for d in b.dims for _, f in d.terms}

    def allowed(self, decided: Sequence[Sequence[int]], prefix: Sequence[int], values: Sequence[int],
                inner_first: bool) -> list[int]:
        """Of ``values`` (the next number of slot ``len(decided)``, after ``prefix`` of it), those with which every
        limit can still be met; all of them if none can (the limits are necessary, the postprocessors decide)."""
        if len(decided) not in self.bounded:
            return list(values)
        ok = [v for v in values if self._feasible(decided, (*prefix, v), inner_first)]
        return ok or list(values)

    def satisfied(self, written: Sequence[Sequence[int]], inner_first: bool) -> bool:
        """Whether whole decisions (each slot's numbers as written) meet every limit."""
        return self._feasible(written, (), inner_first)

    def _feasible(self, decided: Sequence[Sequence[int]], prefix: tuple[int, ...], inner_first: bool) -> bool:
        """Whether, after the ``decided`` slots and ``prefix`` of the next, some completion can meet each limit."""
        def bounds(factor: Factor) -> tuple[int, int]:
            slot = factor.slot
            start = tuple(decided[slot]) if slot < len(decided) else prefix if slot == len(decided) else ()
            return _range(self.slots[slot], start, factor.positions, inner_first)

        for limit in self.threads:
            ranges = [bounds(f) for f in limit.factors]
            if math.prod(lo for lo, _ in ranges) > limit.high or math.prod(hi for _, hi in ranges) < limit.low:
                return False
        return all(sum(b.smallest(bounds) for b in limit.buffers) <= limit.limit for limit in self.shared)


def _range(slot: Any, prefix: tuple[int, ...], positions: tuple[int, ...], inner_first: bool) -> tuple[int, int]:
    """The smallest and largest product of ``positions`` over the slot's decisions that begin with ``prefix`` (its
    numbers in the order written)."""
    written = {slot.n - 1 - p if slot.kind == "SamplePerfectTile" and inner_first else p for p in positions}
    chosen = math.prod(prefix[k] for k in written if k < len(prefix))
    rest = tuple(sorted(k for k in written if k >= len(prefix)))
    if not rest:
        return chosen, chosen
    if slot.kind != "SamplePerfectTile":
        values = slot.choices([])
        return chosen * min(values), chosen * max(values)
    lo, hi = _rest(slot, len(prefix), slot.extent // math.prod(prefix), rest, inner_first)
    return chosen * lo, chosen * hi


@functools.lru_cache(maxsize=65536)
def _rest(slot: Any, i: int, remaining: int, wanted: tuple[int, ...], inner_first: bool) -> tuple[int, int]:
    """The smallest and largest product of a tile's numbers at ``wanted`` (written indices >= i) over the ways to
    write its numbers from the i-th on, ``remaining`` of the loop left."""
    if i == slot.n:
        return 1, 1
    options = []
    for v in slot.tile_choices(i, remaining, inner_first):
        lo, hi = _rest(slot, i + 1, remaining // v, wanted, inner_first)
        scale = v if i in wanted else 1
        options.append((scale * lo, scale * hi))
    return (min(lo for lo, _ in options), max(hi for _, hi in options)) if options else (1, 1)


# Reading them from a sketch (needs TVM)


def derive(task: Any, insts: Sequence[Any], slot_of: dict[int, int],
           read_at_cache: dict[int, str]) -> tuple[list[Threads], list[Shared]]:
    """The thread and shared-memory limits of a sketch's instructions (JSON, up to postprocessing) for a GPU task;
    ``slot_of`` maps a sampling instruction's index to its slot, ``read_at_cache`` a CacheRead's index to the region
    its block read when the sketch was replayed (a block whose reads changed before, e.g. by an inlined cast, is
    not what the task's function says). Nothing for another target, or for what the trace does not say plainly
    (then decoding is as without limits).

    Assumed of the sketches (MetaSchedule's multi-level tiling): a thread block's threads are the threadIdx loops
    split from its own loops, and a shared cache computed at a loop of a ``Reorder`` holds the tiles after that loop
    and the thread and vthread tiles."""
    target = task.target
    if "gpu" not in [str(k) for k in target.keys]:
        return [], []
    max_threads = int(target.attrs.get("max_threads_per_block", 1024))
    max_shared = int(target.attrs.get("max_shared_memory_per_block", 48 * 1024))
    block_of: dict[str, str] = {}  # block RV -> its name in the task
    loop_count: dict[str, int] = {}  # block -> the loops its first GetLoops found
    original: dict[str, tuple[str, int]] = {}  # loop RV -> (block, index among the block's loops)
    loop_block: dict[str, str] = {}  # loop RV -> the block whose loops it was made from
    variable: dict[str, Factor] = {}  # a sampled variable -> the number it is
    split: dict[str, tuple[str, int, Factor]] = {}  # a split's loop -> (block, original loop index, its factor)
    members: dict[str, list[str]] = {}  # a fused loop -> the loops in it
    orders: list[list[str]] = []
    bound: list[tuple[str, list[str]]] = []  # (thread kind, loops)
    annotations: dict[tuple[str, str], int] = {}
    moved: set[str] = set()  # blocks computed at another block's loop: its threads enclose them too
    caches: dict[str, tuple[str, int, int]] = {}  # a shared cache block RV -> (block read, read index, CacheRead)
    computed_at: list[tuple[str, str]] = []
    stages: dict[str, list[int]] = {}  # a pipelined (fused) loop's innermost -> the stage of each block in it
    for i, (kind, inputs, attrs, outputs) in enumerate(insts):
        if kind == "GetSBlock":
            block_of[outputs[0]] = attrs[0]
        elif kind == "GetLoops" and inputs[0] in block_of and block_of[inputs[0]] not in loop_count:
            loop_count[block_of[inputs[0]]] = len(outputs)
            original.update((loop, (block_of[inputs[0]], k)) for k, loop in enumerate(outputs))
            loop_block.update((loop, block_of[inputs[0]]) for loop in outputs)
        elif kind == "SamplePerfectTile" and i in slot_of:
            variable.update((v, Factor(slot_of[i], (p,))) for p, v in enumerate(outputs))
        elif kind == "SampleCategorical" and i in slot_of:
            variable[outputs[0]] = Factor(slot_of[i], (0,))
        elif kind == "Split":
            if inputs[0] in original:
                block, k = original[inputs[0]]
                split.update((loop, (block, k, variable[v])) for loop, v in zip(outputs, inputs[1:]) if v in variable)
            if inputs[0] in loop_block:
                loop_block.update((loop, loop_block[inputs[0]]) for loop in outputs)
        elif kind == "Fuse":
            members[outputs[0]] = [m for x in inputs for m in members.get(x, [x])]
            if len({loop_block.get(x) for x in inputs}) == 1 and inputs[0] in loop_block:
                loop_block[outputs[0]] = loop_block[inputs[0]]
        elif kind == "Reorder":
            orders.append(list(inputs))
        elif kind == "Bind":
            bound.append((attrs[0].split(".")[0], members.get(inputs[0], [inputs[0]])))
        elif kind == "Annotate" and attrs[0] in (_LOW, _HIGH) and inputs[0] in block_of and isinstance(inputs[1], int):
            annotations[(block_of[inputs[0]], attrs[0])] = inputs[1]
        elif kind == "Annotate" and attrs[0] == _STAGES and inputs[0] in members:
            stages[members[inputs[0]][-1]] = [int(x) for x in inputs[1]]  # the blocks sit in the innermost loop
        elif kind in ("ComputeAt", "ReverseComputeAt") and inputs[0] in block_of:
            moved.add(block_of[inputs[0]])
        elif kind == "CacheRead" and attrs[1] in _SHARED and inputs[0] in block_of:
            caches[outputs[0]] = (block_of[inputs[0]], int(attrs[0]), i)
        elif kind == "ComputeAt" and inputs[0] in caches:
            computed_at.append((inputs[0], inputs[1]))

    by_block: dict[str, list[str]] = {}
    for kind, loops in bound:
        if kind == "threadIdx":
            for loop in loops:
                by_block.setdefault(loop_block.get(loop, ""), []).append(loop)
    threads = []
    for block, loops in by_block.items():
        if block and all(loop in split for loop in loops):  # a thread loop of unknown extent: no bound for its block
            # "": a thread loop of unknown block, which may add threads to any: no lower bound then
            low = 1 if "" in by_block or block in moved else annotations.get((block, _LOW), 1)
            threads.append(Threads(_merged([split[loop][2] for loop in loops]), low,
                                   min(annotations.get((block, _HIGH), max_threads), max_threads)))

    from tvm.s_tir.schedule import Schedule

    function = Schedule(task.mod, debug_mask=0)  # only read: the blocks as the task's function has them
    shared: dict[str, list[SharedBuffer]] = {}
    per_block = [loop for kind, loops in bound if kind in _PER_BLOCK for loop in loops if loop in split]
    for cache, at in computed_at:
        block, read, index = caches[cache]
        order = next((o for o in orders if at in o), None)
        if order is None or at not in split or split[at][0] != block:
            continue
        inside = [split[loop] for loop in dict.fromkeys(order[order.index(at) + 1:] + per_block) if loop in split]
        tiles = {k: _merged([f for b, j, f in inside if b == block and j == k])[0]
                 for k in {j for b, j, _ in inside if b == block}}
        buffer = _footprint(function, block, read, tiles, loop_count[block], read_at_cache.get(index))
        caches_at = [c for c, loop in computed_at if loop == at]
        pipeline = stages.get(at, [])
        if buffer is not None and len(pipeline) == len(caches_at) + 1:  # the caches, then the block they feed
            # TVM's InjectSoftwarePipeline keeps a tile from its stage to its reader's; two versions only where a
            # reader comes before the writer, which is not read here: one, the smaller
            versions = pipeline[-1] - pipeline[caches_at.index(cache)] + 1
            buffer = dataclasses.replace(buffer, copies=versions if versions != 2 else 1)
        if buffer is not None:
            shared.setdefault(block, []).append(buffer)
    return threads, [Shared(tuple(buffers), max_shared) for buffers in shared.values()]


def _merged(factors: Sequence[Factor]) -> tuple[Factor, ...]:
    """One factor per slot: the product of a slot's positions is bounded as one (tighter than each apart)."""
    positions: dict[int, list[int]] = {}
    for f in factors:
        positions.setdefault(f.slot, []).extend(f.positions)
    return tuple(Factor(slot, tuple(sorted(p))) for slot, p in positions.items())


def _footprint(sch: Any, block_name: str, read: int, tiles: dict[int, Factor], loops_in_trace: int,
               read_in_trace: str | None) -> SharedBuffer | None:
    """The shared tile of the block's ``read``-th operand, given the tile (the factors inside) of each of its loops,
    read from ``sch``, the task's function unscheduled; None where it does not show the block as the trace had it."""
    from tvm import DataType

    try:
        block_rv = sch.get_sblock(block_name)
    except Exception:  # TVM raises for a name the task does not have
        return None
    loops = sch.get_loops(block_rv)
    block = sch.get(block_rv)
    realize = sch.get(loops[-1]).body if loops else None
    if (len(loops) != loops_in_trace or not hasattr(realize, "iter_values") or read >= len(block.reads)
            or str(block.reads[read]) != read_in_trace):
        return None
    loop_vars = [sch.get(loop).loop_var.name for loop in loops]
    loop_index: dict[str, int] = {}  # by name: a TVM variable's == builds an expression
    domains: dict[str, tuple[int, int]] = {}
    for iter_var, value in zip(block.iter_vars, realize.iter_values):
        if not (_is_int(iter_var.dom.min) and _is_int(iter_var.dom.extent)):
            return None
        name, start = iter_var.var.name, int(iter_var.dom.min)
        domains[name] = (start, start + int(iter_var.dom.extent) - 1)
        if type(value).__name__ == "Var" and value.name in loop_vars:
            loop_index[name] = loop_vars.index(value.name)
    region = block.reads[read]
    if not all(_is_int(size) for size in region.source.shape):
        return None
    dims = []
    for r, size in zip(region.region, region.source.shape):
        affine = _affine(r.min, domains)  # not affine: the region's extent alone, less than the truth
        terms = [(c, tiles[loop_index[v]]) for v, c in (affine[0].items() if affine else ())
                 if c and v in loop_index and loop_index[v] in tiles]
        dims.append(Dim(int(r.extent) if _is_int(r.extent) else 1, int(size), tuple(terms)))
    dtype = DataType(str(region.source.dtype))
    return SharedBuffer(dtype.bits * dtype.lanes, tuple(dims))


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
