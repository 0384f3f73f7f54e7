"""Split an ONNX graph into the fused kernels onnxruntime actually runs, each with its shape features.

In the manner of nn-Meter, latency is predicted per kernel, not per ONNX node: the runtime fuses
Conv + BatchNormalization + activation (+ the residual Add, in fp32) into one kernel, and folds a QDQ
sandwich (DequantizeLinear -> Conv -> QuantizeLinear) into one QLinearConv. So the splitter looks through
Q/DQ nodes to the compute nodes, marks those fed through a DequantizeLinear as int8, and then greedily
fuses each Conv/Gemm with its sole consumers by the rules in `FUSIBLE_AFTER`. A model in QOperator form
(QLinearConv, com.microsoft QGemm, QLinearAdd, ...) is read as its QDQ twin (`fedzoo.edge.qoperator`): the
runtime runs both forms as the same kernels.

fp32 convs also carry the memory layout onnxruntime gives them: on x86 its NCHWc kernels take most convs,
but not all (it depends on channel counts, kernel and fused activation in ways that change between
releases), and a conv left in plain NCHW runs several times slower. Rather than re-implement those rules,
`split_kernels` asks onnxruntime's own graph optimizer (no inference is run) which convs it left in NCHW.
A runtime without NCHWc kernels (`all_plain_layout`) also fuses less: its FusedConv takes Relu/Clip but runs a
residual Add and a HardSwish as kernels of their own (`PLAIN_LAYOUT_FUSIBLE_AFTER`, read off the optimized
graphs at the "extended" level); splitting such a device's models with the NCHWc rules had left its
predictions 15-20% low.

Needs `onnx` (shape inference) and onnxruntime (the layout query), imported lazily.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedzoo.edge.qoperator import is_qoperator, qoperator_as_qdq
from fedzoo.errors import InvalidInputError

QUANTIZE_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
# Ops the runtime removes or folds into their neighbours: looked through, never kernels of their own.
# (torch's exporter writes an Identity per de-duplicated weight; quantization wraps tensors in Q/DQ.)
TRANSPARENT_OPS = QUANTIZE_OPS | {"Identity", "Dropout"}
ACTIVATION_OPS = frozenset({"Relu", "Clip", "HardSwish", "HardSigmoid", "LeakyRelu", "Sigmoid", "Tanh", "Elu"})
SHAPE_OPS = frozenset({"Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Shape", "Gather"})
POOL_OPS = frozenset({"MaxPool", "AveragePool"})
GLOBAL_POOL_OPS = frozenset({"GlobalAveragePool", "GlobalMaxPool", "ReduceMean"})
ELEMENTWISE_OPS = frozenset({"Add", "Mul", "Sub", "Div", "Concat"})
NARROW_INPUT_CHANNELS = 4
# Dense convs (fp32 and INT8) whose channel counts are not multiples of this run far slower per MAC, as
# structured pruning leaves them; keying them apart raised the reference fit's held-out share within ±10%
# from 55% to 87% (measured on random and zoo-like models, never on zoo models).
CHANNEL_ALIGNMENT = 8
# Activations the quantizer folds into the QLinearConv's output range; others (HardSwish) stay float ops
# between a DequantizeLinear and a QuantizeLinear, so they are kernels of their own.
QUANTIZED_FUSED_ACTIVATIONS = frozenset({"Relu", "Clip"})

# What may be fused after a kernel's last op, by (head op, precision): the fusion rules of onnxruntime's
# CPU provider. fp32 convs take BN, an activation and a residual Add (NCHWc conv with "sum"); QLinearConv
# absorbs Relu/Clip during quantization but keeps a residual Add as a separate QLinearAdd.
FUSIBLE_AFTER: dict[tuple[str, str], dict[str, frozenset[str]]] = {
    ("Conv", "fp32"): {
        "Conv": frozenset({"BatchNormalization", "Add"}) | ACTIVATION_OPS,
        "BatchNormalization": frozenset({"Add"}) | ACTIVATION_OPS,
        "Add": ACTIVATION_OPS,
        **{activation: frozenset({"Add"}) for activation in ACTIVATION_OPS},
    },
    ("Conv", "int8"): {"Conv": QUANTIZED_FUSED_ACTIVATIONS},
    ("Gemm", "fp32"): {"Gemm": ACTIVATION_OPS},
    ("Gemm", "int8"): {"Gemm": ACTIVATION_OPS},
    ("MatMul", "fp32"): {"MatMul": frozenset({"Add"}), "Add": ACTIVATION_OPS},
    ("MatMul", "int8"): {"MatMul": frozenset({"Add"})},
}
# Activations onnxruntime's layout-independent FusedConv absorbs (the conv-activation fusion below the NCHWc
# level). A runtime without NCHWc kernels runs a residual Add and a HardSwish (as HardSigmoid + Mul) apart.
FUSED_CONV_ACTIVATIONS = frozenset({"Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid"})
PLAIN_LAYOUT_FUSIBLE_AFTER: dict[tuple[str, str], dict[str, frozenset[str]]] = {
    **FUSIBLE_AFTER,
    ("Conv", "fp32"): {
        "Conv": frozenset({"BatchNormalization"}) | FUSED_CONV_ACTIVATIONS,
        "BatchNormalization": FUSED_CONV_ACTIVATIONS,
    },
}


@dataclass(frozen=True)
class Kernel:
    """One fused kernel and the shape features its latency is regressed on (batch 1)."""

    name: str  # the first ONNX node's name (or output), for reading a split
    ops: tuple[str, ...]  # the fused ONNX op types, e.g. ("Conv", "Clip")
    category: str  # what the latency regression is keyed on, e.g. "conv-dw"
    precision: str  # "fp32" or "int8"
    macs: int
    input_elements: int
    output_elements: int
    weight_elements: int = 0
    kernel_size: int = 0
    stride: int = 1
    groups: int = 1
    in_channels: int = 0
    out_channels: int = 0
    activation: str = ""  # the fused activation op, lower case, e.g. "clip"
    layout: str = ""  # "nchw" for an fp32 conv onnxruntime leaves out of its NCHWc kernels; "" otherwise
    aligned: bool = True  # False for a dense conv with channels that are not multiples of CHANNEL_ALIGNMENT

    @property
    def key(self) -> str:
        """The lookup key of this kernel's regression: category, fused activation, layout, alignment and
        precision, e.g. "conv-pw+hardswish/fp32" (a fused HardSwish costs more than a fused Relu) or
        "conv-pw:nchw:odd/fp32"."""
        activation = f"+{self.activation}" if self.activation else ""
        layout = f":{self.layout}" if self.layout else ""
        odd = "" if self.aligned else ":odd"
        return f"{self.category}{activation}{layout}{odd}/{self.precision}"

    @property
    def output_pixels(self) -> int:
        """Output positions (H x W) of a conv; 0 for other kernels."""
        return self.output_elements // self.out_channels if self.out_channels else 0


def split_kernels(model: Any, all_plain_layout: bool = False) -> list[Kernel]:
    """The fused kernels of `model` (a path, ONNX bytes or `onnx.ModelProto`) in execution order; with
    `all_plain_layout`, as a runtime without NCHWc kernels (an ARM build, or below full optimisation) runs them."""
    proto = _load_with_shapes(model)
    if all_plain_layout:
        plain = {node.name for node in proto.graph.node if node.op_type == "Conv"}
    else:
        plain = plain_layout_convs(proto)
    return _Graph(proto, plain, all_plain_layout).kernels()


def plain_layout_convs(proto: Any) -> set[str]:
    """Names of the Conv nodes onnxruntime's full graph optimisation leaves in plain NCHW (not NCHWc)."""
    import tempfile

    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(Path(folder) / "optimized.onnx")
        options.log_severity_level = 3  # it warns that NCHWc graphs are machine-specific: that is the point
        try:
            ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception as error:  # onnxruntime raises its own untyped errors
            raise InvalidInputError(f"onnxruntime cannot load the model: {error}", field="model") from None
        optimized = onnx.load(options.optimized_model_filepath)
    return {
        node.name
        for node in optimized.graph.node
        if node.op_type in ("Conv", "FusedConv") and node.domain in ("", "ai.onnx", "com.microsoft")
    }


