"""The gradient rules of our ONNX autodiff: one entry per op type, registered in one table.

Each rule receives a forward node, the gradients of its outputs and which inputs need a gradient, and
emits standard default-domain ONNX ops (through a `GraphBuilder`) that compute the gradients of its
inputs. The reverse sweep in `fedzoo.graphs.autodiff` looks rules up in `GRADIENT_RULES`; an op on the
path from a trainable parameter to the loss without a rule there is an error naming the op.

Conventions the rules follow, chosen to match torch autograd exactly:
- masks of piecewise-linear ops (Relu, Clip, HardSigmoid, HardSwish, LeakyRelu) are strict at the kinks, like torch;
- broadcasting is undone by `reduce_to_shape`, summing over the broadcast axes of the operand;
- attributes that select elements (Slice starts, Gather indices, Pad pads, reduction axes) must be constants
  once `fedzoo.graphs.forward_preparation` has folded the model's constant subgraphs.

The rules of the ops that move elements around (pooling, Concat, Split, Slice, Gather, Pad, Resize) are
in `fedzoo.graphs.layout_rules`, registered in this same table.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedzoo.errors import InvalidInputError

StaticShape = tuple[int | None, ...]  # None marks a symbolic dimension such as the batch
_FLOAT = 1  # onnx.TensorProto.FLOAT


@dataclass(frozen=True)
class ForwardNode:
    """A forward node as a rule sees it: op type, input/output value names ("" = omitted) and attributes."""

    op_type: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: dict[str, Any] = field(default_factory=dict)

    def input(self, index: int) -> str:
        """The name of input `index`, or "" when the optional input is absent."""
        return self.inputs[index] if index < len(self.inputs) else ""


class GraphBuilder(ABC):
    """What a rule may do to the training graph under construction."""

    opset: int  # the default-domain opset of the training graph

    @abstractmethod
    def emit(self, op_type: str, inputs: Sequence[str], **attributes: Any) -> str:
        """Append a default-domain node with one output and return the output's (fresh) name."""

    @abstractmethod
    def constant(self, value: np.ndarray) -> str:
        """A name holding `value` as a constant of the training graph."""

    @abstractmethod
    def static_shape(self, value_name: str) -> StaticShape:
        """The inferred shape of a forward value; symbolic dimensions are None."""

    @abstractmethod
    def shape_of(self, value_name: str) -> str:
        """A name holding the runtime shape (int64 1-D) of a forward value."""

    @abstractmethod
    def is_constant(self, value_name: str) -> bool:
        """True when the value is fixed in the training graph (a frozen initializer or a Constant)."""

    @abstractmethod
    def constant_value(self, value_name: str) -> np.ndarray | None:
        """The value of a constant (an initializer or a Constant node's output), None for a computed value."""

    @abstractmethod
    def emit_outputs(self, op_type: str, inputs: Sequence[str], count: int, **attributes: Any) -> list[str]:
        """Append a node with `count` outputs and return their fresh names."""


Backward = Callable[[GraphBuilder, ForwardNode, list[str | None], list[bool]], list[str | None]]


EVERY_INPUT = None  # `differentiable_inputs` of variadic ops such as Concat


@dataclass(frozen=True)
class GradientRule:
    """The gradient of one op type: which input positions are differentiable, and how to compute them."""

    differentiable_inputs: tuple[int, ...] | None
    backward: Backward

    def differentiates(self, position: int) -> bool:
        """True when the input at `position` can carry a gradient."""
        return self.differentiable_inputs is EVERY_INPUT or position in self.differentiable_inputs


GRADIENT_RULES: dict[str, GradientRule] = {}


def gradient_rule(op_type: str, differentiable_inputs: tuple[int, ...] | None = (0,)) -> Callable[[Backward], Backward]:
    """Register `backward` as the rule of `op_type` (registering an op twice is a programming error)."""

    def register(backward: Backward) -> Backward:
        if op_type in GRADIENT_RULES:
            raise ValueError(f"a gradient rule for {op_type} is already registered")
        GRADIENT_RULES[op_type] = GradientRule(differentiable_inputs, backward)
        return backward

    return register


class MissingGradientRuleError(InvalidInputError):
    """A node on the path from a trainable parameter to the loss has an op type without a gradient rule."""


def rule_for(node: ForwardNode) -> GradientRule:
    """The registered rule of `node`'s op type, or an error naming the op and the node."""
    rule = GRADIENT_RULES.get(node.op_type)
    if rule is None:
        known = ", ".join(sorted(GRADIENT_RULES))
        raise MissingGradientRuleError(
            f"no gradient rule for ONNX op {node.op_type!r} (node {node.name!r}); rules exist for: {known}",
            field=node.op_type,
        )
    return rule


# helpers ---------------------------------------------------------------------------------------


def int64s(ctx: GraphBuilder, values: Sequence[int]) -> str:
    return ctx.constant(np.asarray(values, dtype=np.int64))


def scalar(ctx: GraphBuilder, value: float) -> str:
    return ctx.constant(np.asarray(value, dtype=np.float32))


