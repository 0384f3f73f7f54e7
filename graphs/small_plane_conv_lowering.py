"""Trainable convolutions on small planes rewritten as one GEMM over the whole batch (im2col by a constant).

onnxruntime runs a Conv whose weight is a graph input (as every trainable weight of a training graph is)
image by image: an im2col and a (C_out, C_in*kh*kw) x (C_in*kh*kw, OH*OW) GEMM per image, and its
ConvTranspose and weight-gradient Conv likewise. On the small planes of a network's later stages (8x8 down
to 1x1) those GEMMs are a few columns wide, down to matrix-vector products, and most of the time goes to
per-image overhead: profiled at 1 thread, ResNet-18's 3x3 convs of the 8x8 to 1x1 stages ran at a
few GFLOP/s. Here such a conv becomes

    x (N, C, H, W) -> transposed (N, H*W, C) -> E (OH*OW*T, H*W) @ it -> patches (N*OH*OW, T*C)
    -> patches @ W' (T*C, C_out) -> (N, OH*OW, C_out) -> transposed back to (N, C_out, OH, OW)

where T = kh*kw taps, E the constant 0/1 tap matrices of `depthwise_lowering.tap_matrices` (padding,
stride and dilation included) and W' the weight reordered tap-major. The product with W' is one GEMM
with N*OH*OW rows, and the backward (the MatMul, Transpose and Reshape rules) is one GEMM for the weight
gradient and one for the patches' gradient: exact like every other rule. E costs H*W*OH*OW*T
multiply-adds per image and channel, so the rewrite is used only while the planes are small
(`MAX_PLANE_PRODUCT`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

from fedzoo.graphs.depthwise_lowering import Emitter, conv_2d_shapes, tap_matrices
from fedzoo.graphs.gradient_rules import StaticShape

# Largest H*W * OH*OW lowered. Measured on tests/graphs/architectures.py's ResNet-18 (batch 32, 1 thread, CPU
# time of a training step, interleaved): 12.9-13.3 ms with no conv lowered, 10.8-11.1 ms with the planes up to
# 8x8 -> 4x4 lowered (this bound, or 4x4 -> 4x4), 12.1 ms with 8x8 -> 8x8 too (there E's product costs as
# much as the conv). Folding the batch into the GEMM is what pays: the same rewrite with one GEMM per image
# (W @ patches[n]) measured no faster than the Conv, and an im2col by strided Slices for the stem conv slower.
MAX_PLANE_PRODUCT = 64 * 16


def is_lowerable(node: onnx.NodeProto, shapes: dict[str, StaticShape]) -> bool:
    """A 2-D, ungrouped Conv with static shapes (but the batch) on a small enough plane, not a plain 1x1."""
    conv = conv_2d_shapes(node, shapes)
    if conv is None:
        return False
    attributes, weight, x, y = conv
    if attributes.get("group", 1) != 1 or any(dim is None for dim in (*weight, *x[1:], *y[1:])):
        return False
    # A 1x1 conv that keeps the plane needs no im2col: the Conv rule's per-image GEMMs serve it better.
    pointwise = weight[2:] == (1, 1) and x[2:] == y[2:]
    return not pointwise and x[2] * x[3] * y[2] * y[3] <= MAX_PLANE_PRODUCT


def lower_small_plane_conv(
    node: onnx.NodeProto, shapes: dict[str, StaticShape], fresh_name: Callable[[str], str]
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The nodes and constants that compute `node` (see `is_lowerable`) as batch-wide GEMMs; same output name."""
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    x_shape, y_shape, weight_shape = shapes[node.input[0]], shapes[node.output[0]], shapes[node.input[1]]
    out_channels, channels = weight_shape[0], weight_shape[1]
    plane, out_plane = x_shape[2] * x_shape[3], y_shape[2] * y_shape[3]
    taps = tap_matrices(
        tuple(x_shape[2:]), tuple(y_shape[2:]), tuple(weight_shape[2:]), tuple(attributes.get("strides", [1, 1])),
        tuple(attributes.get("dilations", [1, 1])), tuple(attributes.get("pads", [0, 0, 0, 0])),
    )  # fmt: skip
    tap_count = len(taps)
    # rows (output pixel q, tap t), columns input pixel p: E'[q*T + t, p] = E[t, p, q]
    gather = np.ascontiguousarray(taps.transpose(2, 0, 1).reshape(out_plane * tap_count, plane))
    out = Emitter(node.output[0], "small_plane_conv", fresh_name)
    pixels_last = out.emit("Reshape", [out.emit("Transpose", [node.input[0]], perm=[0, 2, 3, 1]), out.int64s(0, plane, channels)])
    patches = out.emit("MatMul", [out.constant(gather), pixels_last])  # (N, OH*OW*T, C)
    patches = out.emit("Reshape", [patches, out.int64s(-1, tap_count * channels)])
    # W (C_out, C, kh, kw) -> (kh*kw*C, C_out), tap-major like the patches' columns
    weight_taps = out.emit("Transpose", [out.emit("Reshape", [node.input[1], out.int64s(out_channels, channels, tap_count)])],
                           perm=[2, 1, 0])
    weight_matrix = out.emit("Reshape", [weight_taps, out.int64s(tap_count * channels, out_channels)])
    product = out.emit("MatMul", [patches, weight_matrix])  # (N*OH*OW, C_out)
    has_bias = len(node.input) > 2 and node.input[2] != ""
    if has_bias:
        product = out.emit("Add", [product, node.input[2]])
    by_image = out.emit("Reshape", [product, out.int64s(-1, *y_shape[2:], out_channels)])
    out.emit("Transpose", [by_image], node.output[0], perm=[0, 3, 1, 2])
    return out.nodes, out.constants
