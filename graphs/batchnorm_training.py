"""BatchNormalization in training mode, written in ops that have gradient rules (the `batch_norm="training"`
option of `fedzoo.graphs.autodiff.build_training_graph`).

A model exported without BatchNorm folding (`torch.onnx.export(..., do_constant_folding=False)`) keeps its
BatchNormalization nodes. In training mode each is rewritten into what torch's train-mode BatchNorm computes:
normalisation with the batch's own mean and biased variance over every axis but the channels, so the
reverse sweep differentiates through the statistics like torch autograd does. The rewrite also computes
the updated running statistics (ONNX momentum m: running * m + batch * (1 - m), the variance unbiased like
torch's); they become graph outputs `running.<statistic>` and the old values graph inputs named like the
initializers, so a device feeds them each step and keeps the outputs (`fedzoo.edge.trainer.Trainer` does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RUNNING_PREFIX = "running."


def running_name(statistic: str) -> str:
    """The training-graph output holding the updated value of running statistic `statistic`."""
    return RUNNING_PREFIX + statistic


@dataclass
class LoweredBatchNorms:
    """The rewritten forward nodes, their constants and the running statistics they update (initializer names)."""

    nodes: list[onnx.NodeProto]
    constants: list[onnx.TensorProto]
    statistics: list[str]


def lower_batch_norms(
    nodes: list[onnx.NodeProto], ranks: dict[str, int], fresh_name: Callable[[str], str]
) -> LoweredBatchNorms:
    """Every BatchNormalization of `nodes` as batch-statistics ops; `ranks` gives each BN input's rank."""
    lowered = LoweredBatchNorms([], [], [])

    def constant(value: np.ndarray) -> str:
        name = fresh_name("batch_norm/const")
        lowered.constants.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def emit(op_type: str, inputs: list[str], output: str | None = None, **attributes) -> str:
        output = output or fresh_name(f"batch_norm/{op_type}")
        lowered.nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attributes))
        return output

    for node in nodes:
        if node.op_type != "BatchNormalization":
            lowered.nodes.append(node)
            continue
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        epsilon, momentum = attributes.get("epsilon", 1e-5), attributes.get("momentum", 0.9)
        x, scale, bias, running_mean, running_var = node.input[:5]
        rank = ranks[x]
        axes = constant(np.asarray([0, *range(2, rank)], np.int64))
        per_channel = constant(np.asarray([-1, *[1] * (rank - 2)], np.int64))
        channels = emit("Gather", [emit("Shape", [x]), constant(np.asarray(1, np.int64))])
        count = emit("Cast", [emit("Div", [emit("Size", [x]), channels])], to=TensorProto.FLOAT)  # values per channel
        mean = emit("Div", [emit("ReduceSum", [x, axes], keepdims=1), count])
        centered = emit("Sub", [x, mean])
        variance = emit("Div", [emit("ReduceSum", [emit("Mul", [centered, centered]), axes], keepdims=1), count])
        normalized = emit("Div", [centered, emit("Sqrt", [emit("Add", [variance, constant(np.float32(epsilon))])])])
        scaled = emit("Mul", [normalized, emit("Reshape", [scale, per_channel])])
        emit("Add", [scaled, emit("Reshape", [bias, per_channel])], node.output[0])
        unbiased = emit("Mul", [variance, emit("Div", [count, emit("Sub", [count, constant(np.float32(1.0))])])])
        keep, take = constant(np.float32(momentum)), constant(np.float32(1.0 - momentum))
        for statistic, batch_value in ((running_mean, mean), (running_var, unbiased)):
            flat = emit("Reshape", [batch_value, constant(np.asarray([-1], np.int64))])
            emit("Add", [emit("Mul", [statistic, keep]), emit("Mul", [flat, take])], running_name(statistic))
            lowered.statistics.append(statistic)
    return lowered
