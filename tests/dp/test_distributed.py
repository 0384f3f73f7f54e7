"""Distributed DP under SecAgg+ (`fedzoo.dp.distributed`): the encoding's shared vectors, the accountant's bound
against an exact Renyi divergence and the Gaussian limit, and the noise the server unmasks."""

import json
import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy.special import logsumexp

sys.path.insert(0, str(Path(__file__).parents[1] / "vectors"))  # the vector writer (importlib mode)
from distributed_noise_vectors import VECTORS_PATH, vectors_text  # noqa: E402

from fedzoo.dp.accountant import epsilon_after
from fedzoo.dp.discrete_gaussian import SecureRandom, sample_discrete_gaussian
from fedzoo.dp.distributed import (DistributedNoise, NoisePolicy, check_noise_request,
                                   device_sigma_squared, equivalent_noise_multiplier, noise_multiplier_of_sum,
                                   noised_ring_input, norm_bound_squared, ring_bits_needed,
                                   round_conditionally)
from fedzoo.dp.seeded_stream import SeededStream
from fedzoo.errors import InvalidInputError
from fedzoo.secagg import SecAggConfig
from fedzoo.secagg.bounds import SecAggBounds
from fedzoo.secagg.errors import ProtocolViolation
from fedzoo.secagg.local import run_local_round

VECTORS = json.loads(VECTORS_PATH.read_text())


def test_the_committed_vectors_are_what_the_writer_writes():
    assert VECTORS_PATH.read_text() == vectors_text()


def test_the_vector_cases_stay_within_their_bounds():
    """What the vectors pin holds: each rounded update within the integer norm bound, the ring wide enough, and the
    redrawn case really redrew (so a second SDK's redraw path is exercised)."""
    assert any(case["rounding_attempts"] > 1 for case in VECTORS["cases"])
    for case in VECTORS["cases"]:
        assert case["ring_bits_needed"] <= case["modulus_bits"]
        assert case["equivalent_noise_multiplier"] >= case["noise"]["noise_multiplier"]
        ring = np.array(case["ring"], dtype=np.int64)
        assert ring[-1] == case["levels"]  # weight 1


def _divergence(order: float, sigma_squared: float, summands: int, shift: int) -> float:
    """The exact Renyi divergence D_order(S + shift || S), S the sum of `summands` discrete Gaussians, from the
    distribution computed on a wide support (numerically, independently of KLS's bound)."""
    width = int(60 * math.sqrt(sigma_squared * summands)) + 20
    support = np.arange(-width, width + 1)
    one = np.exp(-support.astype(float) ** 2 / (2 * sigma_squared))
    total = one / one.sum()
    for _ in range(summands - 1):
        total = np.convolve(total, one / one.sum(), mode="same")
    shifted = np.roll(total, shift)
    keep = (total > 1e-280) & (shifted > 1e-280)  # beyond: terms that add nothing a float can hold
    terms = order * np.log(shifted[keep]) + (1 - order) * np.log(total[keep])
    return float(logsumexp(terms) / (order - 1))


@pytest.mark.parametrize("sigma_squared,summands", [(0.3, 2), (0.5, 3), (1.0, 2), (2.0, 4)])
def test_the_bound_covers_the_exact_renyi_divergence_of_a_sum_of_discrete_gaussians(sigma_squared, summands):
    """KLS's bound, as the Gaussian noise multiplier the ledger charges, is at least the exact divergence of the
    summed noise at every order (one coordinate, sensitivity 1; small sigma, where the sum is furthest from a
    discrete Gaussian and tau matters)."""
    multiplier = noise_multiplier_of_sum(sigma_squared, summands, 1, 1)
    for order in (1.5, 2, 4, 8, 16, 32):
        assert _divergence(order, sigma_squared, summands, 1) <= order / (2 * multiplier**2) * (1 + 1e-9)


def test_with_large_noise_the_bound_is_the_gaussian_mechanisms_and_tau_matters_only_for_tiny_noise():
    # large per-device noise: tau underflows and the sum is worth exactly sqrt(n) sigma / sensitivity
    assert noise_multiplier_of_sum(1e6, 50, 1e4, 60_000) == pytest.approx(math.sqrt(50 * 1e6 / 1e4), rel=1e-12)
    # a value by hand: sigma^2 = 1, n = 2, D2 = 1, d = 1: eps = 1/sqrt(2) + 10 exp(-pi^2)
    assert noise_multiplier_of_sum(1.0, 2, 1, 1) == pytest.approx(1 / (1 / math.sqrt(2) + 10 * math.exp(-math.pi**2)))
    # tiny noise in many coordinates: the tau term costs, so the sum is worth less than the Gaussian's
    assert noise_multiplier_of_sum(0.5, 100, 4, 10_000) < 0.5 * math.sqrt(100 * 0.5 / 4)


