"""Trainable depthwise convolutions rewritten as batched MatMuls, so their training runs fast on onnxruntime.

onnxruntime's fast depthwise kernel (NCHWc) needs a constant weight; with the weight as a graph input it
loops over the channels with tiny GEMMs, and so do the ConvTranspose and grouped Conv of the backward
(profiled at about two thirds of a training step of the bench/train_benchmark.py subnet). A depthwise conv is,
per channel c, a linear map of the flattened input plane: y[n, c, :] = x[n, c, :] @ M[c], where the
(H*W, OH*OW) matrix M[c] = sum over taps t of w[c, t] * E[t] and E[t] is a constant 0/1 matrix that
holds the padding, stride and dilation. The rewrite builds M with one MatMul and applies it with one
batched MatMul over the channels; the backward is then that of MatMul, Reshape and Transpose, exact
like every other rule. M costs H*W/(kernel taps) times the multiply-adds of the direct conv, so it is
used only while the planes are small (`MAX_PLANE_PRODUCT`); larger depthwise layers stay Conv (whose
weight gradient the Conv rule computes with per-kernel-row MatMuls instead).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from fedzoo.graphs.gradient_rules import StaticShape

# Largest H*W * OH*OW lowered: 14x14 -> 7x7 (stride 2). Measured on a NAS subnet (batch 32, 1 thread),
# the whole training graph of a depthwise layer on a 7x7 or 4x4 plane ran 4-10x faster lowered, one from
# 14x14 to 7x7 about 1.2x faster, and one at 14x14 -> 14x14 no faster than the Conv.
MAX_PLANE_PRODUCT = 196 * 49


def tap_matrices(
    input_size: tuple[int, int], output_size: tuple[int, int], kernel: tuple[int, int],
    strides: tuple[int, int], dilations: tuple[int, int], pads: tuple[int, int, int, int],
) -> np.ndarray:  # fmt: skip
    """E of shape (kh*kw, H*W, OH*OW): E[t, p, q] = 1 when kernel tap t reads input pixel p for output pixel q."""
    height, width = input_size
    out_height, out_width = output_size
    taps = np.zeros((kernel[0] * kernel[1], height * width, out_height * out_width), np.float32)
    out_rows, out_columns = np.meshgrid(np.arange(out_height), np.arange(out_width), indexing="ij")
    outputs = (out_rows * out_width + out_columns).ravel()
    for a in range(kernel[0]):
        for b in range(kernel[1]):
            rows = (out_rows * strides[0] + a * dilations[0] - pads[0]).ravel()
            columns = (out_columns * strides[1] + b * dilations[1] - pads[1]).ravel()
            inside = (rows >= 0) & (rows < height) & (columns >= 0) & (columns < width)
            taps[a * kernel[1] + b, rows[inside] * width + columns[inside], outputs[inside]] = 1.0
    return taps


def conv_2d_shapes(
    node: onnx.NodeProto, shapes: dict[str, StaticShape]
) -> tuple[dict, StaticShape, StaticShape, StaticShape] | None:
    """The attributes and the weight, input and output shapes of a 2-D Conv with explicit pads, else None."""
    if node.op_type != "Conv":
        return None
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    weight, x, y = shapes.get(node.input[1]), shapes.get(node.input[0]), shapes.get(node.output[0])
    if weight is None or x is None or y is None or len(weight) != 4 or attributes.get("auto_pad", b"NOTSET") != b"NOTSET":
        return None
    return attributes, weight, x, y


def is_lowerable(node: onnx.NodeProto, shapes: dict[str, StaticShape]) -> bool:
    """A 2-D depthwise Conv (one filter per channel) with static spatial shapes and a small enough plane."""
    conv = conv_2d_shapes(node, shapes)
    if conv is None:
        return False
    attributes, weight, x, y = conv
    channels = weight[0]
    if attributes.get("group", 1) != channels or weight[1] != 1 or x[1] != channels or channels == 1:
        return False
    if any(dim is None for dim in (*x[2:], *y[2:])):
        return False
    return x[2] * x[3] * y[2] * y[3] <= MAX_PLANE_PRODUCT


class Emitter:
    """Appends the nodes and constants of one lowered conv, named `<its output>/<tag>/...`."""

    def __init__(self, output: str, tag: str, fresh_name: Callable[[str], str]) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.constants: list[onnx.TensorProto] = []
        self._prefix = f"{output}/{tag}"
        self._fresh_name = fresh_name

    def constant(self, value: np.ndarray) -> str:
        name = self._fresh_name(f"{self._prefix}/const")
        self.constants.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def int64s(self, *values: int) -> str:
        return self.constant(np.asarray(values, np.int64))

    def emit(self, op_type: str, inputs: list[str], output: str | None = None, **attributes) -> str:
        output = output or self._fresh_name(f"{self._prefix}/{op_type}")
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attributes))
        return output


def lower_depthwise(
    node: onnx.NodeProto, shapes: dict[str, StaticShape], fresh_name: Callable[[str], str]
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The nodes and constants that compute `node` (see `is_lowerable`) with MatMuls; same output name."""
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    x_shape, y_shape, weight_shape = shapes[node.input[0]], shapes[node.output[0]], shapes[node.input[1]]
    channels, plane, out_plane = weight_shape[0], x_shape[2] * x_shape[3], y_shape[2] * y_shape[3]
    taps = tap_matrices(
        tuple(x_shape[2:]), tuple(y_shape[2:]), tuple(weight_shape[2:]), tuple(attributes.get("strides", [1, 1])),
        tuple(attributes.get("dilations", [1, 1])), tuple(attributes.get("pads", [0, 0, 0, 0])),
    )  # fmt: skip
    out = Emitter(node.output[0], "depthwise", fresh_name)
    weight_rows = out.emit("Reshape", [node.input[1], out.int64s(channels, len(taps))])
    matrices = out.emit("MatMul", [weight_rows, out.constant(taps.reshape(len(taps), plane * out_plane))])
    matrices = out.emit("Reshape", [matrices, out.int64s(channels, plane, out_plane)])
    # Channels lead, so the MatMul is one (N, H*W) @ (H*W, OH*OW) product per channel.
    planes = out.emit("Transpose", [out.emit("Reshape", [node.input[0], out.int64s(0, channels, plane)])], perm=[1, 0, 2])
    products = out.emit("Transpose", [out.emit("MatMul", [planes, matrices])], perm=[1, 0, 2])
    has_bias = len(node.input) > 2 and node.input[2] != ""
    convolved = out.emit("Reshape", [products, out.int64s(0, channels, *y_shape[2:])], None if has_bias else node.output[0])
    if has_bias:
        out.emit("Add", [convolved, out.emit("Reshape", [node.input[2], out.int64s(channels, 1, 1)])], node.output[0])
    return out.nodes, out.constants
