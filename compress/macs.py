"""Multiply-accumulates and parameters of a torch model, counted on one batch-1 forward pass.

MACs count convolutions and linear layers only: they are >95% of the work in our nets, and BN
disappears into the convs at export anyway. Parameters are all trainable tensors (BN affine included),
as the NAS cards count them, so a pruned card compares with its parent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ModelCost:
    macs: int
    params: int


def count_cost(model: nn.Module, input_shape: tuple[int, ...]) -> ModelCost:
    """MACs of one batch-1 inference and the number of trainable parameters."""
    macs = 0

    def count_conv(conv: nn.Conv2d, _inputs: tuple, output: torch.Tensor) -> None:
        nonlocal macs
        kernel = conv.weight.shape[2] * conv.weight.shape[3]
        macs += output[0].numel() * (conv.in_channels // conv.groups) * kernel

    def count_linear(linear: nn.Linear, _inputs: tuple, output: torch.Tensor) -> None:
        nonlocal macs
        macs += linear.in_features * linear.out_features

    hooks = []
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            hooks.append(module.register_forward_hook(count_conv))
        elif isinstance(module, nn.Linear):
            hooks.append(module.register_forward_hook(count_linear))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros((1, *input_shape[1:])))
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    return ModelCost(macs=macs, params=sum(parameter.numel() for parameter in model.parameters()))
