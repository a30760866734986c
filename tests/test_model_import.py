"""Real models in: ONNX files whose shapes are computed in the graph, --input-shape, PyTorch factories, and the
corpus of real architectures (tunecore/workloads/corpus.py; the whole corpus tuned and compiled is `-m slow`)."""

import os
import textwrap

import numpy as np
import pytest

from tunecore.errors import UsageError
from tunecore.testing.cli import assert_one_line_exit_2, run_cli
from tunecore.testing.cli import cli_json as _json


def _channel_shuffle_onnx(path, batch="N", height=6):
    """A 1x1 conv, a channel shuffle and a flatten, with every shape computed from Shape ops the way torch's
    exporter writes ``x.view(b, g, c // g, h, w).transpose(1, 2).view(b, -1, h, w)`` then ``x.view(b, -1)``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def const(name, values):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64)))

    def dim(shape, axis):
        return [const(f"{shape}_i{axis}", axis), helper.make_node("Gather", [shape, f"{shape}_i{axis}"],
                                                                  [f"{shape}_d{axis}"]),
                helper.make_node("Unsqueeze", [f"{shape}_d{axis}", "axis0"], [f"{shape}_u{axis}"])]

    weight = numpy_helper.from_array(np.random.default_rng(0).uniform(-1, 1, (8, 8, 1, 1)).astype(np.float32), "w")
    nodes = [
        const("axis0", [0]), const("groups", 2), const("groups1", [2]), const("minus1", [-1]),
        helper.make_node("Conv", ["x", "w"], ["y"]),
        helper.make_node("Shape", ["y"], ["s"]),
        *dim("s", 0), *dim("s", 1), *dim("s", 2), *dim("s", 3),
        helper.make_node("Div", ["s_d1", "groups"], ["per_group"]),
        helper.make_node("Unsqueeze", ["per_group", "axis0"], ["per_group1"]),
        helper.make_node("Concat", ["s_u0", "groups1", "per_group1", "s_u2", "s_u3"], ["shape5"], axis=0),
        helper.make_node("Reshape", ["y", "shape5"], ["grouped"]),
        helper.make_node("Transpose", ["grouped"], ["swapped"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Concat", ["s_u0", "minus1", "s_u2", "s_u3"], ["shape4"], axis=0),
        helper.make_node("Reshape", ["swapped", "shape4"], ["shuffled"]),
        helper.make_node("Shape", ["shuffled"], ["t"]),  # reads a Reshape whose shape was computed
        *dim("t", 0),
        helper.make_node("Concat", ["t_u0", "minus1"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["shuffled", "flat_shape"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes, "channel_shuffle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8, height, 6])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [batch, "features"])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return str(path)


def _exported_shuffle_unit(path):
    """A ShuffleNetV2 unit exported by torch's TorchScript exporter: channel shuffle, chunk, concat, shuffle;
    every view and split is a Shape → Gather → Div → Concat chain in the file."""
    torch = pytest.importorskip("torch")

    class Unit(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.branch = torch.nn.Conv2d(8, 8, 1), torch.nn.Conv2d(4, 4, 3, padding=1)

        @staticmethod
        def shuffle(x):
            b, c, h, w = x.shape
            return x.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous().view(b, -1, h, w)

        def forward(self, x):
            keep, work = self.shuffle(self.stem(x)).chunk(2, dim=1)
            return self.shuffle(torch.cat((keep, self.branch(work).relu()), dim=1))

    from tunecore.workloads.corpus import export_onnx

    torch.manual_seed(0)
    export_onnx(Unit().eval(), (torch.randn(1, 8, 6, 6),), ("x",), ({0: "batch"},), str(path))
    return str(path)


def test_tvms_frontend_alone_cannot_import_a_channel_shuffle_exported_by_torch(tmp_path):
    """Why the folding exists: the pinned TVM's frontend makes the second shuffle's Shape read a Relax shape."""
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    path = _exported_shuffle_unit(tmp_path / "unit.onnx")
    with pytest.raises(Exception, match="shape_of expects a tensor"):
        from_onnx(onnx.load(path), shape_dict={"x": [1, 8, 6, 6]}, keep_params_in_input=False)


def test_a_channel_shuffle_exported_by_torch_imports_and_compiles_matching_onnxruntime(tmp_path, target):
    pytest.importorskip("onnxruntime")
    from tunecore.compile import compile_and_check
    from tunecore.store.sqlite import MemoryStore
    from tunecore.workloads import extract_tasks, load_workload

    workload = load_workload(_exported_shuffle_unit(tmp_path / "unit.onnx"))
    assert [list(p.ty.shape) for p in workload.mod["main"].params] == [[1, 8, 6, 6]]  # batch bound to 1
    assert any(t.kernel_class.startswith("conv2d") for t in extract_tasks(workload, target))
    report = compile_and_check(workload, target, MemoryStore(), repeat=1, min_repeat_ms=1)
    assert report["outputs_match"] and report["reference"] == "onnxruntime"
    assert report["reference_relative_error"] < 1e-5


def test_a_hand_written_shape_chain_folds_to_constants(tmp_path):
    """The file's flatten reads the shape of a Reshape to a computed shape: folding repeats until it is known."""
    import onnx

    from tunecore.workloads.onnx_import import fold_static_shapes

    folded = fold_static_shapes(onnx.load(_channel_shuffle_onnx(tmp_path / "shuffle.onnx")), {"x": [1, 8, 6, 6]})
    assert [n.op_type for n in folded.graph.node] == ["Conv", "Reshape", "Transpose", "Reshape", "Reshape"]
    shapes = {init.name: list(onnx.numpy_helper.to_array(init)) for init in folded.graph.initializer
              if init.name != "w"}
    assert sorted(shapes.values()) == [[1, -1], [1, -1, 6, 6], [1, 2, 4, 6, 6]]


