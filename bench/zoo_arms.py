"""The arms of bench/fl_zoo.py: which subnet each tier trains, and one federated loop that runs every arm.

Every arm is a set of subnets of the zoo's supernet (smallest tier first) trained per element over the supernet
(`fedzoo.aggregation.per_element.step_supernet`), so the arms differ only in what they say they differ in:
- tier_alone: each tier's zoo model on its own copy of the supernet, trained by that tier only (per-model FL);
- heterofl: static width slices of the largest subnet (the supernet): every layer's channels (stem, every
  block's output and hidden channels, the head) times one ratio per tier, the first ones kept, the largest ratio
  within the tier's budget (as HeteroFL scales every hidden layer by its complexity level's ratio);
- fedrolex: the same widths, the window of every layer's channels rolling by one channel a round;
- depthwise: depth prefixes of the largest subnet (the first blocks of each stage), the deepest within budget,
  and where even the shallowest is over, its width scaled as heterofl's;
- everyone_largest: every device on the largest subnet, budgets ignored (the upper bound);
- fedzoo: each tier's zoo model on one shared supernet, with the zoo plan's coverage step scaling.
Every tier's model of every arm but everyone_largest is within its tier's MACs budget (`count_macs`).

Where the arms start: tier_alone, everyone_largest and fedzoo from the cloud-built zoo's supernet; the anchors
(heterofl, fedrolex, depthwise) from `warm_up`: their own tier models trained jointly in the cloud from the
supernet's initialisation, on the same labelled examples with the same optimiser, schedule, batch size and
epochs as the zoo's supernet training, so every arm's start had the same cloud data and steps.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedzoo.compress.zoo_extraction import SupernetSpec
from fedzoo.nas.space import Arch, arch_key
from fedzoo.nas.subnet import Subnet, count_macs, evaluate_accuracy, recalibrate_batchnorm
from fedzoo.nas.training import (TrainingConfig, epoch_generators, learning_rate_at, shift_images, shift_offsets,
                                 steps_per_epoch)
from fedzoo.nas.subnet_mapping import MappedDelta, Placement, placements
from fedzoo.aggregation.per_element import CoverageSum, step_supernet
from fedzoo.aggregation.strategies import make_strategy

BATCH_SIZE, LOCAL_LEARNING_RATE = 16, 0.05
WIDTH_STEPS = 32  # width ratios tried: 32/32, 31/32, ..., 1/32
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
    ignores_budgets: bool = False  # everyone_largest
    tuned_exponent: bool = False  # fedzoo: the coverage step exponent is tuned too (0 elsewhere)
    warmed_up: bool = False  # the anchors: start from `warm_up` of their own tier models, not the zoo's supernet


@dataclass
class ArmResult:
    models: dict[int, nn.Module]  # each tier's served model, BatchNorm recalibrated on the cloud's images
    bytes_per_device_round: float  # float32 tensors down (subnet state) + up (delta), summed from the arrays
    forward_macs_per_device_round: float  # the model's counted MACs x examples trained on, mean over updates
    supernets: dict[int | None, Weights]  # the trained supernet (tier_alone: one per tier)
    refused_updates: int = 0  # updates with a non-finite value, refused as the server refuses them


def width_scaled(arch: Arch, ratio: float) -> Arch:
    """`arch` with every layer's channels (stem, every stage's output, the head) times `ratio`, at least one;
    blocks keep their expand ratios, so their hidden channels scale too (HeteroFL's slice of a model)."""
    scaled = copy.deepcopy(arch)
    scaled["stem_channels"] = max(1, round(arch["stem_channels"] * ratio))
    scaled["head_channels"] = max(1, round(arch["head_channels"] * ratio))
    for stage in scaled["stages"]:
        stage["out_channels"] = max(1, round(stage["out_channels"] * ratio))
    return scaled


def depth_capped(arch: Arch, depth: int) -> Arch:
    capped = copy.deepcopy(arch)
    for stage in capped["stages"]:
        stage["kernels"], stage["expand_ratios"] = stage["kernels"][:depth], stage["expand_ratios"][:depth]
    return capped


def full_width(spec: SupernetSpec, arch: Arch) -> Arch:
    """`arch` with the supernet's channels: the subnet whose tensors a scaled `arch` slices."""
    full = copy.deepcopy(arch)
    full["stem_channels"], full["head_channels"] = spec.space.stem_channels, spec.space.head_channels
    for stage, stage_spec in zip(full["stages"], spec.space.stages):
        stage["out_channels"] = stage_spec.out_channels
    return full


def sliced_placements(spec: SupernetSpec, arch: Arch, weights: Weights,
                      shapes: dict[str, tuple[int, ...]]) -> list[Placement]:
    """Where each tensor of `arch`'s module (of the given `shapes`) lives in the supernet: its full-width arch's
    placements, each narrowed to the leading channels of every axis (a depthwise kernel's map keeps its own)."""
    return [dataclasses.replace(placement, index=(slice(0, shapes[placement.subnet_name][0]),)
                                if placement.kernel_map is not None
                                else tuple(slice(0, size) for size in shapes[placement.subnet_name]))
            for placement in placements(spec.space, full_width(spec, arch), weights)]


def tier_module(spec: SupernetSpec, arch: Arch, weights: Weights) -> Subnet:
    """A standalone torch module of `arch` (full or scaled width) holding its slice of the supernet weights."""
    module = Subnet(arch, spec.num_classes, spec.in_channels)
    state = module.state_dict()
    with torch.no_grad():
        for placement in sliced_placements(spec, arch, weights, {name: tuple(value.shape) for name, value in
                                                                 state.items()}):
            state[placement.subnet_name].copy_(torch.from_numpy(placement.extract(weights)))
    return module.eval()


def sliced_map_back(spec: SupernetSpec, arch: Arch, weights: Weights, delta: Weights) -> MappedDelta:
    """A delta of `arch`'s module (full or scaled width) on the supernet, with the mask of what it covers."""
    deltas, masks = {}, {}
    for placement in sliced_placements(spec, arch, weights, {name: value.shape for name, value in delta.items()}):
        shape = weights[placement.supernet_name].shape
        region, covered = placement.map_back(delta[placement.subnet_name], shape)
        deltas.setdefault(placement.supernet_name, np.zeros(shape, np.float32))[placement.index] = np.where(
            covered, region, 0.0)
        masks.setdefault(placement.supernet_name, np.zeros(shape, bool))[placement.index] = covered
    return MappedDelta(deltas, masks)


class MacCounter:
    """Forward MACs of one example, counted on each arch's torch module once."""

    def __init__(self, spec: SupernetSpec) -> None:
        self.spec, self.cache = spec, {}

    def __call__(self, arch: Arch) -> int:
        key = arch_key(arch)
        if key not in self.cache:
            shape = (1, self.spec.in_channels, self.spec.space.resolution, self.spec.space.resolution)
            self.cache[key] = count_macs(Subnet(arch, self.spec.num_classes, self.spec.in_channels), shape)
        return self.cache[key]


def fit_budget(candidates: list[Arch], budget_macs: int, macs: MacCounter) -> Arch:
    """The first of `candidates` (largest first) within the budget."""
    fitting = next((arch for arch in candidates if macs(arch) <= budget_macs), None)
    if fitting is None:
        raise ValueError(f"no candidate within {budget_macs} MACs (the smallest has {macs(candidates[-1])})")
    return fitting


def best_within(archs: list[Arch], budgets: list[int], macs: MacCounter, score: Callable[[Arch], float]) -> list[Arch]:
    """For each MACs budget, the arch of `archs` within it that scores best (a zoo's lookup at that budget)."""
    chosen = []
    for budget in budgets:
        fitting = [arch for arch in archs if macs(arch) <= budget]
        if not fitting:
            raise ValueError(f"no arch within {budget} MACs (the smallest has {min(map(macs, archs))})")
        chosen.append(max(fitting, key=score))
    return chosen


def make_arms(spec: SupernetSpec, zoo_archs: list[Arch], budgets: list[int], macs: MacCounter) -> dict[str, Arm]:
    """Every arm at the tiers' MACs `budgets` (slowest first): the zoo's models `zoo_archs` for tier_alone and
    fedzoo, slices of the space's largest subnet for the others."""
    largest = spec.space.max_arch()
    ratios = [step / WIDTH_STEPS for step in range(WIDTH_STEPS, 0, -1)]
    shallowest = depth_capped(largest, min(spec.space.depth_choices))
    widths = [width_scaled(largest, ratio) for ratio in ratios]
    depths = [depth_capped(largest, depth) for depth in sorted(spec.space.depth_choices, reverse=True)[:-1]] + [
        width_scaled(shallowest, ratio) for ratio in ratios]
    sliced = tuple(fit_budget(widths, budget, macs) for budget in budgets)
    return {
        "tier_alone": Arm("tier_alone", tuple(zoo_archs), separate_models=True),
        "heterofl": Arm("heterofl", sliced, warmed_up=True),
        "fedrolex": Arm("fedrolex", sliced, rolling=True, warmed_up=True),
        "depthwise": Arm("depthwise", tuple(fit_budget(depths, budget, macs) for budget in budgets), warmed_up=True),
        "everyone_largest": Arm("everyone_largest", (largest,) * len(budgets), ignores_budgets=True),
        "fedzoo": Arm("fedzoo", tuple(zoo_archs), tuned_exponent=True),
    }


def over_budget(arm: Arm, budgets: list[int], macs: MacCounter) -> list[int]:
    """The tiers whose model of `arm` exceeds the tier's MACs budget (none allowed unless it ignores budgets)."""
    return [tier for tier, (arch, budget) in enumerate(zip(arm.tier_archs, budgets)) if macs(arch) > budget]


# the channel axes of each supernet tensor, by the name's ending (the classifier's classes and the stem's image
# channels are not channels of the model's width, kernel transforms have none)
CHANNEL_AXES = {"stem.0.weight": (0,), "expand_weight": (0, 1), "project_weight": (0, 1), "head.0.weight": (0, 1),
                "classifier.weight": (1,), "depthwise_weight": (0,), "weight": (0,), "bias": (0,),
                "running_mean": (0,), "running_var": (0,)}


def channel_axes(name: str) -> tuple[int, ...]:
    if "kernel_transforms" in name or name == "classifier.bias":
        return ()
    return next(axes for ending, axes in CHANNEL_AXES.items() if name.endswith(ending))


def roll_channels(weights: Weights, shift: int) -> Weights:
    """Every layer's channels rolled by `shift` (one permutation per layer's width, the same wherever those
    channels meet: the full model computes the same), so a leading slice of the result is a rolling window of
    `weights` on every layer (FedRolex)."""
    return {name: np.roll(value, shift, axis=channel_axes(name)) if channel_axes(name) else value
            for name, value in weights.items()}


def float_state(module: nn.Module) -> Weights:
    return {name: value.detach().numpy().copy() for name, value in module.state_dict().items()
            if value.is_floating_point()}


def warm_up(spec: SupernetSpec, family: tuple[Arch, ...], initial: Weights, x: np.ndarray, y: np.ndarray,
            config: TrainingConfig, seed: int) -> tuple[Weights, int]:
    """`family` (an anchor's tier models, full or scaled width) trained jointly in the cloud, as HeteroFL trains
    its width levels and DepthFL its depths: each step the sum of every member's cross-entropy on the batch,
    backpropagated through its slice of the shared supernet tensors. Everything else is the zoo's supernet
    training (`train_supernet_epoch`): batches, pixel shifts, SGD with Nesterov momentum and weight decay, the
    cosine schedule, gradient clipping at 5, `config.epochs` over `x`; the sandwich rule's passes a step (the
    largest, the smallest, `sandwich_random_subnets` random) become one pass per member. Kernel transforms stay
    as initialised and BatchNorm statistics are left to the recalibration every served model gets. The first
    `config.largest_only_epochs` train the family's largest member alone, as the zoo's supernet training does its
    largest subnet. Returns the trained supernet weights and the examples trained on (each seen by every member
    training that epoch)."""
    params = {name: torch.tensor(value, requires_grad=True) for name, value in initial.items()
              if "kernel_transforms" not in name and not name.endswith(("running_mean", "running_var"))}
    members = []
    for arch in family:
        module = Subnet(arch, spec.num_classes, spec.in_channels).train()
        shapes = {name: tuple(value.shape) for name, value in module.state_dict().items()}
        trained = dict(module.named_parameters())
        members.append((module, [placement for placement in sliced_placements(spec, arch, initial, shapes)
                                 if placement.subnet_name in trained]))
    optimizer = torch.optim.SGD(params.values(), lr=config.learning_rate, momentum=config.momentum,
                                weight_decay=config.weight_decay, nesterov=True)
    per_epoch = steps_per_epoch(len(y), config.batch_size)
    images_all, labels_all = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))
    examples = 0
    for epoch in range(config.epochs):
        this_epoch = members[-1:] if epoch < config.largest_only_epochs else members  # the family is smallest first
        generator, _ = epoch_generators(seed, epoch)
        order = torch.randperm(len(y), generator=generator)
        for step in range(per_epoch):
            index = order[step * config.batch_size:(step + 1) * config.batch_size]
            offsets = shift_offsets(len(index), config.max_shift_pixels, generator)
            images = shift_images(images_all[index], offsets, config.max_shift_pixels)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate_at(config, epoch * per_epoch + step, config.epochs * per_epoch)
            optimizer.zero_grad(set_to_none=True)
            loss = sum(nn.functional.cross_entropy(torch.func.functional_call(
                module, {placement.subnet_name: sliced_tensor(placement, params) for placement in placed},
                (images,)), labels_all[index]) for module, placed in this_epoch)
            loss.backward()
            nn.utils.clip_grad_norm_(params.values(), 5.0)
            optimizer.step()
            examples += len(index)
    return {**initial, **{name: value.detach().numpy().copy() for name, value in params.items()}}, examples