@pytest.mark.parametrize("z,survivors,levels,dimension", [(0.5, 3, 127, 100), (1.1, 30, 32767, 60_000),
                                                         (3.0, 1000, 32767, 1000), (0.3, 200, 2, 10),
                                                         (0.05, 5000, 1, 10), (0.1, 1000, 2, 10_000)])
def test_calibration_meets_the_charged_noise_multiplier_within_a_percent(z, survivors, levels, dimension):
    noise = DistributedNoise(z, survivors)
    assert equivalent_noise_multiplier(noise, levels, dimension) >= z
    if levels > 100:  # a realistic grid: the margin costs almost nothing
        assert equivalent_noise_multiplier(noise, levels, dimension) <= z * 1.01


def test_the_ledger_charge_covers_the_mechanism_over_rounds_and_is_within_a_percent_of_it():
    """T rounds of the calibrated mechanism compose to T rho_DDG (zCDP, the Renyi curve of a Gaussian at the
    equivalent multiplier); the ledger charges the plan's z, at most that curve's epsilon and within 1% of it."""
    z, rounds, delta = 1.1, 20, 1e-5
    effective = equivalent_noise_multiplier(DistributedNoise(z, 30), 32767, 60_000)
    mechanism = epsilon_after(rounds, effective, 1.0, delta)
    charged = epsilon_after(rounds, z, 1.0, delta)
    assert mechanism <= charged <= mechanism * 1.01
    textbook = min(order * rounds / (2 * effective**2) + math.log(1 / delta) / (order - 1)
                   for order in np.linspace(1.01, 200, 20_000))  # Mironov's conversion of the same curve
    assert mechanism <= textbook


def test_the_device_input_is_rounded_within_the_bound_noised_and_weighted():
    clipped = np.random.default_rng(1).normal(size=500)
    clipped *= 0.5 / np.linalg.norm(clipped)
    noise = DistributedNoise(1.0, 3)
    ring = noised_ring_input(clipped, 0.5, 127, 32, noise)
    assert ring.dtype == np.uint32 and ring.shape == (501,) and ring[-1] == 127
    values = np.where(ring >= 2**31, ring.astype(np.int64) - 2**32, ring.astype(np.int64))[:-1]
    assert np.var(values) == pytest.approx(float(device_sigma_squared(noise, 127, 500)), rel=0.25)
    rounded = round_conditionally(clipped * 254, norm_bound_squared(254, 500), SecureRandom())
    assert int(np.dot(rounded, rounded)) <= norm_bound_squared(254, 500)
    assert np.all(np.abs(rounded - clipped * 254) < 1)
    with pytest.raises(InvalidInputError) as refused:
        noised_ring_input(clipped * 2, 0.5, 127, 32, noise)
    assert refused.value.field == "vector"


def test_the_unmasked_sum_of_honest_devices_carries_the_calibrated_noise():
    """A real SecAgg+ round of devices that add their share: the unmasked sum of zero deltas has, per coordinate,
    the variance the calibration promised for the fewest survivors (z D2)^2, within sampling tolerance; with a
    device dropping after key sharing, the sum of the minimum number of survivors still carries it."""
    dimension, levels, z = 1500, 127, 1.0
    config = SecAggConfig("ddp-variance", 8, 6, 5, dimension, 0.5, levels, minimum_survivors=7)
    noise = DistributedNoise(z, config.minimum_survivors)
    inputs = {client: noised_ring_input(np.zeros(dimension), 0.5, levels, config.modulus_bits, noise)
              for client in range(config.num_clients)}
    result = run_local_round(config, inputs, dropouts={"masked_input": {7}}).result
    assert sorted(result.survivors) == list(range(7))
    signed = result.ring_sum.astype(np.int64)
    signed = np.where(signed >= 2 ** (config.modulus_bits - 1), signed - 2**config.modulus_bits, signed)
    assert signed[-1] == 7 * levels  # seven weights of 1
    calibrated = z**2 * norm_bound_squared(levels, dimension)
    assert np.var(signed[:-1]) == pytest.approx(calibrated, rel=0.12)  # 1500 samples: sd of the estimate ~3.7%
    assert ring_bits_needed(levels, config.num_clients, device_sigma_squared(noise, levels, dimension)) <= \
        config.modulus_bits


def test_a_device_refuses_noise_calibrated_for_more_survivors_than_the_round_unmasks():
    """The lying server asks each device for the share of 30 honest survivors, but a sum the round unmasks may hold
    only 4 honest inputs: it would carry 4/30 of the accounted variance. The device compares with what its signed
    config's floor guarantees (`SecAggBounds.honest_survivors`: the floor less the corrupt devices it tolerates)."""
    config = SecAggConfig("ddp-floor", 8, 6, 5, 10, 0.5, 127, minimum_survivors=7)
    assert SecAggBounds().honest_survivors(config) == 5  # c = 2 of 8 may be the server's and add no noise
    with pytest.raises(ProtocolViolation) as refused:
        check_noise_request(DistributedNoise(1.0, 30), 4, NoisePolicy())
    assert refused.value.reason == "noise_survivors_above_floor"
    check_noise_request(DistributedNoise(1.0, 4), 4, NoisePolicy())  # calibrated for the floor: fine