def test_input_shape_binds_a_symbolic_dimension_and_changes_the_tasks(tmp_path):
    path = _channel_shuffle_onnx(tmp_path / "shuffle.onnx", height="H")
    missing = run_cli("tasks", "--model", path)
    assert_one_line_exit_2(missing, "input 'x'", "'H'", "--input-shape x=1x8x128x6")
    tall = _json(run_cli("tasks", "--model", path, "--input-shape", "x=2x8x12x6", "--json"))
    short = _json(run_cli("tasks", "--model", path, "--input-shape", "x=2x8x6x6", "--json"))
    conv = [[t["flops"] for t in out["tasks"] if t["kernel_class"].startswith("conv2d")][0] for out in (tall, short)]
    assert conv[0] == 2 * conv[1] > 0


@pytest.mark.parametrize("value, fragments", [
    ("y=1x8x6x6", ["no input 'y'", "inputs: x"]),
    ("x=1x8x6", ["rank 4", "not 3"]),
    ("x=1x9x6x6", ["dimension 1", "fixed at 8"]),
    ("x=1x8xHx6", ["expected NAME=DIMS"]),
])
def test_a_wrong_input_shape_is_one_line_and_exit_2(tmp_path, value, fragments):
    path = _channel_shuffle_onnx(tmp_path / "shuffle.onnx")
    assert_one_line_exit_2(run_cli("tasks", "--model", path, "--input-shape", value), "--input-shape", *fragments)


def test_input_shape_on_a_model_with_fixed_shapes_is_refused():
    assert_one_line_exit_2(run_cli("tasks", "--model", "zoo:bert-tiny", "--input-shape", "x=1x2"),
                           "applies to ONNX files and PyTorch modules")


