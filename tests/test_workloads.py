import pytest

from tunecore.errors import UsageError
from tunecore.workloads import extract_tasks, has_kernel, kernel_class_of, load_workload
from tunecore.workloads.ops import op_names
from tunecore.workloads.zoo import ZOO_NAMES

# (tasks, kernel calls per inference = sum of weights, GFLOP) with batch-norm folded into the convolutions,
# as deployed models are; GFLOP counts the polynomials of fast erf/exp (bert-tiny's softmax and GELU: 0.12 -> 0.125)
ZOO_EXPECTED = {
    "resnet-18": (22, 24, 3.64), "resnet-50": (32, 57, 8.21), "mobilenet-v2": (33, 55, 0.62),
    "bert-base": (14, 184, 22.4), "bert-tiny": (14, 34, 0.125), "dcgan": (5, 5, 0.857), "resnet3d-18": (21, 23, 81.4),
}


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_models_give_their_tasks(name, target):
    tasks = extract_tasks(load_workload(f"zoo:{name}"), target)
    count, calls, gflop = ZOO_EXPECTED[name]
    assert len(tasks) == count and sum(t.weight for t in tasks) == calls
    assert sum(t.flops * t.weight for t in tasks) / 1e9 == pytest.approx(gflop, rel=0.01)
    assert len({t.task_id for t in tasks}) == count
    assert all(t.model == f"zoo:{name}" and t.weight >= 1 for t in tasks)  # every task occurs


def test_task_identity_is_stable_across_extractions(target):
    a = extract_tasks(load_workload("zoo:resnet-18"), target)
    b = extract_tasks(load_workload("zoo:resnet-18"), target)
    assert [t.task_id for t in a] == [t.task_id for t in b]


def test_same_kernel_in_two_models_has_one_id(target):
    r18 = {t.workload_hash: t.task_id for t in extract_tasks(load_workload("zoo:resnet-18"), target)}
    r50 = {t.workload_hash: t.task_id for t in extract_tasks(load_workload("zoo:resnet-50"), target)}
    shared = set(r18) & set(r50)
    assert shared and all(r18[h] == r50[h] for h in shared)


@pytest.mark.parametrize("name", op_names())
def test_every_listed_op_builds_a_task(name, target):
    (task,) = extract_tasks(load_workload(f"op:{name}"), target)
    assert task.flops > 0 and task.args and task.kernel_class


def test_kernel_class_strips_uniquifying_suffixes(target):
    mod = load_workload("op:c2d-0").mod
    assert kernel_class_of(mod, "fused_conv2d1_add1_add2_relu1") == "conv2d_add_add_relu@4d"
    assert kernel_class_of(mod, "fused_conv3d_add_relu") == "conv3d_add_relu@4d"
    assert kernel_class_of(mod, "fused_matmul3_add4_gelu") == "matmul_add_gelu@4d"


def test_kernels_are_chosen_by_operator_name_in_any_case(target):
    """``--kernels conv`` takes a single operator whose class comes from its compute blocks (Conv2dOutput)."""
    (task,) = extract_tasks(load_workload("op:cbr-0"), target)
    assert task.kernel_class.startswith("Conv2dOutput")
    assert has_kernel(task.kernel_class, ["conv"]) and has_kernel("matmul_add@3d", ["dense", "MatMul"])
    assert not has_kernel(task.kernel_class, ["dense", "matmul"])


@pytest.mark.parametrize("spec", ["zoo:nosuch", "op:nosuch", "op:matmul-0", "nofile.onnx"])
def test_unknown_workloads_are_usage_errors(spec):
    with pytest.raises(UsageError):
        load_workload(spec)
