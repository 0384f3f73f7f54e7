"""Reverse-mode autodiff over ONNX graphs, source to source: inference model in, training graph out.

The training graph (docs/training-graphs.md) is an ordinary ONNX model of default-domain ops that
the stock onnxruntime runs on a device:

    inputs   x (the inference input, renamed, batch symbolic), y (int64 labels for cross-entropy, float
             targets shaped like the output for MSE and BCE), one input per trainable parameter, named
             like the inference model's initializer
    outputs  loss (a float scalar) and grad.<parameter> for every trainable parameter

Frozen parameters stay initializers of the training graph, and so do float initializers that are not
weights (buffers, folded statistics): only the weights and biases of Conv / Gemm / MatMul /
normalization layers are trained unless the caller names others. `fedzoo.graphs.forward_preparation`
first makes the batch symbolic, folds constant subgraphs and makes pooling and padding explicit.

The sweep visits the forward nodes in reverse topological order; when it reaches a node every consumer of its outputs has already been
visited, so their gradients are complete (contributions of several consumers, e.g. a residual
branch, are summed). Each node's gradient comes from its rule in `fedzoo.graphs.gradient_rules`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Collection, Sequence
from functools import partial
from typing import Any, Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fedzoo.errors import InvalidInputError
from fedzoo.graphs import depthwise_lowering, small_plane_conv_lowering
from fedzoo.graphs.batchnorm_training import lower_batch_norms, running_name
from fedzoo.graphs.forward_preparation import infer_shapes, prepare_forward
from fedzoo.graphs.gradient_rules import GRADIENT_RULES, ForwardNode, GraphBuilder, MissingGradientRuleError, StaticShape, rule_for

INPUT_NAME = "x"
TARGET_NAME = "y"
LOSS_NAME = "loss"
GRADIENT_PREFIX = "grad."
MIN_OPSET = 13  # the rules emit the opset-13 forms of ReduceSum, Slice, Unsqueeze (axes as inputs)

Trainable = Literal["all", "head", "all_but_depthwise"] | Collection[str]
# Input positions that hold a layer's own weights: the parameters "all" trains.
WEIGHT_POSITIONS: dict[str, tuple[int, ...]] = {
    "Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (0, 1, 2), "MatMul": (0, 1), "PRelu": (1,),
    "BatchNormalization": (1, 2), "LayerNormalization": (1, 2), "InstanceNormalization": (1, 2),
}  # fmt: skip
# Ops whose outputs are indices, shapes or booleans: no gradient flows through them.
NON_DIFFERENTIABLE_OPS = {"Shape", "Size", "ArgMax", "ArgMin", "NonZero", "Equal", "Greater", "GreaterOrEqual", "Less",
                          "LessOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf"}  # fmt: skip
# How BatchNormalization nodes left in the model (not folded) run: with their stored statistics, or with
# batch statistics and updated running statistics (`fedzoo.graphs.batchnorm_training`).
BATCH_NORM_MODES = ("inference", "training")
# How Dropout nodes run: as the identity (the inference forward), or dropping at random like torch's train mode.
DROPOUT_MODES = ("inference", "training")
# Output activations a loss already contains: a model ending in one of them would be trained wrongly.
LOSS_ACTIVATIONS = {"cross_entropy": ("Softmax", "LogSoftmax"), "bce": ("Sigmoid",)}


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

    def __init__(
        self, shapes: dict[str, StaticShape], fresh_names: _FreshNames, constants: dict[str, np.ndarray | None], opset: int
    ) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.constants: list[onnx.TensorProto] = []
        self.opset = opset
        self._shapes = shapes
        self._fresh_names = fresh_names
        self._constant_values = constants  # name -> value (None: a frozen float initializer, value not needed)
        self._shape_names: dict[str, str] = {}

    def fresh_name(self, hint: str) -> str:
        return self._fresh_names(hint)

    def emit(self, op_type: str, inputs: Sequence[str], **attributes: Any) -> str:
        output = self.fresh_name(f"grad/{op_type}")
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=output, **attributes))
        return output

    def emit_outputs(self, op_type: str, inputs: Sequence[str], count: int, **attributes: Any) -> list[str]:
        outputs = [self.fresh_name(f"grad/{op_type}") for _ in range(count)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=outputs[0], **attributes))
        return outputs

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
        return value_name in self._constant_values

    def constant_value(self, value_name: str) -> np.ndarray | None:
        return self._constant_values.get(value_name)

    def shape_of(self, value_name: str) -> str:
        if value_name not in self._shape_names:
            self._shape_names[value_name] = self.emit("Shape", [value_name])
        return self._shape_names[value_name]


# losses ----------------------------------------------------------------------------------------

# A loss gets the model output's name and shape and the batch dimension; it adds its nodes and returns
# (loss value, gradient of the model output, the declaration of the target input `y`).
LossBuilder = Callable[[_TrainingGraphBuilder, str, StaticShape, Any], tuple[str, str, onnx.ValueInfoProto]]
# What the device feeds as `y` for each loss (also written into the graph's metadata).
TARGET_DESCRIPTIONS = {
    "cross_entropy": "int64 class indices, shape (batch,)",
    "mse": "float32 targets shaped like the model output",
    "bce": "float32 targets in [0, 1] shaped like the model output (multi-label: one column per label)",
}


def _cross_entropy(ctx: _TrainingGraphBuilder, logits: str, shape: StaticShape, batch_dim: Any, label_smoothing: float = 0.0):
    """Softmax cross-entropy averaged over the batch; its logits gradient is (softmax - target) / N, the
    target being the one-hot label, or with label smoothing e (torch's) (1 - e) one-hot + e / classes."""
    if len(shape) != 2 or shape[1] is None:
        raise InvalidInputError(f"cross-entropy needs logits of shape (batch, classes), got {shape}")
    classes = shape[1]
    log_probs = ctx.emit("LogSoftmax", [logits], axis=1)
    probabilities = ctx.emit("Exp", [log_probs])
    depth = ctx.constant(np.asarray(classes, dtype=np.int64))
    off, on = label_smoothing / classes, 1.0 - label_smoothing + label_smoothing / classes
    target = ctx.emit("OneHot", [TARGET_NAME, depth, ctx.constant(np.asarray([off, on], np.float32))], axis=-1)
    batch = ctx.emit("Cast", [ctx.emit("Size", [TARGET_NAME])], to=TensorProto.FLOAT)
    if label_smoothing:
        per_example = ctx.emit("ReduceSum", [ctx.emit("Mul", [target, log_probs]), ctx.constant(np.asarray([1]))], keepdims=0)
        loss = ctx.emit_named("Neg", [ctx.emit("ReduceMean", [per_example], keepdims=0)], LOSS_NAME)
    else:
        loss = ctx.emit_named("NegativeLogLikelihoodLoss", [log_probs, TARGET_NAME], LOSS_NAME, reduction="mean")
    gradient = ctx.emit("Div", [ctx.emit("Sub", [probabilities, target]), batch])
    target_info = helper.make_tensor_value_info(TARGET_NAME, TensorProto.INT64, [batch_dim])
    return loss, gradient, target_info


def _mean_squared_error(ctx: _TrainingGraphBuilder, output: str, shape: StaticShape, batch_dim: Any):
    """Mean of squared errors over every element (torch's MSELoss default); gradient 2 (out - y) / numel."""
    difference = ctx.emit("Sub", [output, TARGET_NAME])
    loss = ctx.emit_named("ReduceMean", [ctx.emit("Mul", [difference, difference])], LOSS_NAME, keepdims=0)
    count = ctx.emit("Cast", [ctx.emit("Size", [output])], to=TensorProto.FLOAT)
    gradient = ctx.emit("Div", [ctx.emit("Mul", [difference, ctx.constant(np.float32(2.0))]), count])
    target = helper.make_tensor_value_info(TARGET_NAME, TensorProto.FLOAT, [batch_dim, *shape[1:]])
    return loss, gradient, target


def _binary_cross_entropy(ctx: _TrainingGraphBuilder, logits: str, shape: StaticShape, batch_dim: Any):
    """Binary cross-entropy on logits (torch's BCEWithLogitsLoss), the mean over every element, in the stable
    form max(z, 0) - z y + log(1 + exp(-|z|)); gradient (sigmoid(z) - y) / numel."""
    positive_part = ctx.emit("Relu", [logits])
    softplus_of_negative_abs = ctx.emit("Log", [ctx.emit("Add", [ctx.emit("Exp", [ctx.emit("Neg", [ctx.emit("Abs", [logits])])]),
                                                                  ctx.constant(np.float32(1.0))])])  # fmt: skip
    elementwise = ctx.emit("Add", [ctx.emit("Sub", [positive_part, ctx.emit("Mul", [logits, TARGET_NAME])]), softplus_of_negative_abs])
    loss = ctx.emit_named("ReduceMean", [elementwise], LOSS_NAME, keepdims=0)
    count = ctx.emit("Cast", [ctx.emit("Size", [logits])], to=TensorProto.FLOAT)
    gradient = ctx.emit("Div", [ctx.emit("Sub", [ctx.emit("Sigmoid", [logits]), TARGET_NAME]), count])
    target = helper.make_tensor_value_info(TARGET_NAME, TensorProto.FLOAT, [batch_dim, *shape[1:]])
    return loss, gradient, target


LOSSES: dict[str, LossBuilder] = {"cross_entropy": _cross_entropy, "mse": _mean_squared_error, "bce": _binary_cross_entropy}


# parameters ------------------------------------------------------------------------------------


def _weight_aliases(model: onnx.ModelProto) -> dict[str, str]:
    """Identity outputs mapped to the initializer they copy (exports alias shared weights so)."""
    aliases = {node.output[0]: node.input[0] for node in model.graph.node if node.op_type == "Identity"}
    for alias in list(aliases):
        while aliases[alias] in aliases:
            aliases[alias] = aliases[aliases[alias]]
    return aliases


def _float_initializers_at(model: onnx.ModelProto, positions: Callable[[onnx.NodeProto, int], bool]) -> list[str]:
    floats = {init.name for init in model.graph.initializer if init.data_type == TensorProto.FLOAT}
    aliases = _weight_aliases(model)
    chosen: set[str] = set()
    for node in model.graph.node:
        for position, name in enumerate(node.input):
            name = aliases.get(name, name)
            if name in floats and positions(node, position):
                chosen.add(name)
    return [init.name for init in model.graph.initializer if init.name in chosen]


def parameter_candidates(model: onnx.ModelProto) -> list[str]:
    """The weights and biases of the model's layers (`WEIGHT_POSITIONS`), in initializer order: what "all" trains.

    Other float initializers (buffers, constants of an elementwise op) stay constants unless named."""
    return _float_initializers_at(model, lambda node, position: position in WEIGHT_POSITIONS.get(node.op_type, ()))


def nameable_parameters(model: onnx.ModelProto) -> list[str]:
    """Every float initializer a caller may name as trainable: those at an input that can carry a gradient."""

    def differentiable(node: onnx.NodeProto, position: int) -> bool:
        rule = GRADIENT_RULES.get(node.op_type)  # without a rule: selectable, so training it reports the op
        return rule is None or rule.differentiates(position) or position in WEIGHT_POSITIONS.get(node.op_type, ())

    return _float_initializers_at(model, differentiable)


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
    aliases = _weight_aliases(model)
    names = []
    for node in model.graph.node:
        if node.op_type == "Conv" and _attributes(node).get("group", 1) > 1:
            names.extend(aliases.get(name, name) for name in node.input[1:])
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
    """The parameter names `trainable` selects (a name of SELECTIONS, or names and glob patterns such as
    "classifier.*"), checked against the model."""
    if isinstance(trainable, str):
        if trainable not in SELECTIONS:
            raise InvalidInputError(
                f"trainable must be one of {sorted(SELECTIONS)} or a list of parameter names, got {trainable!r}",
                field="trainable",
            )
        chosen = SELECTIONS[trainable](model)
    else:
        nameable = nameable_parameters(model)
        matches = {entry: fnmatch.filter(nameable, entry) for entry in trainable}
        unknown = sorted(entry for entry, found in matches.items() if not found)
        if unknown:
            raise InvalidInputError(
                f"trainable names {unknown} match no float parameter of the model; parameters: {nameable}",
                field="trainable",
            )
        selected = {name for found in matches.values() for name in found}
        chosen = [name for name in nameable if name in selected]
    if not chosen:
        raise InvalidInputError("no parameter selected for training", field="trainable")
    return chosen


# the sweep -------------------------------------------------------------------------------------


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    values = {}
    for attribute in node.attribute:
        value = helper.get_attribute_value(attribute)
        values[attribute.name] = value.decode() if isinstance(value, bytes) else value
    return values


def _single_input_and_output(model: onnx.ModelProto) -> tuple[onnx.ValueInfoProto, str]:
    """The model's one data input and the name of its one output, after checking what the sweep supports."""
    graph = model.graph
    opset = _default_opset(model)
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


def _lower_trainable_convs(
    nodes: list[onnx.NodeProto], shapes: dict[str, StaticShape], parameters: set[str], fresh_name: _FreshNames
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Convs with a trainable kernel as MatMuls where onnxruntime's Conv is slow for them: depthwise ones
    (`fedzoo.graphs.depthwise_lowering`) and those on small planes (`fedzoo.graphs.small_plane_conv_lowering`).
    A frozen kernel stays a Conv: onnxruntime runs those with its fast blocked kernels."""
    lowered: list[onnx.NodeProto] = []
    constants: list[onnx.TensorProto] = []
    for node in nodes:
        trainable_kernel = node.op_type == "Conv" and node.input[1] in parameters
        replacement, new_constants = [node], []
        if trainable_kernel and depthwise_lowering.is_lowerable(node, shapes):
            replacement, new_constants = depthwise_lowering.lower_depthwise(node, shapes, fresh_name)
        elif trainable_kernel and small_plane_conv_lowering.is_lowerable(node, shapes):
            replacement, new_constants = small_plane_conv_lowering.lower_small_plane_conv(node, shapes, fresh_name)
        lowered.extend(replacement)
        constants.extend(new_constants)
    return lowered, constants


def _values_needing_gradients(forward_nodes: list[onnx.NodeProto], parameters: list[str]) -> set[str]:
    """Values that depend on a trainable parameter: only they need gradients."""
    requires_grad = set(parameters)
    for node in forward_nodes:
        if node.op_type not in NON_DIFFERENTIABLE_OPS and any(name in requires_grad for name in node.input):
            requires_grad.update(node.output)
    return requires_grad


def _check_every_op_has_a_rule(forward_nodes: list[onnx.NodeProto], output_name: str, parameters: list[str]) -> None:
    """Refuse, naming them all at once, the ops without a rule between a trainable parameter and the loss,
    with the parameters that could still be trained with the layers below those ops frozen."""
    requires_grad = _values_needing_gradients(forward_nodes, parameters)
    reaches_loss = {output_name}
    for node in reversed(forward_nodes):
        if reaches_loss & set(node.output):
            reaches_loss.update(node.input)
    missing = [
        node for node in forward_nodes
        if node.op_type not in GRADIENT_RULES and node.op_type not in NON_DIFFERENTIABLE_OPS
        and requires_grad & set(node.input) and reaches_loss & set(node.output)
    ]  # fmt: skip
    if not missing:
        return
    upstream = {name for node in missing for name in node.input}
    for node in reversed(forward_nodes):
        if upstream & set(node.output):
            upstream.update(node.input)
    trainable_above = [name for name in parameters if name not in upstream]
    listed = ", ".join(f"{node.op_type} (node {node.name or node.output[0]!r})" for node in missing)
    suggestion = (
        f"freeze the layers below them by training only the {len(trainable_above)} parameters above them, "
        f"trainable={trainable_above}"
        if trainable_above
        else "no trainable parameter lies above them, so freezing cannot help"
    )
    raise MissingGradientRuleError(
        f"no gradient rule for {len(missing)} node(s) on the path from the trainable parameters to the loss: {listed}; "
        f"{suggestion}. Supported ops: {', '.join(sorted(GRADIENT_RULES))}",
        field=missing[0].op_type,
    )


def _reverse_sweep(
    ctx: _TrainingGraphBuilder, forward_nodes: list[onnx.NodeProto], output_name: str, output_gradient: str,
    parameters: list[str],
) -> dict[str, str | None]:
    """The gradient of every parameter (None when the loss does not depend on it)."""  # fmt: skip
    requires_grad = _values_needing_gradients(forward_nodes, parameters)
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
        needs = [rule.differentiates(position) and name in requires_grad for position, name in enumerate(node.input)]
        if not any(needs):
            continue
        for name, need, input_grad in zip(node.input, needs, rule.backward(ctx, view, output_grads, needs)):
            if need and input_grad is not None:
                contributions.setdefault(name, []).append(input_grad)
    return {name: total_gradient(name) for name in parameters}


def _logits_output(nodes: list[onnx.NodeProto], output_name: str, loss: str, strip: bool) -> tuple[list[onnx.NodeProto], str]:
    """The forward nodes and the name of the logits: a trailing activation the loss already applies is
    refused (the model would be trained through it twice), or dropped when `strip` asks for that."""
    last = next((node for node in nodes if output_name in node.output), None)
    if last is None or last.op_type not in LOSS_ACTIVATIONS.get(loss, ()):
        return nodes, output_name
    if not strip:
        raise InvalidInputError(
            f"the model ends in {last.op_type} (node {last.name or output_name!r}) but the {loss} loss expects logits: "
            f"export the model without the final {last.op_type}, or build with strip_output_activation=True",
            field="loss",
        )
    return [node for node in nodes if node is not last], last.input[0]


def build_training_graph(
    model: onnx.ModelProto,
    trainable: Trainable = "all",
    loss: str = "cross_entropy",
    label_smoothing: float = 0.0,
    strip_output_activation: bool = False,
    batch_norm: str = "inference",
    dropout: str = "inference",
) -> onnx.ModelProto:
    """The training graph of an inference model (BN folded): loss and a gradient per trainable parameter.

    `label_smoothing` (cross-entropy only) is torch's; `strip_output_activation` drops a final Softmax /
    LogSoftmax (cross-entropy) or Sigmoid (BCE) that would otherwise be refused; `batch_norm="training"`
    trains unfolded BatchNormalization nodes like torch's train mode (batch statistics; the running
    statistics become inputs and `running.<name>` outputs); `dropout="training"` makes the model's Dropout
    nodes drop at random (onnxruntime's generator) instead of being the identity."""
    if loss not in LOSSES:
        raise InvalidInputError(f"unknown loss {loss!r}; choose one of {sorted(LOSSES)}", field="loss")
    if batch_norm not in BATCH_NORM_MODES:
        raise InvalidInputError(f"batch_norm must be one of {BATCH_NORM_MODES}, got {batch_norm!r}", field="batch_norm")
    if dropout not in DROPOUT_MODES:
        raise InvalidInputError(f"dropout must be one of {DROPOUT_MODES}, got {dropout!r}", field="dropout")
    if label_smoothing and (loss != "cross_entropy" or not 0.0 < label_smoothing < 1.0):
        raise InvalidInputError(
            f"label_smoothing must be in [0, 1) and applies to cross_entropy only, got {label_smoothing} with {loss}",
            field="label_smoothing",
        )
    source_input, _ = _single_input_and_output(model)
    parameters = resolve_trainable(model, trainable)
    model = prepare_forward(model, source_input.name)
    graph = model.graph
    source_input = next(value for value in graph.input if value.name == source_input.name)
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
    forward_nodes, output_name = _logits_output(forward_nodes, graph.output[0].name, loss, strip_output_activation)
    fresh_names = _FreshNames(taken | {INPUT_NAME, TARGET_NAME, LOSS_NAME})
    statistics: list[str] = []
    added_constants: list[onnx.TensorProto] = []
    if batch_norm == "training":
        forward_nodes, added_constants, statistics = _batch_statistics(model, forward_nodes, source_input.name, fresh_names)
    added_constants.extend(_set_dropout_mode(forward_nodes, dropout, fresh_names))
    _check_every_op_has_a_rule(forward_nodes, output_name, parameters)
    x_info = onnx.ValueInfoProto()
    x_info.CopyFrom(source_input)
    x_info.name = INPUT_NAME
    by_name = {init.name: init for init in graph.initializer}
    frozen = [init for init in graph.initializer if init.name not in {*parameters, *statistics}] + added_constants
    parameter_inputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, list(by_name[name].dims)) for name in [*parameters, *statistics]
    ]
    output_info = helper.make_tensor_value_info(output_name, TensorProto.FLOAT, None)
    forward = helper.make_model(
        helper.make_graph(forward_nodes, "forward", [x_info, *parameter_inputs], [output_info], frozen),
        opset_imports=list(model.opset_import),
    )
    shapes = infer_shapes(forward)
    forward_nodes, lowering_constants = _lower_trainable_convs(forward_nodes, shapes, set(parameters), fresh_names)
    if lowering_constants:
        frozen = [*frozen, *lowering_constants]
        del forward.graph.node[:]
        forward.graph.node.extend(forward_nodes)
        forward.graph.initializer.extend(lowering_constants)
        shapes = infer_shapes(forward)
    batch = x_info.type.tensor_type.shape.dim[0].dim_param

    ctx = _TrainingGraphBuilder(shapes, fresh_names, _constant_values(frozen, forward_nodes), _default_opset(model))
    loss_builder = partial(LOSSES[loss], label_smoothing=label_smoothing) if label_smoothing else LOSSES[loss]
    _, output_gradient, target_info = loss_builder(ctx, output_name, shapes[output_name], batch)
    gradients = _reverse_sweep(ctx, forward_nodes, output_name, output_gradient, parameters)

    outputs = [helper.make_tensor_value_info(LOSS_NAME, TensorProto.FLOAT, [])]
    for name in parameters:
        total = gradients[name] or ctx.constant(np.zeros(by_name[name].dims, np.float32))
        ctx.emit_named("Identity", [total], gradient_name(name))
        outputs.append(helper.make_tensor_value_info(gradient_name(name), TensorProto.FLOAT, list(by_name[name].dims)))
    for name in statistics:
        outputs.append(helper.make_tensor_value_info(running_name(name), TensorProto.FLOAT, list(by_name[name].dims)))
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
        producer_name="fedzoo.graphs.autodiff",
        ir_version=model.ir_version,
        doc_string=f"training graph: loss={loss}, trainable={len(parameters)} parameters",
    )
    metadata = {"fedzoo.loss": loss, "fedzoo.target": TARGET_DESCRIPTIONS[loss], "fedzoo.batch_norm": batch_norm,
                "fedzoo.dropout": dropout}  # fmt: skip
    if label_smoothing:
        metadata["fedzoo.label_smoothing"] = str(label_smoothing)
    helper.set_model_props(result, metadata)
    onnx.checker.check_model(result, full_check=True)
    return result


