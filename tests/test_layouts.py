"""Conv layouts (tunecore.layouts) and Winograd candidates (tunecore.winograd): every path computes what the model
computes (values, not timings)."""

import re

import pytest

from tunecore.layouts import vector_lanes
from tunecore.targets import host_target
from tunecore.testing.cli import assert_one_line_exit_2, cli_json, run_cli
from tunecore.testing.helpers import write_inverted_residual_onnx, write_small_cnn_onnx


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    path = tmp_path_factory.mktemp("layouts") / "cnn.onnx"
    write_small_cnn_onnx(str(path))
    return str(path)


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    """An inverted residual block: three convs, 13 tasks over the three layouts where the CNN has 38."""
    path = tmp_path_factory.mktemp("layouts") / "block.onnx"
    write_inverted_residual_onnx(str(path))
    return str(path)


def _tasks(cnn, layout, *more):
    return cli_json(run_cli("tasks", "--model", cnn, "--layout", layout, *more, "--json"))["tasks"]


def _task_names(cnn, layout, *more):
    return [t["name"] for t in _tasks(cnn, layout, *more)]


def _channels(task):
    """A blocked conv task's (input, output) channels, from its data (N, C/b, H, W, b) and weights
    (O/b', I/b, kh, kw, b, b')."""
    data, weight = task["args"][0][2], task["args"][1][2]
    return data[1] * data[-1], weight[0] * weight[-1]


def _blocks(task):
    """A blocked conv task's (input, output) channel blocks."""
    return task["args"][0][2][-1], task["args"][1][2][-1]


def test_the_blocked_layout_gives_blocked_conv_tasks_and_no_weight_transforms(cnn):
    plain, tasks = _task_names(cnn, "nchw"), _tasks(cnn, "nchwc")
    blocked = [t["name"] for t in tasks]
    assert not any("NCHWc" in name for name in plain)
    # the 16- and 32-channel convs are blocked, the depthwise one too, the 24-channel one by 8 where vectors
    # hold 16 floats (by 8 with 8), and the stem's 3 input channels as one block; the grouped conv stays NCHW
    # (computed in NCHW between transforms)
    assert sum("conv2d_NCHWc" in name and "depthwise" not in name for name in blocked) == 5
    lanes = vector_lanes(host_target())
    convs = [t for t in tasks if "conv2d_NCHWc" in t["name"] and "depthwise" not in t["name"]]
    assert [_blocks(t) for t in convs if _channels(t) == (32, 24)] == [(min(lanes, 16), 8 if lanes >= 8 else 4)]
    assert [_blocks(t) for t in convs if _channels(t)[0] == 3] == [(3, min(lanes, 16))]
    assert sum("depthwise_conv2d_NCHWc" in name for name in blocked) == 1
    assert sum("conv2d" in name and "NCHWc" not in name for name in blocked) == 1
    # the stem's max pool follows it into the blocked layout: no transform between the stem and the two convs
    # reading the pool
    pool = next(t for t in tasks if "max_pool2d" in t["name"])
    assert len(pool["args"][0][2]) == 5 and "max_pool2d" in _task_names(cnn, "nchw")
    # weights are transformed once at compile time: no task transforms a weight alone; activations are
    # transformed into the blocked layout at the input, around the grouped conv, from 16 to 8 lanes (one
    # transform, not two) and out of it at the end
    assert 2 <= sum("layout_transform" in name for name in blocked) <= 5
    assert any("transpose" in name for name in _task_names(cnn, "nhwc"))


@pytest.mark.parametrize("layout", ["nchwc", "nhwc"])
def test_a_network_tuned_and_compiled_in_a_layout_computes_what_onnxruntime_computes(cnn, tmp_path, layout):
    store = str(tmp_path / "s.db")
    run = cli_json(run_cli("run", "--model", cnn, "--layout", layout, "--trials", "12", "--search", "random",
                           "--store", store, "--json"))
    assert run["trials_measured"] == 12
    report = cli_json(run_cli("compile", "--model", cnn, "--store", store, "--json"))  # the layout tuned in
    assert report["layout"] == layout and report["tasks_tuned"] > 0
    assert report["outputs_match"] and report["reference"] == "onnxruntime"
    assert report["reference_relative_error"] < 1e-4


