"""Strip an ONNX file down to what a device needs to run it, without changing one computed value.

A small model's file is not only its weights: the quantizer's generated tensor and node names, the
shapes recorded in `value_info`, doc strings, metadata, opset imports of unused domains, attributes that
repeat their ONNX defaults, all-zero zero-point vectors and per-channel scale vectors whose channels are
equal can add a quarter to the weights' bytes. `compact_model` removes them (node names are optional;
tensors get names of one or two characters); the same cleanup applies to an fp32 model, so size ratios
can be taken between two equally cleaned files.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

# Symmetric int8 weights and int32 biases have all-zero zero points; for DequantizeLinear of these types
# the zero-point input is optional and defaults to 0, so the vector is dead weight.
_ZERO_POINT_OPTIONAL_TYPES = (onnx.TensorProto.INT8, onnx.TensorProto.INT32)
# QLinearConv accepts a scalar weight zero point with per-channel scales; one shared scalar replaces the
# per-channel zero vectors (QGemm does not: its scale and zero point must have the same shape).
_SCALAR_ZERO_POINT_INPUT = {"QLinearConv": 5}
# Weight (scale, zero point) slots of ops that also take per-tensor weights: a vector of equal scales (the
# dense-per-tensor recipe writes them through the quantizer's per-channel path) is stored as that scalar,
# and so is the zero point (QGemm needs both of one shape).
_WEIGHT_SCALE_INPUTS = {"QLinearConv": (4, 5), "QGemm": (4, 5)}
NAME_ALPHABET = string.ascii_letters + string.digits
# Where a conv's weight is: its kernel_shape, when equal to the weight's spatial dims, is implied by it.
_CONV_WEIGHT_INPUT = {"Conv": 1, "QLinearConv": 3}


def compact_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` without names, shapes, docs and zero vectors it does not need.

    The graph's inputs and outputs keep their names (devices feed and fetch them by name).
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    del graph.value_info[:]
    del model.metadata_props[:]
    model.doc_string = graph.doc_string = model.producer_name = model.producer_version = ""
    graph.name = "g"  # required to be non-empty; nothing reads it
    used_domains = {node.domain or "" for node in graph.node} | {""}
    kept_opsets = [opset for opset in model.opset_import if (opset.domain or "") in used_domains or opset.domain == "ai.onnx"]
    del model.opset_import[:]
    model.opset_import.extend(kept_opsets)
    _drop_zero_points(graph)
    _collapse_equal_scales(graph)
    _drop_unused_initializers(graph)
    _deduplicate_initializers(graph)
    _shorten_names(graph)
    _drop_default_attributes(graph, {opset.domain or "": opset.version for opset in model.opset_import})
    return model


def _all_zero_vector(tensor: onnx.TensorProto | None) -> bool:
    if tensor is None or len(tensor.dims) != 1:
        return False
    return not numpy_helper.to_array(tensor).any()


def _drop_zero_points(graph: onnx.GraphProto) -> None:
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    # onnxruntime 1.32 fuses DequantizeLinear -> Gemm into QGemm only if the weight's zero point is there
    # (without it the Gemm ran in float: other logits, and slower); Conv fuses either way
    feeds_gemm = {name for node in graph.node if node.op_type == "Gemm" for name in node.input}
    shared_zero: str | None = None
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and len(node.input) == 3 and node.output[0] not in feeds_gemm:
            quantized = initializers.get(node.input[0])
            if quantized is not None and quantized.data_type in _ZERO_POINT_OPTIONAL_TYPES and _all_zero_vector(initializers.get(node.input[2])):
                del node.input[2]
        slot = _SCALAR_ZERO_POINT_INPUT.get(node.op_type)
        if slot is not None and len(node.input) > slot and _all_zero_vector(zero := initializers.get(node.input[slot])):
            if shared_zero is None:
                shared_zero = "weight_zero"
                graph.initializer.append(numpy_helper.from_array(np.zeros((), numpy_helper.to_array(zero).dtype), shared_zero))
            node.input[slot] = shared_zero


def _collapse_equal_scales(graph: onnx.GraphProto) -> None:
    initializers = {tensor.name: tensor for tensor in graph.initializer}

    def scalar_of(name: str) -> onnx.TensorProto | None:
        """The one value of an initializer vector whose entries are all equal (or the scalar itself)."""
        tensor = initializers.get(name)
        if tensor is None or len(tensor.dims) > 1:
            return None
        values = numpy_helper.to_array(tensor).reshape(-1)
        if not len(values) or not np.all(values == values[0]):
            return None
        return numpy_helper.from_array(values[:1].reshape(()), f"{name}.scalar")

    for node in graph.node:
        slots = _WEIGHT_SCALE_INPUTS.get(node.op_type)
        if slots is None or len(node.input) <= max(slots):
            continue
        collapsed = [scalar_of(node.input[slot]) for slot in slots]
        if all(tensor is not None for tensor in collapsed):
            for slot, tensor in zip(slots, collapsed):
                graph.initializer.append(tensor)
                initializers[tensor.name] = tensor
                node.input[slot] = tensor.name


def _drop_unused_initializers(graph: onnx.GraphProto) -> None:
    """Remove the constants no node reads any more (the zero points and scale vectors replaced above)."""
    used = {name for node in graph.node for name in node.input} | {value.name for value in graph.output}
    kept = [tensor for tensor in graph.initializer if tensor.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _implied_conv_attribute(node: onnx.NodeProto, attribute: onnx.AttributeProto, initializers: dict) -> bool:
    """Conv attributes the spec defines in prose when absent: all-one strides and dilations, zero pads, and
    a kernel_shape inferred from the weight."""
    if node.op_type not in _CONV_WEIGHT_INPUT:
        return False
    values = list(attribute.ints)
    if attribute.name in ("strides", "dilations"):
        return all(value == 1 for value in values)
    if attribute.name == "pads":
        return not any(values)
    if attribute.name == "kernel_shape":
        weight = initializers.get(node.input[_CONV_WEIGHT_INPUT[node.op_type]])
        return weight is not None and values == list(weight.dims[2:])
    return False


def _drop_default_attributes(graph: onnx.GraphProto, opset_versions: dict[str, int]) -> None:
    """Remove attributes equal to their schema default (e.g. Conv group=1, Gemm alpha=1.0) or implied for
    a conv: the runtime fills them in again. Ops without a known schema keep every attribute."""
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    for node in graph.node:
        domain = node.domain or ""
        try:
            schema = onnx.defs.get_schema(node.op_type, opset_versions.get(domain, 1), domain)
        except onnx.defs.SchemaError:
            continue
        kept = []
        for attribute in node.attribute:
            declared = schema.attributes.get(attribute.name)
            default = declared.default_value if declared is not None else None
            if _implied_conv_attribute(node, attribute, initializers):
                continue
            if default is None or not default.name or helper.get_attribute_value(default) != helper.get_attribute_value(attribute):
                kept.append(attribute)
        del node.attribute[:]
        node.attribute.extend(kept)


def _deduplicate_initializers(graph: onnx.GraphProto) -> None:
    """Point every user of a repeated constant (e.g. equal activation scales) at its first copy."""
    graph_inputs = {value.name for value in graph.input}
    first: dict[tuple, str] = {}
    alias: dict[str, str] = {}
    kept = []
    for tensor in graph.initializer:
        if tensor.name in graph_inputs:  # an overridable initializer is not a constant
            kept.append(tensor)
            continue
        array = numpy_helper.to_array(tensor)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key in first:
            alias[tensor.name] = first[key]
        else:
            first[key] = tensor.name
            kept.append(tensor)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    for node in graph.node:
        node.input[:] = [alias.get(name, name) for name in node.input]


def _short_names(taken: set[str]) -> Iterator[str]:
    """Names a, b, ..., Z, 0.., then aa, ab, ...: one character for the first 62 tensors, two for 3,844 more."""
    for length in range(1, 8):
        for name in itertools.product(NAME_ALPHABET, repeat=length):
            joined = "".join(name)
            if joined not in taken:
                yield joined


def _shorten_names(graph: onnx.GraphProto) -> None:
    kept = {value.name for value in [*graph.input, *graph.output]}
    fresh = _short_names(kept)
    renamed: dict[str, str] = {}

    def short(name: str) -> str:
        if not name or name in kept:
            return name
        if name not in renamed:
            renamed[name] = next(fresh)
        return renamed[name]

    for tensor in graph.initializer:
        tensor.name = short(tensor.name)
    for node in graph.node:
        node.name = ""
        node.doc_string = ""
        node.input[:] = [short(name) for name in node.input]
        node.output[:] = [short(name) for name in node.output]
