"""Structured channel pruning: score channels, pick the weakest per group (or globally), slice them out.

The coupling of channels comes from `dependency.analyse_channel_groups`; here we only decide which
channels of each group to keep and cut every parameter slot of the group with the same indices, so
the pruned network is a smaller dense network of the same modules (it exports and runs like any other).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from fedzoo.compress.dependency import (
    BATCHNORM,
    CONV_IN,
    CONV_OUT,
    DEPTHWISE,
    LINEAR_IN,
    LINEAR_OUT,
    ChannelGroup,
    ChannelSlot,
    analyse_channel_groups,
)
from fedzoo.compress.macs import count_cost
from fedzoo.errors import InvalidInputError


def _norm_scores(order: int) -> Callable[[nn.Module, ChannelSlot], torch.Tensor | None]:
    def score(module: nn.Module, slot: ChannelSlot) -> torch.Tensor | None:
        if slot.role not in (CONV_OUT, DEPTHWISE, LINEAR_OUT):
            return None
        weight = module.weight.detach().flatten(1)
        return weight.abs().sum(1) if order == 1 else weight.pow(2).sum(1).sqrt()

    return score


def _bn_scale_scores(module: nn.Module, slot: ChannelSlot) -> torch.Tensor | None:
    """Network slimming (Liu et al. 2017): a channel matters as much as its BN scale |gamma|."""
    return module.weight.detach().abs() if slot.role == BATCHNORM else None


IMPORTANCE_CRITERIA: dict[str, Callable[[nn.Module, ChannelSlot], torch.Tensor | None]] = {
    "l1": _norm_scores(1),
    "l2": _norm_scores(2),
    "bn-scale": _bn_scale_scores,
}
SCOPES = ("layer", "global")


def channel_importance(model: nn.Module, group: ChannelGroup, method: str) -> torch.Tensor:
    """One score per channel of `group`: the sum over its slots, each slot scaled to mean 1 so layers of
    different fan-in weigh alike (this is also what makes scores comparable across groups)."""
    criterion = IMPORTANCE_CRITERIA[method]
    total = torch.zeros(group.channels)
    for slot in group.slots:
        scores = criterion(model.get_submodule(slot.module), slot)
        if scores is not None:
            total += scores / scores.mean().clamp_min(1e-12)
    if not total.any() and method == "bn-scale":  # a group without BN falls back to weight norms
        return channel_importance(model, group, "l1")
    return total


@dataclass(frozen=True)
class PruningResult:
    model: nn.Module
    method: str
    scope: str
    channel_ratio: float  # fraction of prunable channels removed
    macs_before: int
    macs_after: int
    params_before: int
    params_after: int
    kept_indices: dict[str, tuple[int, ...]]  # group name -> indices of the channels kept

    @property
    def kept_channels(self) -> dict[str, int]:
        return {name: len(indices) for name, indices in self.kept_indices.items()}

    @property
    def macs_reduction(self) -> float:
        return 1.0 - self.macs_after / self.macs_before


def _keep_count(channels: int, ratio: float, min_keep_fraction: float) -> int:
    floor = max(1, math.ceil(channels * min_keep_fraction))
    return max(floor, channels - int(round(channels * ratio)))


def _select_per_layer(scores: list[torch.Tensor], ratios: list[float], min_keep_fraction: float) -> list[torch.Tensor]:
    kept = []
    for group_scores, ratio in zip(scores, ratios):
        count = _keep_count(len(group_scores), ratio, min_keep_fraction)
        kept.append(torch.sort(torch.topk(group_scores, count).indices).values)
    return kept


def _select_global(scores: list[torch.Tensor], ratio: float, min_keep_fraction: float) -> list[torch.Tensor]:
    """Remove the globally weakest `ratio` of all channels, never taking a group below its floor."""
    entries = [(float(value), group, channel) for group, s in enumerate(scores) for channel, value in enumerate(s)]
    entries.sort()
    remaining = [len(s) for s in scores]
    floors = [max(1, math.ceil(len(s) * min_keep_fraction)) for s in scores]
    removed = [set() for _ in scores]
    budget = int(round(ratio * len(entries)))
    for _value, group, channel in entries:
        if budget == 0:
            break
        if remaining[group] > floors[group]:
            removed[group].add(channel)
            remaining[group] -= 1
            budget -= 1
    return [torch.tensor([c for c in range(len(s)) if c not in removed[g]], dtype=torch.long) for g, s in enumerate(scores)]


def _slice_parameter(module: nn.Module, name: str, indices: torch.Tensor, dim: int) -> None:
    tensor = getattr(module, name)
    if tensor is None:
        return
    sliced = tensor.detach().index_select(dim, indices).clone()
    if isinstance(tensor, nn.Parameter):
        setattr(module, name, nn.Parameter(sliced, requires_grad=tensor.requires_grad))
    else:
        module.register_buffer(name, sliced)


def _apply(model: nn.Module, slot: ChannelSlot, kept: torch.Tensor) -> None:
    module = model.get_submodule(slot.module)
    count = len(kept)
    if slot.role in (CONV_OUT, DEPTHWISE, LINEAR_OUT):
        _slice_parameter(module, "weight", kept, 0)
        _slice_parameter(module, "bias", kept, 0)
    if slot.role == CONV_OUT:
        module.out_channels = count
    elif slot.role == DEPTHWISE:
        module.in_channels = module.out_channels = module.groups = count
    elif slot.role == LINEAR_OUT:
        module.out_features = count
    elif slot.role == CONV_IN:
        _slice_parameter(module, "weight", kept, 1)
        module.in_channels = count
    elif slot.role == LINEAR_IN:
        width = slot.features_per_channel
        features = (kept[:, None] * width + torch.arange(width)[None, :]).flatten()
        _slice_parameter(module, "weight", features, 1)
        module.in_features = len(features)
    elif slot.role == BATCHNORM:
        for name in ("weight", "bias", "running_mean", "running_var"):
            _slice_parameter(module, name, kept, 0)
        module.num_features = count


def prune_channels(
    model: nn.Module,
    input_shape: tuple[int, ...],
    ratio: float,
    method: str = "l1",
    scope: str = "layer",
    layer_ratios: dict[str, float] | None = None,
    min_keep_fraction: float = 0.1,
) -> PruningResult:
    """A pruned copy of `model` with `ratio` of its prunable channels removed (the original is untouched).

    `scope="layer"` removes `ratio` of every group (overridable per group name with `layer_ratios`);
    `scope="global"` removes the globally least important channels. No group drops below
    `min_keep_fraction` of its channels (and at least one).
    """
    if method not in IMPORTANCE_CRITERIA:
        raise InvalidInputError(f"unknown importance method {method!r}; use one of {sorted(IMPORTANCE_CRITERIA)}", field="method")
    if scope not in SCOPES:
        raise InvalidInputError(f"unknown pruning scope {scope!r}; use one of {list(SCOPES)}", field="scope")
    for name, value in {"ratio": ratio, **(layer_ratios or {})}.items():
        if not 0.0 <= value < 1.0:
            raise InvalidInputError(f"pruning ratio for {name!r} must lie in [0, 1), got {value}", field="ratio")
    if layer_ratios and scope == "global":
        raise InvalidInputError("layer_ratios apply to scope='layer' only", field="layer_ratios")
    pruned = copy.deepcopy(model)
    before = count_cost(pruned, input_shape)
    groups = [group for group in analyse_channel_groups(pruned, input_shape) if group.prunable]
    unknown = set(layer_ratios or {}) - {group.name for group in groups}
    if unknown:
        raise InvalidInputError(
            f"layer_ratios name unknown groups {sorted(unknown)}; prunable groups are {[g.name for g in groups]}",
            field="layer_ratios",
        )
    scores = [channel_importance(pruned, group, method) for group in groups]
    if scope == "layer":
        ratios = [(layer_ratios or {}).get(group.name, ratio) for group in groups]
        kept = _select_per_layer(scores, ratios, min_keep_fraction)
    else:
        kept = _select_global(scores, ratio, min_keep_fraction)
    for group, indices in zip(groups, kept):
        for slot in group.slots:
            _apply(pruned, slot, indices)
    after = count_cost(pruned, input_shape)
    total = sum(group.channels for group in groups)
    removed = total - sum(len(indices) for indices in kept)
    return PruningResult(
        model=pruned,
        method=method,
        scope=scope,
        channel_ratio=removed / total if total else 0.0,
        macs_before=before.macs,
        macs_after=after.macs,
        params_before=before.params,
        params_after=after.params,
        kept_indices={group.name: tuple(indices.tolist()) for group, indices in zip(groups, kept)},
    )


def resize_to_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> nn.Module:
    """Shrink an unpruned skeleton (e.g. `build_subnet(card.arch, ...)`) to the shapes of a pruned
    state dict and load it: how a pruned card's `torch_state` is turned back into a module."""
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        weight = state_dict.get(prefix + "weight")
        if weight is None:
            continue
        if isinstance(module, nn.Conv2d):
            depthwise = module.groups == module.in_channels == module.out_channels and module.groups > 1
            module.out_channels = weight.shape[0]
            module.in_channels = weight.shape[0] if depthwise else weight.shape[1] * module.groups
            if depthwise:
                module.groups = weight.shape[0]
        elif isinstance(module, nn.BatchNorm2d):
            module.num_features = weight.shape[0]
        elif isinstance(module, nn.Linear):
            module.out_features, module.in_features = weight.shape
        else:
            continue
        for tensor_name, tensor in module.named_parameters(recurse=False):
            setattr(module, tensor_name, nn.Parameter(torch.empty_like(state_dict[prefix + tensor_name])))
        for tensor_name, tensor in module.named_buffers(recurse=False):
            if tensor is not None and prefix + tensor_name in state_dict:
                module.register_buffer(tensor_name, torch.empty_like(state_dict[prefix + tensor_name]))
    model.load_state_dict(state_dict)
    return model