def test_ops_tvm_cannot_convert_are_named_in_one_line(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Celu", ["x"], ["y"]), helper.make_node("Relu", ["y"], ["z"]),
         helper.make_node("Det", ["z"], ["out"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])])
    path = str(tmp_path / "celu.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert_one_line_exit_2(run_cli("tasks", "--model", path), "no converter for Celu, Det")


_FACTORY = textwrap.dedent("""
    import torch

    class Shuffle(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x):
            x = self.conv(x)
            b, c, h, w = x.shape
            return x.view(b, 2, c // 2, h, w).transpose(1, 2).reshape(b, -1).relu()

    def make():
        torch.manual_seed(0)
        return Shuffle(), (torch.randn(1, 8, 10, 10),)

    def not_a_pair():
        return Shuffle()
""")


@pytest.fixture
def factory_file(tmp_path):
    pytest.importorskip("torch")
    path = tmp_path / "shuffle_net.py"
    path.write_text(_FACTORY)
    return str(path)


def test_a_pytorch_factory_imports_tunes_and_compiles_against_torch(factory_file, tmp_path):
    store = str(tmp_path / "t.db")
    tasks = _json(run_cli("tasks", "--model", f"{factory_file}:make", "--json"))["tasks"]
    assert any(t["kernel_class"].startswith("conv2d") for t in tasks)
    run = _json(run_cli("run", "--model", f"{factory_file}:make", "--trials", "4", "--store", store, "--json"))
    assert run["trials_measured"] == 4
    report = _json(run_cli("compile", "--model", f"{factory_file}:make", "--store", store, "--json"))
    assert report["outputs_match"] and report["reference"] == "torch" and report["reference_relative_error"] < 1e-5
    assert report["tasks_tuned"] >= 1
    wider = _json(run_cli("tasks", "--model", f"{factory_file}:make", "--input-shape", "x=1x8x20x10", "--json"))
    assert sum(t["flops"] for t in wider["tasks"]) == pytest.approx(2 * sum(t["flops"] for t in tasks), rel=0.01)


@pytest.mark.parametrize("suffix, args, fragments", [
    ("", [], ["name the function"]),
    (":nosuch", [], ["no function 'nosuch'", "make"]),
    (":not_a_pair", [], ["must return (nn.Module, example inputs)"]),
    (":make", ["--input-shape", "y=1x2"], ["no input 'y'", "inputs: x"]),
    (":make", ["--input-shape", "x=1x2"], ["rank 4", "not 2"]),
])
def test_a_bad_pytorch_factory_is_one_line_and_exit_2(factory_file, suffix, args, fragments):
    assert_one_line_exit_2(run_cli("tasks", "--model", factory_file + suffix, *args), *fragments)


def test_the_core_does_not_import_torch():
    """torch is the factories' extra: the CLI, the API and the workloads package load without it. (TVM's own
    ONNX frontend imports torch when it is installed; that is TVM's import, made only for ONNX files.)"""
    import subprocess
    import sys

    code = ("import sys; import tunecore.cli, tunecore.api, tunecore.workloads, tunecore.compile; "
            "from tunecore.cli import main; assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# the corpus ------------------------------------------------------------------------------------------------


def _corpus():
    pytest.importorskip("transformers")
    pytest.importorskip("onnxruntime")
    from tunecore.workloads import corpus

    return corpus


@pytest.mark.parametrize("name", ["shufflenet-v2", "gpt2"])
def test_corpus_models_that_need_folding_or_a_factory_import(name, tmp_path, target, monkeypatch):
    """Fast subset: shufflenet-v2's shuffles and flatten fail in TVM's frontend without folding; GPT-2 cannot
    be exported by torch's TorchScript exporter and comes in as a PyTorch factory. Both by their ``corpus:``
    name, which is what a dataset's tasks record, whatever the machine."""
    _corpus()
    from tunecore.workloads import extract_tasks, load_workload

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    workload = load_workload(f"corpus:{name}")
    assert workload.name == f"corpus:{name}" and workload.reference is not None
    tasks = extract_tasks(workload, target)
    assert len(tasks) > 10 and sum(t.flops * t.weight for t in tasks) > 1e8
    assert {t.model for t in tasks} == {f"corpus:{name}"}
    if name == "shufflenet-v2":  # exported once: only its batch axis is symbolic, so the module is not built again
        import dataclasses

        import torch

        corpus = _corpus()
        monkeypatch.setitem(corpus.BY_NAME, name, dataclasses.replace(corpus.BY_NAME[name], build=None))
        directory = str(tmp_path / "tunecore" / "corpus" / f"torch-{torch.__version__}")
        assert corpus.model_spec(name, directory) == (os.path.join(directory, f"{name}.onnx"), [])


def test_an_unknown_corpus_model_is_one_line():
    _corpus()
    from tunecore.workloads import load_workload

    with pytest.raises(UsageError, match="unknown corpus model 'resnet-9'; known: bert, "):
        load_workload("corpus:resnet-9")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "distilbert", "gpt2", "t5-encoder", "vit", "swin", "convnext", "resnext",
                                  "shufflenet-v2", "mobilenet-v1", "squeezenet", "googlenet"])
def test_every_corpus_model_imports_tunes_and_compiles_matching_its_framework(name, tmp_path):
    corpus = _corpus()
    assert name in corpus.BY_NAME
    spec, shapes = corpus.model_spec(name, str(tmp_path))
    model_args = ["--model", spec, *[a for s in shapes for a in ("--input-shape", s)]]
    store = str(tmp_path / "t.db")
    assert _json(run_cli("tasks", *model_args, "--json"))["tasks"]
    run = _json(run_cli("run", *model_args, "--trials", "32", "--search", "ansor", "--cost-model", "xgb",
                        "--store", store, "--json"))
    assert run["trials_measured"] == 32 and run["errors"] < 32
    report = _json(run_cli("compile", *model_args, "--store", store, "--json"))
    assert report["outputs_match"], report
    assert report["reference"] == ("torch" if spec.endswith(".py:" + name.replace("-", "_")) else "onnxruntime")
    assert report["tasks_tuned"] >= 1 and os.path.exists(store)
