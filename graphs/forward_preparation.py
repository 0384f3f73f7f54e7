"""Ready an exported inference model for the reverse sweep: symbolic batch, folded constants, explicit pads.

Exporters leave things a gradient rule cannot use, although the values are fixed for a given input size:
- a static batch dimension (an export traced at batch 1): made symbolic here, and refused with the fix
  when the graph hard-codes it (a Reshape to (1, -1)), instead of failing on the device at batch 2;
- small constant subgraphs (torch computes a Pad's pads with ConstantOfShape, Concat, Reshape, Slice,
  Cast, and a chunk's split points from `Shape`): folded into Constant nodes, so rules see constant
  pads, starts and indices and shape inference sees static shapes. Dims of `Shape` outputs that are
  static fold even when the batch is symbolic. Nothing that reads a float initializer is folded (it may
  be a trainable parameter);
- `auto_pad` (SAME_UPPER, SAME_LOWER, VALID) on Conv and pooling: rewritten to explicit `pads`;
- pooling with `ceil_mode`: rewritten to the equal floor-mode pooling with a larger end pad, because onnx's
  shape inference sizes ceil-mode outputs differently from onnxruntime and torch (which drop a last
  window that would start in the end padding), and the rules need the true shapes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from fedzoo.errors import InvalidInputError

StaticShape = tuple[int | None, ...]
BATCH_DIM = "batch"
_NOT_FOLDED = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli",
               "If", "Loop", "Scan", "Dropout"}  # fmt: skip
_PADDED_OPS = ("Conv", "MaxPool", "AveragePool")
_MAX_FOLD_ROUNDS = 64  # each round can resolve one more Reshape of a chain (one per ShuffleNet unit)


SymbolicShape = tuple[int | str | None, ...]  # a symbolic dim by its name ("batch"), None when unknown


def _dims(value: onnx.ValueInfoProto) -> SymbolicShape:
    return tuple(
        dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None) for dim in value.type.tensor_type.shape.dim
    )


def infer_symbolic_shapes(model: onnx.ModelProto, strict: bool = True) -> dict[str, SymbolicShape]:
    """The shape of every value shape inference (with data propagation through shape ops) can reach;
    `strict` raises on an inconsistency instead of leaving the shapes after it unknown."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=strict, data_prop=True)
    graph = inferred.graph
    shapes = {value.name: _dims(value) for value in [*graph.input, *graph.value_info, *graph.output]}
    shapes.update({init.name: tuple(init.dims) for init in graph.initializer})
    return shapes


def infer_shapes(model: onnx.ModelProto, strict: bool = True) -> dict[str, StaticShape]:
    """The static shape of every value shape inference can reach; symbolic dims are None."""
    return {
        name: tuple(dim if isinstance(dim, int) else None for dim in shape)
        for name, shape in infer_symbolic_shapes(model, strict).items()
    }


def prepare_forward(model: onnx.ModelProto, input_name: str) -> onnx.ModelProto:
    """A copy of `model` with a symbolic batch, its constant subgraphs folded, and auto_pad and ceil-mode
    pooling made explicit pads."""
    prepared = onnx.ModelProto()
    prepared.CopyFrom(model)
    del prepared.graph.value_info[:]  # the exporter's shapes: inferred again as the rewrites go
    exported_batch = _make_batch_symbolic(prepared, input_name)
    for _ in range(_MAX_FOLD_ROUNDS):
        # Pooling sizes first: folding a Shape of a ceil-mode output must see its true size. Until they are
        # right, inference is lenient (onnx's ceil-mode size can contradict a later layer).
        _resolve_auto_pad(prepared, infer_shapes(prepared, strict=False), strict=False)
        _resolve_ceil_mode(prepared, infer_shapes(prepared, strict=False), strict=False)
        if not _fold_constants(prepared, infer_symbolic_shapes(prepared, strict=False)):
            break
    _drop_unused_constants(prepared)
    _resolve_auto_pad(prepared, infer_shapes(prepared), strict=True)
    _resolve_ceil_mode(prepared, infer_shapes(prepared), strict=True)
    if exported_batch is not None:
        _check_batch_follows_input(prepared, input_name, exported_batch)
    return prepared


# the batch -------------------------------------------------------------------------------------


def _make_batch_symbolic(model: onnx.ModelProto, input_name: str) -> int | None:
    """Make a static batch dim of the input (and the outputs) symbolic; returns the exported batch size, if static."""
    graph = model.graph
    input_dims = next(value for value in graph.input if value.name == input_name).type.tensor_type.shape.dim
    if not input_dims or not input_dims[0].HasField("dim_value"):
        return None
    exported_batch = input_dims[0].dim_value
    for dims in [input_dims, *(value.type.tensor_type.shape.dim for value in graph.output)]:
        if dims and dims[0].HasField("dim_value") and dims[0].dim_value == exported_batch:
            dims[0].dim_param = BATCH_DIM  # clears dim_value (a oneof)
    return exported_batch


