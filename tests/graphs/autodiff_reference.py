"""Test helpers for the ONNX autodiff: run an ONNX graph in torch, in float64 (so torch autograd gives
reference gradients for exactly the same computation), and run our training graph in onnxruntime.

The torch forms are written from the ONNX operator specification, independently of our rules and of
`fedzoo.graphs.forward_preparation` (shape subgraphs, Pad's computed pads and auto_pad run as the ONNX
graph says)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper


def _same_pads(attributes, spatial_in, kernel):
    """Explicit pads of an auto_pad attribute (ONNX spec: SAME_UPPER puts the odd pixel at the end)."""
    mode = attributes.get("auto_pad", b"NOTSET").decode()
    if mode == "NOTSET":
        return attributes.get("pads", [0] * 2 * len(kernel))
    strides = attributes.get("strides", [1] * len(kernel))
    dilations = attributes.get("dilations", [1] * len(kernel))
    begins, ends = [], []
    for size, k, stride, dilation in zip(spatial_in, kernel, strides, dilations):
        total = 0 if mode == "VALID" else max((-(-size // stride) - 1) * stride + (k - 1) * dilation + 1 - size, 0)
        begins.append(total - total // 2 if mode == "SAME_LOWER" else total // 2)
        ends.append(total // 2 if mode == "SAME_LOWER" else total - total // 2)
    return begins + ends


def _torch_pads(pads):
    """ONNX (begin..., end...) over the last len/2 axes to F.pad's (last begin, last end, ...)."""
    rank = len(pads) // 2
    return [value for axis in reversed(range(rank)) for value in (pads[axis], pads[rank + axis])]


def _conv(inputs, attributes):
    x, weight = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    pads = _same_pads(attributes, x.shape[2:], weight.shape[2:])
    x = F.pad(x, _torch_pads(pads))
    return F.conv2d(
        x, weight, bias, stride=attributes.get("strides", 1), dilation=attributes.get("dilations", 1),
        groups=attributes.get("group", 1),
    )  # fmt: skip


def _gemm(inputs, attributes):
    a = inputs[0].T if attributes.get("transA", 0) else inputs[0]
    b = inputs[1].T if attributes.get("transB", 0) else inputs[1]
    out = attributes.get("alpha", 1.0) * (a @ b)
    return out + attributes.get("beta", 1.0) * inputs[2] if len(inputs) > 2 else out


