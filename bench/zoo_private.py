"""The private arms of `bench/fl_zoo.py --private`: the zoo-wide plan under SecAgg+ with central DP or with distributed
DP, as the server runs it (docs/privacy.md, "DP in zoo-wide rounds" and "Distributed DP in zoo-wide rounds"), on the
draws, local training and seeds of the fedzoo arm in the clear (`zoo_arms.run_arm`).

Each round the drawn devices are grouped by subnet (their tier's zoo model); a group below 3 forms no cohort and
sits out. A cohort's devices clip their trainable delta to C and make their SecAgg+ ring input: central, the SecAgg+
quantiser (`fedzoo.secagg.quantise`); distributed, conditional rounding within the norm bound plus their noise share
for 3z at the cohort's honest floor (`fedzoo.server.fl.distributed_dp.noise_request`). Their ring sum is what SecAgg+
unmasks (masking cancels, so it is left out, as in bench/fl_distributed_dp.py). The server then releases every
public subnet's noised sum and combines them with public denominators (`zoo_privacy.noised_coverage_sum`, the
server's own code), and the plan's strategy steps per element. BatchNorm statistics are not released under DP: every
arm's served models are recalibrated on the cloud's images anyway.

The noise is seeded numpy (each draw a rounded normal of the calibrated variance, the simulator's `SeededNoise`), not
the exact sampler from os.urandom the server and devices use (tens of microseconds a coordinate): at the hundreds
to thousands of grid steps here the two have the same accuracy effect, and nothing here is published.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np

from fedzoo.aggregation.per_element import step_supernet
from fedzoo.aggregation.strategies import make_strategy
from fedzoo.compress.zoo_extraction import SupernetSpec
from fedzoo.dp.clipping import clip_delta
from fedzoo.dp.discrete_gaussian import SecureRandom
from fedzoo.dp.distributed import (DistributedNoise, device_sigma_squared, norm_bound_squared, ring_bits_needed,
                                   round_conditionally)
from fedzoo.dp.noise import SeededNoise
from fedzoo.nas.space import Arch, arch_key
from fedzoo.nas.subnet_mapping import map_back
from fedzoo.secagg import SecAggConfig, dequantise_sum, flatten, quantise, unflatten
from fedzoo.server.fl.distributed_dp import noise_request
from fedzoo.server.fl.schemas import RoundConfig
from fedzoo.server.fl.secure_rounds import MIN_COHORT, check_planned_ring, secagg_config
from fedzoo.server.fl.zoo_privacy import (CentralNoise, CohortNoise, PublicSubnet, cohort_sensitivity, longest_subnet,
                                          noised_coverage_sum, trainable_shapes)
from zoo_arms import Arm, Device, sent_subnet, served_models, train_locally


@dataclass
class PrivateRounds:
    """What a run of a zoo-wide plan released, round by round (besides the served models)."""

    models: dict = field(default_factory=dict)
    min_device_coverage: list[int] = field(default_factory=list)  # per round: the fewest devices behind an element
    ring_bits: list[int] = field(default_factory=list)  # per cohort: the SecAgg+ ring (clear arm: 32, float32)
    bits_needed: list[int] = field(default_factory=list)  # per cohort: what no sum of its inputs can wrap
    upload_vs_int8: list[float] = field(default_factory=list)  # per device: bytes masked / one byte a coordinate
    sat_out: int = 0  # devices drawn whose subnet had fewer than 3


@dataclass(frozen=True)
class SeededAbsentCohortNoise:
    """`zoo_privacy.AbsentCohortNoise` with seeded numpy draws (the bench's noise, above)."""

    grid_step: float
    levels: int
    request: DistributedNoise
    rng: np.random.Generator

    def steps(self, formed: bool, dimension: int) -> np.ndarray:
        if formed:
            return np.zeros(dimension, np.int64)
        sigma = math.sqrt(float(device_sigma_squared(self.request, self.levels, dimension)))
        return np.rint(self.rng.normal(0.0, sigma, size=(MIN_COHORT, dimension))).astype(np.int64).sum(axis=0)


def plan_config(mode: str, noise_multiplier: float, clip_norm: float, levels: int, per_round: int,
                survivor_fraction: float | None = None) -> RoundConfig:
    """The zoo-wide plan the private arm runs, as the server would hold it."""
    return RoundConfig.model_validate({
        "model_id": "supernet", "evaluation_sha256": "0" * 64, "deadline_s": 60, "target_clients": per_round,
        "min_clients": MIN_COHORT,
        "privacy": {"secure_aggregation": {"levels": levels, "survivor_fraction": survivor_fraction},
                    "dp": {"max_epsilon": 1000, "delta": 1e-5, "clip_norm": clip_norm,
                           "noise_multiplier": noise_multiplier, "noise": mode}},
        "zoo": {"latency_budget_ms": 1.0, "calibration_sha256": "0" * 64}})


def covered_devices(spec: SupernetSpec, weights: dict, groups: dict[str, tuple[Arch, int]]) -> int:
    """The fewest devices behind any element that some group's update covers (`groups`: arch and devices)."""
    counts: dict[str, np.ndarray] = {}
    for arch, devices in groups.values():
        zeros = {name: np.zeros(shape, np.float32) for name, shape in trainable_shapes(spec.space, arch,
                                                                                      weights).items()}
        for name, mask in map_back(spec.space, arch, weights, zeros).masks.items():
            counts[name] = counts.get(name, np.zeros(mask.shape, np.int64)) + devices * mask
    return int(min(value[value > 0].min() for value in counts.values() if (value > 0).any()))


def clear_coverage(arm: Arm, spec: SupernetSpec, initial: dict, devices: list[Device], rounds: int, per_round: int,
                   seed: int) -> list[int]:
    """Per round of `zoo_arms.run_arm` (the same draws): the fewest devices behind any element it released."""
    rng, minimum = np.random.default_rng(seed), []
    for _ in range(rounds):
        chosen = rng.choice(len(devices), size=min(per_round, len(devices)), replace=False)
        groups: dict[str, tuple[Arch, int]] = {}
        for index in chosen:
            arch = arm.tier_archs[devices[index].tier]
            groups[arch_key(arch)] = (arch, groups.get(arch_key(arch), (arch, 0))[1] + 1)
        minimum.append(covered_devices(spec, initial, groups))
    return minimum


def run_private(mode: str, arm: Arm, spec: SupernetSpec, initial: dict, devices: list[Device], cloud_x: np.ndarray,
                rounds: int, per_round: int, local_epochs: int, seed: int, server_learning_rate: float,
                coverage_step_exponent: float, noise_multiplier: float, clip_norm: float, levels: int,
                survivor_fraction: float | None = None, batch_norm: str = "training") -> PrivateRounds:
    """`rounds` rounds of the zoo-wide plan under SecAgg+ with `mode` DP (the draws, training seeds and devices'
    BatchNorm of `zoo_arms.run_arm`); returns the served models and what each round released."""
    config = plan_config(mode, noise_multiplier, clip_norm, levels, per_round, survivor_fraction)
    public = {arch_key(arch): PublicSubnet(arch_key(arch), arch) for arch in arm.tier_archs}
    archs = [subnet.arch for subnet in public.values()]
    longest = longest_subnet(spec.space, initial, archs)
    check_planned_ring(config, longest)  # the server refuses a plan whose noised sums could wrap the ring
    noise_rng = np.random.default_rng(seed + 7_919)
    noise = server_noise(config, longest, seed + 7_919, noise_rng)
    supernet = dict(initial)
    strategy = make_strategy({"name": "fedavg", "server_learning_rate": server_learning_rate})
    rng, result = np.random.default_rng(seed), PrivateRounds()
    rounding = SecureRandom()
    for round_number in range(rounds):
        chosen = rng.choice(len(devices), size=min(per_round, len(devices)), replace=False)
        groups: dict[str, list[int]] = {}
        for index in chosen:
            groups.setdefault(arch_key(arm.tier_archs[devices[index].tier]), []).append(int(index))
        sums, formed = {}, {}
        for key, members in groups.items():
            if len(members) < MIN_COHORT:
                result.sat_out += len(members)
                continue
            arch = public[key].arch
            shapes = trainable_shapes(spec.space, arch, supernet)
            protocol = secagg_config(config.privacy.secure_aggregation, round_number, len(members),
                                     sum(math.prod(shape) for shape in shapes.values()), clip_norm, MIN_COHORT, 0)
            request = noise_request(config, protocol) if mode == "distributed" else None
            vectors = []
            sent = sent_subnet(spec, arch, supernet, cloud_x, batch_norm)
            for index in members:
                device = devices[index]
                delta, _ = train_locally(copy.deepcopy(sent), device.x, device.y, local_epochs,
                                         seed * 100_003 + round_number * 1009 + index, batch_norm)
                clipped, _ = clip_delta({name: delta[name] for name in shapes}, clip_norm)
                vectors.append(flatten(clipped))
                result.upload_vs_int8.append((protocol.vector_length + 1) * protocol.modulus_bits / 8
                                             / protocol.vector_length)
            sums[key] = unflatten(unmasked_sum(vectors, protocol, request, rounding, noise_rng), shapes)
            formed[key] = (arch, len(members))
            result.ring_bits.append(protocol.modulus_bits)
            result.bits_needed.append(
                ring_bits_needed(levels, len(members), device_sigma_squared(request, levels, protocol.vector_length))
                if request is not None else math.ceil(math.log2(2 * levels * len(members) + 1)))
        if not formed:
            result.min_device_coverage.append(0)
            continue
        result.min_device_coverage.append(covered_devices(spec, supernet, formed))
        total = noised_coverage_sum(spec.space, supernet, list(public.values()), sums, per_round, noise)
        supernet, _ = step_supernet(strategy, supernet, total, min_coverage=1,
                                    coverage_step_exponent=coverage_step_exponent)
    result.models = served_models(arm, spec, {None: supernet}, cloud_x)
    return result


def server_noise(config: RoundConfig, longest: int, seed: int, rng: np.random.Generator) -> CohortNoise:
    """The noise the server adds to every public subnet's sum (`zoo_privacy.zoo_noise`'s, seeded): central, z x
    `cohort_sensitivity` on the longest subnet vector; distributed, an absent cohort's shares where none formed."""
    dp, settings = config.privacy.dp, config.privacy.secure_aggregation
    step = dp.clip_norm / settings.levels
    if dp.noise == "central":
        return CentralNoise(step, dp.noise_multiplier * cohort_sensitivity(dp.clip_norm, step, longest),
                            SeededNoise(seed))
    least = secagg_config(settings, 0, MIN_COHORT, longest, dp.clip_norm, MIN_COHORT, 0)
    return SeededAbsentCohortNoise(step, settings.levels, noise_request(config, least), rng)


def unmasked_sum(vectors: list[np.ndarray], protocol: SecAggConfig, request: DistributedNoise | None,
                 rounding: SecureRandom, rng: np.random.Generator) -> np.ndarray:
    """What SecAgg+ unmasks from a cohort's clipped update vectors (masking cancels), in model units: the sum of
    their quantised inputs (central), or of their noised ring inputs (distributed: `request`), in the ring."""
    ring = np.zeros(protocol.vector_length + 1, np.int64)
    for vector in vectors:
        ring += (quantise(vector, protocol, 1.0, rng).astype(np.int64) if request is None
                 else ring_input(vector, protocol, request, rounding, rng))
    total, _ = dequantise_sum(ring % 2 ** protocol.modulus_bits, protocol)
    return total


def ring_input(vector: np.ndarray, protocol: SecAggConfig, request: DistributedNoise, rounding: SecureRandom,
               rng: np.random.Generator) -> np.ndarray:
    """A device's distributed-DP ring input (`fedzoo.dp.distributed.noised_ring_input`, whose exact sampler is
    swapped for seeded rounded normals of the same variance), as signed integers before the ring."""
    levels, dimension = protocol.levels, protocol.vector_length
    rounded = round_conditionally(vector * (levels / protocol.clip_range), norm_bound_squared(levels, dimension),
                                  rounding)
    sigma = math.sqrt(float(device_sigma_squared(request, levels, dimension)))
    return np.append(rounded + np.rint(rng.normal(0.0, sigma, dimension)).astype(np.int64), levels)


@dataclass(frozen=True)
class NoNoise:
    """No noise on any subnet's sum: the clear aggregate `released_noise` compares each arm's release with."""

    grid_step: float

    def steps(self, formed: bool, dimension: int) -> np.ndarray:
        return np.zeros(dimension, np.int64)


def released_noise(arm: Arm, spec: SupernetSpec, initial: dict, devices: list[Device], rounds: int, per_round: int,
                   seed: int, noise_multiplier: float, clip_norm: float,
                   arms: dict[str, tuple[str, int, float | None]]) -> dict[str, dict[str, tuple[float, float]]]:
    """The noise each DP arm's release puts on the supernet's mean delta, per element, without training: the first
    `rounds` draws of `run_private` (the same cohorts), each device a random vector of norm `clip_norm` (the noise
    does not depend on the data), released as `run_private` releases it, minus the same round's clear aggregate
    (the vectors' float sums, no noise, the same public denominators). Returns, per arm (`arms`: name -> mode,
    levels, survivor fraction), the standard deviation of released - clear over the elements of each coverage
    pattern (which of the zoo's subnets cover the element, slowest tier first, e.g. "1111"), pooled over rounds,
    in units of clip_norm, and what the calibrated variances predict it to be (the noise each subnet's sum is
    asked to carry: central z x `cohort_sensitivity`; distributed, each survivor's `device_sigma_squared`, or an
    absent cohort's shares); pattern "all" pools every released element."""
    public = {arch_key(arch): PublicSubnet(arch_key(arch), arch) for arch in arm.tier_archs}
    archs = [subnet.arch for subnet in public.values()]
    longest = longest_subnet(spec.space, initial, archs)
    pattern = {name: np.zeros(value.shape, np.int64) for name, value in initial.items()}
    masks = {}
    for bit, (key, subnet) in enumerate(public.items()):
        zeros = {name: np.zeros(shape, np.float32) for name, shape in trainable_shapes(spec.space, subnet.arch,
                                                                                      initial).items()}
        masks[key] = map_back(spec.space, subnet.arch, initial, zeros).masks
        for name, mask in masks[key].items():
            pattern[name] += mask.astype(np.int64) << bit
    draws, vectors_rng = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    squares: dict[str, dict[str, list[np.ndarray]]] = {name: {} for name in arms}
    for round_number in range(rounds):
        chosen = draws.choice(len(devices), size=min(per_round, len(devices)), replace=False)
        groups: dict[str, int] = {}
        for index in chosen:
            key = arch_key(arm.tier_archs[devices[index].tier])
            groups[key] = groups.get(key, 0) + 1
        vectors = {}
        for key, members in groups.items():
            if members >= MIN_COHORT:
                length = sum(math.prod(shape) for shape in trainable_shapes(spec.space, public[key].arch,
                                                                            initial).values())
                drawn = vectors_rng.normal(size=(members, length))
                vectors[key] = list(clip_norm * drawn / np.linalg.norm(drawn, axis=1, keepdims=True))
        for name, (mode, levels, survivor_fraction) in arms.items():
            config = plan_config(mode, noise_multiplier, clip_norm, levels, per_round, survivor_fraction)
            noise_rng = np.random.default_rng(seed + 7_919 + round_number)
            noise = server_noise(config, longest, seed + 7_919 + round_number, noise_rng)
            released, clear, variance = {}, {}, {}  # variance: per coordinate of each subnet's sum, model units
            for key, subnet in public.items():
                shapes = trainable_shapes(spec.space, subnet.arch, initial)
                length = sum(math.prod(shape) for shape in shapes.values())
                variance[key] = (noise.stddev ** 2 if isinstance(noise, CentralNoise) else MIN_COHORT * float(
                    device_sigma_squared(noise.request, levels, length)) * noise.grid_step ** 2)
                if key not in vectors:
                    continue
                cohort = vectors[key]
                protocol = secagg_config(config.privacy.secure_aggregation, round_number, len(cohort), length,
                                         clip_norm, MIN_COHORT, 0)
                request = noise_request(config, protocol) if mode == "distributed" else None
                released[key] = unflatten(unmasked_sum(cohort, protocol, request, SecureRandom(), noise_rng), shapes)
                clear[key] = unflatten(np.sum(cohort, axis=0), shapes)
                if request is not None:
                    variance[key] = len(cohort) * float(device_sigma_squared(request, levels, length)) \
                        * noise.grid_step ** 2
            noised = noised_coverage_sum(spec.space, initial, list(public.values()), released, per_round, noise)
            exact = noised_coverage_sum(spec.space, initial, list(public.values()), clear, per_round,
                                        NoNoise(noise.grid_step))
            for tensor, weights in exact.weights.items():
                covered = weights > 0
                error = (noised.sums[tensor] - exact.sums[tensor])[covered] / weights[covered] / clip_norm
                predicted = sum((variance[key] * masks[key][tensor] for key in public if tensor in masks[key]),
                                np.zeros(weights.shape))
                predicted = predicted[covered] / weights[covered] ** 2 / clip_norm ** 2
                for value in np.unique(pattern[tensor][covered]):
                    label = "".join("1" if value >> bit & 1 else "0" for bit in range(len(archs)))
                    group = pattern[tensor][covered] == value
                    squares[name].setdefault(label, []).append(np.stack([error[group] ** 2, predicted[group]]))
    return {name: {label: tuple(np.sqrt(np.concatenate(values, axis=1).mean(axis=1)))
                   for label, values in [*sorted(by_pattern.items()), ("all", sum(by_pattern.values(), []))]}
            for name, by_pattern in squares.items()}