def test_a_device_that_requires_distributed_noise_refuses_a_round_that_drops_it():
    with pytest.raises(ProtocolViolation) as refused:
        check_noise_request(None, 4, NoisePolicy(require_distributed=True))
    assert refused.value.reason == "noise_not_distributed"
    check_noise_request(None, 4, NoisePolicy())  # central noise stays available by default
    with pytest.raises(ProtocolViolation) as weak:
        check_noise_request(DistributedNoise(0.2, 4), 4, NoisePolicy(minimum_noise_multiplier=0.5))
    assert weak.value.reason == "noise_below_floor"


def test_the_seeded_stream_and_sampler_reproduce_the_vectors():
    stream = VECTORS["stream"]
    assert SeededStream(stream["seed"].encode()).read(48).hex() == stream["first_48_bytes"]
    below = SeededStream(stream["below"]["seed"].encode())
    assert [below.below(bound) for bound in stream["below"]["bounds"]] == stream["below"]["values"]
    gaussian = VECTORS["discrete_gaussian"]
    sigma_squared = Fraction(*gaussian["sigma_squared"])
    source = SeededStream(gaussian["seed"].encode())
    assert [sample_discrete_gaussian(sigma_squared, source) for _ in gaussian["values"]] == gaussian["values"]


@pytest.mark.parametrize("fields, field", [
    ((0.0, 3), "noise_multiplier"), ((-1.0, 3), "noise_multiplier"), ((math.nan, 3), "noise_multiplier"),
    ((math.inf, 3), "noise_multiplier"), ((1.0, 0), "survivors"), ((1.0, True), "survivors"),
    ((1.0, 3.0), "survivors"),
])
def test_a_noise_request_outside_the_mechanisms_domain_is_refused_naming_the_field(fields, field):
    """A lying server's request for no noise, infinite noise or a survivor count that is not a count."""
    with pytest.raises(InvalidInputError) as refused:
        DistributedNoise(*fields)
    assert refused.value.field == field


def test_a_noise_request_is_read_only_for_its_own_mechanism():
    noise = DistributedNoise(0.7, 1)
    assert DistributedNoise.from_dict(noise.to_dict()) == noise
    with pytest.raises(InvalidInputError) as refused:
        DistributedNoise.from_dict(dict(noise.to_dict(), mechanism="central-gaussian"))
    assert refused.value.field == "mechanism"


def test_a_device_takes_noise_exactly_at_its_floor_and_calibrated_for_exactly_its_honest_survivors():
    check_noise_request(DistributedNoise(0.5, 4), 4, NoisePolicy(require_distributed=True,
                                                                 minimum_noise_multiplier=0.5))
    with pytest.raises(ProtocolViolation) as refused:
        check_noise_request(DistributedNoise(0.5, 5), 4, NoisePolicy(minimum_noise_multiplier=0.5))
    assert refused.value.reason == "noise_survivors_above_floor"


@pytest.mark.parametrize("vector, message", [(np.array([0.1, math.nan]), "must be a finite vector"),
                                             (np.array([[0.1, 0.2]]), "must be a finite vector"),
                                             (np.array([0.3, 0.4001]), "is above clip_norm 0.5")])
def test_a_device_input_that_is_not_a_finite_clipped_vector_is_refused(vector, message):
    with pytest.raises(InvalidInputError, match=message) as refused:
        noised_ring_input(vector, 0.5, 127, 32, DistributedNoise(1.0, 3))
    assert refused.value.field == "vector"


def test_an_input_at_the_clip_norm_is_taken_and_an_unclipped_grid_vector_never_rounds_within_the_bound():
    ring = noised_ring_input(np.array([0.3, 0.4]), 0.5, 127, 16, DistributedNoise(1.0, 3))  # norm exactly 0.5
    assert ring.dtype == np.uint16 and ring.shape == (3,) and ring[-1] == 127
    with pytest.raises(InvalidInputError, match="1000 attempts") as refused:
        round_conditionally(np.full(4, 10.25), norm_bound_squared(1, 4), SecureRandom())
    assert refused.value.field == "vector"


def test_the_ring_holds_every_sum_of_the_cohorts_inputs():
    """One device's coordinate lies in [-(levels + 1), levels + 1] after rounding, plus its noise's tail: at levels
    127 that is 257 values, one more than 8 bits hold; at 126, 255 values fit in 8."""
    tiny = Fraction(1, 10**12)  # noise far below one grid step
    assert ring_bits_needed(127, 1, tiny) == 9 and ring_bits_needed(126, 1, tiny) == 8
    assert ring_bits_needed(126, 2, tiny) == 9  # two devices' inputs add up
    sigma_squared = Fraction(100)  # 20 standard deviations of the sum of 4 devices' noise: 400 more
    assert ring_bits_needed(126, 4, sigma_squared) == math.ceil(math.log2(2 * (4 * 127 + 400) + 1))