def sliced_tensor(placement: Placement, params: dict[str, torch.Tensor]) -> torch.Tensor:
    """`placement.extract` on torch tensors, so gradients reach the supernet tensor."""
    region = params[placement.supernet_name][placement.index]
    if placement.kernel_map is None:
        return region
    channels, kernel = region.shape[0], int(round(np.sqrt(placement.kernel_map.shape[1])))
    flat = region.reshape(channels, -1) @ torch.from_numpy(placement.kernel_map.astype(np.float32))
    return flat.reshape(channels, 1, kernel, kernel)


def train_locally(module: nn.Module, x: np.ndarray, y: np.ndarray, epochs: int, seed: int,
                  batch_norm: str = "training") -> tuple[Weights, int]:
    """SGD on the device's data: (trained - initial of every float tensor, examples trained on). `batch_norm`:
    "training" normalises with each batch's statistics (the zoo plan's training cards); "inference" with the
    module's stored statistics, training only BatchNorm's scale and bias (a training graph built with
    `batch_norm="inference"`)."""
    initial = float_state(module)
    optimizer = torch.optim.SGD(module.parameters(), lr=LOCAL_LEARNING_RATE)
    rng, examples = np.random.default_rng(seed), 0
    module.train()
    if batch_norm == "inference":
        for layer in module.modules():
            if isinstance(layer, nn.modules.batchnorm._BatchNorm):
                layer.eval()
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


