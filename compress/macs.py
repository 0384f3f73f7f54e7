"""Multiply-accumulates and parameters of a (pruned) torch model, counted exactly as the NAS cards count
them (`fedzoo.nas.subnet.count_macs` / `count_params`), so a pruned card compares with its parent."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from fedzoo.nas.subnet import count_macs, count_params


@dataclass(frozen=True)
class ModelCost:
    macs: int
    params: int


def count_cost(model: nn.Module, input_shape: tuple[int, ...]) -> ModelCost:
    """MACs of one batch-1 inference and the number of trainable parameters."""
    return ModelCost(macs=count_macs(model, input_shape), params=count_params(model))