def reduce_to_shape(ctx: GraphBuilder, gradient: str, gradient_shape: StaticShape, target: str) -> str:
    """Sum `gradient` over the axes along which forward value `target` was broadcast."""
    target_shape = ctx.static_shape(target)
    leading = len(gradient_shape) - len(target_shape)
    axes = list(range(leading))
    for offset, target_dim in enumerate(target_shape):
        gradient_dim = gradient_shape[leading + offset]  # two symbolic (None) dims are the same: the batch
        if target_dim == 1 and gradient_dim != 1:
            axes.append(leading + offset)
        elif target_dim not in (1, gradient_dim):
            raise InvalidInputError(
                f"cannot reduce a gradient of shape {gradient_shape} to {target!r} of shape {target_shape}"
            )
    if not axes:
        return gradient
    summed = ctx.emit("ReduceSum", [gradient, int64s(ctx, axes)], keepdims=1)
    if all(dim is not None for dim in target_shape):
        return ctx.emit("Reshape", [summed, int64s(ctx, target_shape)])
    return ctx.emit("Reshape", [summed, ctx.shape_of(target)])


def static_dims(node: ForwardNode, value_name: str, shape: StaticShape, axes: Sequence[int]) -> None:
    """Refuse a node whose gradient needs the dims `axes` of a value to be static."""
    if any(shape[axis] is None for axis in axes):
        raise InvalidInputError(
            f"{node.op_type} {node.name!r}: the gradient needs static dims {list(axes)} of {value_name!r}, got {shape}"
        )


def constant_input(ctx: GraphBuilder, node: ForwardNode, index: int, what: str) -> np.ndarray | None:
    """The constant value of optional input `index` (None when absent); an error if it is computed at run time."""
    name = node.input(index)
    if not name:
        return None
    value = ctx.constant_value(name)
    if value is None:
        raise InvalidInputError(f"{node.op_type} {node.name!r}: the gradient needs constant {what}, but {name!r} is computed")
    return value


def reduction_axes(ctx: GraphBuilder, node: ForwardNode, rank: int) -> list[int]:
    """The axes a Reduce* node reduces (attribute before opset 18 for ReduceMean, input otherwise), non-negative."""
    axes = node.attributes.get("axes")
    if axes is None:
        axes = constant_input(ctx, node, 1, "axes")
    if axes is None or len(axes) == 0:
        if node.attributes.get("noop_with_empty_axes", 0):
            return []
        return list(range(rank))
    return sorted(int(axis) % rank for axis in np.asarray(axes).ravel())


def _mask_gradient(ctx: GraphBuilder, gradient: str, mask: str) -> str:
    # Cast + Mul, not Where: onnxruntime's broadcasting Where is an order of magnitude slower here.
    return ctx.emit("Mul", [gradient, ctx.emit("Cast", [mask], to=_FLOAT)])


def _between(ctx: GraphBuilder, value: str, low: str, high: str) -> str:
    """Boolean `low < value < high` (strict, like torch's hardtanh/hardsigmoid backward)."""
    above = ctx.emit("Greater", [value, low])
    below = ctx.emit("Less", [value, high])
    return ctx.emit("And", [above, below])


# elementwise -----------------------------------------------------------------------------------


