"""Read an INT8 model in QOperator form (QLinearConv, com.microsoft QGemm, QLinearAdd, ...) as its QDQ
equivalent (DequantizeLinear -> Conv -> QuantizeLinear), so the kernel splitter needs only one INT8 form.

onnxruntime runs both forms as the same fused kernels: it folds each QDQ sandwich into the very QLinear
op the QOperator form spells out. The QOperator ops of the com.microsoft domain are opaque to ONNX shape
inference, and the splitter's fusion rules are written for QDQ graphs; rewritten, a QOperator model splits
into the kernel list of its QDQ twin. The rewrite is exact (the bias is dequantized with the product of its
operands' scales, as the quantizer made it), so the result also computes what the QOperator model does.

A standard op may read a quantized tensor directly (the quantizer leaves Flatten, Reshape, MaxPool, ...
on uint8 data); it is wrapped in a DequantizeLinear and a QuantizeLinear with its input's parameters, as
the QDQ form does. Any other op on quantized data has no rule here and is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedzoo.errors import InvalidInputError


@dataclass(frozen=True)
class _Rule:
    """Where a QOperator op keeps its operands: each quantized operand's slot is followed by its scale and
    zero point; the output scale and zero point sit at `output` (None: the op returns float)."""

    float_op: str
    operands: slice  # input slots of the quantized operands, e.g. slice(0, 4, 3) -> slots 0 and 3
    output: int | None
    bias: int | None = None  # an int32 bias, scaled by the product of the first two operands' scales
    weight_axis: int = 0  # the channel axis of a per-channel weight (the second operand)


QOPERATOR_RULES: dict[str, _Rule] = {
    "QLinearConv": _Rule("Conv", slice(0, 4, 3), output=6, bias=8),
    "QLinearMatMul": _Rule("MatMul", slice(0, 4, 3), output=6, weight_axis=1),
    "QGemm": _Rule("Gemm", slice(0, 4, 3), output=7, bias=6),  # transB=0 moves the weight axis (see _weight_axis)
    "QLinearAdd": _Rule("Add", slice(0, 4, 3), output=6),
    "QLinearMul": _Rule("Mul", slice(0, 4, 3), output=6),
    "QLinearGlobalAveragePool": _Rule("GlobalAveragePool", slice(0, 1), output=3),
    "QLinearAveragePool": _Rule("AveragePool", slice(0, 1), output=3),
    "QLinearSigmoid": _Rule("Sigmoid", slice(0, 1), output=3),
    "QLinearLeakyRelu": _Rule("LeakyRelu", slice(0, 1), output=3),
    "QLinearSoftmax": _Rule("Softmax", slice(0, 1), output=3),
    "QLinearConcat": _Rule("Concat", slice(2, None, 3), output=0),
}
# Attributes of the QOperator ops that their float twins do not have.
QOPERATOR_ONLY_ATTRIBUTES = frozenset({"channels_last", "opset"})
# Standard ops the quantizer leaves on quantized data: their output keeps their input's scale and zero point.
DIRECT_8BIT_OPS = frozenset({
    "Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "MaxPool", "Gather", "Split", "Pad", "Resize", "Slice",
})  # fmt: skip


def is_qoperator(model: Any) -> bool:
    """Whether the ONNX model holds any QOperator op this module rewrites."""
    return any(node.op_type in QOPERATOR_RULES for node in model.graph.node)


def qoperator_as_qdq(model: Any) -> Any:
    """A copy of `model` with every QOperator op replaced by DequantizeLinear -> float op -> QuantizeLinear."""
    import onnx

    result = onnx.ModelProto()
    result.CopyFrom(model)
    _Rewriter(result.graph).rewrite()
    if not any(node.domain == "com.microsoft" for node in result.graph.node):
        kept = [opset for opset in result.opset_import if opset.domain != "com.microsoft"]
        del result.opset_import[:]
        result.opset_import.extend(kept)
    return result


class _Rewriter:
    """Walks the graph in order, tracking each quantized tensor's (scale, zero point) input names."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.initializers = {tensor.name: tensor for tensor in graph.initializer}
        self.quantization: dict[str, tuple[str, str]] = {}  # quantized tensor -> (scale, zero point)
        self.dequantized: dict[tuple[str, str, str], str] = {}  # (tensor, scale, zero point) -> its float twin
        self.nodes: list[Any] = []
        self.fresh = 0

    def rewrite(self) -> None:
        for node in self.graph.node:
            if node.op_type in QOPERATOR_RULES:
                self._rewrite_qoperator(node, QOPERATOR_RULES[node.op_type])
            elif node.op_type == "QuantizeLinear":
                self.quantization[node.output[0]] = (node.input[1], node.input[2] if len(node.input) > 2 else "")
                self.nodes.append(node)
            elif node.op_type == "DequantizeLinear" or not any(name in self.quantization for name in node.input):
                self.nodes.append(node)
            elif node.op_type in DIRECT_8BIT_OPS:
                self._wrap_direct_8bit(node)
            else:
                raise InvalidInputError(
                    f"{node.op_type} node {node.name!r} reads quantized data and has no QDQ rule; "
                    f"known QOperator ops: {sorted(QOPERATOR_RULES)}, 8-bit ops: {sorted(DIRECT_8BIT_OPS)}",
                    field="model",
                )
        del self.graph.node[:]
        self.graph.node.extend(self.nodes)
        used = {name for node in self.nodes for name in node.input} | {value.name for value in self.graph.output}
        kept = [tensor for tensor in self.graph.initializer if tensor.name in used]
        del self.graph.initializer[:]
        self.graph.initializer.extend(kept)

    def _name(self, stem: str) -> str:
        self.fresh += 1
        return f"{stem}.qdq{self.fresh}"

    def _initializer(self, stem: str, array: Any) -> str:
        from onnx import numpy_helper

        name = self._name(stem)
        self.graph.initializer.append(numpy_helper.from_array(array, name))
        self.initializers[name] = self.graph.initializer[-1]
        return name

    def _array(self, name: str, node: Any) -> Any:
        from onnx import numpy_helper

        if name not in self.initializers:
            raise InvalidInputError(f"{node.op_type} node {node.name!r}: quantization parameter {name!r} is not an initializer", field="model")
        return numpy_helper.to_array(self.initializers[name])

    def _dequantize(self, tensor: str, scale: str, zero_point: str, node: Any, axis: int) -> str:
        """The float twin of quantized `tensor` (one DequantizeLinear per tensor); a per-channel scale gets
        `axis` and a zero point of its own shape (compaction may have shared one scalar between channels)."""
        import numpy as np
        from onnx import helper

        key = (tensor, scale, zero_point)  # a shared int32 bias is dequantized with each conv's own scale
        if key in self.dequantized:
            return self.dequantized[key]
        scale_shape = self._array(scale, node).shape
        attributes = {}
        if scale_shape:
            attributes["axis"] = axis
            if zero_point and self._array(zero_point, node).shape != scale_shape:
                zero_point = self._initializer(zero_point, np.full(scale_shape, self._array(zero_point, node)))
        output = self._name(tensor)
        self.nodes.append(helper.make_node("DequantizeLinear", [tensor, scale, zero_point] if zero_point else [tensor, scale], [output], **attributes))
        self.dequantized[key] = output
        return output

    def _quantize(self, float_tensor: str, output: str, scale: str, zero_point: str) -> None:
        from onnx import helper

        self.nodes.append(helper.make_node("QuantizeLinear", [float_tensor, scale, zero_point] if zero_point else [float_tensor, scale], [output]))
        self.quantization[output] = (scale, zero_point)

    def _rewrite_qoperator(self, node: Any, rule: _Rule) -> None:
        from onnx import helper

        inputs = list(node.input)
        slots = range(len(inputs))[rule.operands]
        weight_axis = _weight_axis(node, rule)
        float_inputs = [
            self._dequantize(inputs[slot], inputs[slot + 1], inputs[slot + 2], node, weight_axis if index == 1 else 1)
            for index, slot in enumerate(slots)
        ]
        if rule.bias is not None and len(inputs) > rule.bias and inputs[rule.bias]:
            bias_scale = self._array(inputs[slots[0] + 1], node) * self._array(inputs[slots[1] + 1], node)
            bias_scale_name = self._initializer(inputs[rule.bias], bias_scale.astype("float32"))
            float_inputs.append(self._dequantize(inputs[rule.bias], bias_scale_name, "", node, 0))
        attributes = [attribute for attribute in node.attribute if attribute.name not in QOPERATOR_ONLY_ATTRIBUTES]
        if any(attribute.name == "channels_last" and attribute.i for attribute in node.attribute):
            raise InvalidInputError(f"{node.op_type} node {node.name!r} is channels-last, which has no QDQ twin here", field="model")
        quantized_output = rule.output is not None and len(inputs) > rule.output and inputs[rule.output]
        float_output = self._name(node.output[0]) if quantized_output else node.output[0]
        float_node = helper.make_node(rule.float_op, float_inputs, [float_output], name=node.name)
        float_node.attribute.extend(attributes)
        self.nodes.append(float_node)
        if quantized_output:
            zero_point = inputs[rule.output + 1] if len(inputs) > rule.output + 1 else ""
            self._quantize(float_output, node.output[0], inputs[rule.output], zero_point)

    def _wrap_direct_8bit(self, node: Any) -> None:
        from onnx import helper

        quantized = [name for name in node.input if name in self.quantization]
        scale, zero_point = self.quantization[quantized[0]]
        inputs = [self._dequantize(name, *self.quantization[name], node, 1) if name in self.quantization else name for name in node.input]
        outputs = [self._name(name) for name in node.output]
        float_node = helper.make_node(node.op_type, inputs, outputs, name=node.name, domain=node.domain)
        float_node.attribute.extend(node.attribute)
        self.nodes.append(float_node)
        for float_output, output in zip(outputs, node.output):
            self._quantize(float_output, output, scale, zero_point)


def _weight_axis(node: Any, rule: _Rule) -> int:
    """The channel axis of the weight: QGemm's weight is (N, K) with transB=1, (K, N) without."""
    if node.op_type == "QGemm":
        return 0 if any(attribute.name == "transB" and attribute.i for attribute in node.attribute) else 1
    return rule.weight_axis
