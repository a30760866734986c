"""Small real workloads and a measurer that needs no compiler, for testing plugins quickly."""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Sequence

from tunecore.data import Candidate, MeasureResult, Task
from tunecore.roles import Artifact, Measurer, Profiler, SearchPolicy, TaskContext


def tiny_task(op: str = "matmul-64", target: Any = None) -> Task:
    """A real task (default: 64x64x64 fp32 matmul) on this host's CPU target."""
    from tunecore.targets import host_target
    from tunecore.workloads import extract_tasks, load_workload

    return extract_tasks(load_workload(f"op:{op}"), target or host_target())[0]


def sample_candidates(task: Task, n: int, seed: int = 1) -> list[Candidate]:
    """Up to n distinct random programs of the task (fewer only if the space has fewer)."""
    from tunecore.space import DesignSpace

    space = DesignSpace(task, seed=seed)
    out: dict[str, Candidate] = {}
    for _ in range(n * 20):
        sch = space.sample()
        if sch is not None:
            c = Candidate.from_schedule(task, sch, origin="test")
            out.setdefault(c.key, c)
        if len(out) == n:
            break
    return list(out.values())


def wrong_schedule(sch: Any, which: int = 0, axis: int = -1, factor: int = 2) -> Any | None:
    """A copy of a schedule edited so that it no longer computes its task, or None when no edit applies: a block
    reads one of the function's inputs (the ``which``-th read of one, counting on if TVM refuses the edit there)
    through a copy whose ``axis`` is folded by ``factor`` (index i -> i // factor), so elements share a place.
    TVM does not check that a layout transform is one-to-one: a wrong program it builds and runs, which only a
    comparison of outputs can tell (the class of fault a trace replayed on other shapes produces)."""
    func = sch.mod["main"]
    reads, pending = [], list(sch.get_child_blocks(sch.get_sblock("root")))
    while pending:
        block = pending.pop(0)
        for index, region in enumerate(sch.get(block).reads):
            shapes = [[int(d) for d in p.ty.shape] for p in func.params if region.source.same_as(p)]
            if shapes and len(shapes[0]) > (axis if axis >= 0 else -axis - 1) and shapes[0][axis] >= 2:
                reads.append((block, index))  # an axis of one element folds onto itself: not wrong
        pending.extend(sch.get_child_blocks(block))

    def fold(*axes: Any) -> tuple:
        folded = list(axes)
        folded[axis] = folded[axis] // factor
        return tuple(folded)

    for block, index in reads[which % max(1, len(reads)):] + reads[: which % max(1, len(reads))]:
        edited = sch.copy()
        try:
            edited.cache_read(block, index, "global")
            edited.transform_layout(block, ("read", index), fold)
        except Exception:  # TVM refuses this edit here: try another input
            continue
        return edited
    return None


def wrong_candidates(task: Task, n: int, seed: int = 1) -> list[Candidate]:
    """Up to n distinct programs that do not compute the task: random programs edited by ``wrong_schedule``."""
    out: dict[str, Candidate] = {}
    for good in sample_candidates(task, n, seed=seed):
        sch = wrong_schedule(good.sch)
        if sch is not None:
            c = Candidate.from_schedule(task, sch, origin="wrong")
            out.setdefault(c.key, c)
    return list(out.values())


class WrongProgramSearch(SearchPolicy):
    """Proposes programs that do not compute the task (``wrong_candidates``), with correct ones between them when
    ``every`` > 1 (one in ``every`` wrong): a measurer must report each wrong one as a failure."""

    name = "wrong-programs"

    def __init__(self, *, every: int = 2, **options: Any):
        super().__init__(**options)
        self.every = every
        self.queues: dict[str, list[Candidate]] = {}

    def start_task(self, context: TaskContext) -> None:
        task = context.task
        good = sample_candidates(task, 8, seed=context.seed or 1)
        wrong = iter(wrong_candidates(task, 8, seed=(context.seed or 1) + 1))
        queue = []
        for i, candidate in enumerate(good):
            if i % self.every == 0:
                queue.append(next(wrong, candidate))
            queue.append(candidate)
        self.queues[task.task_id] = [c for c in queue if c.key not in context.measured]

    def propose(self, task: Task, n: int) -> list[Candidate]:
        batch, self.queues[task.task_id] = self.queues[task.task_id][:n], self.queues[task.task_id][n:]
        return batch


