"""The search space: MobileNetV2/V3-style classifiers for small images, with elastic depth and width per
stage, elastic expand ratio and kernel size per block.

An architecture ("arch") is plain JSON, complete enough to rebuild the network on its own::

    {"family": "ofa-mbv2", "resolution": 28, "stem_channels": 16, "stem_stride": 2, "head_channels": 128,
     "stages": [{"out_channels": 16, "stride": 1, "activation": "relu6",
                 "kernels": [3, 5], "expand_ratios": [4, 6]}, ...]}

A stage's depth is the length of its `kernels` list and its width is its `out_channels`: one of the space's
`width_choices` (fractions) of the stage's full width, the supernet's first channels (Once-for-All's elastic
width). The fixed parts (stem and head widths, strides, activations) come from the `SearchSpace`; the elastic
parts are what the search chooses. A space whose only width choice is 1 (the default, and every space saved
before widths were elastic) has every stage at full width, so archs saved then stay valid.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from fedzoo.errors import InvalidInputError

Arch = dict[str, Any]
FAMILY = "ofa-mbv2"
ACTIVATIONS = ("relu", "relu6", "hswish")


@dataclass(frozen=True)
class StageSpec:
    """One stage of the supernet: fixed output width, stride of its first block, and activation."""

    out_channels: int
    stride: int
    activation: str = "relu6"


@dataclass(frozen=True)
class SearchSpace:
    """Which subnets the supernet contains; `max_arch` is the supernet itself."""

    resolution: int
    stem_channels: int
    stem_stride: int
    head_channels: int
    stages: tuple[StageSpec, ...]
    depth_choices: tuple[int, ...] = (1, 2, 3)
    expand_ratio_choices: tuple[int, ...] = (3, 4, 6)
    kernel_choices: tuple[int, ...] = (3, 5)
    stem_activation: str = "relu6"
    head_activation: str = "relu6"
    width_choices: tuple[float, ...] = (1.0,)  # fractions of each stage's out_channels; 1 is the supernet's width

    def __post_init__(self) -> None:
        for stage in self.stages:
            if stage.activation not in ACTIVATIONS:
                raise InvalidInputError(f"unknown activation {stage.activation!r}; use one of {ACTIVATIONS}")
        if min(self.expand_ratio_choices) < 2:
            raise InvalidInputError(f"expand ratios must be at least 2 (every block has an expand conv), got {self.expand_ratio_choices}")
        if any(kernel % 2 == 0 for kernel in self.kernel_choices):
            raise InvalidInputError(f"kernel sizes must be odd, got {self.kernel_choices}")
        if max(self.width_choices) != 1.0 or min(self.width_choices) <= 0:
            raise InvalidInputError(f"width choices must be fractions in (0, 1] including 1, got {self.width_choices}")

    @property
    def max_depth(self) -> int:
        return max(self.depth_choices)

    @property
    def max_kernel(self) -> int:
        return max(self.kernel_choices)

    @property
    def max_expand_ratio(self) -> int:
        return max(self.expand_ratio_choices)

    def stage_widths(self, index: int) -> tuple[int, ...]:
        """The out_channels stage `index` may have, narrowest first: each width choice of its full width."""
        full = self.stages[index].out_channels
        return tuple(sorted({max(1, round(fraction * full)) for fraction in self.width_choices}))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SearchSpace:
        data = dict(data)
        data["stages"] = tuple(StageSpec(**stage) for stage in data["stages"])
        for key in ("depth_choices", "expand_ratio_choices", "kernel_choices", "width_choices"):
            if key in data:  # spaces saved before widths were elastic lack width_choices
                data[key] = tuple(data[key])
        return cls(**data)

    # architectures -------------------------------------------------------------------------

    def make_arch(
        self, depths: list[int], kernels: list[list[int]], expand_ratios: list[list[int]], widths: list[int] | None = None
    ) -> Arch:
        """An arch from per-stage depths and out_channels (None: full width) and per-block choices (lists longer
        than the depth are cut)."""
        stages = []
        widths = widths if widths is not None else [spec.out_channels for spec in self.stages]
        for spec, depth, width, stage_kernels, stage_ratios in zip(self.stages, depths, widths, kernels, expand_ratios):
            stages.append(
                {
                    "out_channels": int(width),
                    "stride": spec.stride,
                    "activation": spec.activation,
                    "kernels": [int(k) for k in stage_kernels[:depth]],
                    "expand_ratios": [int(e) for e in stage_ratios[:depth]],
                }
            )
        return {
            "family": FAMILY,
            "resolution": self.resolution,
            "stem_channels": self.stem_channels,
            "stem_stride": self.stem_stride,
            "stem_activation": self.stem_activation,
            "head_channels": self.head_channels,
            "head_activation": self.head_activation,
            "stages": stages,
        }

    def max_arch(self) -> Arch:
        """The largest subnet: every block at full width, the largest kernel and expand ratio."""
        count = len(self.stages)
        return self.make_arch(
            [self.max_depth] * count,
            [[self.max_kernel] * self.max_depth] * count,
            [[self.max_expand_ratio] * self.max_depth] * count,
        )

    def min_arch(self) -> Arch:
        """The smallest subnet: fewest and narrowest blocks, the smallest kernel and expand ratio."""
        count = len(self.stages)
        depth, kernel, ratio = min(self.depth_choices), min(self.kernel_choices), min(self.expand_ratio_choices)
        widths = [self.stage_widths(index)[0] for index in range(count)]
        return self.make_arch([depth] * count, [[kernel] * depth] * count, [[ratio] * depth] * count, widths)

    def sample_arch(self, rng: np.random.Generator) -> Arch:
        """A uniformly random subnet."""
        count = len(self.stages)
        depths = [int(rng.choice(self.depth_choices)) for _ in range(count)]
        kernels = [[int(rng.choice(self.kernel_choices)) for _ in range(self.max_depth)] for _ in range(count)]
        ratios = [[int(rng.choice(self.expand_ratio_choices)) for _ in range(self.max_depth)] for _ in range(count)]
        widths = [self._draw_width(index, rng) for index in range(count)]
        return self.make_arch(depths, kernels, ratios, widths)

    def _draw_width(self, index: int, rng: np.random.Generator) -> int:
        """A random width of stage `index`; draws nothing when there is one (spaces without elastic width
        keep the draws, and so the searches, they had before)."""
        choices = self.stage_widths(index)
        return int(rng.choice(choices)) if len(choices) > 1 else choices[0]

    def mutate(self, arch: Arch, rng: np.random.Generator, probability: float = 0.2) -> Arch:
        """A copy of `arch` with each depth, width, kernel and expand ratio resampled with `probability`."""
        depths, kernels, ratios, widths = self._padded_choices(arch, rng)
        for index in range(len(self.stages)):
            if rng.random() < probability:
                depths[index] = int(rng.choice(self.depth_choices))
            for block in range(self.max_depth):
                if rng.random() < probability:
                    kernels[index][block] = int(rng.choice(self.kernel_choices))
                if rng.random() < probability:
                    ratios[index][block] = int(rng.choice(self.expand_ratio_choices))
            if len(self.stage_widths(index)) > 1 and rng.random() < probability:
                widths[index] = self._draw_width(index, rng)
        return self.make_arch(depths, kernels, ratios, widths)

    def crossover(self, first: Arch, second: Arch, rng: np.random.Generator) -> Arch:
        """A child taking each stage's depth and width and each block's choices from either parent at random."""
        parents = [self._padded_choices(first, rng), self._padded_choices(second, rng)]
        depths, kernels, ratios, widths = [], [], [], []
        for index in range(len(self.stages)):
            depths.append(parents[int(rng.integers(2))][0][index])
            kernels.append([parents[int(rng.integers(2))][1][index][b] for b in range(self.max_depth)])
            ratios.append([parents[int(rng.integers(2))][2][index][b] for b in range(self.max_depth)])
            width_parent = int(rng.integers(2)) if len(self.stage_widths(index)) > 1 else 0  # no draw without a choice
            widths.append(parents[width_parent][3][index])
        return self.make_arch(depths, kernels, ratios, widths)

    def _padded_choices(
        self, arch: Arch, rng: np.random.Generator
    ) -> tuple[list[int], list[list[int]], list[list[int]], list[int]]:
        """Depths, per-block choices (padded with random choices for the blocks the arch skips) and widths."""
        depths, kernels, ratios, widths = [], [], [], []
        for stage in arch["stages"]:
            depth = len(stage["kernels"])
            padding = self.max_depth - depth
            depths.append(depth)
            widths.append(int(stage["out_channels"]))
            kernels.append(list(stage["kernels"]) + [int(rng.choice(self.kernel_choices)) for _ in range(padding)])
            ratios.append(
                list(stage["expand_ratios"]) + [int(rng.choice(self.expand_ratio_choices)) for _ in range(padding)]
            )
        return depths, kernels, ratios, widths

    def contains(self, arch: Arch) -> bool:
        """True when `arch` is a subnet of this space's supernet."""
        try:
            if len(arch["stages"]) != len(self.stages) or arch["stem_channels"] != self.stem_channels:
                return False
            for index, (spec, stage) in enumerate(zip(self.stages, arch["stages"])):
                depth = len(stage["kernels"])
                if depth not in self.depth_choices or len(stage["expand_ratios"]) != depth:
                    return False
                if stage["out_channels"] not in self.stage_widths(index) or stage["stride"] != spec.stride:
                    return False
                if not set(stage["kernels"]) <= set(self.kernel_choices):
                    return False
                if not set(stage["expand_ratios"]) <= set(self.expand_ratio_choices):
                    return False
        except (KeyError, TypeError):
            return False
        return True