def test_an_inverted_residual_keeps_bias_and_relu6_in_its_convs_where_24_and_48_channels_take_different_blocks(
        block, tmp_path):
    """MobileNetV2's 24 -> 144 expansion: 24 channels take a narrower block than a full vector, the expansion's
    output a full one. Its bias and relu6 fuse into the conv and no transform is left between it and the depthwise
    conv (before: conv, transform to NCHW, bias and relu6 alone, transform back: 0.69 of MobileNetV2's 3.3 ms)."""
    model = block
    tasks = _tasks(model, "nchwc")
    names = [t["name"] for t in tasks]
    assert all("conv2d" in name for name in names if "maximum" in name or "minimum" in name), names
    expansion = [t for t in tasks if "conv2d_NCHWc" in t["name"] and "depthwise" not in t["name"]
                 and _channels(t) == (24, 48)]
    assert len(expansion) == 1 and "maximum" in expansion[0]["name"], names
    lanes = vector_lanes(host_target())
    assert _blocks(expansion[0]) == ((8, 16) if lanes == 16 else (lanes, lanes))
    # left: the input into blocks and the block's output out of them (its residual add is computed in NCHW)
    assert sum("layout_transform" in name for name in names) <= 2, names
    store = str(tmp_path / "s.db")
    run = cli_json(run_cli("run", "--model", model, "--layout", "nchwc", "--trials", "8", "--search", "random",
                           "--store", store, "--json"))
    assert run["trials_measured"] == 8 and run["errors"] == 0
    report = cli_json(run_cli("compile", "--model", model, "--store", store, "--json"))
    assert report["layout"] == "nchwc" and report["outputs_match"] and report["reference"] == "onnxruntime"
    assert report["reference_relative_error"] < 1e-4


def test_bad_layouts_are_one_line_errors(cnn):
    assert_one_line_exit_2(run_cli("tasks", "--model", cnn, "--layout", "nchw8c"), "--layout nchw8c", "nchwc")
    assert_one_line_exit_2(run_cli("tasks", "--model", cnn, "--layout", "nchwc", "--target", "cuda"),
                           "--layout nchwc", "cuda")
    assert_one_line_exit_2(run_cli("tasks", "--model", "op:matmul-64", "--layout", "nhwc"), "single operator")
    assert_one_line_exit_2(run_cli("tasks", "--model", cnn, "--layout", "nhwc", "--winograd"), "--winograd", "nhwc")


def test_register_tiles_fit_the_vector_registers():
    from tunecore.blocked_conv import register_tiles

    avx512 = register_tiles(16, 4, 56)  # 32 registers: accumulators + a broadcast per pixel + a filter vector
    assert {(4, 4), (2, 7), (2, 8), (1, 14)} <= set(avx512)
    assert (4, 7) not in avx512 and (2, 14) not in avx512 and (4, 8) not in avx512  # 36, 43, 41 registers: spills
    assert all(4 % fc == 0 and 56 % ow == 0 and 4 <= fc * ow and fc * ow + ow + 1 <= 32 for fc, ow in avx512)
    avx2 = register_tiles(8, 8, 28)  # 16 registers
    assert {(4, 2), (2, 4), (1, 7)} <= set(avx2) and (4, 4) not in avx2 and (2, 7) not in avx2