def sent_subnet(spec: SupernetSpec, arch: Arch, weights: Weights, cloud_x: np.ndarray, batch_norm: str) -> nn.Module:
    """The subnet a round sends a device: with `batch_norm` "inference", its BatchNorm statistics recalibrated on
    the cloud's images, which the device then trains with (`train_locally`)."""
    module = tier_module(spec, arch, weights)
    if batch_norm == "inference":
        recalibrate_batchnorm(module, cloud_x)
    return module


def run_arm(arm: Arm, spec: SupernetSpec, initial: Weights, devices: list[Device], cloud_x: np.ndarray,
            rounds: int, per_round: int, local_epochs: int, seed: int, server_learning_rate: float,
            coverage_step_exponent: float, macs: MacCounter, batch_norm: str = "training") -> ArmResult:
    """`rounds` rounds of `per_round` devices drawn by `seed` (the same draws in every arm): each trains its
    tier's subnet, the server steps each supernet copy per element. With `batch_norm` "inference" each round's
    subnets are sent with their BatchNorm statistics recalibrated on the cloud's images (as the server
    recalibrates what it serves) and devices train with those statistics fixed (`train_locally`)."""
    keys = range(len(arm.tier_archs)) if arm.separate_models else (None,)
    supernets = {key: dict(initial) for key in keys}
    strategies = {key: make_strategy({"name": "fedavg", "server_learning_rate": server_learning_rate}) for key in keys}
    shapes = {name: value.shape for name, value in initial.items()}
    rng = np.random.default_rng(seed)
    sent_bytes, forward_macs, updates, refused = 0, 0, 0, 0
    for round_number in range(rounds):
        chosen = rng.choice(len(devices), size=min(per_round, len(devices)), replace=False)
        shift = round_number if arm.rolling else 0
        for key in keys:
            members = [index for index in chosen if key is None or devices[index].tier == key]
            if not members:
                continue
            base = roll_channels(supernets[key], -shift) if shift else supernets[key]
            total = CoverageSum(shapes)
            sent = {}  # the round's subnet of each tier, as sent down
            for index in members:
                device, arch = devices[index], arm.tier_archs[devices[index].tier]
                if device.tier not in sent:
                    sent[device.tier] = sent_subnet(spec, arch, base, cloud_x, batch_norm)
                module = copy.deepcopy(sent[device.tier])
                down = sum(value.nbytes for value in float_state(module).values())
                delta, examples = train_locally(module, device.x, device.y, local_epochs,
                                                seed * 100_003 + round_number * 1009 + int(index), batch_norm)
                sent_bytes += down + sum(value.nbytes for value in delta.values())
                forward_macs += macs(arch) * examples
                updates += 1
                if not all(np.isfinite(value).all() for value in delta.values()):
                    refused += 1  # local SGD diverged: the server refuses non-finite tensors in every arm
                    continue
                total.add(sliced_map_back(spec, arch, base, delta), len(device.y), arch_key(arch))
            stepped, _ = step_supernet(strategies[key], base, total, min_coverage=1,
                                       coverage_step_exponent=coverage_step_exponent)
            supernets[key] = roll_channels(stepped, shift) if shift else stepped
    return ArmResult(served_models(arm, spec, supernets, cloud_x), sent_bytes / max(updates, 1),
                     forward_macs / max(updates, 1), supernets, refused)


def served_models(arm: Arm, spec: SupernetSpec, supernets: dict[int | None, Weights],
                  cloud_x: np.ndarray) -> dict[int, nn.Module]:
    """Each tier's model of `arm` from its supernet (tier_alone: the tier's own copy), BatchNorm recalibrated on
    the cloud's images: every arm's served models, the same way."""
    models = {}
    for tier, arch in enumerate(arm.tier_archs):
        models[tier] = tier_module(spec, arch, supernets[tier if arm.separate_models else None])
        recalibrate_batchnorm(models[tier], cloud_x)
    return models


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
