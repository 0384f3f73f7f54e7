"""What the data-parallel tests run inside the workers the elastic agent spawns: module-level, so the
workers can import it (a function in a test module cannot be, in pytest's importlib mode)."""

from __future__ import annotations

import os

import numpy as np
import torch

from fedzoo.cloud.pipeline import BuildReporter
from fedzoo.datasets import load_dataset, split_dataset
from fedzoo.nas.distributed import join_workers, leave_workers, synchronise_batchnorm
from fedzoo.nas.space import tiny_space
from fedzoo.nas.supernet import Supernet
from fedzoo.nas.training import ONE_WORKER, TrainingConfig, make_optimizer, train_supernet_epoch

# 3 global batches of 16: the sandwich's 4 subnets each step. Longer runs of this tiny supernet are chaotic
# (one process and a copy perturbed by 1e-6 part by 0.02 after 3 more steps), so the weights are compared here.
STEPS_CONFIG = TrainingConfig(epochs=1, batch_size=16, learning_rate=0.2, max_shift_pixels=1, sandwich_random_subnets=2)
STEPS_EXAMPLES = 48


def train_a_few_steps(distributed: bool, sync_batchnorm: bool = True, batchnorm_groups: int = 1) -> dict[str, torch.Tensor]:
    """The supernet's state after one short epoch, in one process (its batches normalised in `batchnorm_groups`
    slices) or as one of several workers (BatchNorm over the global batch, or over each worker's slice)."""
    torch.set_num_threads(1)
    split = split_dataset(load_dataset("digits"), seed=0)
    x = ((split.train.x[:STEPS_EXAMPLES] - split.mean[0]) / split.std[0]).astype(np.float32)
    y = split.train.y[:STEPS_EXAMPLES]
    torch.manual_seed(0)
    supernet = Supernet(tiny_space(8), 10, 1).to(memory_format=torch.channels_last)
    replica = ONE_WORKER
    if distributed:
        if sync_batchnorm:
            synchronise_batchnorm(supernet)
        replica = join_workers(torch.device("cpu"))
    optimizer = make_optimizer(supernet, STEPS_CONFIG)
    try:
        train_supernet_epoch(supernet, optimizer, x, y, STEPS_CONFIG, seed=0, epoch=0, replica=replica,
                             batchnorm_groups=batchnorm_groups)
    finally:
        if distributed:
            leave_workers()
    return {name: value.clone() for name, value in supernet.state_dict().items()}


class DieOnceMidEpoch(BuildReporter):
    """Ends worker `rank` abruptly at `step` of epoch `epoch`, in the agent's first attempt only."""

    def __init__(self, rank: int, epoch: int, step: int) -> None:
        self.rank, self.epoch, self.step = rank, epoch, step
        self.stage = ""

    def start_stage(self, name: str, total: int | None = None) -> None:
        self.stage = name

    def advance(self, completed: int) -> None:
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if first_attempt and int(os.environ["RANK"]) == self.rank and f"epoch {self.epoch}/" in self.stage and completed == self.step:
            os._exit(17)  # no cleanup, no exception: as a killed process
