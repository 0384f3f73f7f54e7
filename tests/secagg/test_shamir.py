"""Shamir sharing: any t shares give the secret back, fewer do not, and bad shares never pass as a secret."""

import itertools
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedzoo.errors import InvalidInputError
from fedzoo.secagg.shamir import PRIME, ShareError, combine_shares, split_secret


@settings(max_examples=40, deadline=None)
@given(secret=st.binary(min_size=32, max_size=32), holders=st.integers(2, 12), data=st.data())
def test_any_threshold_subset_recovers_the_secret(secret, holders, data):
    threshold = data.draw(st.integers(1, holders))
    xs = data.draw(st.lists(st.integers(1, 10**6), min_size=holders, max_size=holders, unique=True))
    shares = split_secret(secret, threshold, xs)
    subset = data.draw(st.permutations(shares)).__getitem__(slice(threshold))
    assert combine_shares(subset, threshold) == secret


def test_every_subset_of_a_small_sharing_recovers_and_too_few_cannot():
    secret = os.urandom(32)
    shares = split_secret(secret, 3, [1, 2, 3, 4, 5])
    for subset in itertools.combinations(shares, 3):
        assert combine_shares(list(subset), 3) == secret
    with pytest.raises(ShareError, match="2 shares cannot recover"):
        combine_shares(shares[:2], 3)


def test_threshold_minus_one_shares_are_consistent_with_any_secret():
    """Perfect secrecy, concretely: for t - 1 shares and ANY candidate secret there is a polynomial through both."""
    secret, other = os.urandom(32), os.urandom(32)
    shares = split_secret(secret, 3, [1, 2, 3])
    # a degree-2 polynomial through (0, other) and the first two shares exists: interpolate it and evaluate at 3
    points = [(0, int.from_bytes(other, "big")), *shares[:2]]
    third = sum(y * _lagrange_at(points, i, 3) for i, (_, y) in enumerate(points)) % PRIME
    assert combine_shares([shares[0], shares[1], (3, third)], 3) == other


def _lagrange_at(points, index, x):
    x_i = points[index][0]
    value = 1
    for other, (x_j, _) in enumerate(points):
        if other != index:
            value = value * (x - x_j) * pow(x_i - x_j, -1, PRIME) % PRIME
    return value


def test_a_changed_share_gives_another_value_or_an_error_never_the_secret():
    rng = random.Random(0)
    for _ in range(50):
        secret = os.urandom(32)
        shares = split_secret(secret, 4, [1, 2, 3, 4, 5, 6])
        x, y = shares[1]
        shares[1] = (x, (y + rng.randrange(1, PRIME)) % PRIME)
        try:
            assert combine_shares(shares, 4) != secret
        except ShareError as error:
            assert "inconsistent" in str(error)


@pytest.mark.parametrize("secret, threshold, holders, field", [
    (b"short", 2, [1, 2], "secret"),
    (bytes(32), 3, [1, 2], "threshold"),
    (bytes(32), 0, [1, 2], "threshold"),
    (bytes(32), 2, [1, 1], "holders"),
    (bytes(32), 2, [0, 1], "holders"),
])
def test_bad_parameters_name_themselves(secret, threshold, holders, field):
    with pytest.raises(InvalidInputError) as error:
        split_secret(secret, threshold, holders)
    assert error.value.field == field


def test_duplicate_x_is_refused():
    shares = split_secret(bytes(range(32)), 2, [1, 2])
    with pytest.raises(ShareError, match="distinct"):
        combine_shares([shares[0], shares[0]], 2)
