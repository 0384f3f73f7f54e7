"""The once-for-all supernet: one set of weights holding every subnet of a `SearchSpace`.

Weight sharing as in Once-for-All (Cai et al., ICLR 2020):
- elastic depth: a stage runs only its first `d` blocks;
- elastic width: a stage's blocks keep only the first `out_channels` output channels of their project conv
  (and BatchNorm), and the next layer (the next block's expand conv, or the head) the first input channels;
- elastic expand ratio: a block's expand conv keeps only its first `in * ratio` output channels (`in` being
  the active input width), and the depthwise and project convs the matching slices;
- elastic kernel: a 3x3 kernel is the centre of the 5x5 one passed through a small learned linear
  transform (one matrix per layer and kernel size, shared by all channels).
`set_active(arch)` picks the subnet the next forward pass runs; `extract_subnet` copies its weights into a
standalone `Subnet`. A block adds its residual when its stride is 1 and its active input and output widths
match, as the standalone `Subnet` of the arch does.

Once-for-All sorts channels by importance before it shrinks a pretrained full network; here every width is
trained from the first step (the sandwich rule, as slimmable networks and BigNAS do), so the leading channels
are the ones every subnet trains and no reordering is needed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedzoo.errors import InvalidInputError
from fedzoo.nas.space import Arch, SearchSpace
from fedzoo.nas.subnet import InvertedResidual, Subnet, conv_bn, make_activation


class DynamicBatchNorm(nn.BatchNorm2d):
    """BatchNorm over the first `channels` features; slicing views the buffers, so updates land in place."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channels = x.shape[1]
        return F.batch_norm(
            x,
            self.running_mean[:channels],
            self.running_var[:channels],
            self.weight[:channels],
            self.bias[:channels],
            self.training,
            self.momentum,
            self.eps,
        )