def _check_batch_follows_input(model: onnx.ModelProto, input_name: str, exported_batch: int) -> None:
    """Refuse a graph exported at a static batch whose output keeps a fixed batch size once the input's is symbolic."""
    shapes = infer_shapes(model)
    output = model.graph.output[0].name
    if shapes.get(output, (None,))[:1] == (None,):
        return
    culprits = [
        node.name or node.op_type
        for node in model.graph.node
        if node.input and shapes.get(node.input[0], (0,))[:1] == (None,)
        and any(shapes.get(name, (None,))[:1] != (None,) for name in node.output)
    ]  # fmt: skip
    raise InvalidInputError(
        f"the model was exported with a static batch of {exported_batch} and its output {output!r} keeps a fixed batch "
        f"of {shapes[output][0]} when the input's batch varies: node(s) {culprits[:3]} hard-code the batch size of the export. Re-export with a dynamic batch, "
        "e.g. torch.onnx.export(..., dynamic_axes={'input': {0: 'batch'}, 'output': {0: 'batch'}}), and reshape "
        "with x.flatten(1) or x.reshape(x.shape[0], -1) rather than a literal batch size",
        field=input_name,
    )


# constant folding ------------------------------------------------------------------------------


def _evaluate(node: onnx.NodeProto, values: Sequence[np.ndarray], opset: int) -> list[np.ndarray]:
    inputs = [name for name in node.input if name]
    graph = helper.make_graph(
        [node], "fold",
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
         for name, value in zip(inputs, values)],
        [helper.make_tensor_value_info(name, TensorProto.UNDEFINED, None) for name in node.output],
    )  # fmt: skip
    evaluator = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))
    return evaluator.run(None, dict(zip(inputs, values)))


def _shape_dims(node: onnx.NodeProto, shape: SymbolicShape) -> list[int | str | None]:
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return list(shape[attributes.get("start", 0) : attributes.get("end", len(shape))])


def _partial_result(node: onnx.NodeProto, partial: dict[str, np.ndarray], known: dict[str, np.ndarray]) -> np.ndarray | None:
    """Shape arithmetic on vectors with symbolic entries (Gather, Unsqueeze, Concat), None for other nodes."""
    inputs = [name for name in node.input if name]
    if not any(name in partial for name in inputs) or not all(name in partial or name in known for name in inputs):
        return None
    values = [partial[name] if name in partial else np.asarray(known[name], dtype=object) for name in inputs]
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Gather" and inputs[0] in partial and attributes.get("axis", 0) == 0:
        return values[0][np.asarray(known[inputs[1]], np.int64)]
    if node.op_type == "Unsqueeze" and inputs[0] in partial:
        return np.expand_dims(values[0], tuple(int(axis) for axis in known[inputs[1]]))
    if node.op_type == "Concat":
        return np.concatenate([np.atleast_1d(value) for value in values], axis=attributes["axis"])
    return None


def _constant_node(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"{name}/folded", value=numpy_helper.from_array(value, name))


def _fold_constants(model: onnx.ModelProto, shapes: dict[str, SymbolicShape]) -> bool:
    """Replace every foldable node by a Constant node, and give Reshapes that copy the batch a constant shape
    (0 = copy the input's dim); True when anything changed."""
    graph = model.graph
    opset = next(entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx"))
    known = {init.name: numpy_helper.to_array(init) for init in graph.initializer if init.data_type != TensorProto.FLOAT}
    partial: dict[str, np.ndarray] = {}  # shape vectors with symbolic entries, as object arrays
    graph_outputs = {value.name for value in graph.output}
    changed = False
    nodes = []
    for node in graph.node:
        values = None
        if node.op_type == "Constant":
            known[node.output[0]] = _evaluate(node, [], opset)[0]
            nodes.append(node)
            continue
        if node.op_type == "Shape" and node.input[0] in shapes:
            values = [np.asarray(_shape_dims(node, shapes[node.input[0]]), dtype=object)]
        elif node.op_type == "Reshape" and node.input[1] in partial:
            _reshape_copying_dims(node, partial[node.input[1]], shapes.get(node.input[0], ()), nodes)
            changed |= node.input[1] not in partial
        elif (result := _partial_result(node, partial, known)) is not None:
            values = [np.asarray(result, dtype=object)]
        elif node.op_type not in _NOT_FOLDED and all(name in known for name in node.input if name):
            values = [np.asarray(v) for v in _evaluate(node, [known[name] for name in node.input if name], opset)]
        if values is not None and values[0].dtype == object and not all(isinstance(v, int) for v in values[0].ravel()):
            partial[node.output[0]] = values[0]
            values = None
        if values is None or graph_outputs & set(node.output):
            nodes.append(node)
            continue
        changed = True
        for name, value in zip(node.output, values):
            value = np.asarray(value, np.int64 if value.dtype == object else value.dtype)
            known[name] = value
            nodes.append(_constant_node(name, value))
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]
    return changed