def _batch_statistics(
    model: onnx.ModelProto, forward_nodes: list[onnx.NodeProto], source_input: str, fresh_names: _FreshNames
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], list[str]]:
    """The forward with its BatchNormalization nodes in training mode, their constants and running statistics."""
    shapes = infer_shapes(model)
    ranks = {name: len(shape) for name, shape in shapes.items()}
    ranks[INPUT_NAME] = len(shapes[source_input])
    lowered = lower_batch_norms(forward_nodes, ranks, fresh_names)
    if not lowered.statistics:
        raise InvalidInputError(
            "batch_norm='training' but the model has no BatchNormalization node (the export folded them into the "
            "convolutions): export with torch.onnx.export(..., do_constant_folding=False)",
            field="batch_norm",
        )
    return lowered.nodes, lowered.constants, lowered.statistics


def _set_dropout_mode(forward_nodes: list[onnx.NodeProto], mode: str, fresh_names: _FreshNames) -> list[onnx.TensorProto]:
    """Give every Dropout the mode asked for (whatever the export chose); returns the constants that takes."""
    dropouts = [node for node in forward_nodes if node.op_type == "Dropout"]
    if mode == "inference":
        for node in dropouts:
            del node.input[2:]  # no training_mode: the identity
        return []
    if not dropouts:
        raise InvalidInputError(
            "dropout='training' but the model has no Dropout node (eval-mode exports drop them): export with "
            "torch.onnx.export(..., training=torch.onnx.TrainingMode.TRAINING)",
            field="dropout",
        )
    training = fresh_names("dropout/training_mode")
    for node in dropouts:
        node.input[:] = [node.input[0], node.input[1] if len(node.input) > 1 else "", training]
        if len(node.output) < 2:
            node.output.append(fresh_names(f"{node.output[0]}/mask"))
    return [numpy_helper.from_array(np.asarray(True), training)]


def _default_opset(model: onnx.ModelProto) -> int:
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 0)


def _constant_values(frozen: list[onnx.TensorProto], forward_nodes: list[onnx.NodeProto]) -> dict[str, np.ndarray | None]:
    """What the rules may treat as constants: frozen initializers (small ones with their value, for
    attributes such as a Pow exponent), Constant nodes, and Identity aliases of frozen initializers."""
    values: dict[str, np.ndarray | None] = {
        init.name: numpy_helper.to_array(init) if np.prod(init.dims) <= 1024 else None for init in frozen
    }
    for node in forward_nodes:
        if node.op_type == "Constant":
            attributes = _attributes(node)  # `value`, or one of the value_float(s) / value_int(s) forms
            value = attributes.get("value")
            values[node.output[0]] = numpy_helper.to_array(value) if value is not None else np.asarray(next(iter(attributes.values())))
        elif node.op_type == "Identity" and node.input[0] in values:
            values[node.output[0]] = values[node.input[0]]
    return values