def arch_key(arch: Arch) -> str:
    """A canonical string for an arch, equal for equal archs (used for caches and deduplication)."""
    return json.dumps(arch, sort_keys=True, separators=(",", ":"))


def arch_hash(arch: Arch, length: int = 8) -> str:
    """A short stable hash of an arch, readable in card ids."""
    return hashlib.sha256(arch_key(arch).encode()).hexdigest()[:length]


def copy_arch(arch: Arch) -> Arch:
    return copy.deepcopy(arch)


# the spaces the pipeline knows, by configuration name -----------------------------------------

def default_space(resolution: int) -> SearchSpace:
    """The default space: four stages of widths 16-64; the stem halves 28x28 MNIST to 14x14 but keeps 8x8 digits."""
    return SearchSpace(
        resolution=resolution,
        stem_channels=16,
        stem_stride=2 if resolution >= 24 else 1,
        head_channels=128,
        stages=(
            StageSpec(16, 1, "relu6"),
            StageSpec(24, 2, "relu6"),
            StageSpec(40, 2, "hswish"),
            StageSpec(64, 1, "hswish"),
        ),
        head_activation="hswish",
    )


def tiny_space(resolution: int) -> SearchSpace:
    """A small space for tests and 8x8 digits: runs a whole build in seconds. Its stages are elastic in width
    too, so the slowest tiers' budgets can be met with narrower stages, not only with the smallest kernels and
    expand ratios."""
    return SearchSpace(
        resolution=resolution,
        stem_channels=8,
        stem_stride=1 if resolution <= 16 else 2,
        head_channels=32,
        stages=(StageSpec(8, 1, "relu6"), StageSpec(16, 2, "relu6"), StageSpec(24, 2, "hswish")),
        depth_choices=(1, 2),
        expand_ratio_choices=(2, 4),
        kernel_choices=(3, 5),
        head_activation="hswish",
        width_choices=(0.5, 0.75, 1.0),
    )