def _load_with_shapes(model: Any) -> Any:
    """Load the model, fix symbolic dims of the inputs to 1 (batch-1 latency) and infer every shape."""
    import onnx

    from google.protobuf.message import DecodeError

    try:
        if isinstance(model, (str, Path)):
            proto = onnx.load(str(model))
        elif isinstance(model, (bytes, bytearray)):
            proto = onnx.load_from_string(bytes(model))
        elif isinstance(model, onnx.ModelProto):
            proto = onnx.ModelProto()
            proto.CopyFrom(model)
        else:
            raise InvalidInputError(f"expected an ONNX path, bytes or ModelProto, got {type(model).__name__}", "model")
    except (DecodeError, OSError) as error:
        raise InvalidInputError(f"not a readable ONNX model: {error}", field="model") from None
    if is_qoperator(proto):  # onnxruntime runs it as the kernels of its QDQ twin
        proto = qoperator_as_qdq(proto)
    initializer_names = {initializer.name for initializer in proto.graph.initializer}
    for value in proto.graph.input:
        if value.name in initializer_names:
            continue
        for dim in value.type.tensor_type.shape.dim:
            if not dim.HasField("dim_value"):
                dim.dim_value = 1
    del proto.graph.value_info[:]
    counts = Counter(node.name for node in proto.graph.node)
    for index, node in enumerate(proto.graph.node):  # unique names, so optimized nodes can be traced back
        if not node.name or counts[node.name] > 1:
            node.name = f"{node.op_type}_{index}_{node.name}"
    return onnx.shape_inference.infer_shapes(proto)


