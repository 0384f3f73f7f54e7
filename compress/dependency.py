"""Which channels of a network must be pruned together.

Removing output channel c of a conv also removes input channel c of every layer that reads it: the
BatchNorm after it, a depthwise conv (whose channels follow their producer), the next conv's input,
the classifier's input features, and - through a residual Add - the channels of every other branch
summed with it. We trace the model with torch.fx, propagate a channel *group* along every tensor,
and merge groups where an Add couples them. Each group lists the parameter slots (module + role) that
carry its channels; pruning a group slices all of them with the same indices.

Each operation has one rule in `_MODULE_RULES` / `_FUNCTION_RULES`; an operation without a rule is an
explicit `UnsupportedOperationError`, never a silent guess.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from math import prod

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

from fedzoo.compress.errors import UnsupportedOperationError

# Roles a parameter slot can play for a group of channels.
CONV_OUT = "conv_out"  # weight dim 0, bias
CONV_IN = "conv_in"  # weight dim 1
DEPTHWISE = "depthwise"  # weight dim 0, bias, and the conv's groups
BATCHNORM = "batchnorm"  # weight, bias, running statistics
LINEAR_OUT = "linear_out"  # weight dim 0, bias
LINEAR_IN = "linear_in"  # weight dim 1, `features_per_channel` columns per channel
PRODUCER_ROLES = (CONV_OUT, DEPTHWISE, LINEAR_OUT)


@dataclass(frozen=True)
class ChannelSlot:
    """One parameter tensor dimension that carries a group's channels."""

    module: str
    role: str
    features_per_channel: int = 1


@dataclass
class ChannelGroup:
    """Channels that must be kept or removed together; `pinned` groups (model input/output) are never pruned."""

    channels: int
    slots: list[ChannelSlot] = field(default_factory=list)
    pinned_because: list[str] = field(default_factory=list)

    @property
    def prunable(self) -> bool:
        return not self.pinned_because and any(slot.role in PRODUCER_ROLES for slot in self.slots)

    @property
    def name(self) -> str:
        """The first module producing these channels, a stable handle for per-layer ratios."""
        producers = [slot.module for slot in self.slots if slot.role in (CONV_OUT, LINEAR_OUT)]
        return producers[0] if producers else f"<{self.slots[0].role} of {self.slots[0].module}>"


@dataclass(frozen=True)
class _Layout:
    """Where a tensor's channels live: dim 1, as `features_per_channel` consecutive features each."""

    group: int
    features_per_channel: int = 1


class _Analysis:
    """Union-find over channel groups, filled by the rules while walking the traced graph."""

    def __init__(self, root: nn.Module) -> None:
        self.root = root
        self.parent: list[int] = []
        self.groups: list[ChannelGroup] = []
        self.layouts: dict[torch.fx.Node, _Layout | None] = {}
        self.seen_modules: set[str] = set()

    def new_group(self, channels: int) -> int:
        self.parent.append(len(self.parent))
        self.groups.append(ChannelGroup(channels))
        return len(self.groups) - 1

    def find(self, group: int) -> int:
        while self.parent[group] != group:
            self.parent[group] = self.parent[self.parent[group]]
            group = self.parent[group]
        return group

    def union(self, first: int, second: int, node: torch.fx.Node) -> int:
        first, second = self.find(first), self.find(second)
        if first == second:
            return first
        if self.groups[first].channels != self.groups[second].channels:
            raise UnsupportedOperationError(
                f"node {node.name!r} combines tensors of {self.groups[first].channels} and "
                f"{self.groups[second].channels} channels; channel broadcasting is not supported by pruning"
            )
        self.parent[second] = first
        self.groups[first].slots.extend(self.groups[second].slots)
        self.groups[first].pinned_because.extend(self.groups[second].pinned_because)
        return first

    def add_slot(self, group: int, slot: ChannelSlot) -> None:
        self.groups[self.find(group)].slots.append(slot)

    def pin(self, group: int, reason: str) -> None:
        self.groups[self.find(group)].pinned_because.append(reason)

    def layout_of(self, node: torch.fx.Node) -> _Layout:
        layout = self.layouts.get(node)
        if layout is None:
            raise UnsupportedOperationError(f"node {node.name!r} expects a feature tensor but gets {node.op} {node.target}")
        return layout

    def module(self, node: torch.fx.Node) -> nn.Module:
        name = str(node.target)
        if name in self.seen_modules:
            raise UnsupportedOperationError(f"module {name!r} is called more than once; shared layers cannot be pruned")
        self.seen_modules.add(name)
        return self.root.get_submodule(name)


