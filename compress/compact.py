"""Strip an ONNX file down to what a device needs to run it, without changing one computed value.

A small model's file is not only its weights: the quantizer's generated tensor and node names, the
shapes recorded in `value_info`, doc strings, metadata, opset imports of unused domains and all-zero
zero-point vectors can add a quarter to the weights' bytes. `compact_model` removes them; the same
cleanup applies to an fp32 model, so size ratios can be taken between two equally cleaned files.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

# Symmetric int8 weights and int32 biases have all-zero zero points; for DequantizeLinear of these types
# the zero-point input is optional and defaults to 0, so the vector is dead weight.
_ZERO_POINT_OPTIONAL_TYPES = (onnx.TensorProto.INT8, onnx.TensorProto.INT32)
# QLinearConv accepts a scalar weight zero point with per-channel scales; one shared scalar replaces the
# per-channel zero vectors (QGemm does not: its scale and zero point must have the same shape).
_SCALAR_ZERO_POINT_INPUT = {"QLinearConv": 5}


def compact_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` without names, shapes, docs and zero vectors it does not need.

    The graph's inputs and outputs keep their names (devices feed and fetch them by name).
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    del graph.value_info[:]
    del model.metadata_props[:]
    model.doc_string = graph.doc_string = ""
    used_domains = {node.domain or "" for node in graph.node} | {""}
    kept_opsets = [opset for opset in model.opset_import if (opset.domain or "") in used_domains or opset.domain == "ai.onnx"]
    del model.opset_import[:]
    model.opset_import.extend(kept_opsets)
    _drop_zero_points(graph)
    _deduplicate_initializers(graph)
    _shorten_names(graph)
    return model


def _all_zero_vector(tensor: onnx.TensorProto | None) -> bool:
    if tensor is None or len(tensor.dims) != 1:
        return False
    return not numpy_helper.to_array(tensor).any()


def _drop_zero_points(graph: onnx.GraphProto) -> None:
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    shared_zero: str | None = None
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and len(node.input) == 3:
            quantized = initializers.get(node.input[0])
            if quantized is not None and quantized.data_type in _ZERO_POINT_OPTIONAL_TYPES and _all_zero_vector(initializers.get(node.input[2])):
                del node.input[2]
        slot = _SCALAR_ZERO_POINT_INPUT.get(node.op_type)
        if slot is not None and len(node.input) > slot and _all_zero_vector(zero := initializers.get(node.input[slot])):
            if shared_zero is None:
                shared_zero = "weight_zero"
                graph.initializer.append(numpy_helper.from_array(np.zeros((), numpy_helper.to_array(zero).dtype), shared_zero))
            node.input[slot] = shared_zero
    used = {name for node in graph.node for name in node.input}
    kept = [tensor for tensor in graph.initializer if tensor.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)


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


def _shorten_names(graph: onnx.GraphProto) -> None:
    kept = {value.name for value in [*graph.input, *graph.output]}
    renamed: dict[str, str] = {}

    def short(name: str) -> str:
        if not name or name in kept:
            return name
        return renamed.setdefault(name, f"t{len(renamed)}")

    for tensor in graph.initializer:
        tensor.name = short(tensor.name)
    for index, node in enumerate(graph.node):
        node.name = f"n{index}"
        node.doc_string = ""
        node.input[:] = [short(name) for name in node.input]
        node.output[:] = [short(name) for name in node.output]
