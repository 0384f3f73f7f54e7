"""Reverse-mode autodiff over ONNX graphs, source to source: inference model in, training graph out.

The training graph (DESIGN.md, "Training graph") is an ordinary ONNX model of default-domain ops that
the stock onnxruntime runs on a device:

    inputs   x (the inference input, renamed), y (int64 labels, or float targets for MSE),
             one input per trainable parameter, named like the inference model's initializer
    outputs  loss (a float scalar) and grad.<parameter> for every trainable parameter

Frozen parameters stay initializers of the training graph. The sweep visits the forward nodes in
reverse topological order; when it reaches a node every consumer of its outputs has already been
visited, so their gradients are complete (contributions of several consumers, e.g. a residual
branch, are summed). Each node's gradient comes from its rule in `fedzoo.cloud.gradient_rules`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fedzoo.cloud.depthwise_lowering import is_lowerable, lower_depthwise
from fedzoo.cloud.gradient_rules import GRADIENT_RULES, ForwardNode, GraphBuilder, StaticShape, rule_for
from fedzoo.errors import InvalidInputError

INPUT_NAME = "x"
TARGET_NAME = "y"
LOSS_NAME = "loss"
GRADIENT_PREFIX = "grad."
MIN_OPSET = 13  # the rules emit the opset-13 forms of ReduceSum, Slice, Unsqueeze (axes as inputs)

Trainable = Literal["all", "head", "all_but_depthwise"] | Collection[str]


def gradient_name(parameter: str) -> str:
    """The training-graph output holding the gradient of `parameter`."""
    return GRADIENT_PREFIX + parameter


class _FreshNames:
    """Hands out `hint/<n>` names the graph does not use yet; every name handed out is taken from then on."""

    def __init__(self, taken: set[str]) -> None:
        self._taken = taken
        self._counter = 0

    def __call__(self, hint: str) -> str:
        while True:
            self._counter += 1
            name = f"{hint}/{self._counter}"
            if name not in self._taken:
                self._taken.add(name)
                return name


class _TrainingGraphBuilder(GraphBuilder):
    """Collects the nodes and constants of the training graph and answers shape questions about the forward."""

    def __init__(self, shapes: dict[str, StaticShape], fresh_names: _FreshNames, constants: set[str]) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.constants: list[onnx.TensorProto] = []
        self._shapes = shapes
        self._fresh_names = fresh_names
        self._constant_names = constants
        self._shape_names: dict[str, str] = {}

    def fresh_name(self, hint: str) -> str:
        return self._fresh_names(hint)

    def emit(self, op_type: str, inputs: Sequence[str], **attributes: Any) -> str:
        output = self.fresh_name(f"grad/{op_type}")
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=output, **attributes))
        return output

    def emit_named(self, op_type: str, inputs: Sequence[str], output: str, **attributes: Any) -> str:
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=output, **attributes))
        return output

    def constant(self, value: np.ndarray) -> str:
        name = self.fresh_name("grad/const")
        self.constants.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def static_shape(self, value_name: str) -> StaticShape:
        if value_name not in self._shapes:
            raise InvalidInputError(f"the shape of {value_name!r} could not be inferred; the rules need it")
        return self._shapes[value_name]

    def is_constant(self, value_name: str) -> bool:
        return value_name in self._constant_names

    def shape_of(self, value_name: str) -> str:
        if value_name not in self._shape_names:
            self._shape_names[value_name] = self.emit("Shape", [value_name])
        return self._shape_names[value_name]


# losses ----------------------------------------------------------------------------------------

# A loss gets the model output's name and shape and the batch dimension; it adds its nodes and returns
# (loss value, gradient of the model output, the declaration of the target input `y`).
LossBuilder = Callable[[_TrainingGraphBuilder, str, StaticShape, Any], tuple[str, str, onnx.ValueInfoProto]]


def _cross_entropy(ctx: _TrainingGraphBuilder, logits: str, shape: StaticShape, batch_dim: Any):
    """Softmax cross-entropy averaged over the batch; its logits gradient is (softmax - onehot) / N."""
    if len(shape) != 2 or shape[1] is None:
        raise InvalidInputError(f"cross-entropy needs logits of shape (batch, classes), got {shape}")
    log_probs = ctx.emit("LogSoftmax", [logits], axis=1)
    loss = ctx.emit_named("NegativeLogLikelihoodLoss", [log_probs, TARGET_NAME], LOSS_NAME, reduction="mean")
    probabilities = ctx.emit("Exp", [log_probs])
    depth = ctx.constant(np.asarray(shape[1], dtype=np.int64))
    one_hot = ctx.emit("OneHot", [TARGET_NAME, depth, ctx.constant(np.asarray([0.0, 1.0], np.float32))], axis=-1)
    batch = ctx.emit("Cast", [ctx.emit("Size", [TARGET_NAME])], to=TensorProto.FLOAT)
    gradient = ctx.emit("Div", [ctx.emit("Sub", [probabilities, one_hot]), batch])
    target = helper.make_tensor_value_info(TARGET_NAME, TensorProto.INT64, [batch_dim])
    return loss, gradient, target


def _mean_squared_error(ctx: _TrainingGraphBuilder, output: str, shape: StaticShape, batch_dim: Any):
    """Mean of squared errors over every element (torch's MSELoss default); gradient 2 (out - y) / numel."""
    difference = ctx.emit("Sub", [output, TARGET_NAME])
    loss = ctx.emit_named("ReduceMean", [ctx.emit("Mul", [difference, difference])], LOSS_NAME, keepdims=0)
    count = ctx.emit("Cast", [ctx.emit("Size", [output])], to=TensorProto.FLOAT)
    gradient = ctx.emit("Div", [ctx.emit("Mul", [difference, ctx.constant(np.float32(2.0))]), count])
    target = helper.make_tensor_value_info(TARGET_NAME, TensorProto.FLOAT, [batch_dim, *shape[1:]])
    return loss, gradient, target


LOSSES: dict[str, LossBuilder] = {"cross_entropy": _cross_entropy, "mse": _mean_squared_error}


# parameters ------------------------------------------------------------------------------------


def parameter_candidates(model: onnx.ModelProto) -> list[str]:
    """Float initializers that feed a node at a position that can carry a gradient, in initializer order."""
    floats = {init.name for init in model.graph.initializer if init.data_type == TensorProto.FLOAT}
    differentiable: set[str] = set()
    for node in model.graph.node:
        rule = GRADIENT_RULES.get(node.op_type)
        for position, name in enumerate(node.input):
            # An op without a rule: its float initializers count, so training them reports the missing rule.
            if name in floats and (rule is None or position in rule.differentiable_inputs):
                differentiable.add(name)
    return [init.name for init in model.graph.initializer if init.name in differentiable]


def head_parameters(model: onnx.ModelProto) -> list[str]:
    """The parameters of the last parametric node (the classifier head), e.g. a final Gemm's weight and bias."""
    candidates = set(parameter_candidates(model))
    for node in reversed(model.graph.node):
        own = [name for name in node.input if name in candidates]
        if own:
            return own
    raise InvalidInputError("the model has no trainable parameters")


def depthwise_parameters(model: onnx.ModelProto) -> list[str]:
    """The weights and biases of grouped (depthwise) convolutions, followed through Identity aliases."""
    aliases = {node.output[0]: node.input[0] for node in model.graph.node if node.op_type == "Identity"}
    names = []
    for node in model.graph.node:
        if node.op_type == "Conv" and _attributes(node).get("group", 1) > 1:
            for name in node.input[1:]:
                while name in aliases:
                    name = aliases[name]
                names.append(name)
    candidates = set(parameter_candidates(model))
    return [name for name in dict.fromkeys(names) if name in candidates]


def _all_but_depthwise(model: onnx.ModelProto) -> list[str]:
    # onnxruntime's fast depthwise kernels (NCHWc) need a constant weight and bias: freezing the depthwise
    # convolutions (a small share of the parameters) still makes a training step about 2x faster on CPU,
    # even with trainable depthwise convs lowered to MatMuls (bench/train_benchmark.py).
    frozen = set(depthwise_parameters(model))
    return [name for name in parameter_candidates(model) if name not in frozen]


SELECTIONS: dict[str, Callable[[onnx.ModelProto], list[str]]] = {
    "all": parameter_candidates,
    "head": head_parameters,
    "all_but_depthwise": _all_but_depthwise,
}


def resolve_trainable(model: onnx.ModelProto, trainable: Trainable) -> list[str]:
    """The parameter names `trainable` selects (a name of SELECTIONS or explicit names), checked against the model."""
    candidates = parameter_candidates(model)
    if isinstance(trainable, str):
        if trainable not in SELECTIONS:
            raise InvalidInputError(
                f"trainable must be one of {sorted(SELECTIONS)} or a list of parameter names, got {trainable!r}",
                field="trainable",
            )
        chosen = SELECTIONS[trainable](model)
    else:
        unknown = sorted(set(trainable) - set(candidates))
        if unknown:
            raise InvalidInputError(
                f"trainable names {unknown} are not float parameters of the model; parameters: {candidates}",
                field="trainable",
            )
        chosen = [name for name in candidates if name in set(trainable)]
    if not chosen:
        raise InvalidInputError("no parameter selected for training", field="trainable")
    return chosen


# the sweep -------------------------------------------------------------------------------------


def _static_shape(value: onnx.ValueInfoProto) -> StaticShape:
    return tuple(dim.dim_value if dim.HasField("dim_value") else None for dim in value.type.tensor_type.shape.dim)


def _infer_shapes(forward: onnx.ModelProto) -> dict[str, StaticShape]:
    inferred = onnx.shape_inference.infer_shapes(forward, strict_mode=True)
    graph = inferred.graph
    shapes = {value.name: _static_shape(value) for value in [*graph.input, *graph.value_info, *graph.output]}
    shapes.update({init.name: tuple(init.dims) for init in graph.initializer})
    return shapes


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    values = {}
    for attribute in node.attribute:
        value = helper.get_attribute_value(attribute)
        values[attribute.name] = value.decode() if isinstance(value, bytes) else value
    return values


def _single_input_and_output(model: onnx.ModelProto) -> tuple[onnx.ValueInfoProto, str]:
    """The model's one data input and the name of its one output, after checking what the sweep supports."""
    graph = model.graph
    opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise InvalidInputError(f"the model has opset {opset}; training graphs need opset >= {MIN_OPSET}")
    initializer_names = {init.name for init in graph.initializer}
    data_inputs = [value for value in graph.input if value.name not in initializer_names]
    if len(data_inputs) != 1 or len(graph.output) != 1:
        raise InvalidInputError(
            f"training graphs need one input and one output, got inputs {[v.name for v in data_inputs]} "
            f"and outputs {[v.name for v in graph.output]}"
        )
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            raise InvalidInputError(f"node {node.name!r} is in domain {node.domain!r}; only default-domain ops are supported")
    return data_inputs[0], graph.output[0].name


def _lower_trainable_depthwise(
    nodes: list[onnx.NodeProto], shapes: dict[str, StaticShape], parameters: set[str], fresh_name: _FreshNames
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Depthwise convs with a trainable kernel as MatMuls (`fedzoo.cloud.depthwise_lowering` says why)."""
    lowered: list[onnx.NodeProto] = []
    constants: list[onnx.TensorProto] = []
    for node in nodes:
        if node.input[1:2] and node.input[1] in parameters and is_lowerable(node, shapes):
            replacement, new_constants = lower_depthwise(node, shapes, fresh_name)
            lowered.extend(replacement)
            constants.extend(new_constants)
        else:
            lowered.append(node)
    return lowered, constants


def _reverse_sweep(
    ctx: _TrainingGraphBuilder, forward_nodes: list[onnx.NodeProto], output_name: str, output_gradient: str,
    parameters: list[str],
) -> dict[str, str | None]:
    """The gradient of every parameter (None when the loss does not depend on it)."""  # fmt: skip
    requires_grad = set(parameters)  # values that depend on a trainable parameter: only they need gradients
    for node in forward_nodes:
        if any(name in requires_grad for name in node.input):
            requires_grad.update(node.output)
    contributions: dict[str, list[str]] = {output_name: [output_gradient]}

    def total_gradient(value: str) -> str | None:
        parts = contributions.get(value)
        if not parts:
            return None
        if len(parts) > 1:
            contributions[value] = [ctx.emit("Sum", parts)]
        return contributions[value][0]

    for node in reversed(forward_nodes):
        output_grads = [total_gradient(name) for name in node.output]
        if all(g is None for g in output_grads) or not any(name in requires_grad for name in node.input):
            continue
        view = ForwardNode(node.op_type, node.name, tuple(node.input), tuple(node.output), _attributes(node))
        rule = rule_for(view)
        needs = [
            position in rule.differentiable_inputs and name in requires_grad for position, name in enumerate(node.input)
        ]
        if not any(needs):
            continue
        for name, need, input_grad in zip(node.input, needs, rule.backward(ctx, view, output_grads, needs)):
            if need and input_grad is not None:
                contributions.setdefault(name, []).append(input_grad)
    return {name: total_gradient(name) for name in parameters}


def build_training_graph(
    model: onnx.ModelProto, trainable: Trainable = "all", loss: str = "cross_entropy"
) -> onnx.ModelProto:
    """The training graph of an inference model (BN folded): loss and a gradient per trainable parameter."""
    if loss not in LOSSES:
        raise InvalidInputError(f"unknown loss {loss!r}; choose one of {sorted(LOSSES)}", field="loss")
    source_input, output_name = _single_input_and_output(model)
    parameters = resolve_trainable(model, trainable)
    graph = model.graph
    taken = {name for node in graph.node for name in (*node.input, *node.output)} | {i.name for i in graph.initializer}
    for reserved in (INPUT_NAME, TARGET_NAME, LOSS_NAME, *(gradient_name(p) for p in parameters)):
        if reserved in taken and reserved != source_input.name:
            raise InvalidInputError(f"the model already uses the name {reserved!r}, reserved for the training graph")

    # Forward part: the inference nodes with the input renamed to x and trainable parameters made inputs.
    forward_nodes = []
    for node in graph.node:
        renamed = onnx.NodeProto()
        renamed.CopyFrom(node)
        renamed.input[:] = [INPUT_NAME if name == source_input.name else name for name in node.input]
        forward_nodes.append(renamed)
    x_info = onnx.ValueInfoProto()
    x_info.CopyFrom(source_input)
    x_info.name = INPUT_NAME
    by_name = {init.name: init for init in graph.initializer}
    frozen = [init for init in graph.initializer if init.name not in set(parameters)]
    parameter_inputs = [helper.make_tensor_value_info(p, TensorProto.FLOAT, list(by_name[p].dims)) for p in parameters]
    forward = helper.make_model(
        helper.make_graph(forward_nodes, "forward", [x_info, *parameter_inputs], [graph.output[0]], frozen),
        opset_imports=list(model.opset_import),
    )
    shapes = _infer_shapes(forward)
    fresh_names = _FreshNames(taken | {INPUT_NAME, TARGET_NAME, LOSS_NAME})
    forward_nodes, lowering_constants = _lower_trainable_depthwise(forward_nodes, shapes, set(parameters), fresh_names)
    if lowering_constants:
        frozen = [*frozen, *lowering_constants]
        del forward.graph.node[:]
        forward.graph.node.extend(forward_nodes)
        forward.graph.initializer.extend(lowering_constants)
        shapes = _infer_shapes(forward)
    batch_dim = x_info.type.tensor_type.shape.dim[0]
    batch = batch_dim.dim_param if batch_dim.HasField("dim_param") else (batch_dim.dim_value or "batch")

    constants = {init.name for init in frozen}
    for node in forward_nodes:  # Constant nodes, and Identity aliases of frozen initializers
        if node.op_type == "Constant" or (node.op_type == "Identity" and node.input[0] in constants):
            constants.update(node.output)
    ctx = _TrainingGraphBuilder(shapes, fresh_names, constants)
    _, output_gradient, target_info = LOSSES[loss](ctx, output_name, shapes[output_name], batch)
    gradients = _reverse_sweep(ctx, forward_nodes, output_name, output_gradient, parameters)

    outputs = [helper.make_tensor_value_info(LOSS_NAME, TensorProto.FLOAT, [])]
    for name in parameters:
        total = gradients[name] or ctx.constant(np.zeros(by_name[name].dims, np.float32))
        ctx.emit_named("Identity", [total], gradient_name(name))
        outputs.append(helper.make_tensor_value_info(gradient_name(name), TensorProto.FLOAT, list(by_name[name].dims)))
    training = helper.make_graph(
        [*forward_nodes, *ctx.nodes],
        f"{graph.name or 'model'}_training",
        [x_info, target_info, *parameter_inputs],
        outputs,
        [*frozen, *ctx.constants],
    )
    result = helper.make_model(
        training,
        opset_imports=list(model.opset_import),
        producer_name="fedzoo.cloud.autodiff",
        ir_version=model.ir_version,
        doc_string=f"training graph: loss={loss}, trainable={len(parameters)} parameters",
    )
    onnx.checker.check_model(result, full_check=True)
    return result
