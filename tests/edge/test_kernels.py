"""Splitting ONNX graphs into the fused kernels onnxruntime runs, with exact kernel lists and MACs."""

from __future__ import annotations

import platform

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from fedzoo.edge.calibration_models import Architecture, Block, build_model
from fedzoo.edge.kernels import split_kernels
from fedzoo.errors import InvalidInputError

# stem 3x3 (1->4) + Clip, one inverted residual without expansion (dw 3x3 + Clip, pw + residual Add),
# head 1x1 (4->8) + Clip, global pool, flatten, classifier.
TINY = Architecture((1, 8, 8), 4, (Block(1, 4),), 8)
# onnxruntime's NCHWc kernels exist in its x86 builds only: elsewhere its optimizer leaves every fp32 conv in NCHW,
# which the splitter reads off the runtime and records as the kernel's layout
NCHWC_RUNTIME = platform.machine().lower() in {"x86_64", "amd64", "i386", "i686"}


def test_fp32_graph_splits_into_fused_kernels() -> None:
    kernels = split_kernels(build_model(TINY, "fp32"))
    assert [(k.ops, k.category, k.precision) for k in kernels] == [
        (("Conv", "Clip"), "conv-stem", "fp32"),
        (("Conv", "Clip"), "conv-dw", "fp32"),
        (("Conv", "Add"), "conv-pw", "fp32"),
        (("Conv", "Clip"), "conv-pw", "fp32"),
        (("GlobalAveragePool",), "global-pool", "fp32"),
        (("Flatten",), "shape", "fp32"),
        (("Gemm",), "gemm", "fp32"),
    ]
    assert [k.macs for k in kernels] == [4 * 64 * 9, 4 * 64 * 9, 4 * 64 * 4, 8 * 64 * 4, 8 * 64, 0, 10 * 8]
    conv_layouts = {k.layout for k in kernels if k.ops[0] == "Conv"}
    assert conv_layouts == ({""} if NCHWC_RUNTIME else {"nchw"})  # this runtime's layouts, per architecture
    depthwise = kernels[1]
    assert (depthwise.groups, depthwise.kernel_size, depthwise.stride, depthwise.activation) == (4, 3, 1, "clip")
    # The residual Add reads the block input besides the conv's input: both count as input traffic.
    assert kernels[2].input_elements == 2 * 4 * 64


def test_int8_qdq_graph_folds_quantization_into_its_kernels() -> None:
    kernels = split_kernels(build_model(TINY, "int8"))
    assert [(k.ops, k.category, k.precision) for k in kernels] == [
        (("QuantizeLinear",), "quantize", "int8"),
        (("Conv",), "conv-stem", "int8"),  # QLinearConv: the quantizer folded the Clip into its output range
        (("Conv",), "conv-dw", "int8"),
        (("Conv",), "conv-pw", "int8"),
        (("Add",), "elementwise", "int8"),  # QLinearAdd stays a kernel of its own
        (("Conv",), "conv-pw", "int8"),
        (("GlobalAveragePool",), "global-pool", "int8"),
        (("Flatten",), "shape", "int8"),
        (("Gemm",), "gemm", "int8"),
        (("DequantizeLinear",), "dequantize", "int8"),
    ]
    assert all(k.layout == "" for k in kernels)


def test_a_runtime_without_nchwc_runs_residual_adds_and_hardswish_apart() -> None:
    """Below the NCHWc level onnxruntime's FusedConv takes Relu/Clip but not a residual Add or a HardSwish,
    and INT8 convs lose their NHWC kernels: those convs get their own plain-layout keys."""
    architecture = Architecture((1, 8, 8), 8, (Block(1, 8, activation="hardswish"),), 16)
    kernels = split_kernels(build_model(architecture, "fp32"), all_plain_layout=True)
    assert [(k.ops, k.key) for k in kernels] == [
        (("Conv", "Clip"), "conv-stem+clip:nchw/fp32"),
        (("Conv",), "conv-dw:nchw/fp32"),
        (("HardSwish",), "activation+hardswish/fp32"),
        (("Conv",), "conv-pw:nchw/fp32"),
        (("Add",), "elementwise/fp32"),
        (("Conv", "Clip"), "conv-pw+clip:nchw/fp32"),
        (("GlobalAveragePool",), "global-pool/fp32"),
        (("Flatten",), "shape/fp32"),
        (("Gemm",), "gemm/fp32"),
    ]
    int8 = split_kernels(build_model(TINY, "int8"), all_plain_layout=True)
    assert {k.layout for k in int8 if k.ops[0] == "Conv"} == {"nchw"}