def _clip(inputs, attributes):
    low = float(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else -torch.inf
    high = float(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else torch.inf
    return F.hardtanh(inputs[0], low, high)


def _hard_sigmoid(inputs, attributes):
    alpha, beta = attributes.get("alpha", 0.2), attributes.get("beta", 0.5)
    # torch's own hardsigmoid has alpha=1/6, beta=1/2; other slopes via hardtanh (same strict mask).
    return F.hardtanh(alpha * inputs[0] + beta, 0.0, 1.0)


def _axes(inputs, attributes, index, rank):
    axes = attributes.get("axes")
    if axes is None and len(inputs) > index and inputs[index] is not None:
        axes = [int(axis) for axis in inputs[index]]
    if not axes:
        return None if attributes.get("noop_with_empty_axes", 0) else list(range(rank))
    return [axis % rank for axis in axes]


def _reduce(function):
    def reduce(inputs, attributes):
        axes = _axes(inputs, attributes, 1, inputs[0].dim())
        if axes is None:
            return inputs[0]
        return function(inputs[0], dim=axes, keepdim=bool(attributes.get("keepdims", 1)))
    return reduce


def _max_pool(inputs, attributes):
    kernel = attributes["kernel_shape"]
    x = inputs[0]
    pads = _same_pads(attributes, x.shape[2:], kernel)
    if pads[:2] != pads[2:]:  # asymmetric (auto_pad): pad explicitly, torch pads symmetrically only
        x, pads = F.pad(x, _torch_pads(pads), value=-torch.inf), [0, 0, 0, 0]
    return F.max_pool2d(x, kernel, attributes.get("strides", kernel), pads[:2], attributes.get("dilations", 1),
                        ceil_mode=bool(attributes.get("ceil_mode", 0)))  # fmt: skip


def _average_pool(inputs, attributes):
    kernel = attributes["kernel_shape"]
    pads = _same_pads(attributes, inputs[0].shape[2:], kernel)
    if pads[:2] == pads[2:] and attributes.get("auto_pad", b"NOTSET") == b"NOTSET":
        return F.avg_pool2d(inputs[0], kernel, attributes.get("strides", kernel), pads[:2],
                            ceil_mode=bool(attributes.get("ceil_mode", 0)),
                            count_include_pad=bool(attributes.get("count_include_pad", 0)))  # fmt: skip
    # Asymmetric pads (auto_pad): average over the valid elements only, as ONNX without count_include_pad.
    padded = F.pad(inputs[0], _torch_pads(pads))
    ones = F.pad(torch.ones_like(inputs[0]), _torch_pads(pads))
    stride = attributes.get("strides", kernel)
    return F.avg_pool2d(padded, kernel, stride, divisor_override=1) / F.avg_pool2d(ones, kernel, stride, divisor_override=1)


def _pad(inputs, attributes):
    x, pads = inputs[0], [int(p) for p in inputs[1]]
    rank = x.dim()
    axes = list(range(rank)) if len(inputs) < 4 or inputs[3] is None else [int(a) % rank for a in inputs[3]]
    full = [0] * (2 * rank)
    for index, axis in enumerate(axes):
        full[axis], full[rank + axis] = pads[index], pads[len(axes) + index]
    mode = attributes.get("mode", b"constant").decode()
    first = rank - 2  # torch pads (at most) the last dims; the tests pad only the spatial ones
    torch_pads = _torch_pads([*full[first:rank], *full[rank + first:]])
    value = float(inputs[2]) if len(inputs) > 2 and inputs[2] is not None and mode == "constant" else 0.0
    if mode == "constant":
        return F.pad(x, torch_pads, value=value)
    return F.pad(x, torch_pads, mode={"reflect": "reflect", "edge": "replicate"}[mode])


def _slice(inputs, attributes):
    x = inputs[0]
    starts, ends = [int(v) for v in inputs[1]], [int(v) for v in inputs[2]]
    axes = range(len(starts)) if len(inputs) < 4 or inputs[3] is None else [int(a) for a in inputs[3]]
    steps = [1] * len(starts) if len(inputs) < 5 or inputs[4] is None else [int(v) for v in inputs[4]]
    for start, end, axis, step in zip(starts, ends, axes, steps):
        selected = np.arange(x.shape[axis])[slice(start, end, step)]
        x = x.index_select(axis % x.dim(), torch.tensor(selected.copy(), dtype=torch.long))
    return x


def _gather(inputs, attributes):
    x, indices = inputs[0], inputs[1].long()
    axis = attributes.get("axis", 0) % x.dim()
    picked = x.index_select(axis, (indices.reshape(-1) % x.shape[axis]))
    return picked.reshape((*x.shape[:axis], *indices.shape, *x.shape[axis + 1:]))


def _split(inputs, attributes):
    x = inputs[0]
    axis = attributes.get("axis", 0) % x.dim()
    if len(inputs) > 1 and inputs[1] is not None:
        return torch.split(x, [int(v) for v in inputs[1]], dim=axis)
    return torch.chunk(x, attributes.get("num_outputs", attributes["output_count"]), dim=axis)


def _resize_nearest(inputs, attributes):
    """Resize with mode nearest, coordinate mode asymmetric and nearest_mode floor (what torch exports)."""
    x = inputs[0]
    scales = inputs[2] if len(inputs) > 2 and inputs[2] is not None and inputs[2].numel() else None
    for axis in range(x.dim()):
        size = x.shape[axis]
        out = int(inputs[3][axis]) if scales is None else int(np.floor(size * float(scales[axis])))
        if out != size:
            scale = out / size if scales is None else float(scales[axis])
            sources = np.minimum(np.floor(np.arange(out) / scale), size - 1).astype(np.int64)
            x = x.index_select(axis, torch.tensor(sources))
    return x


def _layer_norm(inputs, attributes):
    x = inputs[0]
    axis = attributes.get("axis", -1) % x.dim()
    bias = inputs[2] if len(inputs) > 2 else None
    return F.layer_norm(x, x.shape[axis:], inputs[1], bias, attributes.get("epsilon", 1e-5))


def _cast(inputs, attributes):
    dtype = {1: torch.float64, 6: torch.int32, 7: torch.int64, 9: torch.bool, 11: torch.float64}[attributes["to"]]
    return inputs[0].to(dtype)


def _div(inputs, attributes):
    if inputs[0].is_floating_point():
        return inputs[0] / inputs[1]
    return torch.div(inputs[0], inputs[1], rounding_mode="trunc")


def _selu(inputs, attributes):
    alpha = attributes.get("alpha", 1.67326319217681884765625)
    gamma = attributes.get("gamma", 1.05070102214813232421875)
    x = inputs[0]
    return gamma * torch.where(x > 0, x, alpha * (torch.exp(x) - 1))


TORCH_OPS = {
    "Conv": _conv,
    "Gemm": _gemm,
    "MatMul": lambda inputs, attributes: inputs[0] @ inputs[1],
    "Add": lambda inputs, attributes: inputs[0] + inputs[1],
    "Sub": lambda inputs, attributes: inputs[0] - inputs[1],
    "Mul": lambda inputs, attributes: inputs[0] * inputs[1],
    "Relu": lambda inputs, attributes: F.relu(inputs[0]),
    "Clip": _clip,
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": lambda inputs, attributes: F.hardswish(inputs[0]),
    "GlobalAveragePool": lambda inputs, attributes: inputs[0].mean(dim=tuple(range(2, inputs[0].dim())), keepdim=True),
    "Flatten": lambda inputs, attributes: inputs[0].reshape(
        int(np.prod(inputs[0].shape[: attributes.get("axis", 1)])), -1
    ),
    "Reshape": lambda inputs, attributes: inputs[0].reshape(
        [inputs[0].shape[i] if int(d) == 0 else int(d) for i, d in enumerate(inputs[1])]
    ),
    "Unsqueeze": lambda inputs, attributes: inputs[0].reshape(
        _unsqueezed_shape(inputs[0].shape, [int(axis) for axis in inputs[1]])
    ),
    "Squeeze": lambda inputs, attributes: inputs[0].squeeze(tuple(int(axis) for axis in inputs[1])),
    "Identity": lambda inputs, attributes: inputs[0],
    "Sigmoid": lambda inputs, attributes: torch.sigmoid(inputs[0]),
    "PRelu": lambda inputs, attributes: torch.where(inputs[0] > 0, inputs[0], inputs[0] * inputs[1]),
    "Sum": lambda inputs, attributes: sum(inputs[1:], inputs[0]),
    "Tanh": lambda inputs, attributes: torch.tanh(inputs[0]),
    "LeakyRelu": lambda inputs, attributes: F.leaky_relu(inputs[0], attributes.get("alpha", 0.01)),
    "Elu": lambda inputs, attributes: F.elu(inputs[0], attributes.get("alpha", 1.0)),
    "Selu": _selu,
    "Softplus": lambda inputs, attributes: F.softplus(inputs[0]),
    "Erf": lambda inputs, attributes: torch.erf(inputs[0]),
    "Exp": lambda inputs, attributes: torch.exp(inputs[0]),
    "Log": lambda inputs, attributes: torch.log(inputs[0]),
    "Sqrt": lambda inputs, attributes: torch.sqrt(inputs[0]),
    "Neg": lambda inputs, attributes: -inputs[0],
    "Abs": lambda inputs, attributes: torch.abs(inputs[0]),
    "Pow": lambda inputs, attributes: torch.pow(inputs[0], inputs[1]),
    "Div": _div,
    "Softmax": lambda inputs, attributes: torch.softmax(inputs[0], attributes.get("axis", -1)),
    "LogSoftmax": lambda inputs, attributes: torch.log_softmax(inputs[0], attributes.get("axis", -1)),
    "Dropout": lambda inputs, attributes: inputs[0],
    "Expand": lambda inputs, attributes: inputs[0] * torch.ones([int(d) for d in inputs[1]], dtype=inputs[0].dtype),
    "ReduceSum": _reduce(torch.sum),
    "ReduceMean": _reduce(torch.mean),
    "LayerNormalization": _layer_norm,
    "BatchNormalization": lambda inputs, attributes: F.batch_norm(
        inputs[0], inputs[3], inputs[4], inputs[1], inputs[2], False, 0.0, attributes.get("epsilon", 1e-5)),
    "Concat": lambda inputs, attributes: torch.cat(inputs, dim=attributes["axis"]),
    "Split": _split,
    "Slice": _slice,
    "Gather": _gather,
    "Pad": _pad,
    "Resize": _resize_nearest,
    "MaxPool": _max_pool,
    "AveragePool": _average_pool,
    "GlobalMaxPool": lambda inputs, attributes: inputs[0].amax(dim=(2, 3), keepdim=True),
    "Shape": lambda inputs, attributes: torch.tensor(inputs[0].shape, dtype=torch.int64),
    "Cast": _cast,
    "ConstantOfShape": lambda inputs, attributes: torch.full(
        [int(d) for d in inputs[0]], float(numpy_helper.to_array(attributes["value"])[0]) if "value" in attributes else 0.0,
        dtype=torch.int64 if "value" in attributes and attributes["value"].data_type == 7 else torch.float64),
    "Transpose": lambda inputs, attributes: inputs[0].permute(
        attributes.get("perm", list(reversed(range(inputs[0].dim()))))
    ),
}


def _unsqueezed_shape(shape, axes):
    rank = len(shape) + len(axes)
    axes = sorted(axis % rank for axis in axes)
    dims = iter(shape)
    return [1 if index in axes else next(dims) for index in range(rank)]


def _as_torch(value: np.ndarray, requires_grad: bool = False) -> torch.Tensor:
    """float32 values become float64, so the reference is more precise than what it checks."""
    array = value.astype(np.float64) if value.dtype == np.float32 else value
    return torch.tensor(array.copy(), requires_grad=requires_grad)


def torch_reference_gradients(
    model: onnx.ModelProto, x: np.ndarray, y: np.ndarray, loss: str, trainable: list[str], label_smoothing: float = 0.0
) -> tuple[float, dict[str, np.ndarray]]:
    """Loss and gradients of `trainable` initializers from torch autograd (float64) on the same ONNX graph."""
    values: dict[str, torch.Tensor] = {}
    for init in model.graph.initializer:
        values[init.name] = _as_torch(numpy_helper.to_array(init), requires_grad=init.name in trainable)
    values[model.graph.input[0].name] = _as_torch(x)
    for node in model.graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attributes["output_count"] = len(node.output)  # an equal Split without num_outputs has that many parts
        if node.op_type == "Constant":
            values[node.output[0]] = _as_torch(numpy_helper.to_array(attributes["value"]))
            continue
        inputs = [values[name] if name else None for name in node.input]
        result = TORCH_OPS[node.op_type](inputs, attributes)
        for name, value in zip(node.output, result if isinstance(result, tuple) else (result,)):
            values[name] = value
    output = values[model.graph.output[0].name]
    target = _as_torch(y)
    if loss == "cross_entropy":
        value = F.cross_entropy(output, target, label_smoothing=label_smoothing)
    elif loss == "bce":
        value = F.binary_cross_entropy_with_logits(output, target)
    else:
        value = F.mse_loss(output, target)
    value.backward()
    return float(value.detach()), {name: values[name].grad.numpy() for name in trainable}


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {init.name: numpy_helper.to_array(init).copy() for init in model.graph.initializer}


def run_training_graph(
    graph: onnx.ModelProto, x: np.ndarray, y: np.ndarray, parameters: dict[str, np.ndarray]
) -> tuple[float, dict[str, np.ndarray]]:
    """Loss and gradients computed by our training graph in onnxruntime."""
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [spec.name for spec in session.get_inputs()][2:]
    outputs = ["loss", *(f"grad.{name}" for name in names)]
    loss, *grads = session.run(outputs, {"x": x, "y": y, **{name: parameters[name] for name in names}})
    return float(loss), dict(zip(names, grads))


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """Max abs difference relative to the largest reference magnitude (0 when both are zero)."""
    scale = max(float(np.abs(expected).max()), 1e-12)
    return float(np.abs(actual - expected).max()) / scale
