"""The arms of bench/fl_zoo.py: which subnet each tier trains, and one federated loop that runs every arm.

Every arm is a set of subnets of the zoo's supernet (smallest tier first) trained per element over the supernet
(`fedzoo.aggregation.per_element.step_supernet`), so the arms differ only in what they say they differ in:
- tier_alone: each tier's zoo model on its own copy of the supernet, trained by that tier only (per-model FL);
- heterofl: static width slices of the largest zoo model (every block's hidden channels capped, the first ones
  kept), the widest that fits each tier's budget;
- fedrolex: the same widths, the window of hidden channels rolling by one channel a round;
- depthwise: depth prefixes of the largest zoo model (the first blocks of each stage), the deepest that fits;
- everyone_largest: every device on the largest zoo model, budgets ignored (the upper bound);
- fedzoo: each tier's zoo model on one shared supernet, with the zoo plan's coverage step scaling.
Width levels are hidden-channel counts (every expand ratio 2..max): the supernet's tensors hold them all.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedzoo.compress.zoo_extraction import SupernetSpec, subnet_module
from fedzoo.nas.space import Arch, arch_key
from fedzoo.nas.subnet import count_macs, evaluate_accuracy, recalibrate_batchnorm
from fedzoo.nas.subnet_mapping import map_back
from fedzoo.aggregation.per_element import CoverageSum, step_supernet
from fedzoo.aggregation.strategies import make_strategy

BATCH_SIZE, LOCAL_LEARNING_RATE = 16, 0.05
Weights = dict[str, np.ndarray]


@dataclass
class Device:
    tier: int  # 0 = the slowest
    x: np.ndarray
    y: np.ndarray
    held_x: np.ndarray  # the device's own held-out data: deployed accuracy
    held_y: np.ndarray


@dataclass(frozen=True)
class Arm:
    name: str
    tier_archs: tuple[Arch, ...]  # what each tier trains and is served, smallest tier first
    separate_models: bool = False  # tier_alone: one supernet copy per tier
    rolling: bool = False  # fedrolex
    tuned_exponent: bool = False  # fedzoo: the coverage step exponent is tuned too (0 elsewhere)


@dataclass
class ArmResult:
    models: dict[int, nn.Module]  # each tier's served model, BatchNorm recalibrated on the cloud's images
    bytes_per_device_round: float  # float32 tensors down (subnet state) + up (delta), summed from the arrays
    forward_macs_per_device_round: float  # the model's counted MACs x examples trained on, mean over updates
    supernets: dict[int | None, Weights]  # the trained supernet (tier_alone: one per tier)


def wide_spec(spec: SupernetSpec) -> SupernetSpec:
    """The supernet's space with every expand ratio 2..max allowed (the space needs 2 at least: every block has
    an expand conv): the same tensors, finer width levels."""
    ratios = tuple(range(2, spec.space.max_expand_ratio + 1))
    return dataclasses.replace(spec, space=dataclasses.replace(spec.space, expand_ratio_choices=ratios))


def width_capped(arch: Arch, ratio: int) -> Arch:
    capped = copy.deepcopy(arch)
    for stage in capped["stages"]:
        stage["expand_ratios"] = [min(int(value), ratio) for value in stage["expand_ratios"]]
    return capped


def depth_capped(arch: Arch, depth: int) -> Arch:
    capped = copy.deepcopy(arch)
    for stage in capped["stages"]:
        stage["kernels"], stage["expand_ratios"] = stage["kernels"][:depth], stage["expand_ratios"][:depth]
    return capped


class MacCounter:
    """Forward MACs of one example, counted on each arch's torch module once."""

    def __init__(self, spec: SupernetSpec, weights: Weights) -> None:
        self.spec, self.weights, self.cache = spec, weights, {}

    def __call__(self, arch: Arch) -> int:
        key = arch_key(arch)
        if key not in self.cache:
            shape = (1, self.spec.in_channels, self.spec.space.resolution, self.spec.space.resolution)
            self.cache[key] = count_macs(subnet_module(self.spec, arch, self.weights), shape)
        return self.cache[key]


def fit_budget(candidates: list[Arch], budget_macs: int, macs: MacCounter) -> Arch:
    """The first of `candidates` (largest first) within the budget, else the last (the smallest; over budget)."""
    return next((arch for arch in candidates if macs(arch) <= budget_macs), candidates[-1])


def make_arms(spec: SupernetSpec, zoo_archs: list[Arch], macs: MacCounter) -> dict[str, Arm]:
    largest, budgets = zoo_archs[-1], [macs(arch) for arch in zoo_archs]
    widths = [width_capped(largest, ratio) for ratio in sorted(spec.space.expand_ratio_choices, reverse=True)]
    depths = [depth_capped(largest, depth) for depth in sorted(spec.space.depth_choices, reverse=True)]
    sliced = tuple(fit_budget(widths, budget, macs) for budget in budgets)
    return {
        "tier_alone": Arm("tier_alone", tuple(zoo_archs), separate_models=True),
        "heterofl": Arm("heterofl", sliced),
        "fedrolex": Arm("fedrolex", sliced, rolling=True),
        "depthwise": Arm("depthwise", tuple(fit_budget(depths, budget, macs) for budget in budgets)),
        "everyone_largest": Arm("everyone_largest", (largest,) * len(zoo_archs)),
        "fedzoo": Arm("fedzoo", tuple(zoo_archs), tuned_exponent=True),
    }


