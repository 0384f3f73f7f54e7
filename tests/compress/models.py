"""Small test networks: a MobileNetV2-style net (expand, depthwise, project, residual Adds) and a plain CNN."""

import torch
from torch import nn


def conv_bn_act(in_channels: int, out_channels: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int, expand_ratio: int, kernel: int = 3) -> None:
        super().__init__()
        hidden = in_channels * expand_ratio
        layers = [conv_bn_act(in_channels, hidden, 1)] if expand_ratio != 1 else []
        layers += [
            conv_bn_act(hidden, hidden, kernel, stride, groups=hidden),
            nn.Conv2d(hidden, out_channels, 1, bias=False),
            nn.BatchNorm2d(out_channels),
        ]
        self.conv = nn.Sequential(*layers)
        self.use_residual = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_residual else self.conv(x)


class TinyMobileNet(nn.Module):
    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 8) -> None:
        super().__init__()
        self.stem = conv_bn_act(in_channels, width, 3, 1)
        self.blocks = nn.Sequential(
            InvertedResidual(width, width, 1, 1),
            InvertedResidual(width, 2 * width, 2, 3),
            InvertedResidual(2 * width, 2 * width, 1, 3, kernel=5),
            InvertedResidual(2 * width, 2 * width, 1, 3),
        )
        self.head = conv_bn_act(2 * width, 4 * width, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.head(self.blocks(self.stem(x))))
        return self.classifier(torch.flatten(x, 1))


class PlainNet(nn.Module):
    """conv-BN-ReLU twice, max-pool, then flatten C*H*W into a two-layer MLP head."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 12, 3, padding=1), nn.BatchNorm2d(12), nn.ReLU(),
            nn.Conv2d(12, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.hidden = nn.Linear(16 * 4 * 4, 32)
        self.out = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        return self.out(torch.relu(self.hidden(x.view(x.size(0), -1))))


def randomise_batchnorm(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give BN layers non-trivial statistics so folding and slicing errors show up numerically."""
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            count = module.num_features
            module.weight.data = torch.rand(count, generator=generator) + 0.5
            module.bias.data = torch.randn(count, generator=generator) * 0.1
            module.running_mean = torch.randn(count, generator=generator) * 0.1
            module.running_var = torch.rand(count, generator=generator) + 0.5
    return model.eval()