def _shape(node: torch.fx.Node) -> tuple[int, ...] | None:
    meta = node.meta.get("tensor_meta")
    return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None


# rules: each returns the layout of the node's output -----------------------------------------------


def _conv(analysis: _Analysis, node: torch.fx.Node) -> _Layout:
    conv = analysis.module(node)
    name = str(node.target)
    source = analysis.layout_of(node.args[0])
    if conv.groups == 1:
        analysis.add_slot(source.group, ChannelSlot(name, CONV_IN))
        output = analysis.new_group(conv.out_channels)
        analysis.add_slot(output, ChannelSlot(name, CONV_OUT))
        return _Layout(output)
    if conv.groups == conv.in_channels == conv.out_channels:
        analysis.add_slot(source.group, ChannelSlot(name, DEPTHWISE))
        return _Layout(source.group)
    # A grouped conv ties channels in blocks; we keep both sides whole rather than guess.
    analysis.pin(source.group, f"input of grouped conv {name}")
    output = analysis.new_group(conv.out_channels)
    analysis.pin(output, f"output of grouped conv {name}")
    return _Layout(output)


def _batchnorm(analysis: _Analysis, node: torch.fx.Node) -> _Layout:
    analysis.module(node)
    source = analysis.layout_of(node.args[0])
    analysis.add_slot(source.group, ChannelSlot(str(node.target), BATCHNORM))
    return source


def _linear(analysis: _Analysis, node: torch.fx.Node) -> _Layout:
    linear = analysis.module(node)
    name = str(node.target)
    source = analysis.layout_of(node.args[0])
    analysis.add_slot(source.group, ChannelSlot(name, LINEAR_IN, source.features_per_channel))
    output = analysis.new_group(linear.out_features)
    analysis.add_slot(output, ChannelSlot(name, LINEAR_OUT))
    return _Layout(output)


def _passthrough(analysis: _Analysis, node: torch.fx.Node) -> _Layout:
    """Element-wise activations, dropout and spatial pooling keep every channel where it was."""
    if node.op == "call_module":
        analysis.module(node)
    return analysis.layout_of(node.args[0])


def _flatten(analysis: _Analysis, node: torch.fx.Node) -> _Layout:
    """(N, C, H, W) -> (N, C*H*W): each channel becomes H*W consecutive features."""
    if node.op == "call_module":
        analysis.module(node)
    source = analysis.layout_of(node.args[0])
    before, after = _shape(node.args[0]), _shape(node)
    if before is None or after is None or len(after) != 2 or after[0] != before[0] or after[1] != prod(before[1:]):
        raise UnsupportedOperationError(
            f"node {node.name!r} reshapes {before} to {after}; pruning supports only flattening all but the batch dim"
        )
    return _Layout(source.group, source.features_per_channel * prod(before[2:]))


def _spatial_mean(analysis: _Analysis, node: torch.fx.Node) -> _Layout:
    """`x.mean((2, 3))`: global average pooling written as a reduction."""
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    rank = len(_shape(node.args[0]) or ())
    if rank < 3 or sorted(d % rank for d in dims) != list(range(2, rank)):
        raise UnsupportedOperationError(f"node {node.name!r} averages over dims {dims}; pruning supports spatial means only")
    return analysis.layout_of(node.args[0])


def _elementwise_binary(analysis: _Analysis, node: torch.fx.Node) -> _Layout:
    """Add/Mul/Sub of two feature tensors couples their channels (residual connections)."""
    tensors = [arg for arg in node.args[:2] if isinstance(arg, torch.fx.Node) and analysis.layouts.get(arg) is not None]
    if len(tensors) == 1:
        return analysis.layouts[tensors[0]]
    first, second = (analysis.layout_of(arg) for arg in tensors)
    if first.features_per_channel != second.features_per_channel:
        raise UnsupportedOperationError(f"node {node.name!r} combines tensors with different layouts")
    return _Layout(analysis.union(first.group, second.group, node), first.features_per_channel)


