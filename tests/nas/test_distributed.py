"""Data-parallel supernet training on 2 gloo workers: the same weights as one process with the same global
batch, and a worker that dies mid-epoch is restarted from the last checkpoint to the same result."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # the shared helpers next to this file (importlib mode)
from distributed_helpers import DieOnceMidEpoch, train_a_few_steps
from fedzoo.cloud.pipeline import CHECKPOINT_FOLDER, BuildConfig, train_supernet_worker
from fedzoo.nas.distributed import run_local_workers

torch.set_num_threads(1)


@pytest.mark.slow  # spawning 2 workers that import torch: ~10 s on a quiet 2-core machine
def test_two_workers_train_the_weights_of_one_process_with_the_same_global_batch():
    one = train_a_few_steps(distributed=False)
    two = run_local_workers(train_a_few_steps, (True,), workers=2)
    assert two[0].keys() == one.keys()
    for name, value in one.items():
        # the workers hold the same weights, bit for bit; against one process, float rounding of sums taken in
        # another order (1e-5 here): a worker-local batch norm or subnet sample moves them by 0.1 to 1
        assert torch.equal(two[0][name], two[1][name]), name
        assert torch.allclose(two[0][name].float(), value.float(), rtol=1e-4, atol=2e-4), name


@pytest.mark.slow
def test_two_workers_with_their_own_batchnorm_train_the_weights_of_one_process_with_two_batchnorm_groups():
    one_group = train_a_few_steps(distributed=False)
    two_groups = train_a_few_steps(distributed=False, batchnorm_groups=2)
    two = run_local_workers(train_a_few_steps, (True, False), workers=2)
    parameters = [name for name in one_group if "running_" not in name and "num_batches" not in name]
    # the groups matter: normalising each half of the batch on its own trains other weights
    assert any(not torch.allclose(two_groups[name], one_group[name], atol=1e-2) for name in parameters)
    for name in one_group:
        assert torch.equal(two[0][name], two[1][name]), name  # the workers' running statistics are averaged too
    for name in parameters:
        assert torch.allclose(two[0][name], two_groups[name], rtol=1e-4, atol=2e-4), name


def _config(out: Path) -> BuildConfig:
    return BuildConfig(dataset="digits", out=out, preset="tiny", epochs=2, device="cpu")


def _checkpoint(out: Path) -> dict:
    return torch.load(out / CHECKPOINT_FOLDER / "supernet.pt", map_location="cpu", weights_only=False)


@pytest.mark.slow
def test_a_worker_killed_mid_epoch_resumes_from_the_last_checkpoint(tmp_path):
    uninterrupted = run_local_workers(train_supernet_worker, (_config(tmp_path / "once"),), workers=2)
    killed = run_local_workers(train_supernet_worker, (_config(tmp_path / "killed"), DieOnceMidEpoch(rank=1, epoch=2, step=3)),
                               workers=2, max_restarts=1)
    assert uninterrupted == killed == {0: 2, 1: 2}
    expected, resumed = _checkpoint(tmp_path / "once"), _checkpoint(tmp_path / "killed")
    assert resumed["epoch"] == 2
    assert all(torch.equal(resumed["model"][name], expected["model"][name]) for name in expected["model"])
