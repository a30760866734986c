"""Conv layouts (tunecore.layouts): every layout path computes what the model computes (values, not timings)."""

import pytest

from tunecore.testing.cli import assert_one_line_exit_2, cli_json, run_cli
from tunecore.testing.helpers import write_small_cnn_onnx


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    path = tmp_path_factory.mktemp("layouts") / "cnn.onnx"
    write_small_cnn_onnx(str(path))
    return str(path)


def _task_names(cnn, layout):
    return [t["name"] for t in cli_json(run_cli("tasks", "--model", cnn, "--layout", layout, "--json"))["tasks"]]


def test_the_blocked_layout_gives_blocked_conv_tasks_and_no_weight_transforms(cnn):
    plain, blocked = _task_names(cnn, "nchw"), _task_names(cnn, "nchwc")
    assert not any("NCHWc" in name for name in plain)
    # the 16- and 32-channel convs are blocked; the stem (3 channels) and the depthwise conv stay NCHW
    assert sum("conv2d_NCHWc" in name for name in blocked) == 2
    assert sum("conv2d" in name and "NCHWc" not in name for name in blocked) == 2
    # weights are transformed once at compile time: no task transforms a weight; activations are transformed
    # into the blocked layout after the stem and out of it before the depthwise conv
    assert sum("layout_transform" in name for name in blocked) == 2
    assert any("transpose" in name for name in _task_names(cnn, "nhwc"))


@pytest.mark.parametrize("layout", ["nchwc", "nhwc"])
def test_a_network_tuned_and_compiled_in_a_layout_computes_what_onnxruntime_computes(cnn, tmp_path, layout):
    store = str(tmp_path / "s.db")
    run = cli_json(run_cli("run", "--model", cnn, "--layout", layout, "--trials", "12", "--search", "random",
                           "--store", store, "--json"))
    assert run["trials_measured"] == 12
    report = cli_json(run_cli("compile", "--model", cnn, "--layout", layout, "--store", store, "--json"))
    assert report["layout"] == layout and report["tasks_tuned"] > 0
    assert report["outputs_match"] and report["reference"] == "onnxruntime"
    assert report["reference_relative_error"] < 1e-4


def test_bad_layouts_are_one_line_errors(cnn):
    assert_one_line_exit_2(run_cli("tasks", "--model", cnn, "--layout", "nchw8c"), "--layout nchw8c", "nchwc")
    assert_one_line_exit_2(run_cli("tasks", "--model", cnn, "--layout", "nchwc", "--target", "cuda"),
                           "--layout nchwc", "cuda")
    assert_one_line_exit_2(run_cli("tasks", "--model", "op:matmul-64", "--layout", "nhwc"), "single operator")
