import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def target():
    from tunecore.targets import host_target

    return host_target()


@pytest.fixture(scope="session")
def matmul_task():
    from tunecore.testing import tiny_task

    return tiny_task()


def run_cli(*args, cwd=None, env=None, timeout=600):
    """Run the real `tunecore` command in a subprocess; returns CompletedProcess."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "tunecore.cli", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def assert_one_line_exit_2(result, *fragments):
    """What a user's mistake must give: exit code 2 and one line on stderr naming the problem."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tunecore: error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.stderr


def cli_json(result):
    """The JSON a successful command printed."""
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def write_tiny_onnx(path, size=64):
    """A conv + relu + reshape + matmul ONNX model with a dynamic batch dimension (3 tasks), input size x size."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

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
    graph = helper.make_graph(nodes, "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
