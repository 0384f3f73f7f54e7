"""Every gradient rule against torch autograd on the same one-op graph, plus finite-difference property
tests over conv geometries and broadcasting."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))  # the shared helpers next to this file (importlib mode)
from autodiff_reference import initializers, relative_error, run_training_graph, torch_reference_gradients
from fedzoo.errors import InvalidInputError
from fedzoo.graphs import depthwise_lowering, small_plane_conv_lowering
from fedzoo.graphs.autodiff import build_training_graph, nameable_parameters
from fedzoo.graphs.gradient_rules import GRADIENT_RULES, MissingGradientRuleError

torch.set_num_threads(1)
ZOO_OPS = {"Conv", "Gemm", "MatMul", "Add", "Relu", "Clip", "HardSwish", "HardSigmoid", "GlobalAveragePool", "Flatten",
           "Reshape", "Identity"}  # fmt: skip


def make_model(nodes, x_shape, params: dict[str, np.ndarray], output="out", constants=()) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(value.astype(np.float32), name) for name, value in params.items()]
    inits += [numpy_helper.from_array(np.asarray(value), name) for name, value in constants]
    graph = helper.make_graph(
        nodes, "case", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", *x_shape[1:]])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def node(op, inputs, output, **attributes):
    return helper.make_node(op, inputs, [output], **attributes)


rng = np.random.default_rng(0)


def randn(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def scaled(op_nodes, channels=3):
    """input * s (a per-channel parameter) feeding `op_nodes`: so the op's own rule carries s's gradient."""
    return [node("Mul", ["input", "s"], "h"), *op_nodes], {"s": randn(1, channels, 1, 1, scale=2.0)}


def _conv_case(x_shape, weight_shape, with_scale=True, **attributes):
    params = {"w": randn(*weight_shape), "b": randn(weight_shape[0])}
    nodes = [node("Conv", ["h" if with_scale else "input", "w", "b"], "out", **attributes)]
    if with_scale:
        nodes, scale = scaled(nodes, x_shape[1])
        params.update(scale)
    return make_model(nodes, x_shape, params), x_shape


def _gemm_case(trans_a, trans_b, alpha, beta, bias_shape):
    a = randn(4, 3) if trans_a else randn(3, 4)
    b = randn(5, 4) if trans_b else randn(4, 5)
    attributes = dict(transA=trans_a, transB=trans_b, alpha=alpha, beta=beta)
    nodes = [node("Gemm", ["a", "b", "c"], "g", **attributes), node("Add", ["g", "input"], "out")]
    return make_model(nodes, (3, 5), {"a": a, "b": b, "c": randn(*bias_shape)}), (3, 5)


def _activation_case(op_nodes, constants=(), x_scale=4.0):
    nodes, params = scaled(op_nodes)
    return make_model(nodes, (4, 3, 5, 5), params, constants=constants), (4, 3, 5, 5), x_scale


def const(name, value, dtype=np.float32):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dtype), name))


def _case(op_nodes, x_shape=(4, 3, 5, 5), extra=None, constants=()):
    """`input * s` (a per-channel parameter) feeding `op_nodes`, which read it as "h"."""
    nodes, params = scaled(op_nodes, x_shape[1])
    if x_shape[1:] != (3, 5, 5):
        params["s"] = randn(1, x_shape[1], *[1] * (len(x_shape) - 2), scale=2.0)
    params.update(extra or {})
    return make_model(nodes, x_shape, params, constants=constants), x_shape


def _gelu_erf():
    return [const("root2", np.sqrt(2.0)), const("one", 1.0), const("half", 0.5), node("Div", ["h", "root2"], "a"),
            node("Erf", ["a"], "e"), node("Add", ["e", "one"], "b"), node("Mul", ["h", "b"], "c"),
            node("Mul", ["c", "half"], "out")]  # fmt: skip


def _gelu_tanh():
    return [const("three", 3.0), const("k", 0.044715), const("c", np.sqrt(2 / np.pi)), const("one", 1.0),
            const("half", 0.5), node("Pow", ["h", "three"], "cube"), node("Mul", ["cube", "k"], "kc"),
            node("Add", ["h", "kc"], "inner"), node("Mul", ["inner", "c"], "scaled"), node("Tanh", ["scaled"], "t"),
            node("Add", ["t", "one"], "t1"), node("Mul", ["h", "t1"], "p"), node("Mul", ["p", "half"], "out")]  # fmt: skip


TORCH_RESIZE = dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
BIG = np.iinfo(np.int64).max


CASES = {
    "conv": lambda: _conv_case((2, 3, 7, 7), (4, 3, 3, 3), pads=[1, 1, 1, 1]),
    "conv_strided_dilated_asymmetric": lambda: _conv_case(
        (2, 3, 9, 8), (4, 3, 3, 2), strides=[2, 3], dilations=[2, 1], pads=[0, 1, 2, 0]
    ),
    "conv_depthwise_strided": lambda: _conv_case((2, 6, 9, 9), (6, 1, 3, 3), group=6, strides=[2, 2], pads=[1, 1, 1, 1]),
    "conv_depthwise_5x5": lambda: _conv_case((2, 4, 8, 8), (4, 1, 5, 5), group=4, pads=[2, 2, 2, 2]),
    "conv_depthwise_dilated_large_plane_stays_conv": lambda: _conv_case(
        (2, 3, 15, 14), (3, 1, 3, 2), group=3, strides=[1, 2], dilations=[2, 1], pads=[1, 0, 2, 1]
    ),
    "conv_grouped": lambda: _conv_case((2, 4, 6, 6), (6, 2, 3, 3), group=2, pads=[1, 0, 1, 0]),
    "conv_strided_dilated_asymmetric_large_plane": lambda: _conv_case(
        (2, 3, 17, 16), (4, 3, 3, 2), strides=[2, 3], dilations=[2, 1], pads=[0, 1, 2, 0]
    ),
    "conv_pointwise": lambda: _conv_case((3, 5, 6, 6), (7, 5, 1, 1)),
    "conv_pointwise_strided_small_plane": lambda: _conv_case((3, 5, 4, 4), (7, 5, 1, 1), strides=[2, 2]),
    "conv_first_layer_no_input_gradient": lambda: _conv_case((2, 1, 8, 8), (4, 1, 3, 3), with_scale=False, strides=[2, 2]),
    "gemm": lambda: _gemm_case(0, 0, 1.0, 1.0, (5,)),
    "gemm_transB_alpha_beta": lambda: _gemm_case(0, 1, 0.5, 2.0, (1, 5)),
    "gemm_transA": lambda: _gemm_case(1, 0, 1.5, 1.0, (3, 5)),
    "gemm_transA_transB": lambda: _gemm_case(1, 1, 1.0, 0.5, (3, 1)),
    "matmul_broadcast_weight": lambda: (
        make_model([node("MatMul", ["input", "w"], "out")], (2, 3, 4, 6), {"w": randn(6, 5)}), (2, 3, 4, 6)),
    "matmul_weight_first": lambda: (
        make_model([node("MatMul", ["w", "input"], "out")], (2, 4, 6), {"w": randn(3, 4)}), (2, 4, 6)),
    "add_broadcast": lambda: (
        make_model([node("Add", ["input", "b"], "out")], (2, 3, 4, 4), {"b": randn(3, 1, 1)}), (2, 3, 4, 4)),
    "add_both_sides_residual": lambda: (
        make_model([node("Mul", ["input", "s"], "h"), node("Add", ["h", "input"], "r"), node("Add", ["r", "h"], "out")],
                   (2, 3, 4, 4), {"s": randn(1, 3, 1, 1)}), (2, 3, 4, 4)),
    "sub_broadcast": lambda: (
        make_model([node("Sub", ["b", "input"], "out")], (2, 3, 4), {"b": randn(1, 4)}), (2, 3, 4)),
    "mul_broadcast": lambda: (
        make_model([node("Mul", ["input", "s"], "h"), node("Mul", ["h", "t"], "out")], (2, 3, 4),
                   {"s": randn(3, 1), "t": randn(4)}), (2, 3, 4)),
    "relu": lambda: _activation_case([node("Relu", ["h"], "out")])[:2],
    "clip_relu6_constants": lambda: _activation_case(
        [node("Constant", [], "lo", value=numpy_helper.from_array(np.float32(0.0))),
         node("Constant", [], "hi", value=numpy_helper.from_array(np.float32(6.0))),
         node("Clip", ["h", "lo", "hi"], "out")])[:2],
    "clip_min_only_initializer": lambda: _activation_case(
        [node("Clip", ["h", "lo"], "out")], constants=[("lo", np.float32(-1.0))])[:2],
    "hard_sigmoid_default": lambda: _activation_case([node("HardSigmoid", ["h"], "out")])[:2],
    "hard_sigmoid_torch": lambda: _activation_case([node("HardSigmoid", ["h"], "out", alpha=1 / 6)])[:2],
    "hard_swish": lambda: _activation_case([node("HardSwish", ["h"], "out")])[:2],
    "global_average_pool_flatten": lambda: (
        make_model([node("Mul", ["input", "s"], "h"), node("GlobalAveragePool", ["h"], "p"),
                    node("Flatten", ["p"], "out", axis=1)], (2, 3, 5, 4), {"s": randn(1, 3, 1, 1)}), (2, 3, 5, 4)),
    "squeeze": lambda: (
        make_model([node("Mul", ["input", "s"], "h"), node("GlobalAveragePool", ["h"], "p"),
                    node("Squeeze", ["p", "axes"], "out")], (2, 3, 4, 4), {"s": randn(1, 3, 1, 1)},
                   constants=[("axes", np.array([2, 3], np.int64))]), (2, 3, 4, 4)),
    "unsqueeze": lambda: (
        make_model([node("Mul", ["input", "s"], "h"), node("Unsqueeze", ["h", "axes"], "out")], (2, 3, 4),
                   {"s": randn(3, 1)}, constants=[("axes", np.array([1, -1], np.int64))]), (2, 3, 4)),
    "transpose": lambda: (
        make_model([node("Mul", ["input", "s"], "h"), node("Transpose", ["h"], "out", perm=[0, 2, 3, 1])],
                   (2, 3, 4, 5), {"s": randn(1, 3, 1, 1)}), (2, 3, 4, 5)),
    "reshape_identity": lambda: (
        make_model([node("Mul", ["input", "s"], "h"), node("Reshape", ["h", "shape"], "r"), node("Identity", ["r"], "out")],
                   (2, 3, 4, 4), {"s": randn(1, 3, 1, 1)}, constants=[("shape", np.array([0, -1, 8], np.int64))]),
        (2, 3, 4, 4)),
    "sigmoid": lambda: _case([node("Sigmoid", ["h"], "out")]),
    "prelu_per_channel_slope": lambda: _case([node("PRelu", ["h", "slope"], "out")], extra={"slope": randn(3, 1, 1)}),
    "sum_three_broadcast": lambda: _case([node("Sum", ["h", "t", "input"], "out")], extra={"t": randn(5)}),
    "tanh": lambda: _case([node("Tanh", ["h"], "out")]),
    "leaky_relu": lambda: _case([node("LeakyRelu", ["h"], "out", alpha=0.1)]),
    "elu": lambda: _case([node("Elu", ["h"], "out", alpha=0.7)]),
    "selu": lambda: _case([node("Selu", ["h"], "out")]),
    "softplus": lambda: _case([node("Softplus", ["h"], "out")]),
    "silu": lambda: _case([node("Sigmoid", ["h"], "g"), node("Mul", ["h", "g"], "out")]),
    "gelu_erf": lambda: _case(_gelu_erf()),
    "gelu_tanh_pow": lambda: _case(_gelu_tanh()),
    "abs_sqrt_log_neg_exp": lambda: _case(
        [const("one", 1.0), node("Abs", ["h"], "a"), node("Add", ["a", "one"], "b"), node("Sqrt", ["b"], "c"),
         node("Log", ["c"], "d"), node("Neg", ["d"], "e"), node("Exp", ["e"], "out")]),
    "div_both_sides_broadcast": lambda: _case(
        [node("Div", ["h", "d"], "q"), node("Abs", ["q"], "a"), node("Add", ["a", "d"], "b"), node("Div", ["t", "b"], "out")],
        extra={"d": np.abs(randn(1, 3, 1, 1)) + 1.0, "t": randn(5)}),
    "softmax_inner": lambda: _case([node("Softmax", ["h"], "out", axis=1)]),
    "log_softmax_last_axis": lambda: _case([node("LogSoftmax", ["h"], "out", axis=-1)]),
    "dropout_inference": lambda: _case([node("Dropout", ["h"], "out")]),
    "expand": lambda: _case(
        [const("shape", [3, 5, 5], np.int64), node("Expand", ["e", "shape"], "big"), node("Add", ["h", "big"], "out")],
        extra={"e": randn(3, 1, 5)}),
    "reduce_sum_keepdims_0": lambda: _case(
        [const("axes", [1, 3], np.int64), node("ReduceSum", ["h", "axes"], "out", keepdims=0)]),
    "reduce_mean_axes_attribute": lambda: _case([node("ReduceMean", ["h"], "out", axes=[2, 3])]),
    # A per-channel s alone cancels out of a norm over the last axes: adding t keeps dx visible.
    "layer_norm_last_axis": lambda: _case(
        [node("Add", ["h", "t"], "u"), node("LayerNormalization", ["u", "gamma", "beta"], "out", axis=-1, epsilon=1e-3)],
        extra={"gamma": randn(5), "beta": randn(5), "t": randn(5)}),
    "layer_norm_two_axes_no_bias": lambda: _case(
        [node("Add", ["h", "t"], "u"), node("LayerNormalization", ["u", "gamma"], "out", axis=2)],
        extra={"gamma": randn(5, 5), "t": randn(5, 5)}),
    "batch_norm_inference": lambda: _case(
        [node("BatchNormalization", ["h", "scale", "bias", "mean", "var"], "out", epsilon=1e-3)],
        extra={"scale": randn(3), "bias": randn(3), "mean": randn(3), "var": np.abs(randn(3)) + 0.5}),
    "matmul_batched_both_operands": lambda: _case(
        [node("Transpose", ["h"], "t", perm=[0, 1, 3, 2]), node("MatMul", ["h", "t"], "out")]),
    "concat_two_branches": lambda: _case(
        [node("Mul", ["input", "t"], "u"), node("Concat", ["h", "u", "h"], "out", axis=1)], extra={"t": randn(1, 3, 1, 5)}),
    "split_with_sizes_reordered": lambda: _case(
        [const("sizes", [1, 2], np.int64), helper.make_node("Split", ["h", "sizes"], ["a", "b"], axis=1),
         node("Concat", ["b", "a"], "out", axis=1)]),
    "split_equal_one_output_unused": lambda: _case(
        [helper.make_node("Split", ["h"], ["a", "b", "c"], axis=1), node("Add", ["a", "c"], "out")]),
    "slice_contiguous": lambda: _case(
        [const("starts", [1, 0], np.int64), const("ends", [3, -1], np.int64), const("axes", [1, 3], np.int64),
         node("Slice", ["h", "starts", "ends", "axes"], "out")]),
    "slice_steps_negative": lambda: _case(
        [const("starts", [0, -1], np.int64), const("ends", [BIG, -BIG], np.int64), const("axes", [2, 3], np.int64),
         const("steps", [2, -2], np.int64), node("Slice", ["h", "starts", "ends", "axes", "steps"], "out")]),
    "gather_matrix_indices": lambda: _case(
        [const("idx", [[0, 2], [2, 2]], np.int64), node("Gather", ["h", "idx"], "out", axis=1)]),
    "gather_scalar_negative_index_last_axis": lambda: _case(
        [const("idx", -2, np.int64), node("Gather", ["h", "idx"], "out", axis=-1)]),
    "pad_constant_value": lambda: _case(
        [const("pads", [0, 0, 1, 2, 0, 0, 2, 1], np.int64), const("value", 0.5),
         node("Pad", ["h", "pads", "value"], "out", mode="constant")]),
    "pad_reflect": lambda: _case(
        [const("pads", [0, 0, 2, 1, 0, 0, 1, 3], np.int64), node("Pad", ["h", "pads"], "out", mode="reflect")]),
    "pad_edge": lambda: _case(
        [const("pads", [0, 0, 3, 0, 0, 0, 1, 2], np.int64), node("Pad", ["h", "pads"], "out", mode="edge")]),
    "resize_nearest_scales": lambda: _case(
        [const("scales", [1.0, 1.0, 2.0, 1.5]), node("Resize", ["h", "", "scales"], "out", **TORCH_RESIZE)]),
    "resize_nearest_sizes": lambda: _case(
        [const("sizes", [4, 3, 10, 15], np.int64), node("Resize", ["h", "", "", "sizes"], "out", **TORCH_RESIZE)]),
    "max_pool_padded_strided": lambda: _case(
        [node("MaxPool", ["h"], "out", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])]),
    "max_pool_ceil_mode": lambda: _case(
        [node("MaxPool", ["h"], "out", kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)]),
    "global_max_pool": lambda: _case([node("GlobalMaxPool", ["h"], "out")]),
    "average_pool_count_include_pad": lambda: _case(
        [node("AveragePool", ["h"], "out", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)]),
    "average_pool_ceil_mode_excluding_pad": lambda: _case(
        [node("AveragePool", ["h"], "out", kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)]),
    "average_pool_auto_pad_same_upper": lambda: _case(
        [node("AveragePool", ["h"], "out", kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER")]),
    "conv_auto_pad_same_upper_strided": lambda: _conv_case((2, 3, 7, 6), (4, 3, 3, 2), strides=[2, 2], auto_pad="SAME_UPPER"),
    "conv_auto_pad_same_lower": lambda: _conv_case((2, 3, 6, 6), (4, 3, 2, 2), auto_pad="SAME_LOWER"),
    "max_pool_auto_pad_valid": lambda: _case(
        [node("MaxPool", ["h"], "out", kernel_shape=[2, 2], strides=[2, 2], auto_pad="VALID")]),
}  # fmt: skip


def _output_shape(model: onnx.ModelProto, x: np.ndarray) -> tuple[int, ...]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x})[0].shape


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_matches_torch_autograd(case):
    model, x_shape = CASES[case]()
    x = randn(*x_shape, scale=4.0)
    y = randn(*_output_shape(model, x))
    params = initializers(model)
    trainable = nameable_parameters(model)
    graph = build_training_graph(model, trainable, loss="mse")
    loss, grads = run_training_graph(graph, x, y, params)
    expected_loss, expected = torch_reference_gradients(model, x, y, "mse", trainable)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    assert sorted(grads) == sorted(trainable)
    for name in trainable:
        assert grads[name].shape == params[name].shape
        assert relative_error(grads[name], expected[name]) < 1e-4, name


FROZEN_KERNEL_CASES = {  # a stride-1 conv with a frozen kernel takes its input gradient through a flipped-kernel Conv
    "dense": ((2, 3, 7, 7), (4, 3, 3, 3), dict(pads=[1, 1, 1, 1])),
    "depthwise_5x5": ((2, 4, 8, 8), (4, 1, 5, 5), dict(group=4, pads=[2, 2, 2, 2])),
    "grouped_dilated_asymmetric": ((2, 4, 9, 8), (6, 2, 3, 2), dict(group=2, dilations=[2, 1], pads=[1, 0, 2, 1])),
    "pointwise": ((2, 5, 4, 4), (3, 5, 1, 1), {}),
    "strided_uses_conv_transpose": ((2, 4, 9, 9), (4, 1, 3, 3), dict(group=4, strides=[2, 2], pads=[1, 1, 1, 1])),
}


@pytest.mark.parametrize("case", sorted(FROZEN_KERNEL_CASES))
def test_input_gradient_through_a_frozen_kernel_matches_torch(case):
    x_shape, weight_shape, attributes = FROZEN_KERNEL_CASES[case]
    model, _ = _conv_case(x_shape, weight_shape, **attributes)
    x = randn(*x_shape)
    y = randn(*_output_shape(model, x))
    graph = build_training_graph(model, ["s", "b"], loss="mse")
    uses_transpose = any(n.op_type == "ConvTranspose" for n in graph.graph.node)
    assert uses_transpose == case.startswith("strided")
    _, grads = run_training_graph(graph, x, y, initializers(model))
    _, expected = torch_reference_gradients(model, x, y, "mse", ["s", "b"])
    for name in ("s", "b"):
        assert relative_error(grads[name], expected[name]) < 1e-4, name


@pytest.mark.parametrize("case, lowered", [("conv_depthwise_5x5", True), ("conv_depthwise_strided", True),
                                           ("conv_depthwise_dilated_large_plane_stays_conv", False)])
def test_trainable_depthwise_on_small_planes_becomes_matmuls(case, lowered):
    model, _ = CASES[case]()
    graph = build_training_graph(model, ["w", "b"], loss="mse")
    grouped = [n for n in graph.graph.node if n.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in n.attribute)]
    assert (not grouped) == lowered
    # Frozen, the depthwise kernel is a constant and stays a Conv, which onnxruntime runs fastest.
    frozen = build_training_graph(model, ["s"], loss="mse")
    assert any(n.op_type == "Conv" and n.input[1] == "w" for n in frozen.graph.node)


@pytest.mark.parametrize("case, lowered", [("conv_strided_dilated_asymmetric", True), ("conv_pointwise_strided_small_plane", True),
                                           ("conv_first_layer_no_input_gradient", True), ("conv", False),
                                           ("conv_strided_dilated_asymmetric_large_plane", False), ("conv_grouped", False)])
def test_trainable_ungrouped_convs_on_small_planes_become_matmuls(case, lowered):
    model, _ = CASES[case]()
    graph = build_training_graph(model, ["w", "b"], loss="mse")
    assert (not any(n.op_type == "Conv" and n.input[1] == "w" for n in graph.graph.node)) == lowered
    # Frozen, the kernel is a constant and stays a Conv, which onnxruntime runs fastest.
    frozen = build_training_graph(model, ["b"], loss="mse")
    assert any(n.op_type == "Conv" and n.input[1] == "w" for n in frozen.graph.node)


def test_every_rule_is_checked_against_torch():
    covered = {n.op_type for build in CASES.values() for n in build()[0].graph.node}
    assert set(GRADIENT_RULES) <= covered, set(GRADIENT_RULES) - covered


def test_every_zoo_op_has_a_rule():
    assert ZOO_OPS <= set(GRADIENT_RULES)


def test_every_op_without_rule_on_the_gradient_path_is_named_at_once():
    nodes = [node("Conv", ["input", "w1"], "c1"), node("Sin", ["c1"], "a"), node("Conv", ["a", "w2"], "c2"),
             node("Cos", ["c2"], "b"), node("Flatten", ["b"], "f"), node("Gemm", ["f", "fc", "fc_bias"], "out", transB=1)]  # fmt: skip
    model = make_model(nodes, (2, 1, 4, 4), {"w1": randn(2, 1, 3, 3), "w2": randn(2, 2, 1, 1), "fc": randn(3, 8), "fc_bias": randn(3)})
    with pytest.raises(MissingGradientRuleError) as raised:
        build_training_graph(model)
    message = str(raised.value)
    assert "2 node(s)" in message and "Sin (node 'a')" in message and "Cos (node 'b')" in message
    assert "trainable=['fc', 'fc_bias']" in message
    # ... and following the suggestion works.
    graph = build_training_graph(model, ["fc", "fc_bias"])
    assert [value.name for value in graph.graph.input] == ["x", "y", "fc", "fc_bias"]


def test_op_without_rule_before_the_trainable_part_is_fine():
    nodes = [node("Sin", ["input"], "h"), node("Mul", ["h", "s"], "out")]
    model = make_model(nodes, (2, 3), {"s": randn(3)})
    graph = build_training_graph(model, ["s"], loss="mse")
    x, y = randn(2, 3), randn(2, 3)
    _, grads = run_training_graph(graph, x, y, initializers(model))
    _, expected = torch_reference_gradients(
        make_model([node("Mul", ["input", "s"], "out")], (2, 3), initializers(model)), np.sin(x), y, "mse", ["s"]
    )
    assert relative_error(grads["s"], expected["s"]) < 1e-4


# property tests against torch over shapes and attributes -------------------------------------------


def _check_against_torch(model: onnx.ModelProto, x: np.ndarray, seed: int) -> None:
    y = np.random.default_rng(seed).standard_normal(_output_shape(model, x)).astype(np.float32)
    trainable = nameable_parameters(model)
    loss, grads = run_training_graph(build_training_graph(model, trainable, loss="mse"), x, y, initializers(model))
    expected_loss, expected = torch_reference_gradients(model, x, y, "mse", trainable)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    for name in trainable:
        assert relative_error(grads[name], expected[name]) < 1e-4, name


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(["MaxPool", "AveragePool"]), st.integers(1, 3), st.integers(1, 3), st.integers(0, 1),
       st.booleans(), st.booleans(), st.integers(3, 8), st.integers(0, 2**16))  # fmt: skip
def test_pooling_matches_torch(op, kernel, stride, pad, ceil_mode, include_pad, size, seed):
    pad = min(pad, kernel // 2)  # torch's limit
    attributes = dict(kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4, ceil_mode=int(ceil_mode))
    if op == "AveragePool":
        attributes["count_include_pad"] = int(include_pad)
    local = np.random.default_rng(seed)
    params = {"s": local.standard_normal((1, 2, 1, 1))}
    model = make_model([node("Mul", ["input", "s"], "h"), node(op, ["h"], "out", **attributes)], (2, 2, size, size + 1), params)
    x = local.standard_normal((2, 2, size, size + 1)).astype(np.float32)
    windows_past_the_padding = _output_shape(model, x)[2:] != _output_shape(_without_ceil_mode(model), x)[2:]
    if op == "AveragePool" and ceil_mode and include_pad and windows_past_the_padding:
        with pytest.raises(InvalidInputError, match="ceil_mode with count_include_pad"):
            build_training_graph(model, ["s"], loss="mse")
        return
    _check_against_torch(model, x, seed)


def _without_ceil_mode(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for attribute in copy.graph.node[-1].attribute:
        if attribute.name == "ceil_mode":
            attribute.i = 0
    return copy


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(["constant", "reflect", "edge"]), st.lists(st.integers(0, 3), min_size=4, max_size=4),
       st.integers(4, 6), st.integers(0, 2**16))  # fmt: skip
def test_pad_matches_torch(mode, spatial_pads, size, seed):
    pads = [0, 0, spatial_pads[0], spatial_pads[1], 0, 0, spatial_pads[2], spatial_pads[3]]
    local = np.random.default_rng(seed)
    nodes = [node("Mul", ["input", "s"], "h"), node("Pad", ["h", "pads"], "out", mode=mode)]
    model = make_model(nodes, (2, 2, size, size), {"s": local.standard_normal((1, 2, 1, 1))},
                       constants=[("pads", np.asarray(pads, np.int64))])  # fmt: skip
    _check_against_torch(model, local.standard_normal((2, 2, size, size)).astype(np.float32), seed)


@settings(max_examples=15, deadline=None)
@given(st.integers(-6, 6), st.integers(-6, 6), st.sampled_from([1, 2, -1, -2]), st.sampled_from([1, 2, 3]), st.data())
def test_slice_and_concat_match_torch(start, end, step, axis, data):
    seed = data.draw(st.integers(0, 2**16))
    local = np.random.default_rng(seed)
    shape = (2, 4, 5, 6)
    if len(np.arange(shape[axis])[slice(start, end, step)]) == 0:
        start, end = (0, shape[axis]) if step > 0 else (-1, -shape[axis] - 1)
    nodes = [node("Mul", ["input", "s"], "h"), node("Slice", ["h", "starts", "ends", "axes", "steps"], "sliced"),
             node("Concat", ["sliced", "sliced"], "out", axis=axis)]  # fmt: skip
    constants = [(name, np.asarray([value], np.int64)) for name, value in
                 (("starts", start), ("ends", end), ("axes", axis), ("steps", step))]  # fmt: skip
    model = make_model(nodes, shape, {"s": local.standard_normal((1, 4, 1, 1))}, constants=constants)
    _check_against_torch(model, local.standard_normal(shape).astype(np.float32), seed)


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(["ReduceSum", "ReduceMean", "Softmax", "LogSoftmax", "Gather", "Split", "LeakyRelu", "Elu"]),
       st.integers(1, 3), st.booleans(), st.data())  # fmt: skip
def test_axis_and_attribute_ops_match_torch(op, axis, keepdims, data):
    seed = data.draw(st.integers(0, 2**16))
    local = np.random.default_rng(seed)
    shape = (2, 3, 4, 5)
    constants = []
    if op in ("ReduceSum", "ReduceMean"):
        axes = sorted(data.draw(st.sets(st.integers(1, 3), min_size=1, max_size=3)))
        constants.append(("axes", np.asarray(axes, np.int64)))
        op_node = node(op, ["h", "axes"], "out", keepdims=int(keepdims)) if op == "ReduceSum" else \
            node(op, ["h"], "out", axes=axes, keepdims=int(keepdims))  # fmt: skip
    elif op in ("Softmax", "LogSoftmax"):
        op_node = node(op, ["h"], "out", axis=axis)
    elif op == "Gather":
        indices = data.draw(st.lists(st.integers(-shape[axis], shape[axis] - 1), min_size=1, max_size=5))
        constants.append(("indices", np.asarray(indices, np.int64)))
        op_node = node("Gather", ["h", "indices"], "out", axis=axis)
    elif op == "Split":
        first = data.draw(st.integers(1, shape[axis] - 1))
        constants.append(("sizes", np.asarray([first, shape[axis] - first], np.int64)))
        op_node = helper.make_node("Split", ["h", "sizes"], ["a", "b"], axis=axis)
    else:
        op_node = node(op, ["h"], "out", alpha=data.draw(st.floats(0.01, 2.0)))
    nodes = [node("Mul", ["input", "s"], "h"), op_node]
    if op == "Split":  # both parts on the gradient path, in a different order
        nodes.append(node("Concat", ["b", "a"], "out", axis=axis))
    model = make_model(nodes, shape, {"s": local.standard_normal((1, 3, 1, 1))}, constants=constants)
    _check_against_torch(model, local.standard_normal(shape).astype(np.float32) * 3, seed)


# finite differences ------------------------------------------------------------------------------


def _directional_check(model: onnx.ModelProto, x: np.ndarray, y: np.ndarray, seed: int) -> None:
    """For each parameter p and a random direction v: (L(p + e v) - L(p - e v)) / 2e equals <grad p, v>."""
    params = initializers(model)
    graph = build_training_graph(model, nameable_parameters(model), loss="mse")
    loss_at = lambda values: run_training_graph(graph, x, y, values)[0]  # noqa: E731
    _, grads = run_training_graph(graph, x, y, params)
    direction_rng = np.random.default_rng(seed)
    step = 0.05
    for name, grad in grads.items():
        direction = direction_rng.standard_normal(grad.shape).astype(np.float32)
        plus = {**params, name: params[name] + step * direction}
        minus = {**params, name: params[name] - step * direction}
        finite_difference = (loss_at(plus) - loss_at(minus)) / (2 * step)
        analytic = float(np.sum(grad.astype(np.float64) * direction))
        # The loss is quadratic in each single parameter, so the central difference is exact up to rounding.
        assert finite_difference == pytest.approx(analytic, rel=3e-3, abs=3e-3), name


@st.composite
def conv_geometries(draw):
    groups = draw(st.integers(1, 3))
    in_per_group, out_per_group = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    strides = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    dilations = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    spatial = []
    for axis in range(2):
        reach = dilations[axis] * (kernel[axis] - 1) + 1
        spatial.append(draw(st.integers(max(reach - pads[axis] - pads[axis + 2], 1) + 1, 9)))
    return groups, in_per_group, out_per_group, kernel, strides, dilations, pads, spatial, draw(st.integers(1, 2))


@settings(max_examples=20, deadline=None)
@given(conv_geometries(), st.integers(0, 2**16), st.booleans())
def test_conv_gradients_match_finite_differences(geometry, seed, lower):
    # Without the lowerings a trainable conv goes through the Conv rule (its large-plane path); with them a
    # depthwise conv on a small plane is lowered, and every ungrouped one, whatever its plane.
    with mock.patch.object(depthwise_lowering, "MAX_PLANE_PRODUCT", depthwise_lowering.MAX_PLANE_PRODUCT if lower else 0), \
            mock.patch.object(small_plane_conv_lowering, "MAX_PLANE_PRODUCT", 10**9 if lower else 0):
        _check_conv_geometry(geometry, seed)


def _check_conv_geometry(geometry, seed):
    groups, in_per_group, out_per_group, kernel, strides, dilations, pads, spatial, batch = geometry
    local = np.random.default_rng(seed)
    channels = groups * in_per_group
    params = {
        "s": local.standard_normal((1, channels, 1, 1)),
        "w": local.standard_normal((groups * out_per_group, in_per_group, *kernel)),
        "b": local.standard_normal(groups * out_per_group),
    }
    nodes = [node("Mul", ["input", "s"], "h"),
             node("Conv", ["h", "w", "b"], "out", group=groups, strides=strides, dilations=dilations, pads=pads)]  # fmt: skip
    model = make_model(nodes, (batch, channels, *spatial), params)
    x = local.standard_normal((batch, channels, *spatial)).astype(np.float32)
    y = local.standard_normal(_output_shape(model, x)).astype(np.float32)
    _directional_check(model, x, y, seed)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_broadcast_gradients_match_finite_differences(shape, data):
    # The parameter keeps a suffix of the output's dims, some of them squeezed to 1.
    kept = data.draw(st.integers(1, len(shape)))
    param_shape = [dim if data.draw(st.booleans()) else 1 for dim in shape[len(shape) - kept :]]
    op = data.draw(st.sampled_from(["Add", "Sub", "Mul"]))
    seed = data.draw(st.integers(0, 2**16))
    local = np.random.default_rng(seed)
    x_shape = (2, *shape)
    model = make_model([node(op, ["input", "p"], "out")], x_shape, {"p": local.standard_normal(param_shape)})
    x = local.standard_normal(x_shape).astype(np.float32)
    y = local.standard_normal(x_shape).astype(np.float32)
    _directional_check(model, x, y, seed)


def test_every_rule_is_documented():
    docs = (Path(__file__).parents[2] / "docs" / "training-graphs.md").read_text()
    table = docs.split("## Supported operators and their gradient rules")[1].split("\n## ")[0]
    rows = table.split("|---|---|")[1].strip().splitlines()
    documented = {op.strip() for row in rows for op in re.sub(r"\(.*?\)", "", row.split("|")[1]).split(",")}
    assert set(GRADIENT_RULES) == documented, set(GRADIENT_RULES) ^ documented
