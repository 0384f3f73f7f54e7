"""Test helpers for the ONNX autodiff: run an ONNX graph in torch (so torch autograd gives reference
gradients for exactly the same computation) and run our training graph in onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper


def _conv(inputs, attributes):
    x, weight = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    pads = attributes.get("pads", [0, 0, 0, 0])
    x = F.pad(x, (pads[1], pads[3], pads[0], pads[2]))
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
    "Squeeze": lambda inputs, attributes: inputs[0].squeeze(tuple(int(axis) for axis in inputs[1])),
    "Unsqueeze": lambda inputs, attributes: inputs[0].reshape(
        _unsqueezed_shape(inputs[0].shape, [int(axis) for axis in inputs[1]])
    ),
    "Identity": lambda inputs, attributes: inputs[0],
    "Transpose": lambda inputs, attributes: inputs[0].permute(
        attributes.get("perm", list(reversed(range(inputs[0].dim()))))
    ),
}


def _unsqueezed_shape(shape, axes):
    rank = len(shape) + len(axes)
    axes = sorted(axis % rank for axis in axes)
    dims = iter(shape)
    return [1 if index in axes else next(dims) for index in range(rank)]


def torch_reference_gradients(
    model: onnx.ModelProto, x: np.ndarray, y: np.ndarray, loss: str, trainable: list[str]
) -> tuple[float, dict[str, np.ndarray]]:
    """Loss and gradients of `trainable` initializers from torch autograd on the same ONNX graph."""
    values: dict[str, torch.Tensor] = {}
    for init in model.graph.initializer:
        values[init.name] = torch.tensor(numpy_helper.to_array(init).copy(), requires_grad=init.name in trainable)
    values[model.graph.input[0].name] = torch.tensor(x)
    for node in model.graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Constant":
            values[node.output[0]] = torch.tensor(numpy_helper.to_array(attributes["value"]).copy())
            continue
        inputs = [values[name] if name else None for name in node.input]
        values[node.output[0]] = TORCH_OPS[node.op_type](inputs, attributes)
    output = values[model.graph.output[0].name]
    target = torch.tensor(y)
    value = F.cross_entropy(output, target) if loss == "cross_entropy" else F.mse_loss(output, target)
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