def test_the_blocked_conv_space_reaches_register_tiled_kernels_beside_multi_level_tiling(cnn):
    from tunecore.blocked_conv import register_tiles
    from tunecore.layouts import vector_lanes
    from tunecore.space import DesignSpace
    from tunecore.targets import host_target
    from tunecore.workloads import extract_tasks, load_workload

    target = host_target()
    task = max((t for t in extract_tasks(load_workload(cnn, layout="nchwc"), target) if "conv2d_NCHWc" in t.name
                and "depthwise" not in t.name), key=lambda t: t.flops)  # the 16 -> 32 channel 3x3 conv, 16x16 output
    lanes = vector_lanes(target)
    tiles = register_tiles(lanes, 32 // lanes, 16)
    space = DesignSpace(task, seed=0)
    programs = [space.sample(index).mod.script() for index in range(len(space.sketches))]  # each sketch: valid
    # two loop orders per tile, then MetaSchedule's own sketches (multi-level tiling annotates its blocks and gives
    # several); their order in the space differs between CPUs
    blocked = [text for text in programs if "meta_schedule.tiling_structure" not in text]
    assert tiles and len(blocked) == 2 * len(tiles) and len(programs) > len(blocked)
    # the B input channels of a block unrolled in every register-tiled kernel
    assert all(f"T.unroll(T.int64({lanes}))" in text for text in blocked)
    # in the "tile" order the bias, residual add and relu are applied to the register tile (B lanes wide) as it is
    # stored: the accumulator's write-back is the last block, not a second pass over the output
    last_blocks = [re.findall(r'T\.sblock\("(\w+)"\)', text)[-1] for text in blocked]
    fused = [text for text, last in zip(blocked, last_blocks) if last.endswith("_local")]
    assert "relu" in task.name and len(fused) == len(tiles)
    assert all(f"T.vectorized(T.int64({lanes}))" in text for text in fused)


def test_auto_probes_every_layout_keeps_the_fastest_build_and_compile_follows_it(block, tmp_path):
    from tunecore.layouts import LAYOUTS

    store = str(tmp_path / "s.db")
    run = cli_json(run_cli("run", "--model", block, "--layout", "auto", "--trials", "20", "--search", "random",
                           "--store", store, "--json"))
    choice = run["layout_choice"]
    assert set(choice["probes"]) == set(LAYOUTS) and choice["layout"] in LAYOUTS
    assert all(p["latency_ms"] > 0 and p["tasks_tuned"] == p["tasks"] for p in choice["probes"].values())
    assert choice["probes"][choice["layout"]]["latency_ms"] == min(p["latency_ms"] for p in choice["probes"].values())
    report = cli_json(run_cli("compile", "--model", block, "--store", store, "--json"))
    assert report["layout"] == choice["layout"] and report["outputs_match"]
    assert_one_line_exit_2(run_cli("run", "--model", "op:matmul-64", "--layout", "auto", "--trials", "4",
                                   "--store", "memory:"), "single operator")


# nchw's kernels are the blocked ones' without the blocks (and compute the model in the test below): slow only
@pytest.mark.parametrize("layout", [pytest.param("nchw", marks=pytest.mark.slow), "nchwc"])
def test_winograd_kernels_are_tuned_beside_direct_ones_and_kept_only_where_they_measured_faster(cnn, tmp_path,
                                                                                                layout):
    """In the blocked layout too: there the Winograd kernel reads and writes blocked activations."""
    from tunecore.store.sqlite import SqliteStore
    from tunecore.targets import host_target
    from tunecore.winograd import choose, task_signature
    from tunecore.workloads import extract_tasks, load_workload

    names = _task_names(cnn, layout, "--winograd")
    # the stem and the 16 -> 32 conv are 3x3 stride 1: each has a Winograd kernel beside its direct one
    assert sum("winograd" in name for name in names) == 2 and len(names) == len(_task_names(cnn, layout)) + 2
    store = str(tmp_path / "s.db")
    cli_json(run_cli("run", "--model", cnn, "--layout", layout, "--winograd", "--trials", "48", "--search", "random",
                     "--store", store, "--json"))
    report = cli_json(run_cli("compile", "--model", cnn, "--store", store, "--json"))  # as tuned
    assert report["outputs_match"] and report["reference_relative_error"] < 1e-4 and report["layout"] == layout
    tasks = extract_tasks(load_workload(cnn, layout=layout, winograd=True), host_target())
    opened = SqliteStore(store)
    try:
        # timed cold: inside a network a Winograd kernel's weights (4x the filter's) come from memory
        assert opened.runs()[-1]["info"]["options"]["measurer"] == {"cpu_cache_flush": True, "repeat": 10}
        latency = {t.task_id: opened.best(t.task_id, k=1)[0].latency for t in tasks if opened.best(t.task_id, k=1)}
        assert report["winograd_convs"] == sorted(choose(opened, tasks))
    finally:
        opened.close()
    by_conv: dict = {}
    for task in tasks:
        named = task_signature(task)
        if named:
            by_conv.setdefault(named[0], {})[named[1]] = latency.get(task.task_id)
    assert len(by_conv) == 2
    for signature, side in by_conv.items():  # Winograd kept only where its kernel measured faster than the direct one
        faster = side[True] is not None and (side[False] is None or side[True] < side[False])
        assert (signature in report["winograd_convs"]) == faster
    assert_one_line_exit_2(run_cli("tasks", "--model", "op:matmul-64", "--winograd"), "--winograd", "single operator")


@pytest.mark.parametrize("layout", ["nchw", "nchwc"])
def test_a_network_built_with_every_conv_winograd_can_compute_computes_what_the_model_does(cnn, layout):
    """Whichever convs measure faster by Winograd, its build computes the model: here every one it can (the stem's
    3 -> 16 conv, blocked by 3 in nchwc, and the 16 -> 32), untuned, against the plain untuned build."""
    import numpy as np
    from tvm.s_tir import meta_schedule as ms

    from tunecore.compile import Runnable, build, random_inputs
    from tunecore.winograd import ALL
    from tunecore.workloads import load_workload

    target = host_target()
    plain, winograd = load_workload(cnn), load_workload(cnn, layout=layout, winograd=True)
    winograd.winograd_convs = frozenset({ALL})
    inputs = random_inputs(plain)
    expected, got = (Runnable(build(w, target, ms.database.MemoryDatabase()), w, target, inputs).outputs()[0]
                     for w in (plain, winograd))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def _stage(tensor, name):
    """The stage called ``name`` among those ``tensor`` is computed from."""
    if tensor.op.name == name:
        return tensor
    return next((found for t in tensor.op.input_tensors if (found := _stage(t, name)) is not None), None)


@pytest.mark.parametrize("block", [1, 16])
def test_a_winograd_conv_whose_output_is_no_multiple_of_its_tile_computes_the_conv(block):
    """ResNet's 14x14 and 7x7 convs: the last 6x6 input tiles reach past the input and its padding of 1, and the
    padded input must cover them (TOPI's stops at the padding: it read two rows and columns past its buffer)."""
    import numpy as np
    import tvm
    from tvm import te

    from tunecore.winograd import ALPHA, TILE, conv2d, filter_transform

    channels, size = 32, 14
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, channels, size, size)).astype("float32")
    w = rng.uniform(-0.1, 0.1, (channels, channels, 3, 3)).astype("float32")
    kernel = te.placeholder(w.shape, name="kernel")
    transform = filter_transform(kernel)
    packed_value = tvm.runtime.tensor(np.zeros([int(d) for d in transform.shape], "float32"))
    tvm.tirx.build(te.create_prim_func([kernel, transform]), target="llvm")(tvm.runtime.tensor(w), packed_value)

    def blocked(a):
        return a.reshape(1, channels // block, block, size, size).transpose(0, 1, 3, 4, 2) if block > 1 else a

    data = te.placeholder(blocked(x).shape, name="data")
    packed = te.placeholder(transform.shape, name="packed")
    out = conv2d(data, packed, (1, 1, 1, 1), "float32", block)
    data_pad, input_tile = _stage(out, "data_pad"), _stage(out, "input_tile")
    tiles = (size + TILE - 1) // TILE
    assert [int(d) for d in data_pad.shape[2:]] == [(tiles - 1) * TILE + ALPHA] * 2 and input_tile is not None
    got = tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], "float32"))
    tvm.tirx.build(te.create_prim_func([data, packed, out]), target="llvm")(
        tvm.runtime.tensor(np.ascontiguousarray(blocked(x))), packed_value, got)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    expected = sum(np.einsum("oc,nchw->nohw", w[:, :, i, j], padded[:, :, i:i + size, j:j + size])
                   for i in range(3) for j in range(3))
    np.testing.assert_allclose(got.numpy(), blocked(expected), rtol=1e-4, atol=1e-4)