def roll_hidden(weights: Weights, spec: SupernetSpec, shift: int) -> Weights:
    """Every block's hidden channels rolled by `shift` (a permutation: the full model computes the same), so a
    prefix slice of the result is a rolling window of `weights` (FedRolex)."""
    rolled = dict(weights)
    for stage in range(len(spec.space.stages)):
        for block in range(spec.space.max_depth):
            prefix = f"stages.{stage}.{block}."
            for name in ("expand_weight", "depthwise_weight", *(f"{norm}.{tensor}" for norm in
                         ("expand_norm", "depthwise_norm") for tensor in ("weight", "bias", "running_mean",
                                                                          "running_var"))):
                rolled[prefix + name] = np.roll(weights[prefix + name], shift, axis=0)
            rolled[prefix + "project_weight"] = np.roll(weights[prefix + "project_weight"], shift, axis=1)
    return rolled


def float_state(module: nn.Module) -> Weights:
    return {name: value.detach().numpy().copy() for name, value in module.state_dict().items()
            if value.is_floating_point()}


def train_locally(module: nn.Module, x: np.ndarray, y: np.ndarray, epochs: int, seed: int) -> tuple[Weights, int]:
    """SGD on the device's data, BatchNorm in training mode: (trained - initial of every float tensor, examples
    trained on)."""
    initial = float_state(module)
    optimizer = torch.optim.SGD(module.parameters(), lr=LOCAL_LEARNING_RATE)
    rng, examples = np.random.default_rng(seed), 0
    module.train()
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for start in range(0, len(order), BATCH_SIZE):
            batch = order[start:start + BATCH_SIZE]
            if len(batch) < 2:  # a batch of 1 has no BatchNorm statistics
                continue
            optimizer.zero_grad()
            nn.functional.cross_entropy(module(torch.from_numpy(x[batch])), torch.from_numpy(y[batch])).backward()
            optimizer.step()
            examples += len(batch)
    module.eval()
    return {name: value - initial[name] for name, value in float_state(module).items()}, examples


def run_arm(arm: Arm, spec: SupernetSpec, initial: Weights, devices: list[Device], cloud_x: np.ndarray,
            rounds: int, per_round: int, local_epochs: int, seed: int, server_learning_rate: float,
            coverage_step_exponent: float, macs: MacCounter) -> ArmResult:
    """`rounds` rounds of `per_round` devices drawn by `seed` (the same draws in every arm): each trains its
    tier's subnet, the server steps each supernet copy per element."""
    keys = range(len(arm.tier_archs)) if arm.separate_models else (None,)
    supernets = {key: dict(initial) for key in keys}
    strategies = {key: make_strategy({"name": "fedavg", "server_learning_rate": server_learning_rate}) for key in keys}
    shapes = {name: value.shape for name, value in initial.items()}
    rng = np.random.default_rng(seed)
    sent_bytes, forward_macs, updates = 0, 0, 0
    for round_number in range(rounds):
        chosen = rng.choice(len(devices), size=min(per_round, len(devices)), replace=False)
        shift = round_number if arm.rolling else 0
        for key in keys:
            members = [index for index in chosen if key is None or devices[index].tier == key]
            if not members:
                continue
            base = roll_hidden(supernets[key], spec, -shift) if shift else supernets[key]
            total = CoverageSum(shapes)
            for index in members:
                device, arch = devices[index], arm.tier_archs[devices[index].tier]
                module = subnet_module(spec, arch, base)
                down = sum(value.nbytes for value in float_state(module).values())
                delta, examples = train_locally(module, device.x, device.y, local_epochs,
                                                seed * 100_003 + round_number * 1009 + int(index))
                sent_bytes += down + sum(value.nbytes for value in delta.values())
                forward_macs += macs(arch) * examples
                updates += 1
                total.add(map_back(spec.space, arch, base, delta), len(device.y), arch_key(arch))
            stepped, _ = step_supernet(strategies[key], base, total, min_coverage=1,
                                       coverage_step_exponent=coverage_step_exponent)
            supernets[key] = roll_hidden(stepped, spec, shift) if shift else stepped
    models = {}
    for tier, arch in enumerate(arm.tier_archs):
        models[tier] = subnet_module(spec, arch, supernets[tier if arm.separate_models else None])
        recalibrate_batchnorm(models[tier], cloud_x)  # every arm's served models, the same way
    return ArmResult(models, sent_bytes / max(updates, 1), forward_macs / max(updates, 1), supernets)


def deployed_accuracy(models: dict[int, nn.Module], devices: list[Device]) -> float:
    """Each device's tier model on its own held-out data, weighted by held-out examples (= the population)."""
    correct = 0.0
    for tier, model in models.items():
        held = [device for device in devices if device.tier == tier]
        if held:
            x = np.concatenate([device.held_x for device in held])
            y = np.concatenate([device.held_y for device in held])
            correct += evaluate_accuracy(model, x, y)[0] * len(y)
    return correct / sum(len(device.held_y) for device in devices)
