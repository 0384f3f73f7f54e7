"""Data loading, seeded splits and the Dirichlet partitioner, including every kind of bad input."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import random
import socket

from fedzoo.datasets import (
    dirichlet_partition,
    hankel_images,
    load_dataset,
    load_mnist1d,
    load_npz,
    split_dataset,
    validate_arrays,
)
from fedzoo.errors import InvalidInputError


def test_mnist_subset_shapes_and_range():
    mnist = load_dataset("mnist")
    assert mnist.x.shape == (5000, 1, 28, 28) and mnist.x.dtype == np.float32
    assert 0.0 <= mnist.x.min() and mnist.x.max() <= 1.0
    assert np.bincount(mnist.y).tolist() == [500] * 10


def test_digits_shapes():
    digits = load_dataset("digits")
    assert digits.x.shape == (1797, 1, 8, 8)
    assert digits.num_classes == 10 and digits.x.max() <= 1.0


def test_mnist1d_is_generated_offline_seeded_and_leaves_global_random_state(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("mnist1d must be generated locally, not downloaded")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    load_mnist1d.cache_clear()
    np.random.seed(7)
    random.seed(7)
    expected_numpy, expected_python = np.random.random(), random.random()
    np.random.seed(7)
    random.seed(7)
    small = load_mnist1d(200)
    assert (np.random.random(), random.random()) == (expected_numpy, expected_python)
    assert small.x.shape == (200, 1, 21, 21) and small.x.dtype == np.float32
    assert small.x.min() == 0.0 and small.x.max() == 1.0
    assert np.bincount(small.y).tolist() == [20] * 10
    load_mnist1d.cache_clear()
    assert np.array_equal(load_mnist1d(200).x, small.x)  # seeded: the same set every time


def test_hankel_image_pixel_is_the_signal_at_row_plus_column():
    signals = np.arange(2 * 40, dtype=np.float64).reshape(2, 40)
    images = hankel_images(signals)
    assert images.shape == (2, 1, 21, 21)
    assert images[1, 0, 3, 5] == signals[1, 8] and images[0, 0, 0, 20] == signals[0, 20]
    assert images[0, 0, 20, 20] == signals[0, 39]  # the even length's last sample repeated


def test_mnist1d_needs_two_samples_per_digit():
    with pytest.raises(InvalidInputError, match="at least 20 samples"):
        load_mnist1d(10)


def test_split_is_seeded_stratified_and_disjoint():
    digits = load_dataset("digits")
    first, second = split_dataset(digits, seed=3), split_dataset(digits, seed=3)
    assert np.array_equal(first.test.x, second.test.x)
    other = split_dataset(digits, seed=4)
    assert not np.array_equal(first.test.x, other.test.x)
    assert len(first.train) + len(first.validation) + len(first.test) == len(digits)
    for part in (first.train, first.validation, first.test):
        assert set(np.unique(part.y)) == set(range(10))
    rows = {row.tobytes() for row in first.test.x}
    assert not rows & {row.tobytes() for row in first.train.x[:200]}
    assert len(first.mean) == 1 and first.std[0] > 0


def test_npz_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "mine.npz"
    np.savez(path, x=rng.integers(0, 256, (30, 12, 12), dtype=np.uint8), y=np.arange(30) % 3)
    data = load_dataset(str(path))
    assert data.x.shape == (30, 1, 12, 12) and data.x.max() <= 1.0
    assert data.num_classes == 3


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"x": np.zeros((4, 8, 8))}, "lacks the array"),
        ({"images": np.zeros((4, 8, 8)), "y": np.zeros(4, int)}, "needs 'x' and 'y'"),
        ({"x": np.zeros((4, 8)), "y": np.zeros(4, int)}, "shape"),
        ({"x": np.zeros((4, 8, 8)), "y": np.zeros(5, int)}, "to match x"),
        ({"x": np.full((4, 8, 8), np.nan), "y": np.zeros(4, int)}, "NaN"),
        ({"x": np.zeros((4, 8, 8)), "y": np.array([0, 1, -1, 1])}, "must lie in"),
        ({"x": np.zeros((4, 8, 8)), "y": np.array([0.5, 1, 0, 1])}, "integers"),
        ({"x": np.array([["a"] * 8] * 8 * 4).reshape(4, 8, 8), "y": np.zeros(4, int)}, "numeric"),
        ({"x": np.zeros((4, 8, 8)), "y": np.zeros(4, int)}, "at least 2 classes"),
    ],
)
def test_bad_npz_is_a_clear_error(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(InvalidInputError, match=message):
        load_npz(path)


def test_unreadable_and_unknown_datasets(tmp_path):
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    with pytest.raises(InvalidInputError, match="not a readable"):
        load_npz(junk)
    with pytest.raises(InvalidInputError, match="does not exist"):
        load_npz(tmp_path / "missing.npz")
    with pytest.raises(InvalidInputError, match="unknown data set 'cifar'"):
        load_dataset("cifar")


def test_labels_beyond_declared_classes():
    with pytest.raises(InvalidInputError, match=r"\[0, 10\)"):
        validate_arrays(np.zeros((2, 1, 4, 4)), np.array([3, 10]), num_classes=10)


def test_bad_split_fractions():
    digits = load_dataset("digits")
    with pytest.raises(InvalidInputError, match="test_fraction"):
        split_dataset(digits, validation_fraction=0.5, test_fraction=0.5)
    with pytest.raises(InvalidInputError, match="validation_fraction"):
        split_dataset(digits, validation_fraction=0.0)


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan")])
def test_alpha_must_be_positive(alpha):
    with pytest.raises(InvalidInputError, match="alpha"):
        dirichlet_partition(np.arange(100) % 10, 5, alpha)


def test_too_many_clients():
    with pytest.raises(InvalidInputError, match="cannot give 20 clients") as error:
        dirichlet_partition(np.arange(10) % 2, 20, 1.0)
    assert error.value.field == "num_clients"


def mean_classes_per_client(labels, shards, threshold=0.05):
    counts = [np.bincount(labels[s], minlength=10) / len(s) for s in shards]
    return np.mean([np.sum(c > threshold) for c in counts])


def test_small_alpha_skews_labels_more_than_large_alpha():
    labels = np.arange(5000) % 10
    skewed = dirichlet_partition(labels, 20, 0.1, seed=1)
    near_iid = dirichlet_partition(labels, 20, 100.0, seed=1)
    assert mean_classes_per_client(labels, skewed) < 5 < mean_classes_per_client(labels, near_iid)


@settings(max_examples=25, deadline=None)
@given(
    num_clients=st.integers(1, 12),
    alpha=st.floats(0.05, 50.0),
    seed=st.integers(0, 10_000),
)
def test_partition_covers_every_example_exactly_once(num_clients, alpha, seed):
    labels = np.random.default_rng(seed).integers(0, 10, 600)
    shards = dirichlet_partition(labels, num_clients, alpha, seed=seed)
    assert len(shards) == num_clients
    merged = np.sort(np.concatenate(shards))
    assert np.array_equal(merged, np.arange(600))
    assert min(len(s) for s in shards) >= 1
    again = dirichlet_partition(labels, num_clients, alpha, seed=seed)
    assert all(np.array_equal(a, b) for a, b in zip(shards, again))
