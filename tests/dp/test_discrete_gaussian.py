"""The discrete Gaussian sampler (Canonne-Kamath-Steinke 2020): integer draws, symmetric, of standard deviation
sigma, from os.urandom."""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedzoo.dp.discrete_gaussian import (SecureRandom, discrete_gaussian_noise, sample_discrete_gaussian,
                                         sigma_squared_at_least)
from fedzoo.dp.seeded_stream import SeededStream
from fedzoo.errors import InvalidInputError

DRAWS = 4000


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sigma=st.floats(min_value=0.6, max_value=5e4))
def test_draws_are_integers_with_standard_deviation_sigma_and_symmetric(sigma):
    draws = discrete_gaussian_noise(sigma, DRAWS)
    assert draws.dtype == np.int64 and draws.shape == (DRAWS,)
    # the discrete Gaussian's variance is within exp(-2 pi^2 sigma^2)-relative terms of sigma^2 (CKS Cor. 9); the
    # sample std of n draws is within 5 x sigma / sqrt(2n) of it (kurtosis 3), the sample mean within 5 sigma / sqrt(n)
    true_std = math.sqrt(float(sigma_squared_at_least(sigma)))
    assert abs(draws.std() - true_std) < 5 * true_std / math.sqrt(2 * DRAWS) + 0.02
    assert abs(draws.mean()) < 5 * true_std / math.sqrt(DRAWS)
    positive, negative = int(np.sum(draws > 0)), int(np.sum(draws < 0))
    assert abs(positive - negative) < 5 * math.sqrt(positive + negative)  # symmetric about 0


def test_small_sigma_probabilities_match_the_exact_mass():
    """At sigma = 1 the mass at 0, +-1, +-2 is known in closed form: the sampler hits it."""
    sigma_squared = Fraction(1)
    source = SecureRandom()
    draws = np.array([sample_discrete_gaussian(sigma_squared, source) for _ in range(20_000)])
    weights = {x: math.exp(-x * x / 2) for x in range(-12, 13)}
    total = sum(weights.values())
    for value in (0, 1, -1, 2):
        expected = weights[value] / total
        observed = float(np.mean(draws == value))
        assert abs(observed - expected) < 5 * math.sqrt(expected * (1 - expected) / len(draws))


def test_sigma_squared_is_rounded_up_and_bad_sigmas_are_refused():
    assert float(sigma_squared_at_least(3.0)) >= 9.0
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidInputError, match="sigma"):
            discrete_gaussian_noise(bad, 3)


def test_uniform_integers_cover_the_range_without_bias():
    source = SecureRandom(block_bytes=64)
    draws = np.array([source.below(3) for _ in range(30_000)])
    assert set(np.unique(draws)) == {0, 1, 2}
    assert np.all(np.abs(np.bincount(draws) / len(draws) - 1 / 3) < 0.02)


def test_a_fresh_source_starts_on_the_operating_systems_bytes():
    """The first byte of each of 64 fresh sources: uniform bytes, so not all the same (a fixed starting buffer, read
    before the first refill, would make every first draw the same; an honest run fails with chance 256^-63)."""
    assert len({SecureRandom().read(1) for _ in range(64)}) > 1


def test_a_bound_below_one_is_refused_naming_it():
    """`below(0)` has no integer to return: refused, not an endless rejection loop."""
    for bound in (0, -1):
        with pytest.raises(InvalidInputError, match=f"^bound must be positive, got {bound}$") as refused:
            SecureRandom().below(bound)
        assert refused.value.field == "bound"
    assert SecureRandom().below(1) == 0


def test_reads_return_the_bytes_asked_for_within_across_and_beyond_a_block():
    """A read larger than a block, one ending exactly at a block's end, and one crossing into the next block each
    return exactly `count` bytes (a short read would shorten a seed or a draw)."""
    source = SecureRandom(block_bytes=16)
    for count in (40, 16, 10, 10, 6, 1, 17):
        assert len(source.read(count)) == count
    assert source.read(0) == b""


def test_sigma_squared_is_the_next_multiple_of_two_to_the_minus_20_plus_one_step_never_less():
    """The contract both SDKs share: ceil(sigma^2 x 2^20) + 1 over 2^20, so the noise is never below the sigma asked."""
    assert sigma_squared_at_least(3.0) == Fraction(9 * 2**20 + 1, 2**20)
    assert sigma_squared_at_least(0.1) == Fraction(math.ceil(0.1 * 0.1 * 2**20) + 1, 2**20)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidInputError, match="sigma must be a positive number") as refused:
            sigma_squared_at_least(bad)
        assert refused.value.field == "sigma"


def test_a_sampler_asked_for_no_noise_or_a_negative_count_refuses_naming_the_field():
    with pytest.raises(InvalidInputError, match="sigma\\^2 must be positive") as refused:
        sample_discrete_gaussian(Fraction(0), SecureRandom())
    assert refused.value.field == "sigma"
    with pytest.raises(InvalidInputError, match="size must be non-negative") as refused:
        discrete_gaussian_noise(1.0, -1)
    assert refused.value.field == "size"
    empty = discrete_gaussian_noise(1.0, 0)
    assert empty.dtype == np.int64 and empty.shape == (0,)


def test_the_noise_is_drawn_from_the_source_given():
    """The vectors' seeded stream must drive the draws (os.urandom otherwise): the same seed, the same noise."""
    first = discrete_gaussian_noise(2.0, 50, SeededStream(b"seed"))
    assert np.array_equal(first, discrete_gaussian_noise(2.0, 50, SeededStream(b"seed")))
    assert not np.array_equal(first, discrete_gaussian_noise(2.0, 50, SeededStream(b"other")))