def hashed_latency(candidate: Candidate) -> float:
    """A latency derived from the program's key: arbitrary, nothing to learn from it."""
    fraction = int(hashlib.sha256(candidate.key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return 1e-4 * (1 + 9 * fraction)


def tiled_latency(candidate: Candidate) -> float:
    """A made-up latency that follows the program's loop tiling: something to learn and to search.

    Every tiled loop has a best innermost tile (8), a best next one (2) and a best one above that
    (4); each factor of two away from it costs a share (innermost 100%, the others 25%). The fastest programs
    (1e-5 s) are rare in a random sample, and the tile sizes show in any program feature that
    sees loop extents (the vectorized loop's width on CPUs), so a cost model that learns from
    measurements ranks unseen programs by it and a guided search finds better ones than random
    sampling at the same budget.
    """
    import math

    trace = candidate.trace
    slowdown = 1.0
    for inst in trace.insts:
        if inst.kind.name == "SamplePerfectTile":
            factors = [int(f) for f in trace.decisions[inst]]
            for position, best_log2, cost in zip(range(len(factors) - 1, 0, -1), (3, 1, 2), (1.0, 0.25, 0.25)):
                slowdown *= 1 + cost * abs(math.log2(factors[position]) - best_log2)
    return 1e-5 * slowdown


class InstantMeasurer(Measurer):
    """Pretends to measure: a latency computed from the candidate, no build, no run.

    For testing search policies and cost models in milliseconds. ``latency`` (candidate -> seconds)
    defaults to ``hashed_latency``; ``tiled_latency`` gives one a model can learn. Candidates whose
    origin starts with "fail" come back as failures. Not registered as a component; construct it directly.
    """

    name = "instant"

    def __init__(self, target: Any, latency: Callable[[Candidate], float] = hashed_latency):
        super().__init__(target)
        self.latency = latency

    def measure(self, task: Task, candidates: Sequence[Candidate]) -> list[MeasureResult]:
        results = []
        for c in candidates:
            if c.origin.startswith("fail"):
                results.append(MeasureResult(error="run: failure requested by the test"))
                continue
            results.append(MeasureResult(run_secs=[self.latency(c)] * 3))
        return results


class ArtifactSizeProfiler(Profiler):
    """A profiler for tests: the size of the built library, read where the runner runs it.

    Proves the profiling path: the metric exists only if the artifact was still there when profiled.
    Register it from a test plugin (``register(ArtifactSizeProfiler)`` in ``tunecore_register_profilers``)
    and select it with ``profilers=["artifact-size"]``.
    """

    name = "artifact-size"

    def profile(self, task: Task, artifact: Artifact, result: MeasureResult) -> dict[str, float]:
        import os

        return {"artifact_bytes": float(os.path.getsize(artifact.path))}


def _save_onnx(path, name, nodes, input_shape, output_shape, weights):
    """A float32 graph from input ``x`` to output ``y``, saved as an opset-17 ONNX model."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, input_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _cnn_weights(shapes):
    """Seeded weights (name -> shape, 0.2 x standard normal, in order) and Clip's relu6 bounds "zero" and "six"."""
    import numpy as np
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    return [numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype("float32"), name)
            for name, shape in shapes.items()] + [numpy_helper.from_array(np.array(0, "float32"), "zero"),
                                                  numpy_helper.from_array(np.array(6, "float32"), "six")]


def write_tiny_onnx(path, size=64):
    """An ONNX model for tests (needs the `onnx` package): conv + relu + reshape + matmul with a dynamic batch
    dimension (3 tasks), input size x size."""
    import numpy as np
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype("float32"), "W"),
        numpy_helper.from_array(rng.standard_normal(16).astype("float32"), "B"),
        numpy_helper.from_array(rng.standard_normal((16 * (size // 2) ** 2, 10)).astype("float32") * 0.05, "W2"),
        numpy_helper.from_array(np.array([1, -1], dtype=np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "W2"], ["y"]),
    ]
    _save_onnx(path, "tiny", nodes, ["N", 3, size, size], [1, 10], weights)


def write_inverted_residual_onnx(path):
    """MobileNetV2's inverted residual block as ONNX (needs the `onnx` package): 24 channels expanded to 48 by a 1x1
    conv with bias and relu6 (Clip), a depthwise 3x3 conv with bias and relu6, a 1x1 conv back to 24 with bias,
    and the residual add; input 1x24x16x16. Where vectors hold 16 floats, 24 channels are blocked by 8 and 48 by 16."""
    from onnx import helper

    weights = _cnn_weights({"We": (48, 24, 1, 1), "Be": (48,), "Wd": (48, 1, 3, 3), "Bd": (48,),
                            "Wp": (24, 48, 1, 1), "Bp": (24,)})
    nodes = [
        helper.make_node("Conv", ["x", "We", "Be"], ["e"]),
        helper.make_node("Clip", ["e", "zero", "six"], ["e6"]),
        helper.make_node("Conv", ["e6", "Wd", "Bd"], ["d"], pads=[1, 1, 1, 1], group=48),
        helper.make_node("Clip", ["d", "zero", "six"], ["d6"]),
        helper.make_node("Conv", ["d6", "Wp", "Bp"], ["p"]),
        helper.make_node("Add", ["p", "x"], ["y"]),
    ]
    _save_onnx(path, "inverted_residual", nodes, [1, 24, 16, 16], [1, 24, 16, 16], weights)


def write_small_cnn_onnx(path):
    """A small CNN as ONNX (needs the `onnx` package), for the layout paths: a 3-channel stem conv with relu and
    a 3x3 max pool (stride 1) read by two convs (a 3x3 conv 16 -> 32 with bias, and a 1x1 shortcut conv added to
    it, then relu), a 1x1 conv with a residual add, a depthwise 3x3 conv with relu6 (Clip), a 1x1
    conv in 2 groups, a 1x1 conv to 24 channels (blocked by 8 where vectors hold 16 floats), global average
    pooling and a matmul; input 1x3x16x16. Every other channel count but the stem's is a multiple of 16."""
    from onnx import helper

    weights = _cnn_weights({"W1": (16, 3, 3, 3), "B1": (16,), "W2": (32, 16, 3, 3), "B2": (32,),
                            "W3": (32, 32, 1, 1), "B3": (32,), "W4": (32, 1, 3, 3), "W6": (32, 16, 1, 1),
                            "W7": (24, 32, 1, 1), "W5": (24, 10), "W8": (32, 16, 1, 1)})
    nodes = [
        helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["m1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["m1", "W2", "B2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["m1", "W8"], ["s2"]),
        helper.make_node("Add", ["c2", "s2"], ["a2"]),
        helper.make_node("Relu", ["a2"], ["r2"]),
        helper.make_node("Conv", ["r2", "W3", "B3"], ["c3"]),
        helper.make_node("Add", ["c3", "r2"], ["a3"]),
        helper.make_node("Relu", ["a3"], ["r3"]),
        helper.make_node("Conv", ["r3", "W4"], ["c4"], pads=[1, 1, 1, 1], group=32),
        helper.make_node("Clip", ["c4", "zero", "six"], ["r4"]),
        helper.make_node("Conv", ["r4", "W6"], ["c5"], group=2),
        helper.make_node("Conv", ["c5", "W7"], ["c6"]),
        helper.make_node("GlobalAveragePool", ["c6"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "W5"], ["y"]),
    ]
    _save_onnx(path, "small_cnn", nodes, [1, 3, 16, 16], [1, 10], weights)
