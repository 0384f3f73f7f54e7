"""Standalone subnets: plain torch modules (Conv2d, BatchNorm2d, activations, Linear, residual adds) built
from an arch dict, so they export to ONNX with standard ops and other tools (pruning, training graphs)
can read them without knowing about the supernet.

Structure, regular on purpose::

    Subnet
      stem:   Sequential(Conv2d 3x3, BatchNorm2d, act)
      blocks: Sequential(InvertedResidual, ...)   # every stage's blocks, in order
      head:   Sequential(Conv2d 1x1, BatchNorm2d, act)
      pool:   AdaptiveAvgPool2d(1), flatten, classifier: Linear
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from fedzoo.errors import InvalidInputError
from fedzoo.nas.space import Arch

ACTIVATION_MODULES: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "relu6": nn.ReLU6, "hswish": nn.Hardswish}


def make_activation(name: str) -> nn.Module:
    """The activation module for a name in the arch; an explicit error for a name without one."""
    if name not in ACTIVATION_MODULES:
        raise InvalidInputError(f"unknown activation {name!r} in arch; use one of {sorted(ACTIVATION_MODULES)}", field="arch")
    return ACTIVATION_MODULES[name]()


def conv_bn(in_channels: int, out_channels: int, kernel: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [
        nn.Conv2d(in_channels, out_channels, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_channels),
    ]


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand (skipped at ratio 1), kxk depthwise, 1x1 project; residual when shapes match."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int, expand_ratio: int, activation: str) -> None:
        super().__init__()
        mid_channels = in_channels * expand_ratio
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers += [*conv_bn(in_channels, mid_channels, 1), make_activation(activation)]
        layers += [*conv_bn(mid_channels, mid_channels, kernel, stride, groups=mid_channels), make_activation(activation)]
        layers += conv_bn(mid_channels, out_channels, 1)
        self.layers = nn.Sequential(*layers)
        self.use_residual = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(x)
        return x + out if self.use_residual else out


class Subnet(nn.Module):
    """A classifier built from an arch; see the module docstring for its layout."""

    def __init__(self, arch: Arch, num_classes: int, in_channels: int) -> None:
        super().__init__()
        try:
            stem_channels = int(arch["stem_channels"])
            self.stem = nn.Sequential(
                *conv_bn(in_channels, stem_channels, 3, int(arch["stem_stride"])),
                make_activation(arch.get("stem_activation", "relu6")),
            )
            blocks: list[nn.Module] = []
            channels = stem_channels
            for stage in arch["stages"]:
                if len(stage["kernels"]) != len(stage["expand_ratios"]) or not stage["kernels"]:
                    raise InvalidInputError("each stage of an arch needs as many kernels as expand_ratios, at least one", field="arch")
                for index, (kernel, ratio) in enumerate(zip(stage["kernels"], stage["expand_ratios"])):
                    stride = int(stage["stride"]) if index == 0 else 1
                    blocks.append(InvertedResidual(channels, int(stage["out_channels"]), int(kernel), stride, int(ratio), stage["activation"]))
                    channels = int(stage["out_channels"])
            self.blocks = nn.Sequential(*blocks)
            head_channels = int(arch["head_channels"])
            self.head = nn.Sequential(*conv_bn(channels, head_channels, 1), make_activation(arch.get("head_activation", "relu6")))
        except (KeyError, TypeError, ValueError) as error:
            raise InvalidInputError(f"arch is not a valid ofa-mbv2 subnet config: {error!r}", field="arch") from None
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(head_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.blocks(self.stem(x)))
        return self.classifier(torch.flatten(self.pool(x), 1))


def build_subnet(arch: Arch, num_classes: int, in_channels: int) -> nn.Module:
    """A freshly initialised standalone module for `arch` (load a zoo card's `torch_state` into it)."""
    return Subnet(arch, num_classes, in_channels)


# measurements -------------------------------------------------------------------------------

def count_params(model: nn.Module) -> int:
    """Trainable parameters (BN affine included, running statistics not)."""
    return int(sum(parameter.numel() for parameter in model.parameters()))


def count_macs(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Multiply-accumulates of one batch-1 inference, counted from the convolutions and linear layers."""
    total = 0

    def conv_hook(module: nn.Conv2d, _inputs: tuple, output: torch.Tensor) -> None:
        nonlocal total
        kernel_elements = module.kernel_size[0] * module.kernel_size[1]
        total += output.numel() * (module.in_channels // module.groups) * kernel_elements

    def linear_hook(module: nn.Linear, _inputs: tuple, output: torch.Tensor) -> None:
        nonlocal total
        total += output.numel() * module.in_features

    handles = []
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            handles.append(module.register_forward_hook(conv_hook))
        elif isinstance(module, nn.Linear):
            handles.append(module.register_forward_hook(linear_hook))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros((1, *input_shape[1:])))
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return int(total)


def batches(x: np.ndarray, batch_size: int, device: torch.device = torch.device("cpu")) -> Iterator[torch.Tensor]:
    """Consecutive batches of `x` on `device` in channels-last layout, which runs these small convnets ~3x
    faster on CPU."""
    for start in range(0, len(x), batch_size):
        yield torch.from_numpy(x[start : start + batch_size]).to(device).contiguous(memory_format=torch.channels_last)


def model_device(model: nn.Module) -> torch.device:
    """The device `model`'s parameters are on (where its inputs must go)."""
    return next(model.parameters()).device


def recalibrate_batchnorm(model: nn.Module, x: np.ndarray, batch_size: int = 256) -> None:
    """Reset every BN's running statistics and re-estimate them on `x` (normalised images).

    Weight sharing leaves the supernet's running statistics averaged over many subnets; each extracted
    subnet needs its own, as in Once-for-All.
    """
    norms = [module for module in model.modules() if isinstance(module, nn.BatchNorm2d)]
    saved_momenta = [norm.momentum for norm in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # cumulative average over the calibration batches
    was_training = model.training
    model.train()
    try:
        with torch.no_grad():
            for batch in batches(x, batch_size, model_device(model)):
                model(batch)
    finally:
        model.train(was_training)
        for norm, momentum in zip(norms, saved_momenta):
            norm.momentum = momentum


def evaluate_accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray, batch_size: int = 500) -> tuple[float, float]:
    """(accuracy in [0, 1], mean cross-entropy) of `model` on normalised images `x` and labels `y`."""
    was_training = model.training
    model.eval()
    correct, loss_sum = 0, 0.0
    try:
        with torch.no_grad():
            device = model_device(model)
            for start, batch in zip(range(0, len(x), batch_size), batches(x, batch_size, device)):
                logits = model(batch)
                labels = torch.from_numpy(y[start : start + batch_size]).to(device)
                loss_sum += float(nn.functional.cross_entropy(logits, labels, reduction="sum"))
                correct += int((logits.argmax(dim=1) == labels).sum())
    finally:
        model.train(was_training)
    return correct / len(y), loss_sum / len(y)