def _not_a_tensor(analysis: _Analysis, node: torch.fx.Node) -> None:
    """`x.size(0)`, `x.shape`: shape arithmetic feeding a reshape carries no channels."""
    if _shape(node) is not None:
        raise UnsupportedOperationError(f"node {node.name!r} indexes a feature tensor; pruning cannot follow slices")
    return None


_PASSTHROUGH_MODULES = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.Hardswish, nn.Hardsigmoid, nn.SiLU, nn.GELU, nn.Sigmoid, nn.Tanh,
    nn.Dropout, nn.Identity, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d,
)  # fmt: skip

_MODULE_RULES: list[tuple[type[nn.Module], Callable]] = [
    (nn.Conv2d, _conv),
    (nn.BatchNorm2d, _batchnorm),
    (nn.Linear, _linear),
    (nn.Flatten, _flatten),
    *[(module_type, _passthrough) for module_type in _PASSTHROUGH_MODULES],
]

_FUNCTION_RULES: dict[object, Callable] = {
    operator.add: _elementwise_binary, torch.add: _elementwise_binary, "add": _elementwise_binary,
    operator.iadd: _elementwise_binary, "add_": _elementwise_binary,
    operator.mul: _elementwise_binary, torch.mul: _elementwise_binary, "mul": _elementwise_binary,
    F.relu: _passthrough, F.relu6: _passthrough, F.hardswish: _passthrough, F.silu: _passthrough,
    F.dropout: _passthrough, F.adaptive_avg_pool2d: _passthrough, F.max_pool2d: _passthrough,
    F.avg_pool2d: _passthrough, torch.relu: _passthrough, torch.sigmoid: _passthrough,
    "relu": _passthrough, "relu_": _passthrough, "sigmoid": _passthrough, "contiguous": _passthrough,
    torch.flatten: _flatten, "flatten": _flatten, "view": _flatten, "reshape": _flatten, torch.reshape: _flatten,
    "mean": _spatial_mean, torch.mean: _spatial_mean,
    "size": _not_a_tensor, getattr: _not_a_tensor, operator.getitem: _not_a_tensor,
}  # fmt: skip


def _rule_for(analysis: _Analysis, node: torch.fx.Node) -> Callable:
    if node.op == "call_module":
        module = analysis.root.get_submodule(str(node.target))
        for module_type, rule in _MODULE_RULES:
            if type(module) is module_type:
                return rule
        what = f"module {node.target!r} of type {type(module).__name__}"
    else:
        rule = _FUNCTION_RULES.get(node.target)
        if rule is not None:
            return rule
        what = f"{node.op} {getattr(node.target, '__name__', node.target)!r}"
    raise UnsupportedOperationError(
        f"channel pruning has no rule for {what} (node {node.name!r}); supported modules: "
        f"{sorted(t.__name__ for t, _ in _MODULE_RULES)}"
    )


def analyse_channel_groups(model: nn.Module, input_shape: tuple[int, ...]) -> list[ChannelGroup]:
    """Trace `model` on an input of `input_shape` (batch first) and return its coupled channel groups."""
    try:
        traced = torch.fx.symbolic_trace(model)
    except Exception as error:  # fx raises many types for untraceable Python control flow
        raise UnsupportedOperationError(f"cannot trace the model for pruning: {error}") from None
    was_training = model.training
    model.eval()
    with torch.no_grad():
        ShapeProp(traced).propagate(torch.zeros((2, *input_shape[1:])))
    model.train(was_training)
    analysis = _Analysis(model)
    for node in traced.graph.nodes:
        if node.op == "placeholder":
            group = analysis.new_group(_shape(node)[1])
            analysis.pin(group, "model input")
            analysis.layouts[node] = _Layout(group)
        elif node.op == "output":
            for result in node.all_input_nodes:
                analysis.pin(analysis.layout_of(result).group, "model output")
        elif node.op == "get_attr":
            raise UnsupportedOperationError(f"node {node.name!r} reads tensor {node.target!r} directly; use modules")
        else:
            analysis.layouts[node] = _rule_for(analysis, node)(analysis, node)
    roots = sorted({analysis.find(index) for index in range(len(analysis.groups))})
    return [analysis.groups[root] for root in roots if analysis.groups[root].slots]