class DynamicInvertedResidual(nn.Module):
    """An inverted-residual block whose output width, expand ratio and kernel size are chosen per forward
    pass; its input width is that of the input it is given."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, activation: str, space: SearchSpace) -> None:
        super().__init__()
        self.in_channels, self.out_channels, self.stride = in_channels, out_channels, stride
        self.max_kernel = space.max_kernel
        self.kernel_choices = sorted(space.kernel_choices, reverse=True)
        max_mid = in_channels * space.max_expand_ratio
        self.expand_weight = nn.Parameter(torch.empty(max_mid, in_channels, 1, 1))
        self.expand_norm = DynamicBatchNorm(max_mid)
        self.depthwise_weight = nn.Parameter(torch.empty(max_mid, 1, self.max_kernel, self.max_kernel))
        self.depthwise_norm = DynamicBatchNorm(max_mid)
        self.project_weight = nn.Parameter(torch.empty(out_channels, max_mid, 1, 1))
        self.project_norm = DynamicBatchNorm(out_channels)
        self.activation = make_activation(activation)
        # one transform per smaller kernel, identity at the start, as OFA's kernel transformation matrices
        self.kernel_transforms = nn.ParameterDict(
            {str(k): nn.Parameter(torch.eye(k * k)) for k in self.kernel_choices if k != self.max_kernel}
        )
        for weight in (self.expand_weight, self.depthwise_weight, self.project_weight):
            nn.init.kaiming_normal_(weight, mode="fan_out")
        self.active_kernel = self.max_kernel
        self.active_expand_ratio = space.max_expand_ratio
        self.active_out_channels = out_channels

    def depthwise_kernel(self, kernel: int, mid_channels: int) -> torch.Tensor:
        """The depthwise weight of size `kernel`: centre crops of the larger kernel, transformed step by step."""
        weight = self.depthwise_weight[:mid_channels]
        for size in self.kernel_choices:
            if size == self.max_kernel or size < kernel:
                continue
            start = (weight.shape[-1] - size) // 2
            centre = weight[:, :, start : start + size, start : start + size]
            weight = (centre.reshape(mid_channels, size * size) @ self.kernel_transforms[str(size)]).reshape(
                mid_channels, 1, size, size
            )
        return weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_channels, out_channels = x.shape[1], self.active_out_channels
        mid = in_channels * self.active_expand_ratio
        kernel = self.active_kernel
        out = self.activation(self.expand_norm(F.conv2d(x, self.expand_weight[:mid, :in_channels])))
        depthwise = self.depthwise_kernel(kernel, mid)
        out = F.conv2d(out, depthwise, stride=self.stride, padding=kernel // 2, groups=mid)
        out = self.activation(self.depthwise_norm(out))
        out = self.project_norm(F.conv2d(out, self.project_weight[:out_channels, :mid]))
        if self.stride == 1 and in_channels == out_channels:
            return x + out
        return out


class Supernet(nn.Module):
    """Every subnet of `space` in one module; `set_active(arch)` selects which one runs."""

    def __init__(self, space: SearchSpace, num_classes: int, in_channels: int) -> None:
        super().__init__()
        self.space, self.num_classes, self.in_channels = space, num_classes, in_channels
        self.stem = nn.Sequential(
            *conv_bn(in_channels, space.stem_channels, 3, space.stem_stride), make_activation(space.stem_activation)
        )
        stages, channels = [], space.stem_channels
        for spec in space.stages:
            blocks = []
            for index in range(space.max_depth):
                stride = spec.stride if index == 0 else 1
                blocks.append(DynamicInvertedResidual(channels, spec.out_channels, stride, spec.activation, space))
                channels = spec.out_channels
            stages.append(nn.ModuleList(blocks))
        self.stages = nn.ModuleList(stages)
        self.head = nn.Sequential(*conv_bn(channels, space.head_channels, 1), make_activation(space.head_activation))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(space.head_channels, num_classes)
        self.active_depths = [space.max_depth] * len(space.stages)

    def set_active(self, arch: Arch) -> None:
        """Run `arch` on the next forward passes."""
        if not self.space.contains(arch):
            raise InvalidInputError("arch is not a subnet of this supernet's search space", field="arch")
        self.active_depths = [len(stage["kernels"]) for stage in arch["stages"]]
        for blocks, stage in zip(self.stages, arch["stages"]):
            for block, kernel, ratio in zip(blocks, stage["kernels"], stage["expand_ratios"]):
                block.active_kernel, block.active_expand_ratio = int(kernel), int(ratio)
                block.active_out_channels = int(stage["out_channels"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for blocks, depth in zip(self.stages, self.active_depths):
            for block in blocks[:depth]:
                x = block(x)
        head_conv, head_norm, head_activation = self.head
        x = head_activation(head_norm(F.conv2d(x, head_conv.weight[:, : x.shape[1]])))  # the last stage's width
        return self.classifier(torch.flatten(self.pool(x), 1))


def _copy_norm(target: nn.BatchNorm2d, source: nn.BatchNorm2d, channels: int) -> None:
    target.weight.copy_(source.weight[:channels])
    target.bias.copy_(source.bias[:channels])
    target.running_mean.copy_(source.running_mean[:channels])
    target.running_var.copy_(source.running_var[:channels])


@torch.no_grad()
def extract_subnet(supernet: Supernet, arch: Arch) -> Subnet:
    """A standalone `Subnet` for `arch` holding copies of the supernet's shared weights.

    Its BN statistics are the supernet's (mixed over subnets): recalibrate them before use
    (`fedzoo.nas.subnet.recalibrate_batchnorm`).
    """
    supernet.set_active(arch)
    subnet = Subnet(arch, supernet.num_classes, supernet.in_channels)
    subnet.stem.load_state_dict(supernet.stem.state_dict())
    subnet.classifier.load_state_dict(supernet.classifier.state_dict())
    targets = iter(subnet.blocks)
    channels = supernet.space.stem_channels
    for blocks, depth in zip(supernet.stages, supernet.active_depths):
        for block in blocks[:depth]:
            target: InvertedResidual = next(targets)
            mid, out = channels * block.active_expand_ratio, block.active_out_channels
            expand_conv, expand_norm, _, depthwise_conv, depthwise_norm, _, project_conv, project_norm = target.layers
            expand_conv.weight.copy_(block.expand_weight[:mid, :channels])
            _copy_norm(expand_norm, block.expand_norm, mid)
            depthwise_conv.weight.copy_(block.depthwise_kernel(block.active_kernel, mid))
            _copy_norm(depthwise_norm, block.depthwise_norm, mid)
            project_conv.weight.copy_(block.project_weight[:out, :mid])
            _copy_norm(project_norm, block.project_norm, out)
            channels = out
    subnet.head[0].weight.copy_(supernet.head[0].weight[:, :channels])
    _copy_norm(subnet.head[1], supernet.head[1], supernet.space.head_channels)
    return subnet
