"""Shared fixtures: keep torch to one thread so parallel test workers do not fight over 2 cores; the 4-device
digits federation most round tests share (a module that needs another defines its own `federation`)."""

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def federation():
    """Four devices on Dirichlet(1.0) digits shards and a small MLP pre-trained for 2 epochs (seed 0)."""
    from fedzoo.cloud.simulation import prepare_federation  # torch: imported by the tests that use it only

    return prepare_federation("digits", num_clients=4, alpha=1.0, hidden_units=16, pretrain_epochs=2, seed=0)