@gradient_rule("Identity")
def _identity(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    return [grads[0]]


@gradient_rule("Add", differentiable_inputs=(0, 1))
def _add(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    out_shape = ctx.static_shape(node.outputs[0])
    return [reduce_to_shape(ctx, grads[0], out_shape, name) if need else None for name, need in zip(node.inputs, needs)]


@gradient_rule("Sub", differentiable_inputs=(0, 1))
def _sub(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    out_shape = ctx.static_shape(node.outputs[0])
    left = reduce_to_shape(ctx, grads[0], out_shape, node.inputs[0]) if needs[0] else None
    right = None
    if needs[1]:
        right = reduce_to_shape(ctx, ctx.emit("Neg", [grads[0]]), out_shape, node.inputs[1])
    return [left, right]


@gradient_rule("Mul", differentiable_inputs=(0, 1))
def _mul(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    out_shape = ctx.static_shape(node.outputs[0])
    left, right = node.inputs
    return [
        reduce_to_shape(ctx, ctx.emit("Mul", [grads[0], right]), out_shape, left) if needs[0] else None,
        reduce_to_shape(ctx, ctx.emit("Mul", [grads[0], left]), out_shape, right) if needs[1] else None,
    ]


@gradient_rule("Relu")
def _relu(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    positive = ctx.emit("Greater", [node.outputs[0], scalar(ctx, 0.0)])
    return [_mask_gradient(ctx, grads[0], positive)]


@gradient_rule("Clip")
def _clip(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    low = node.input(1) or scalar(ctx, float(np.finfo(np.float32).min))
    high = node.input(2) or scalar(ctx, float(np.finfo(np.float32).max))
    # low < x < high exactly when low < clip(x) < high; reading the output leaves the input with its one
    # consumer, so onnxruntime fuses the producing Conv with the Clip (FusedConv).
    return [_mask_gradient(ctx, grads[0], _between(ctx, node.outputs[0], low, high))]


@gradient_rule("HardSigmoid")
def _hard_sigmoid(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    alpha = float(node.attributes.get("alpha", 0.2))
    beta = float(node.attributes.get("beta", 0.5))
    # d/dx clip(alpha*x + beta, 0, 1) = alpha inside the linear part: (-beta/alpha, (1-beta)/alpha).
    inside = _between(ctx, node.inputs[0], scalar(ctx, -beta / alpha), scalar(ctx, (1.0 - beta) / alpha))
    scaled = ctx.emit("Mul", [grads[0], scalar(ctx, alpha)])
    return [_mask_gradient(ctx, scaled, inside)]


@gradient_rule("HardSwish")
def _hard_swish(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    # y = x * hardsigmoid(x), hardsigmoid(x) = clip(x/6 + 1/2, 0, 1), so y' = hardsigmoid(x) + x/6 on
    # [-3, 3] (torch's convention: the middle formula holds at both ends).
    x = node.inputs[0]
    inside = ctx.emit(
        "And",
        [ctx.emit("GreaterOrEqual", [x, scalar(ctx, -3.0)]), ctx.emit("LessOrEqual", [x, scalar(ctx, 3.0)])],
    )
    ramp = ctx.emit("Mul", [x, ctx.emit("Cast", [inside], to=_FLOAT)])
    slope = ctx.emit("Add", [ctx.emit("HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5), ctx.emit("Mul", [ramp, scalar(ctx, 1.0 / 6.0)])])
    return [ctx.emit("Mul", [grads[0], slope])]


@gradient_rule("LeakyRelu")
def _leaky_relu(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    alpha = float(node.attributes.get("alpha", 0.01))
    positive = ctx.emit("Cast", [ctx.emit("Greater", [node.inputs[0], scalar(ctx, 0.0)])], to=_FLOAT)
    slope = ctx.emit("Add", [ctx.emit("Mul", [positive, scalar(ctx, 1.0 - alpha)]), scalar(ctx, alpha)])
    return [ctx.emit("Mul", [grads[0], slope])]


@gradient_rule("PRelu", differentiable_inputs=(0, 1))
def _prelu(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    x, slope = node.inputs
    positive = ctx.emit("Cast", [ctx.emit("Greater", [x, scalar(ctx, 0.0)])], to=_FLOAT)
    negative = ctx.emit("Sub", [scalar(ctx, 1.0), positive])
    out_shape = ctx.static_shape(node.outputs[0])
    grad_x = grad_slope = None
    if needs[0]:
        local_slope = ctx.emit("Add", [positive, ctx.emit("Mul", [negative, slope])])
        grad_x = reduce_to_shape(ctx, ctx.emit("Mul", [grads[0], local_slope]), out_shape, x)
    if needs[1]:
        negative_part = ctx.emit("Mul", [x, negative])
        grad_slope = reduce_to_shape(ctx, ctx.emit("Mul", [grads[0], negative_part]), out_shape, slope)
    return [grad_x, grad_slope]


@gradient_rule("Sum", differentiable_inputs=EVERY_INPUT)
def _sum(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    out_shape = ctx.static_shape(node.outputs[0])
    return [reduce_to_shape(ctx, grads[0], out_shape, name) if need else None for name, need in zip(node.inputs, needs)]


def _exponential_slope(ctx: GraphBuilder, x: str, alpha: float, scale: float) -> str:
    """scale for x > 0, scale * alpha * exp(x) otherwise (Elu, Selu); exp of min(x, 0), so no inf * 0."""
    positive = ctx.emit("Cast", [ctx.emit("Greater", [x, scalar(ctx, 0.0)])], to=_FLOAT)
    exponential = ctx.emit("Exp", [ctx.emit("Min", [x, scalar(ctx, 0.0)])])
    negative_part = ctx.emit("Mul", [exponential, ctx.emit("Sub", [scalar(ctx, 1.0), positive])])
    slope = ctx.emit("Add", [positive, ctx.emit("Mul", [negative_part, scalar(ctx, alpha)])])
    return ctx.emit("Mul", [slope, scalar(ctx, scale)]) if scale != 1.0 else slope


@gradient_rule("Elu")
def _elu(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    alpha = float(node.attributes.get("alpha", 1.0))
    return [ctx.emit("Mul", [grads[0], _exponential_slope(ctx, node.inputs[0], alpha, 1.0)])]


@gradient_rule("Selu")
def _selu(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    alpha = float(node.attributes.get("alpha", 1.67326319217681884765625))
    gamma = float(node.attributes.get("gamma", 1.05070102214813232421875))
    return [ctx.emit("Mul", [grads[0], _exponential_slope(ctx, node.inputs[0], alpha, gamma)])]


@gradient_rule("Sigmoid")
def _sigmoid(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    y = node.outputs[0]
    return [ctx.emit("Mul", [grads[0], ctx.emit("Mul", [y, ctx.emit("Sub", [scalar(ctx, 1.0), y])])])]


@gradient_rule("Tanh")
def _tanh(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    y = node.outputs[0]
    return [ctx.emit("Mul", [grads[0], ctx.emit("Sub", [scalar(ctx, 1.0), ctx.emit("Mul", [y, y])])])]


@gradient_rule("Softplus")
def _softplus(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    return [ctx.emit("Mul", [grads[0], ctx.emit("Sigmoid", [node.inputs[0]])])]


@gradient_rule("Erf")
def _erf(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    x = node.inputs[0]
    density = ctx.emit("Exp", [ctx.emit("Neg", [ctx.emit("Mul", [x, x])])])
    return [ctx.emit("Mul", [grads[0], ctx.emit("Mul", [density, scalar(ctx, 2.0 / np.sqrt(np.pi))])])]


@gradient_rule("Exp")
def _exp(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    return [ctx.emit("Mul", [grads[0], node.outputs[0]])]


@gradient_rule("Log")
def _log(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    return [ctx.emit("Div", [grads[0], node.inputs[0]])]


@gradient_rule("Sqrt")
def _sqrt(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    return [ctx.emit("Div", [grads[0], ctx.emit("Mul", [node.outputs[0], scalar(ctx, 2.0)])])]


@gradient_rule("Neg")
def _neg(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    return [ctx.emit("Neg", [grads[0]])]


@gradient_rule("Abs")
def _abs(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    return [ctx.emit("Mul", [grads[0], ctx.emit("Sign", [node.inputs[0]])])]


@gradient_rule("Pow")
def _pow(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    exponent = constant_input(ctx, node, 1, "exponent")
    if exponent.size != 1:
        raise InvalidInputError(f"Pow {node.name!r}: the gradient needs a scalar constant exponent, got shape {exponent.shape}")
    power = float(exponent.ravel()[0])
    lowered = ctx.emit("Pow", [node.inputs[0], scalar(ctx, power - 1.0)])
    return [ctx.emit("Mul", [grads[0], ctx.emit("Mul", [lowered, scalar(ctx, power)])]), None]


@gradient_rule("Div", differentiable_inputs=(0, 1))
def _div(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    out_shape = ctx.static_shape(node.outputs[0])
    numerator, denominator = node.inputs
    quotient = ctx.emit("Div", [grads[0], denominator])  # dy / b, also a factor of the denominator's gradient
    left = reduce_to_shape(ctx, quotient, out_shape, numerator) if needs[0] else None
    right = None
    if needs[1]:  # d(a/b)/db = -(a/b) / b
        right = reduce_to_shape(ctx, ctx.emit("Neg", [ctx.emit("Mul", [quotient, node.outputs[0]])]), out_shape, denominator)
    return [left, right]


@gradient_rule("Softmax")
def _softmax(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    y = node.outputs[0]
    axis = int64s(ctx, [int(node.attributes.get("axis", -1))])
    weighted = ctx.emit("ReduceSum", [ctx.emit("Mul", [grads[0], y]), axis], keepdims=1)
    return [ctx.emit("Mul", [y, ctx.emit("Sub", [grads[0], weighted])])]


@gradient_rule("LogSoftmax")
def _log_softmax(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    axis = int64s(ctx, [int(node.attributes.get("axis", -1))])
    total = ctx.emit("ReduceSum", [grads[0], axis], keepdims=1)
    return [ctx.emit("Sub", [grads[0], ctx.emit("Mul", [ctx.emit("Exp", [node.outputs[0]]), total])])]


@gradient_rule("Dropout")
def _dropout(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    # `fedzoo.graphs.autodiff` sets the mode: inference (no training_mode input: the identity) or training
    # (training_mode a constant true, the mask an output): dy where the mask kept an element, / (1 - ratio).
    training_mode = constant_input(ctx, node, 2, "training_mode")
    if training_mode is None or not bool(training_mode):
        return [grads[0], None, None][: len(needs)]
    ratio = constant_input(ctx, node, 1, "ratio")
    keep = 1.0 - (0.5 if ratio is None else float(ratio))
    kept = ctx.emit("Cast", [node.outputs[1]], to=_FLOAT)
    return [ctx.emit("Mul", [grads[0], ctx.emit("Mul", [kept, scalar(ctx, 1.0 / keep)])]), None, None][: len(needs)]


@gradient_rule("Expand")
def _expand(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    return [reduce_to_shape(ctx, grads[0], ctx.static_shape(node.outputs[0]), node.inputs[0]), None]


# reductions and normalization -----------------------------------------------------------------


def _spread_reduction(ctx: GraphBuilder, node: ForwardNode, gradient: str, axes: list[int]) -> str:
    """The gradient of a reduction output broadcast back over the input (undoing keepdims=0 first)."""
    if axes and not node.attributes.get("keepdims", 1):
        gradient = ctx.emit("Unsqueeze", [gradient, int64s(ctx, axes)])
    return ctx.emit("Expand", [gradient, ctx.shape_of(node.inputs[0])])


@gradient_rule("ReduceSum")
def _reduce_sum(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    axes = reduction_axes(ctx, node, len(ctx.static_shape(node.inputs[0])))
    return [_spread_reduction(ctx, node, grads[0], axes), None][: len(needs)]


@gradient_rule("ReduceMean")
def _reduce_mean(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    shape = ctx.static_shape(node.inputs[0])
    axes = reduction_axes(ctx, node, len(shape))
    static_dims(node, node.inputs[0], shape, axes)
    count = float(np.prod([shape[axis] for axis in axes]))
    spread = _spread_reduction(ctx, node, grads[0], axes)
    return [ctx.emit("Mul", [spread, scalar(ctx, 1.0 / count)]), None][: len(needs)]


def _mean_over(ctx: GraphBuilder, value: str, axes: str, count: int) -> str:
    # ReduceSum takes its axes as an input from opset 13 on, ReduceMean only from 18: sum and scale.
    return ctx.emit("Mul", [ctx.emit("ReduceSum", [value, axes], keepdims=1), scalar(ctx, 1.0 / count)])


def _normalization_gradients(
    ctx: GraphBuilder, scale_gradient: str, normalized: str, inverse_std: str, axes: str, count: int
) -> str:
    """dx of y = (x - mean) * inverse_std over `axes` with batch statistics: inverse_std * (g - mean(g) - x^ mean(g x^))."""
    centered_g = ctx.emit("Sub", [scale_gradient, _mean_over(ctx, scale_gradient, axes, count)])
    projection = _mean_over(ctx, ctx.emit("Mul", [scale_gradient, normalized]), axes, count)
    return ctx.emit("Mul", [ctx.emit("Sub", [centered_g, ctx.emit("Mul", [normalized, projection])]), inverse_std])


@gradient_rule("LayerNormalization", differentiable_inputs=(0, 1, 2))
def _layer_normalization(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    x, scale = node.inputs[0], node.inputs[1]
    shape = ctx.static_shape(x)
    axis = int(node.attributes.get("axis", -1)) % len(shape)
    normalized_axes = list(range(axis, len(shape)))
    static_dims(node, x, shape, normalized_axes)
    count = int(np.prod([shape[a] for a in normalized_axes]))
    epsilon = float(node.attributes.get("epsilon", 1e-5))
    axes = int64s(ctx, normalized_axes)
    # The statistics are recomputed here (the forward's optional Mean/InvStdDev outputs are rarely exported).
    centered = ctx.emit("Sub", [x, _mean_over(ctx, x, axes, count)])
    variance = _mean_over(ctx, ctx.emit("Mul", [centered, centered]), axes, count)
    inverse_std = ctx.emit("Reciprocal", [ctx.emit("Sqrt", [ctx.emit("Add", [variance, scalar(ctx, epsilon)])])])
    normalized = ctx.emit("Mul", [centered, inverse_std])
    dy = grads[0]
    grad_x = None
    if needs[0]:
        grad_x = _normalization_gradients(ctx, ctx.emit("Mul", [dy, scale]), normalized, inverse_std, axes, count)
    leading = int64s(ctx, list(range(axis)))
    grad_scale = ctx.emit("ReduceSum", [ctx.emit("Mul", [dy, normalized]), leading], keepdims=0) if needs[1] else None
    grad_bias = None
    if len(needs) > 2 and needs[2]:
        grad_bias = ctx.emit("ReduceSum", [dy, leading], keepdims=0)
    return [grad_x, grad_scale, grad_bias][: len(needs)]


@gradient_rule("BatchNormalization", differentiable_inputs=(0, 1, 2))
def _batch_normalization(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    """Inference mode: y = scale * (x - mean) / sqrt(var + eps) + bias with the stored statistics (constants)."""
    if node.attributes.get("training_mode", 0):
        raise InvalidInputError(
            f"BatchNormalization {node.name!r} is in training mode: build with batch_norm='training' (batch statistics) "
            "or export the model in eval mode"
        )
    x, scale, _, mean, variance = node.inputs[:5]
    rank = len(ctx.static_shape(x))
    per_channel = int64s(ctx, [-1, *[1] * (rank - 2)])
    epsilon = float(node.attributes.get("epsilon", 1e-5))
    inverse_std = ctx.emit("Reciprocal", [ctx.emit("Sqrt", [ctx.emit("Add", [variance, scalar(ctx, epsilon)])])])
    inverse_std = ctx.emit("Reshape", [inverse_std, per_channel])
    dy = grads[0]
    other_axes = int64s(ctx, [0, *range(2, rank)])
    grad_x = grad_scale = grad_bias = None
    if needs[0]:
        grad_x = ctx.emit("Mul", [dy, ctx.emit("Mul", [inverse_std, ctx.emit("Reshape", [scale, per_channel])])])
    if needs[1]:
        normalized = ctx.emit("Mul", [ctx.emit("Sub", [x, ctx.emit("Reshape", [mean, per_channel])]), inverse_std])
        grad_scale = ctx.emit("ReduceSum", [ctx.emit("Mul", [dy, normalized]), other_axes], keepdims=0)
    if needs[2]:
        grad_bias = ctx.emit("ReduceSum", [dy, other_axes], keepdims=0)
    return [grad_x, grad_scale, grad_bias, None, None][: len(needs)]


# shape -----------------------------------------------------------------------------------------


def _back_to_input_shape(
    ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]
) -> list[str | None]:
    return [ctx.emit("Reshape", [grads[0], ctx.shape_of(node.inputs[0])])]


@gradient_rule("Transpose")
def _transpose(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    rank = len(ctx.static_shape(node.inputs[0]))
    perm = list(node.attributes.get("perm", reversed(range(rank))))
    return [ctx.emit("Transpose", [grads[0]], perm=[perm.index(axis) for axis in range(rank)])]


gradient_rule("Flatten")(_back_to_input_shape)
gradient_rule("Reshape")(_back_to_input_shape)
gradient_rule("Squeeze")(_back_to_input_shape)
gradient_rule("Unsqueeze")(_back_to_input_shape)


@gradient_rule("GlobalAveragePool")
def _global_average_pool(
    ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]
) -> list[str | None]:
    spatial = ctx.static_shape(node.inputs[0])[2:]
    if any(dim is None for dim in spatial):
        raise InvalidInputError(f"GlobalAveragePool {node.name!r} needs static spatial dims, got {spatial}")
    spread = ctx.emit("Expand", [grads[0], ctx.shape_of(node.inputs[0])])
    return [ctx.emit("Mul", [spread, scalar(ctx, 1.0 / float(np.prod(spatial)))])]


# linear algebra --------------------------------------------------------------------------------


@gradient_rule("Gemm", differentiable_inputs=(0, 1, 2))
def _gemm(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    # Y = alpha * op(A) @ op(B) + beta * C, op = optional transpose.
    a, b = node.inputs[0], node.inputs[1]
    alpha = float(node.attributes.get("alpha", 1.0))
    beta = float(node.attributes.get("beta", 1.0))
    trans_a = int(node.attributes.get("transA", 0))
    trans_b = int(node.attributes.get("transB", 0))
    dy = grads[0]
    grad_a = grad_b = grad_c = None
    if needs[0]:
        if trans_a:
            grad_a = ctx.emit("Gemm", [b, dy], alpha=alpha, transA=trans_b, transB=1)
        else:
            grad_a = ctx.emit("Gemm", [dy, b], alpha=alpha, transB=1 - trans_b)
    if needs[1]:
        if trans_b:
            grad_b = ctx.emit("Gemm", [dy, a], alpha=alpha, transA=1, transB=trans_a)
        else:
            grad_b = ctx.emit("Gemm", [a, dy], alpha=alpha, transA=1 - trans_a)
    if len(needs) > 2 and needs[2]:
        scaled = dy if beta == 1.0 else ctx.emit("Mul", [dy, scalar(ctx, beta)])
        grad_c = reduce_to_shape(ctx, scaled, ctx.static_shape(node.outputs[0]), node.inputs[2])
    return [grad_a, grad_b, grad_c][: len(needs)]


def _swap_last_two(ctx: GraphBuilder, value: str, rank: int) -> str:
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    return ctx.emit("Transpose", [value], perm=perm)


@gradient_rule("MatMul", differentiable_inputs=(0, 1))
def _matmul(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    a, b = node.inputs
    a_rank, b_rank = len(ctx.static_shape(a)), len(ctx.static_shape(b))
    if a_rank < 2 or b_rank < 2:
        raise InvalidInputError(f"MatMul {node.name!r}: gradients need operands of rank >= 2, got {a_rank} and {b_rank}")
    batch_shape = ctx.static_shape(node.outputs[0])[:-2]
    grad_a = grad_b = None
    if needs[0]:
        product = ctx.emit("MatMul", [grads[0], _swap_last_two(ctx, b, b_rank)])
        grad_a = reduce_to_shape(ctx, product, (*batch_shape, *ctx.static_shape(a)[-2:]), a)
    if needs[1]:
        product = ctx.emit("MatMul", [_swap_last_two(ctx, a, a_rank), grads[0]])
        grad_b = reduce_to_shape(ctx, product, (*batch_shape, *ctx.static_shape(b)[-2:]), b)
    return [grad_a, grad_b]


# convolution -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ConvGeometry:
    groups: int
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # begin..., end...
    input_shape: StaticShape
    output_shape: StaticShape
    weight_shape: StaticShape


def _conv_geometry(ctx: GraphBuilder, node: ForwardNode) -> _ConvGeometry:
    if node.attributes.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        raise InvalidInputError(f"Conv {node.name!r}: auto_pad is not supported by the gradient rule; use pads")
    weight_shape = ctx.static_shape(node.inputs[1])
    input_shape = ctx.static_shape(node.inputs[0])
    output_shape = ctx.static_shape(node.outputs[0])
    spatial = len(weight_shape) - 2
    if any(dim is None for dim in (*weight_shape, *input_shape[1:], *output_shape[1:])):
        raise InvalidInputError(
            f"Conv {node.name!r}: gradients need static shapes except the batch, got input {input_shape}, "
            f"weight {weight_shape}, output {output_shape}"
        )
    return _ConvGeometry(
        groups=int(node.attributes.get("group", 1)),
        kernel=tuple(weight_shape[2:]),
        strides=tuple(node.attributes.get("strides", [1] * spatial)),
        dilations=tuple(node.attributes.get("dilations", [1] * spatial)),
        pads=tuple(node.attributes.get("pads", [0] * 2 * spatial)),
        input_shape=input_shape,
        output_shape=output_shape,
        weight_shape=weight_shape,
    )


def _flipped_kernel_pads(geometry: _ConvGeometry) -> list[int] | None:
    """Pads of the stride-1 conv of dy with the flipped kernel that equals dx (None if there is none)."""
    if any(stride != 1 for stride in geometry.strides):
        return None
    spatial = len(geometry.kernel)
    reach = [geometry.dilations[axis] * (geometry.kernel[axis] - 1) for axis in range(spatial)]
    pads = [reach[axis % spatial] - pad for axis, pad in enumerate(geometry.pads)]
    return pads if min(pads) >= 0 else None


def _conv_input_gradient_flipped(ctx: GraphBuilder, node: ForwardNode, geometry: _ConvGeometry, dy: str, pads: list[int]) -> str:
    """dx of a stride-1 conv with a frozen kernel as a Conv of dy with the flipped, transposed kernel.

    onnxruntime folds the kernel rearrangement into a constant and then runs its fast blocked (NCHWc)
    convolution, which it never does for ConvTranspose.
    """
    groups = geometry.groups
    out_channels, in_per_group = geometry.weight_shape[0], geometry.weight_shape[1]
    spatial = len(geometry.kernel)
    by_group = ctx.emit("Reshape", [node.inputs[1], int64s(ctx, [groups, out_channels // groups, in_per_group, *geometry.kernel])])
    swapped = ctx.emit("Transpose", [by_group], perm=[0, 2, 1, *range(3, 3 + spatial)])
    transposed = ctx.emit("Reshape", [swapped, int64s(ctx, [groups * in_per_group, out_channels // groups, *geometry.kernel])])
    axes = list(range(2, 2 + spatial))
    last = np.iinfo(np.int64).min
    flipped = ctx.emit(
        "Slice", [transposed, int64s(ctx, [-1] * spatial), int64s(ctx, [last] * spatial), int64s(ctx, axes), int64s(ctx, [-1] * spatial)]
    )
    return ctx.emit("Conv", [dy, flipped], group=groups, dilations=list(geometry.dilations), pads=pads)


def _conv_input_gradient(ctx: GraphBuilder, node: ForwardNode, geometry: _ConvGeometry, dy: str) -> str:
    """dx = ConvTranspose(dy, W) with the conv's geometry; output_padding restores rows a stride skipped."""
    flipped_pads = _flipped_kernel_pads(geometry)
    if flipped_pads is not None and ctx.is_constant(node.inputs[1]):
        return _conv_input_gradient_flipped(ctx, node, geometry, dy, flipped_pads)
    spatial = len(geometry.kernel)
    output_padding = []
    for axis in range(spatial):
        rebuilt = (
            (geometry.output_shape[2 + axis] - 1) * geometry.strides[axis]
            - geometry.pads[axis]
            - geometry.pads[spatial + axis]
            + geometry.dilations[axis] * (geometry.kernel[axis] - 1)
            + 1
        )
        output_padding.append(geometry.input_shape[2 + axis] - rebuilt)
    return ctx.emit(
        "ConvTranspose",
        [dy, node.inputs[1]],
        group=geometry.groups,
        strides=list(geometry.strides),
        dilations=list(geometry.dilations),
        pads=list(geometry.pads),
        kernel_shape=list(geometry.kernel),
        output_padding=output_padding,
    )


def _conv_weight_gradient(ctx: GraphBuilder, node: ForwardNode, geometry: _ConvGeometry, dy: str) -> str:
    """dW as a Conv of x (channels and batch swapped) with dy as the kernel: dilation = stride, stride = dilation.

    Groups become groups of this conv: x goes to (C_in/g, g*N, H, W), dy to (C_out, N, oh, ow), so output
    channel o only sees the batch copies of its own group's inputs. The result has the kernel size or a
    little more (rows a stride never reached): less end padding drops them where it can, a Slice otherwise.
    """
    groups = geometry.groups
    in_channels = geometry.input_shape[1]
    in_per_group = in_channels // groups
    spatial_in = list(geometry.input_shape[2:])
    spatial_out = list(geometry.output_shape[2:])
    x_channels_first = ctx.emit("Transpose", [node.inputs[0]], perm=[1, 0, *range(2, 2 + len(spatial_in))])
    if groups == 1:
        x_swapped = x_channels_first
    else:
        by_group = ctx.emit("Reshape", [x_channels_first, int64s(ctx, [groups, in_per_group, -1, *spatial_in])])
        swapped = ctx.emit("Transpose", [by_group], perm=[1, 0, *range(2, 3 + len(spatial_in))])
        x_swapped = ctx.emit("Reshape", [swapped, int64s(ctx, [in_per_group, -1, *spatial_in])])
    dy_kernel = ctx.emit("Transpose", [dy], perm=[1, 0, *range(2, 2 + len(spatial_out))])
    # Rows past the kernel that a stride never reached are not computed where the end padding can give them up.
    spatial = len(geometry.kernel)
    full_kernel = list(_conv_weight_gradient_size(geometry))
    pads = list(geometry.pads)
    for axis in range(spatial):
        excess_rows = full_kernel[axis] - geometry.kernel[axis]
        if 0 < excess_rows * geometry.dilations[axis] <= pads[spatial + axis]:
            pads[spatial + axis] -= excess_rows * geometry.dilations[axis]
            full_kernel[axis] = geometry.kernel[axis]
    full = ctx.emit(
        "Conv",
        [x_swapped, dy_kernel],
        group=groups,
        strides=list(geometry.dilations),
        dilations=list(geometry.strides),
        pads=pads,
    )
    weight = ctx.emit("Transpose", [full], perm=[1, 0, *range(2, 2 + len(spatial_in))])
    if tuple(full_kernel) != geometry.kernel:
        axes = list(range(2, 2 + len(geometry.kernel)))
        weight = ctx.emit(
            "Slice", [weight, int64s(ctx, [0] * len(axes)), int64s(ctx, list(geometry.kernel)), int64s(ctx, axes)]
        )
    return weight


def _conv_weight_gradient_size(geometry: _ConvGeometry) -> tuple[int, ...]:
    spatial = len(geometry.kernel)
    sizes = []
    for axis in range(spatial):
        padded = geometry.input_shape[2 + axis] + geometry.pads[axis] + geometry.pads[spatial + axis]
        reach = geometry.strides[axis] * (geometry.output_shape[2 + axis] - 1) + 1
        sizes.append((padded - reach) // geometry.dilations[axis] + 1)
    return tuple(sizes)


def _is_depthwise(geometry: _ConvGeometry) -> bool:
    channels = geometry.input_shape[1]
    return geometry.groups == channels > 1 and geometry.weight_shape[:2] == (channels, 1) and len(geometry.kernel) == 2


def _depthwise_weight_gradient(ctx: GraphBuilder, node: ForwardNode, geometry: _ConvGeometry, dy: str) -> str:
    """dW of a depthwise conv one kernel row a at a time: G_a[c] = rows_a(x)[c]^T @ dy[c], the (padded W, OW)
    products of the input rows that kernel row a reads with the output rows (channels leading, so one
    MatMul batched over the channels), then dW[c, a, b] = sum_j G_a[c, j*stride + b*dilation - pad_left, j].

    Only the height is padded: a column of the width padding is zero, so it is left out of the (W, OW)
    products and of that sum (onnxruntime pads along the last axis several times slower).
    onnxruntime runs the grouped Conv of `_conv_weight_gradient` as one tiny GEMM per channel: measured
    about 3x slower on a 14x14 plane with a 5x5 kernel."""
    channels = geometry.input_shape[1]
    (kernel_height, kernel_width), (stride_h, stride_w) = geometry.kernel, geometry.strides
    (dilation_h, dilation_w), out_height, out_width = geometry.dilations, *geometry.output_shape[2:]
    width, pad_left = geometry.input_shape[3], geometry.pads[1]
    x_channels_first = ctx.emit("Transpose", [node.inputs[0]], perm=[1, 0, 2, 3])
    pads = [0, 0, geometry.pads[0], 0, 0, 0, geometry.pads[2], 0]
    padded = ctx.emit("Pad", [x_channels_first, int64s(ctx, pads)]) if any(pads) else x_channels_first
    dy_rows = ctx.emit("Reshape", [ctx.emit("Transpose", [dy], perm=[1, 0, 2, 3]), int64s(ctx, [channels, -1, out_width])])
    products = []
    for a in range(kernel_height):
        first = a * dilation_h
        rows = ctx.emit(
            "Slice", [padded, int64s(ctx, [first]), int64s(ctx, [first + stride_h * (out_height - 1) + 1]),
                      int64s(ctx, [2]), int64s(ctx, [stride_h])],
        )  # fmt: skip
        rows = ctx.emit("Transpose", [ctx.emit("Reshape", [rows, int64s(ctx, [channels, -1, width])])], perm=[0, 2, 1])
        products.append(ctx.emit("MatMul", [rows, dy_rows]))  # (C, W, OW)
    stacked = ctx.emit("Concat", products, axis=1) if len(products) > 1 else products[0]
    stacked = ctx.emit("Reshape", [stacked, int64s(ctx, [channels, kernel_height, width * out_width])])
    diagonals = np.zeros((width, out_width, kernel_width), np.float32)
    outputs = np.arange(out_width)
    for b in range(kernel_width):
        columns = outputs * stride_w + b * dilation_w - pad_left
        inside = (columns >= 0) & (columns < width)
        diagonals[columns[inside], outputs[inside], b] = 1.0
    summed = ctx.emit("MatMul", [stacked, ctx.constant(diagonals.reshape(width * out_width, kernel_width))])
    return ctx.emit("Reshape", [summed, int64s(ctx, list(geometry.weight_shape))])


def _is_pointwise(geometry: _ConvGeometry) -> bool:
    return (
        geometry.groups == 1
        and all(size == 1 for size in (*geometry.kernel, *geometry.strides, *geometry.dilations))
        and not any(geometry.pads)
    )


def _pointwise_weight_gradient(ctx: GraphBuilder, node: ForwardNode, geometry: _ConvGeometry, dy: str) -> str:
    """dW of a 1x1 conv as per-sample GEMMs dy[n] (C_out, HW) @ x[n]^T (HW, C_in) summed over the batch:
    much faster than a Conv whose kernel is the whole feature map, and no feature map is transposed."""
    out_channels, in_channels = geometry.weight_shape[0], geometry.weight_shape[1]
    dy_rows = ctx.emit("Reshape", [dy, int64s(ctx, [0, out_channels, -1])])
    x_columns = ctx.emit("Transpose", [ctx.emit("Reshape", [node.inputs[0], int64s(ctx, [0, in_channels, -1])])], perm=[0, 2, 1])
    summed = ctx.emit("ReduceSum", [ctx.emit("MatMul", [dy_rows, x_columns]), int64s(ctx, [0])], keepdims=0)
    return ctx.emit("Reshape", [summed, int64s(ctx, list(geometry.weight_shape))])


def _pointwise_input_gradient(ctx: GraphBuilder, node: ForwardNode, geometry: _ConvGeometry, dy: str) -> str:
    """dx of a 1x1 conv as W^T (C_in, C_out) @ dy[n] (C_out, HW), one GEMM per sample."""
    out_channels, in_channels = geometry.weight_shape[0], geometry.weight_shape[1]
    weight_t = ctx.emit("Transpose", [ctx.emit("Reshape", [node.inputs[1], int64s(ctx, [out_channels, in_channels])])], perm=[1, 0])
    product = ctx.emit("MatMul", [weight_t, ctx.emit("Reshape", [dy, int64s(ctx, [0, out_channels, -1])])])
    return ctx.emit("Reshape", [product, ctx.shape_of(node.inputs[0])])


@gradient_rule("Conv", differentiable_inputs=(0, 1, 2))
def _conv(ctx: GraphBuilder, node: ForwardNode, grads: list[str | None], needs: list[bool]) -> list[str | None]:
    geometry = _conv_geometry(ctx, node)
    dy = grads[0]
    # A frozen kernel is better served by `_conv_input_gradient` (a constant-kernel Conv, run blocked).
    trainable_pointwise = _is_pointwise(geometry) and not ctx.is_constant(node.inputs[1])
    input_gradient = _pointwise_input_gradient if trainable_pointwise else _conv_input_gradient
    grad_x = input_gradient(ctx, node, geometry, dy) if needs[0] else None
    grad_w = None
    if needs[1]:
        weight_gradient = _conv_weight_gradient
        if _is_pointwise(geometry):
            weight_gradient = _pointwise_weight_gradient
        elif _is_depthwise(geometry):
            weight_gradient = _depthwise_weight_gradient
        grad_w = weight_gradient(ctx, node, geometry, dy)
    grad_b = None
    if len(needs) > 2 and needs[2]:
        axes = [0, *range(2, len(geometry.output_shape))]
        grad_b = ctx.emit("ReduceSum", [dy, int64s(ctx, axes)], keepdims=0)
    return [grad_x, grad_w, grad_b][: len(needs)]


# Registers the rules of the ops that move elements around into GRADIENT_RULES (kept in their own module).
from fedzoo.graphs import layout_rules  # noqa: E402, F401
