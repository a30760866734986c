import os

from tunecore.testing.fixtures import matmul_task, target  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
