"""Small hand-built versions of the architectures people bring to on-device training, for the whole-model
gradient tests and bench/train_architectures.py: the same operators and block structure as the real ones
(squeeze-excite, residuals, Fire modules, channel split and shuffle), with few channels and small inputs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


def _conv_bn(in_channels: int, out_channels: int, kernel: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(in_channels, out_channels, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(out_channels)]


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeezed: int, gate: type[nn.Module]) -> None:
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(channels, squeezed, 1), nn.Conv2d(squeezed, channels, 1)
        self.activation = nn.ReLU() if gate is nn.Hardsigmoid else nn.SiLU()
        self.gate = gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = F.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.expand(self.activation(self.reduce(scale))))


class InvertedResidual(nn.Module):
    """MobileNetV3 / EfficientNet block: expand 1x1, depthwise, squeeze-excite, project 1x1, residual."""

    def __init__(self, in_channels: int, expanded: int, out_channels: int, kernel: int, stride: int,
                 activation: type[nn.Module], gate: type[nn.Module] | None) -> None:  # fmt: skip
        super().__init__()
        layers: list[nn.Module] = []
        if expanded != in_channels:
            layers += [*_conv_bn(in_channels, expanded, 1), activation()]
        layers += [*_conv_bn(expanded, expanded, kernel, stride, groups=expanded), activation()]
        if gate is not None:
            layers.append(SqueezeExcite(expanded, max(expanded // 4, 4), gate))
        layers += _conv_bn(expanded, out_channels, 1)
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.residual else out


def mobilenet_v3_small(classes: int = 10) -> nn.Module:
    hs, re, hsig = nn.Hardswish, nn.ReLU, nn.Hardsigmoid
    return nn.Sequential(
        *_conv_bn(3, 8, 3, 2), hs(),
        InvertedResidual(8, 8, 8, 3, 2, re, hsig),
        InvertedResidual(8, 24, 12, 3, 2, re, None),
        InvertedResidual(12, 32, 12, 3, 1, re, None),
        InvertedResidual(12, 48, 16, 5, 2, hs, hsig),
        InvertedResidual(16, 64, 16, 5, 1, hs, hsig),
        *_conv_bn(16, 64, 1), hs(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, 64), hs(), nn.Dropout(0.2), nn.Linear(64, classes),
    )  # fmt: skip


def efficientnet_b0_like(classes: int = 10) -> nn.Module:
    silu, sig = nn.SiLU, nn.Sigmoid
    return nn.Sequential(
        *_conv_bn(3, 8, 3, 2), silu(),
        InvertedResidual(8, 8, 8, 3, 1, silu, sig),
        InvertedResidual(8, 32, 12, 3, 2, silu, sig),
        InvertedResidual(12, 48, 12, 3, 1, silu, sig),
        InvertedResidual(12, 48, 20, 5, 2, silu, sig),
        InvertedResidual(20, 80, 24, 3, 2, silu, sig),
        *_conv_bn(24, 96, 1), silu(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(96, classes),
    )  # fmt: skip


class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*_conv_bn(in_channels, out_channels, 3, stride), nn.ReLU(), *_conv_bn(out_channels, out_channels, 3))
        self.shortcut = nn.Sequential(*_conv_bn(in_channels, out_channels, 1, stride)) if stride != 1 or in_channels != out_channels else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


def resnet18(classes: int = 10, width: int = 8) -> nn.Module:
    widths = [width, 2 * width, 4 * width, 8 * width]
    layers: list[nn.Module] = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    in_channels = width
    for stage, channels in enumerate(widths):
        layers += [BasicBlock(in_channels, channels, 1 if stage == 0 else 2), BasicBlock(channels, channels, 1)]
        in_channels = channels
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_channels, classes))


class Fire(nn.Module):
    def __init__(self, in_channels: int, squeeze: int, expand: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(in_channels, squeeze, 1)
        self.expand1x1, self.expand3x3 = nn.Conv2d(squeeze, expand, 1), nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        squeezed = F.relu(self.squeeze(x))
        return torch.cat([F.relu(self.expand1x1(squeezed)), F.relu(self.expand3x3(squeezed))], 1)


def squeezenet(classes: int = 10) -> nn.Module:
    """SqueezeNet 1.1: ceil-mode max pooling, Fire modules (Concat), a convolutional classifier."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 2), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(16, 4, 8), Fire(16, 4, 8), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(16, 8, 16), Fire(32, 8, 16),
        nn.Dropout(0.5), nn.Conv2d(32, classes, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    )  # fmt: skip


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    batch, channels, height, width = x.size()
    x = x.view(batch, groups, channels // groups, height, width).transpose(1, 2).contiguous()
    return x.view(batch, -1, height, width)


class ShuffleUnit(nn.Module):
    """ShuffleNetV2 unit: channel split (chunk) or two strided branches, Concat, channel shuffle."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        branch = out_channels // 2
        if stride > 1:
            self.left = nn.Sequential(*_conv_bn(in_channels, in_channels, 3, stride, in_channels), *_conv_bn(in_channels, branch, 1), nn.ReLU())
        right_in = in_channels if stride > 1 else branch
        self.right = nn.Sequential(
            *_conv_bn(right_in, branch, 1), nn.ReLU(), *_conv_bn(branch, branch, 3, stride, branch), *_conv_bn(branch, branch, 1), nn.ReLU()
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            kept, transformed = x.chunk(2, dim=1)
            out = torch.cat((kept, self.right(transformed)), dim=1)
        else:
            out = torch.cat((self.left(x), self.right(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(*_conv_bn(3, 12, 3, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.stages = nn.Sequential(ShuffleUnit(12, 24, 2), ShuffleUnit(24, 24, 1), ShuffleUnit(24, 48, 2), ShuffleUnit(48, 48, 1))
        self.head = nn.Sequential(*_conv_bn(48, 64, 1), nn.ReLU())
        self.classifier = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.head(self.stages(self.stem(x))).mean([2, 3]))


def lenet5(classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 6, 5), nn.Tanh(), nn.AvgPool2d(2),
        nn.Conv2d(6, 16, 5), nn.Tanh(), nn.AvgPool2d(2), nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.Tanh(), nn.Linear(120, 84), nn.Tanh(), nn.Linear(84, classes),
    )  # fmt: skip


def mlp_regressor(features: int = 8, targets: int = 2) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, targets)
    )


@dataclass(frozen=True)
class Architecture:
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]  # one example, without the batch
    loss: str


ARCHITECTURES: dict[str, Architecture] = {
    "mobilenet_v3_small": Architecture(mobilenet_v3_small, (3, 32, 32), "cross_entropy"),
    "resnet18": Architecture(resnet18, (3, 32, 32), "cross_entropy"),
    "efficientnet_b0_like": Architecture(efficientnet_b0_like, (3, 32, 32), "cross_entropy"),
    "squeezenet": Architecture(squeezenet, (3, 32, 32), "cross_entropy"),
    "shufflenet_v2": Architecture(ShuffleNetV2, (3, 32, 32), "cross_entropy"),
    "lenet5": Architecture(lenet5, (1, 32, 32), "cross_entropy"),
    "mlp_regressor_mse": Architecture(mlp_regressor, (8,), "mse"),
}


def with_batchnorm_statistics(model: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial BatchNorm statistics and affine parameters (so folding them changes the weights); eval mode."""
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            channels = module.num_features
            module.running_mean.copy_(torch.rand(channels, generator=generator) - 0.5)
            module.running_var.copy_(torch.rand(channels, generator=generator) + 0.5)
            module.weight.data.copy_(torch.rand(channels, generator=generator) + 0.5)
            module.bias.data.copy_(torch.rand(channels, generator=generator) - 0.5)
    return model.eval()