def _drop_unused_constants(model: onnx.ModelProto) -> None:
    """Remove the Constant nodes folding left without a reader (onnxruntime warns about each)."""
    graph = model.graph
    read = {name for node in graph.node for name in node.input} | {value.name for value in graph.output}
    kept = [node for node in graph.node if node.op_type != "Constant" or node.output[0] in read]
    del graph.node[:]
    graph.node.extend(kept)


def _reshape_copying_dims(node: onnx.NodeProto, target: np.ndarray, input_shape: SymbolicShape, nodes: list) -> None:
    """A Reshape to a shape made from the input's own symbolic dims (x.view(x.size(0), ...)) gets a constant
    shape that copies those dims (entry 0), so shape inference can size its output."""
    allow_zero = any(a.name == "allowzero" and a.i for a in node.attribute)
    entries = list(target)
    for position, entry in enumerate(entries):
        if isinstance(entry, str) and position < len(input_shape) and input_shape[position] == entry and not allow_zero:
            entries[position] = 0
    if all(isinstance(entry, int) for entry in entries):
        name = f"{node.output[0]}/shape"
        nodes.append(_constant_node(name, np.asarray(entries, np.int64)))
        node.input[1] = name


# auto_pad --------------------------------------------------------------------------------------


def _resolve_auto_pad(model: onnx.ModelProto, shapes: dict[str, StaticShape], strict: bool) -> None:
    """Explicit pads for every auto_pad node whose input size is known; `strict`: refuse one whose size is not."""
    for node in model.graph.node:
        if node.op_type not in _PADDED_OPS:
            continue
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        auto_pad = attributes.get("auto_pad", b"NOTSET").decode()
        if auto_pad == "NOTSET":
            continue
        input_shape = shapes.get(node.input[0], ())
        kernel = attributes.get("kernel_shape") or list(shapes.get(node.input[1], ())[2:])
        spatial = len(input_shape) - 2
        if spatial < 1 or len(kernel) != spatial or any(dim is None for dim in input_shape[2:]):
            if not strict:
                continue
            raise InvalidInputError(
                f"{node.op_type} {node.name!r} uses auto_pad={auto_pad} and its input's spatial shape {input_shape} is "
                "not static: export with a fixed input size (the batch may stay symbolic)"
            )
        strides = attributes.get("strides", [1] * spatial)
        dilations = attributes.get("dilations", [1] * spatial)
        begins, ends = [], []
        for axis in range(spatial):
            size = input_shape[2 + axis]
            if auto_pad == "VALID":
                total = 0
            else:
                out = -(-size // strides[axis])
                total = max((out - 1) * strides[axis] + (kernel[axis] - 1) * dilations[axis] + 1 - size, 0)
            small, large = total // 2, total - total // 2
            begins.append(large if auto_pad == "SAME_LOWER" else small)
            ends.append(small if auto_pad == "SAME_LOWER" else large)
        kept = [a for a in node.attribute if a.name not in ("auto_pad", "pads")]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute("pads", [*begins, *ends])])


# ceil_mode -------------------------------------------------------------------------------------


def _ceil_mode_end_pads(size: int, kernel: int, stride: int, begin: int, end: int) -> int:
    """The end pad with which floor-mode pooling yields the ceil-mode output (torch's and onnxruntime's size)."""
    outputs = -(-(size + begin + end - kernel) // stride) + 1
    if (outputs - 1) * stride >= size + begin:  # the last window would start in the end padding
        outputs -= 1
    return max(end, (outputs - 1) * stride + kernel - size - begin)


def _resolve_ceil_mode(model: onnx.ModelProto, shapes: dict[str, StaticShape], strict: bool) -> None:
    """Floor-mode pads for every ceil-mode pooling whose input size is known; `strict`: refuse one whose size is not."""
    for node in model.graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type not in ("MaxPool", "AveragePool") or not attributes.get("ceil_mode", 0):
            continue
        input_shape = shapes.get(node.input[0], ())
        if len(input_shape) < 3 or any(dim is None for dim in input_shape[2:]):
            if not strict:
                continue
            raise InvalidInputError(f"{node.op_type} {node.name!r} uses ceil_mode and needs a static input size, got {input_shape}")
        kernel = attributes["kernel_shape"]
        spatial = len(kernel)
        strides = attributes.get("strides", [1] * spatial)
        dilations = attributes.get("dilations", [1] * spatial)
        pads = list(attributes.get("pads", [0] * 2 * spatial))
        ends = [
            _ceil_mode_end_pads(input_shape[2 + axis], (kernel[axis] - 1) * dilations[axis] + 1, strides[axis], pads[axis], pads[spatial + axis])
            for axis in range(spatial)
        ]  # fmt: skip
        if ends != pads[spatial:] and node.op_type == "AveragePool" and attributes.get("count_include_pad", 0):
            raise InvalidInputError(
                f"AveragePool {node.name!r}: ceil_mode with count_include_pad makes windows that run past the padding; "
                "no gradient rule for that: export with ceil_mode=False or count_include_pad=False"
            )
        kept = [a for a in node.attribute if a.name not in ("ceil_mode", "pads")]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute("pads", [*pads[:spatial], *ends])])
