"""Shared fixtures: keep torch to one thread so parallel test workers do not fight over 2 cores; the 4-device
digits federation most round tests share (a module that needs another defines its own `federation`); grouped
tests collected first."""

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def federation():
    """Four devices on Dirichlet(1.0) digits shards and a small MLP pre-trained for 2 epochs (seed 0)."""
    from fedzoo.cloud.simulation import prepare_federation  # torch: imported by the tests that use it only

    return prepare_federation("digits", num_clients=4, alpha=1.0, hidden_units=16, pretrain_epochs=2, seed=0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Grouped tests first (`xdist_group`, one test process each group, minutes long): started last, a group
    would keep one process busy while the other has run out of tests. Their order within is kept."""
    grouped = [item for item in items if item.get_closest_marker("xdist_group")]
    items[:] = grouped + [item for item in items if not item.get_closest_marker("xdist_group")]
