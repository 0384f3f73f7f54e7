"""Quantisation into the ring: sums are exact integers, the mean comes back within the quantisation step."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedzoo.errors import InvalidInputError
from fedzoo.secagg.config import SecAggConfig
from fedzoo.secagg.encoding import dequantise_sum, example_weight, flatten, quantise, unflatten


def _config(num_clients=10, vector_length=64, clip_range=1.0, levels=127):
    return SecAggConfig("round-1", num_clients, 4, 3, vector_length, clip_range, levels)


@settings(max_examples=40, deadline=None)
@given(num_clients=st.integers(5, 300), seed=st.integers(0, 2**32 - 1),
       weights=st.lists(st.floats(0.01, 1.0), min_size=3, max_size=300))
def test_the_ring_sum_decodes_to_the_sum_of_levels_without_wrapping(num_clients, seed, weights):
    config = _config(num_clients=num_clients, vector_length=16)
    rng = np.random.default_rng(seed)
    # worst case: every client at +clip or -clip, where wrapping would show first
    vectors = [np.full(16, rng.choice([-5.0, 5.0])) for _ in range(num_clients)]
    weights = (weights * num_clients)[:num_clients]
    ring = [quantise(v, config, w, rng) for v, w in zip(vectors, weights)]
    total = np.zeros(17, dtype=ring[0].dtype)
    for value in ring:
        total += value
    weighted_sum, total_weight = dequantise_sum(total, config)
    levels = [max(1, round(w * 127)) for w in weights]
    expected = sum(np.sign(v) * level for v, level in zip(vectors, levels)) / 127
    np.testing.assert_allclose(weighted_sum, expected, atol=1e-9)
    assert total_weight == pytest.approx(sum(levels) / 127)
    assert config.modulus_bits == (16 if num_clients <= 258 else 32)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), clip_range=st.floats(0.01, 10.0))
def test_values_come_back_within_one_quantisation_step(seed, clip_range):
    config = _config(clip_range=clip_range)
    rng = np.random.default_rng(seed)
    vector = rng.uniform(-clip_range, clip_range, size=64)
    weighted_sum, weight = dequantise_sum(quantise(vector, config, 1.0, rng), config)
    assert weight == 1.0
    assert np.max(np.abs(weighted_sum - vector)) <= clip_range / 127 + 1e-12


def test_stochastic_rounding_is_unbiased():
    config = _config(num_clients=200, vector_length=8)
    rng = np.random.default_rng(1)
    vector = np.array([0.001, -0.004, 0.3, -0.7, 0.0, 0.5 / 127, 0.9999, -1.0])
    total = np.zeros(9, dtype=np.uint16)
    for _ in range(200):
        total += quantise(vector, config, 1.0, rng)
    mean, count = dequantise_sum(total, config)
    np.testing.assert_allclose(mean / count, vector, atol=4 * (1 / 127) / np.sqrt(200))


def test_clipping_and_flattening():
    config = _config(vector_length=5)
    delta = {"w": np.array([[2.0, -3.0], [0.0, 0.5]], dtype=np.float32), "b": np.array([1.0], dtype=np.float32)}
    flat = flatten(delta)
    assert flat.tolist() == [1.0, 2.0, -3.0, 0.0, 0.5]  # sorted names: b, then w
    back = unflatten(flat, {"w": (2, 2), "b": (1,)})
    assert all(np.array_equal(back[name], delta[name]) for name in delta)
    value, _ = dequantise_sum(quantise(flat, config, 1.0, np.random.default_rng(0)), config)
    assert value[:3].tolist() == [1.0, 1.0, -1.0]  # clipped to +-clip_range


def test_example_weights_cap_and_refuse_nonsense():
    assert example_weight(30, 100) == 0.3
    assert example_weight(300, 100) == 1.0
    with pytest.raises(InvalidInputError, match="num_examples"):
        example_weight(0, 100)


@pytest.mark.parametrize("vector, weight, field", [
    (np.zeros(3), 1.0, "vector"),
    (np.full(64, np.nan), 1.0, "vector"),
    (np.zeros(64), 0.0, "weight"),
    (np.zeros(64), 1.5, "weight"),
])
def test_bad_inputs_name_themselves(vector, weight, field):
    with pytest.raises(InvalidInputError) as error:
        quantise(vector, _config(), weight)
    assert error.value.field == field


@pytest.mark.parametrize("changes, field", [
    ({"neighbour_count": 3}, "neighbour_count"),
    ({"neighbour_count": 10}, "neighbour_count"),
    ({"threshold": 2}, "threshold"),
    ({"threshold": 5}, "threshold"),
    ({"clip_range": 0.0}, "clip_range"),
    ({"num_clients": 2}, "num_clients"),
    ({"round_id": ""}, "round_id"),
])
def test_bad_configurations_name_the_parameter(changes, field):
    arguments = {"round_id": "r", "num_clients": 10, "neighbour_count": 4, "threshold": 3, "vector_length": 8,
                 "clip_range": 1.0, **changes}
    with pytest.raises(InvalidInputError) as error:
        SecAggConfig(**arguments)
    assert error.value.field == field
