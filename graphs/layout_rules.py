"""Gradient rules of the ops that move elements around: pooling, Concat, Split, Slice, Gather, Pad, Resize.

They register into `fedzoo.graphs.gradient_rules.GRADIENT_RULES` like every other rule. Most are the
transpose of a selection: the forward reads input element `source[j]` into output position `j` along an
axis, so the backward adds each output gradient back onto its source. With the selection known at build
time (constant starts, indices, pads, scales) that is a constant 0/1 matrix applied along the axis, or a
cheaper Pad/Slice when the selection is one contiguous block. MaxPool's selection depends on the data:
its backward recomputes the argmax indices and scatter-adds the gradient onto them.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from fedzoo.graphs.gradient_rules import (
    EVERY_INPUT,
    ForwardNode,
    GraphBuilder,
    constant_input,
    gradient_rule,
    int64s,
    static_dims,
)
from fedzoo.errors import InvalidInputError

_FLOAT = onnx.TensorProto.FLOAT
MIN_SCATTER_ADD_OPSET = 16  # ScatterElements gained reduction="add" in opset 16


def _scatter_along_axis(ctx: GraphBuilder, gradient: str, axis: int, rank: int, sources: np.ndarray, size: int) -> str:
    """Add gradient[..., j, ...] onto position sources[j] of an axis of length `size` (-1 = dropped)."""
    matrix = np.zeros((len(sources), size), np.float32)
    kept = sources >= 0
    np.add.at(matrix, (np.flatnonzero(kept), sources[kept]), 1.0)
    if axis == rank - 1:
        return ctx.emit("MatMul", [gradient, ctx.constant(matrix)])
    to_last = [*range(axis), *range(axis + 1, rank), axis]
    moved = ctx.emit("MatMul", [ctx.emit("Transpose", [gradient], perm=to_last), ctx.constant(matrix)])
    return ctx.emit("Transpose", [moved], perm=[to_last.index(position) for position in range(rank)])


def _zeros_like(ctx: GraphBuilder, value: str) -> str:
    return ctx.emit("ConstantOfShape", [ctx.shape_of(value)], value=helper.make_tensor("zero", _FLOAT, [1], [0.0]))


# joining and splitting ------------------------------------------------------------------------


@gradient_rule("Concat", differentiable_inputs=EVERY_INPUT)
def _concat(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    rank = len(ctx.static_shape(node.outputs[0]))
    axis = int(node.attributes["axis"]) % rank
    sizes = []
    for name in node.inputs:
        shape = ctx.static_shape(name)
        static_dims(node, name, shape, [axis])
        sizes.append(shape[axis])
    parts = ctx.emit_outputs("Split", [grads[0], int64s(ctx, sizes)], len(sizes), axis=axis)
    return [part if need else None for part, need in zip(parts, needs)]


@gradient_rule("Split")
def _split(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    rank = len(ctx.static_shape(node.inputs[0]))
    axis = int(node.attributes.get("axis", 0)) % rank
    parts = [grad if grad is not None else _zeros_like(ctx, output) for grad, output in zip(grads, node.outputs)]
    return [ctx.emit("Concat", parts, axis=axis), None][: len(needs)]


# selecting ------------------------------------------------------------------------------------


@gradient_rule("Slice")
def _slice(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    x = node.inputs[0]
    shape = ctx.static_shape(x)
    rank = len(shape)
    starts, ends = constant_input(ctx, node, 1, "starts"), constant_input(ctx, node, 2, "ends")
    axes = constant_input(ctx, node, 3, "axes")
    steps = constant_input(ctx, node, 4, "steps")
    axes = [int(a) % rank for a in (range(len(starts)) if axes is None else axes)]
    steps = [1] * len(axes) if steps is None else [int(step) for step in steps]
    static_dims(node, x, shape, axes)
    # Python's slice clamps starts and ends exactly like ONNX Slice does.
    selections = {
        axis: np.arange(shape[axis])[slice(int(start), int(end), step)]
        for axis, start, end, step in zip(axes, starts, ends, steps)
    }
    gradient = grads[0]
    if all(step == 1 for step in steps):  # one block per axis: pad the gradient back to the input's size
        pads = [0] * (2 * rank)
        for axis, selected in selections.items():
            begin = int(selected[0]) if len(selected) else 0
            pads[axis], pads[rank + axis] = begin, shape[axis] - begin - len(selected)
        return [ctx.emit("Pad", [gradient, int64s(ctx, pads)]), None, None, None, None][: len(needs)]
    for axis, selected in selections.items():
        gradient = _scatter_along_axis(ctx, gradient, axis, rank, selected, shape[axis])
    return [gradient, None, None, None, None][: len(needs)]


@gradient_rule("Gather")
def _gather(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    data = node.inputs[0]
    shape = ctx.static_shape(data)
    rank = len(shape)
    axis = int(node.attributes.get("axis", 0)) % rank
    indices = constant_input(ctx, node, 1, "indices")
    static_dims(node, data, shape, range(axis, rank))
    sources = np.asarray(indices, np.int64).ravel() % shape[axis]
    # dy has the indices' dims in place of the axis: flatten them into one, then scatter along it.
    flat = ctx.emit("Reshape", [grads[0], int64s(ctx, [*[0] * axis, len(sources), *shape[axis + 1 :]])])
    return [_scatter_along_axis(ctx, flat, axis, rank, sources, shape[axis]), None]


# padding and resizing --------------------------------------------------------------------------


def _pad_sources(mode: str, size: int, begin: int, end: int) -> np.ndarray:
    """For each output position of a padded axis, the input position it copies (-1: the constant)."""
    positions = np.arange(-begin, size + end)
    if mode == "constant":
        return np.where((positions >= 0) & (positions < size), positions, -1)
    if mode == "edge":
        return np.clip(positions, 0, size - 1)
    period = 2 * (size - 1)  # reflect: ... 2 1 | 0 1 2 3 | 2 1 ...
    folded = np.abs(positions) % period if period else np.zeros_like(positions)
    return np.where(folded < size, folded, period - folded)


@gradient_rule("Pad")
def _pad(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    x = node.inputs[0]
    shape = ctx.static_shape(x)
    rank = len(shape)
    mode = node.attributes.get("mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        raise InvalidInputError(f"Pad {node.name!r}: no gradient rule for mode {mode!r}; supported: constant, reflect, edge")
    pads = constant_input(ctx, node, 1, "pads")
    axes = constant_input(ctx, node, 3, "axes")
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
    begins = dict(zip(axes, (int(p) for p in pads[: len(axes)])))
    ends = dict(zip(axes, (int(p) for p in pads[len(axes) :])))
    padded = [axis for axis in axes if begins[axis] or ends[axis]]
    static_dims(node, x, shape, padded)
    if mode == "constant" and all(begins[a] >= 0 and ends[a] >= 0 for a in padded):
        starts = [begins[axis] for axis in padded]
        stops = [begins[axis] + shape[axis] for axis in padded]
        sliced = ctx.emit("Slice", [grads[0], int64s(ctx, starts), int64s(ctx, stops), int64s(ctx, padded)])
        return [sliced, None, None, None][: len(needs)]
    gradient = grads[0]
    for axis in padded:
        gradient = _scatter_along_axis(
            ctx, gradient, axis, rank, _pad_sources(mode, shape[axis], begins[axis], ends[axis]), shape[axis]
        )
    return [gradient, None, None, None][: len(needs)]


def _resize_sources(node: ForwardNode, axis: int, rank: int, size: int, scales, sizes) -> np.ndarray:
    """The input position each output position of `axis` copies, by running the node's own Resize on 0..size-1."""
    positions = np.arange(size, dtype=np.float32).reshape([size if a == axis else 1 for a in range(rank)])
    if sizes is not None:
        target = np.asarray([sizes[a] if a == axis else 1 for a in range(rank)], np.int64)
        resize_inputs, target_name = ["x", "", "", "target"], onnx.TensorProto.INT64
    else:
        target = np.asarray([scales[a] if a == axis else 1.0 for a in range(rank)], np.float32)
        resize_inputs, target_name = ["x", "", "target"], _FLOAT
    graph = helper.make_graph(
        [helper.make_node("Resize", resize_inputs, ["y"], **node.attributes)], "sources",
        [helper.make_tensor_value_info("x", _FLOAT, None), helper.make_tensor_value_info("target", target_name, None)],
        [helper.make_tensor_value_info("y", _FLOAT, None)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    return ReferenceEvaluator(model).run(None, {"x": positions, "target": target})[0].ravel().astype(np.int64)


@gradient_rule("Resize")
def _resize(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    if node.attributes.get("mode", "nearest") != "nearest" or "axes" in node.attributes:
        raise InvalidInputError(f"Resize {node.name!r}: gradients exist for mode 'nearest' without 'axes' only")
    x = node.inputs[0]
    shape = ctx.static_shape(x)
    out_shape = ctx.static_shape(node.outputs[0])
    rank = len(shape)
    scales, sizes = constant_input(ctx, node, 2, "scales"), constant_input(ctx, node, 3, "sizes")
    if scales is not None and scales.size == 0:
        scales = None
    resized = [axis for axis in range(rank) if shape[axis] is not None and shape[axis] != out_shape[axis]]
    gradient = grads[0]
    for axis in resized:
        sources = _resize_sources(node, axis, rank, shape[axis], scales, sizes)
        gradient = _scatter_along_axis(ctx, gradient, axis, rank, sources, shape[axis])
    return [gradient, None, None, None][: len(needs)]


# pooling ---------------------------------------------------------------------------------------


@gradient_rule("MaxPool")
def _max_pool(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    if ctx.opset < MIN_SCATTER_ADD_OPSET:
        raise InvalidInputError(
            f"MaxPool {node.name!r}: its gradient needs opset >= {MIN_SCATTER_ADD_OPSET} (ScatterElements with "
            f"reduction='add'), the model has {ctx.opset}; re-export with a newer opset_version"
        )
    x = node.inputs[0]
    # The argmax positions (flat indices into the whole input tensor), recomputed by a MaxPool with both outputs.
    _, indices = ctx.emit_outputs("MaxPool", [x], 2, **node.attributes)
    flat = int64s(ctx, [-1])
    zeros = ctx.emit("ConstantOfShape", [ctx.emit("Reshape", [ctx.emit("Size", [x]), flat])],
                     value=helper.make_tensor("zero", _FLOAT, [1], [0.0]))  # fmt: skip
    added = ctx.emit(
        "ScatterElements",
        [zeros, ctx.emit("Reshape", [indices, flat]), ctx.emit("Reshape", [grads[0], flat])],
        axis=0,
        reduction="add",
    )
    return [ctx.emit("Reshape", [added, ctx.shape_of(x)])]


@gradient_rule("GlobalMaxPool")
def _global_max_pool(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    # Every element equal to its plane's maximum gets the gradient (continuous inputs have one).
    at_maximum = ctx.emit("Cast", [ctx.emit("Equal", [node.inputs[0], node.outputs[0]])], to=_FLOAT)
    return [ctx.emit("Mul", [grads[0], at_maximum])]


def _average_pool_divisors(
    sizes: list[int], out_sizes: list[int], kernel: list[int], strides: list[int], pads: list[int], include_pad: bool
) -> np.ndarray:
    """How many elements each output averaged: clipped to the padded input (include_pad) or to the input."""
    spatial = len(sizes)
    counts = []
    for axis in range(spatial):
        starts = np.arange(out_sizes[axis]) * strides[axis] - pads[axis]
        stops = starts + kernel[axis]
        if include_pad:
            counts.append(np.minimum(stops, sizes[axis] + pads[spatial + axis]) - starts)
        else:
            counts.append(np.minimum(stops, sizes[axis]) - np.maximum(starts, 0))
    divisors = counts[0].astype(np.float64)
    for count in counts[1:]:
        divisors = np.multiply.outer(divisors, count)
    return divisors.astype(np.float32)


@gradient_rule("AveragePool")
def _average_pool(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    x = node.inputs[0]
    shape, out_shape = ctx.static_shape(x), ctx.static_shape(node.outputs[0])
    static_dims(node, x, shape, range(1, len(shape)))
    kernel = list(node.attributes["kernel_shape"])
    spatial = len(kernel)
    if any(d != 1 for d in node.attributes.get("dilations", [1] * spatial)):
        raise InvalidInputError(f"AveragePool {node.name!r}: no gradient rule for dilated average pooling")
    strides = list(node.attributes.get("strides", [1] * spatial))
    pads = list(node.attributes.get("pads", [0] * 2 * spatial))
    sizes, out_sizes = list(shape[2:]), list(out_shape[2:])
    divisors = _average_pool_divisors(sizes, out_sizes, kernel, strides, pads, bool(node.attributes.get("count_include_pad", 0)))
    # Each plane on its own: (N*C, 1, ...) through a one-channel ConvTranspose with a kernel of ones.
    planes = ctx.emit("Reshape", [grads[0], int64s(ctx, [-1, 1, *out_sizes])])
    scaled = ctx.emit("Div", [planes, ctx.constant(divisors)])
    end_crops, output_padding = [], []
    for axis in range(spatial):
        # ConvTranspose reaches (out-1)*stride + kernel; crop the begin pad, then the rest beyond the input.
        beyond = (out_sizes[axis] - 1) * strides[axis] + kernel[axis] - pads[axis] - sizes[axis]
        end_crops.append(max(beyond, 0))
        output_padding.append(max(-beyond, 0))
    spread = ctx.emit(
        "ConvTranspose",
        [scaled, ctx.constant(np.ones([1, 1, *kernel], np.float32))],
        strides=strides,
        pads=[*pads[:spatial], *end_crops],
        output_padding=output_padding,
    )
    return [ctx.emit("Reshape", [spread, ctx.shape_of(x)])]