class _Graph:
    """The ONNX graph seen through its Q/DQ nodes: compute nodes, their producers and consumers."""

    def __init__(self, proto: Any, plain_layout_convs: set[str], all_plain_layout: bool = False) -> None:
        import onnx

        self.plain_layout_convs = plain_layout_convs
        self.all_plain_layout = all_plain_layout
        self.fusion_rules = PLAIN_LAYOUT_FUSIBLE_AFTER if all_plain_layout else FUSIBLE_AFTER
        graph = proto.graph
        self.initializers = {initializer.name: initializer for initializer in graph.initializer}
        self.shapes: dict[str, tuple[int, ...]] = {}
        for value in [*graph.input, *graph.value_info, *graph.output]:
            dims = value.type.tensor_type.shape.dim
            if all(dim.HasField("dim_value") for dim in dims):
                self.shapes[value.name] = tuple(dim.dim_value for dim in dims)
        for name, initializer in self.initializers.items():
            self.shapes[name] = tuple(initializer.dims)
        self.graph_inputs = {value.name for value in graph.input} - set(self.initializers)
        self.graph_outputs = {value.name for value in graph.output}
        self.nodes = [node for node in graph.node if node.op_type != "Constant"]
        self.constants = {output for node in graph.node if node.op_type == "Constant" for output in node.output}
        self.producer = {output: node for node in self.nodes for output in node.output}
        self.consumers: dict[str, list[Any]] = {}
        for node in self.nodes:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.attribute = lambda node, name, default: next(
            (onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), default
        )

    def is_constant(self, tensor: str) -> bool:
        """Whether `tensor` is a weight: an initializer, a Constant, or a DequantizeLinear/Identity of one."""
        if tensor in self.initializers or tensor in self.constants or tensor == "":
            return True
        node = self.producer.get(tensor)
        return node is not None and node.op_type in TRANSPARENT_OPS and self.is_constant(node.input[0])

    def through_quantization(self, tensor: str) -> tuple[str, bool]:
        """The tensor behind any Q/DQ (or Identity) chain ending at `tensor`, and whether it dequantized it."""
        quantized = False
        node = self.producer.get(tensor)
        while node is not None and node.op_type in TRANSPARENT_OPS:
            quantized = quantized or node.op_type == "DequantizeLinear"
            tensor = node.input[0]
            node = self.producer.get(tensor)
        return tensor, quantized

    def activation_inputs(self, node: Any) -> list[str]:
        return [name for name in node.input if not self.is_constant(name)]

    def precision(self, node: Any) -> str:
        quantized = any(self.through_quantization(name)[1] for name in node.input if name)
        return "int8" if quantized else "fp32"

    def compute_consumers(self, tensor: str) -> list[Any]:
        """The compute nodes that read `tensor`, looking through Q/DQ (and Identity) nodes in between."""
        found = []
        for node in self.consumers.get(tensor, []):
            if node.op_type in TRANSPARENT_OPS:
                found.extend(self.compute_consumers(node.output[0]))
            else:
                found.append(node)
        return found

    def feeds_graph_output(self, tensor: str) -> bool:
        if tensor in self.graph_outputs:
            return True
        return any(
            node.op_type in TRANSPARENT_OPS and self.feeds_graph_output(node.output[0])
            for node in self.consumers.get(tensor, [])
        )

    def kernels(self) -> list[Kernel]:
        kernels: list[Kernel] = []
        for name in sorted(self.graph_inputs):
            quantizers = [node for node in self.consumers.get(name, []) if node.op_type == "QuantizeLinear"]
            if quantizers:
                kernels.append(self._boundary_kernel(quantizers[0], "quantize"))
        fused: set[int] = set()
        for node in self.nodes:
            if node.op_type in TRANSPARENT_OPS or id(node) in fused:
                continue
            group = self._fuse_from(node)
            fused.update(id(member) for member in group)
            kernels.append(self._kernel(group))
        for node in self.nodes:
            if node.op_type == "DequantizeLinear" and node.output[0] in self.graph_outputs:
                kernels.append(self._boundary_kernel(node, "dequantize"))
        return kernels

    def _fuse_from(self, head: Any) -> list[Any]:
        """`head` plus each sole consumer the fusion rules allow, in order."""
        rules = self.fusion_rules.get((head.op_type, self.precision(head)), {})
        group = [head]
        while True:
            output = group[-1].output[0]
            consumers = self.compute_consumers(output)
            if len(consumers) != 1 or self.feeds_graph_output(output):
                return group
            successor = consumers[0]
            if successor.op_type not in rules.get(group[-1].op_type, frozenset()):
                return group
            if successor.op_type in {op.op_type for op in group}:
                return group
            group.append(successor)

    def _shape(self, tensor: str) -> tuple[int, ...]:
        if tensor not in self.shapes:
            raise InvalidInputError(f"cannot infer the shape of tensor {tensor!r}; is the model valid?", "model")
        return self.shapes[tensor]

    def _elements(self, tensor: str) -> int:
        size = 1
        for dim in self._shape(tensor):
            size *= dim
        return size

    def _boundary_kernel(self, node: Any, category: str) -> Kernel:
        elements = self._elements(node.input[0])
        return Kernel(node.name or node.output[0], (node.op_type,), category, "int8", elements, elements, elements)

    def _kernel(self, group: list[Any]) -> Kernel:
        head, last = group[0], group[-1]
        precision = self.precision(head)
        head_inputs = self.activation_inputs(head)
        first_input = self.through_quantization(head_inputs[0])[0] if head_inputs else head.input[0]
        output = last.output[0]
        extra_inputs = [  # a fused residual Add reads a second activation
            self.through_quantization(name)[0] for member in group[1:] for name in self.activation_inputs(member)
            if self.through_quantization(name)[0] not in {m.output[0] for m in group}
        ]
        input_elements = self._elements(first_input) + sum(self._elements(name) for name in extra_inputs)
        output_elements = self._elements(output)
        name = head.name or head.output[0]
        ops = tuple(node.op_type for node in group)
        if head.op_type == "Conv":
            activation = next((op.lower() for op in ops[1:] if op in ACTIVATION_OPS), "")
            return self._conv_kernel(head, name, ops, precision, input_elements, output_elements, activation)
        if head.op_type in {"Gemm", "MatMul"}:
            weight = next((n for n in head.input[1:2]), "")
            weight_shape = self._shape(self.through_quantization(weight)[0]) if weight else ()
            weight_elements = _product(weight_shape)
            reduction = self._shape(first_input)[-1]
            return Kernel(
                name, ops, "gemm", precision, output_elements * reduction, input_elements, output_elements,
                weight_elements,
            )
        category, macs = self._other_category(head, input_elements, output_elements)
        activation = head.op_type.lower() if head.op_type == "HardSwish" else ""  # two kernels when unfused
        return Kernel(name, ops, category, precision, macs, input_elements, output_elements, activation=activation)

    def _conv_kernel(
        self, head: Any, name: str, ops: tuple[str, ...], precision: str, input_elements: int, output_elements: int,
        activation: str,
    ) -> Kernel:
        weight_shape = self._shape(self.through_quantization(head.input[1])[0])
        out_channels, in_per_group = weight_shape[0], weight_shape[1]
        kernel_area = _product(weight_shape[2:])
        groups = int(self.attribute(head, "group", 1))
        strides = self.attribute(head, "strides", [1])
        in_channels = in_per_group * groups
        if groups > 1 and groups == in_channels:
            category = "conv-dw"
        elif in_per_group < NARROW_INPUT_CHANNELS:
            category = "conv-stem"  # a few input channels: im2col-bound, far from peak MACs/s
        elif kernel_area == 1:
            category = "conv-pw"
        else:
            category = "conv"
        return Kernel(
            name, ops, category, precision,
            macs=output_elements * in_per_group * kernel_area,
            input_elements=input_elements,
            output_elements=output_elements,
            weight_elements=_product(weight_shape),
            kernel_size=int(weight_shape[2]) if len(weight_shape) > 2 else 1,
            stride=int(max(strides)),
            groups=groups,
            in_channels=in_channels,
            out_channels=out_channels,
            activation=activation,
            # Without NCHWc, INT8 convs lose the NHWC QLinearConv too: both precisions get their own costs.
            layout="nchw" if (precision == "fp32" or self.all_plain_layout) and head.name in self.plain_layout_convs
            else "",
            aligned=category == "conv-dw" or (
                out_channels % CHANNEL_ALIGNMENT == 0
                and (category == "conv-stem" or in_per_group % CHANNEL_ALIGNMENT == 0)
            ),
        )

    def _other_category(self, head: Any, input_elements: int, output_elements: int) -> tuple[str, int]:
        """Category and MACs of a non-conv, non-gemm kernel, by the op tables above."""
        op = head.op_type
        if op in POOL_OPS:
            kernel_area = _product(self.attribute(head, "kernel_shape", [1]))
            return "pool", output_elements * kernel_area
        table = [
            (GLOBAL_POOL_OPS, "global-pool", input_elements),
            (ELEMENTWISE_OPS, "elementwise", output_elements),
            (ACTIVATION_OPS | {"BatchNormalization"}, "activation", output_elements),
            (SHAPE_OPS, "shape", 0),
        ]
        for ops, category, macs in table:
            if op in ops:
                return category, macs
        return "other", output_elements


def _product(values: Any) -> int:
    result = 1
    for value in values:
        result *= int(value)
    return result