def _graph_with(nodes: list, initializers: list, input_shape: list, output: str, output_shape: list) -> bytes:
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, output_shape)],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_batchnorm_and_activation_fuse_but_a_shared_output_stops_fusion() -> None:
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
        *(numpy_helper.from_array(np.ones(8, np.float32), name) for name in ("scale", "bias", "mean", "var")),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"]),
        helper.make_node("Relu", ["b"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Sigmoid", ["p"], ["s"]),  # p feeds both Sigmoid and Mul: no fusion across it
        helper.make_node("Mul", ["p", "s"], ["y"]),
    ]
    kernels = split_kernels(_graph_with(nodes, weights, ["batch", 3, 16, 16], "y", ["batch", 8, 8, 8]))
    assert [(k.ops, k.category) for k in kernels] == [
        (("Conv", "BatchNormalization", "Relu"), "conv-stem"),  # 3 input channels: a stem-like conv
        (("MaxPool",), "pool"),
        (("Sigmoid",), "activation"),
        (("Mul",), "elementwise"),
    ]
    assert kernels[0].macs == 8 * 16 * 16 * 3 * 9 and kernels[1].macs == 8 * 8 * 8 * 4


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    channels=st.sampled_from([1, 3, 4, 8, 12]),
    multiplier=st.integers(1, 3),
    kernel=st.sampled_from([1, 3, 5]),
    stride=st.integers(1, 2),
    depthwise=st.booleans(),
    size=st.integers(4, 12),
)
def test_conv_features_follow_the_conv_arithmetic(
    channels: int, multiplier: int, kernel: int, stride: int, depthwise: bool, size: int
) -> None:
    groups = channels if depthwise else 1
    out_channels = channels * multiplier
    weight = np.zeros((out_channels, channels // groups, kernel, kernel), np.float32)
    pad = kernel // 2
    out_size = (size + 2 * pad - kernel) // stride + 1
    node = helper.make_node(
        "Conv", ["x", "w"], ["y"], kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4, group=groups
    )
    model = _graph_with(
        [node], [numpy_helper.from_array(weight, "w")], [1, channels, size, size], "y", [1, out_channels, out_size, out_size]
    )
    (conv,) = split_kernels(model)
    assert conv.macs == out_channels * out_size * out_size * (channels // groups) * kernel * kernel
    assert conv.output_elements == out_channels * out_size * out_size
    assert conv.input_elements == channels * size * size
    assert conv.weight_elements == weight.size
    assert (conv.groups, conv.stride, conv.kernel_size, conv.out_channels) == (groups, stride, kernel, out_channels)
    if depthwise and channels > 1:
        assert conv.category == "conv-dw"
    elif channels < 4:
        assert conv.category == "conv-stem"
    else:
        assert conv.category == ("conv-pw" if kernel == 1 else "conv")


def test_torch_style_identity_weights_are_looked_through() -> None:
    weight = numpy_helper.from_array(np.ones((4, 4, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Identity", ["w"], ["w_copy"]), helper.make_node("Conv", ["x", "w_copy"], ["y"])]
    (conv,) = split_kernels(_graph_with(nodes, [weight], [1, 4, 5, 5], "y", [1, 4, 5, 5]))
    assert conv.category == "conv-pw" and conv.input_elements == 4 * 25 and conv.weight_elements == 16


def test_not_a_model_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="expected an ONNX path, bytes or ModelProto"):
        split_kernels(42)
    with pytest.raises(InvalidInputError, match="not a readable ONNX model"):
        split_kernels(b"garbage")
