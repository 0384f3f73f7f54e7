"""Training: the supernet with the sandwich rule and in-place distillation, and single nets from scratch.

Sandwich rule (Yu & Huang, "Universally Slimmable Networks", 2019; BigNAS 2020): every step trains the
largest subnet on the labels, then the smallest and a few random subnets on the largest one's soft
predictions (in-place distillation), accumulating all gradients into one optimiser step. As in
Once-for-All's progressive shrinking, the first `largest_only_epochs` may train the largest subnet alone:
its soft predictions are worth distilling only once it has learnt something, and those epochs cost about
half a sandwich epoch.

After the search, `finetune_zoo_epoch` trains the zoo's chosen subnets jointly inside the supernet for
`zoo_finetune_epochs`: the sandwich rule over the chosen subnets only (the largest chosen on the labels, the
smallest chosen and `sandwich_random_subnets` other chosen ones distilled from it). The sandwich spreads its
steps over the whole space, and a short schedule leaves the chosen subnets far below what the same steps
give a few fixed models; the fine-tune spends its steps on the subnets the zoo serves, and since they keep
sharing the supernet's tensors, every zoo model is still the slice of the one supernet the zoo carries.

Every epoch draws its shuffling, augmentation and subnet samples from generators seeded by
(seed, epoch), so a run resumed from an epoch checkpoint repeats the uninterrupted run exactly, and
data-parallel workers (`Replica`), which all draw from the same generators, run the same subnets on their
slices of the same global batch: the sandwich rule and the distillation hold across workers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedzoo.errors import InvalidInputError
from fedzoo.nas.devices import DeviceData, autocast
from fedzoo.nas.space import Arch
from fedzoo.nas.supernet import Supernet


@dataclass(frozen=True)
class TrainingConfig:
    """Optimiser and schedule shared by the supernet and the from-scratch baselines."""

    epochs: int = 12
    batch_size: int = 64
    learning_rate: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 4e-5
    sandwich_random_subnets: int = 2
    largest_only_epochs: int = 0  # warm-up epochs training only the largest subnet, before the sandwich rule
    distillation_temperature: float = 1.0
    max_shift_pixels: int = 2
    zoo_finetune_epochs: int = 0  # after the search: the chosen subnets' joint fine-tune (finetune_zoo_epoch)


def epoch_generators(seed: int, epoch: int) -> tuple[torch.Generator, np.random.Generator]:
    """The torch and numpy generators one epoch draws from; the same (seed, epoch) gives the same draws."""
    torch_generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch_generator, np.random.default_rng([seed, epoch])


def shift_offsets(count: int, max_shift_pixels: int, generator: torch.Generator) -> torch.Tensor | None:
    """Per-image (dy, dx) translations in [0, 2 * max_shift_pixels], drawn for a whole global batch so every
    data-parallel worker draws the same; None when augmentation is off (nothing is drawn)."""
    if max_shift_pixels == 0:
        return None
    return torch.randint(0, 2 * max_shift_pixels + 1, (count, 2), generator=generator)


def shift_images(images: torch.Tensor, offsets: torch.Tensor | None, max_shift_pixels: int) -> torch.Tensor:
    """Translate each image by its offset (zero padding), as one gather on whatever device `images` is on."""
    if offsets is None:
        return images
    pad = max_shift_pixels
    padded = F.pad(images, (pad, pad, pad, pad))
    count, channels, height, width = images.shape
    device = images.device
    offsets = offsets.to(device)
    rows = offsets[:, 0, None] + torch.arange(height, device=device)
    columns = offsets[:, 1, None] + torch.arange(width, device=device)
    # indexed in NCHW order, so the result has NCHW strides as the per-image crops had (with one channel, a
    # channels-last result would also pass as contiguous, and oneDNN would pick other kernels for it)
    return padded[
        torch.arange(count, device=device)[:, None, None, None],
        torch.arange(channels, device=device)[None, :, None, None],
        rows[:, None, :, None],
        columns[:, None, None, :],
    ]


def random_shift(images: torch.Tensor, max_shift_pixels: int, generator: torch.Generator) -> torch.Tensor:
    """Translate each image by up to `max_shift_pixels` in x and y (zero padding): cheap augmentation for digits."""
    return shift_images(images, shift_offsets(len(images), max_shift_pixels, generator), max_shift_pixels)


@dataclass(frozen=True)
class Replica:
    """This worker's part in data-parallel training: the `rank`-th of `world_size` equal slices of every global
    batch, and `average_gradients`, which makes every worker's gradients the mean over all of them (None: one
    worker). Every worker draws the whole epoch's order, shifts and subnets from the same generators, so all
    run the same subnets on their slices of the same batch."""

    rank: int = 0
    world_size: int = 1
    average_gradients: Callable[[nn.Module], None] | None = None
    sum_over_workers: Callable[[torch.Tensor], torch.Tensor] | None = None

    def local_batch_size(self, batch_size: int) -> int:
        if batch_size % self.world_size:
            raise InvalidInputError(
                f"the batch size {batch_size} does not split evenly over {self.world_size} workers; use a worker count that divides it",
                field="workers",
            )
        return batch_size // self.world_size


ONE_WORKER = Replica()


def make_optimizer(model: nn.Module, config: TrainingConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        model.parameters(), lr=config.learning_rate, momentum=config.momentum, weight_decay=config.weight_decay, nesterov=True
    )


def learning_rate_at(config: TrainingConfig, step: int, total_steps: int) -> float:
    """Cosine decay from the base rate to zero over the whole run."""
    return 0.5 * config.learning_rate * (1.0 + np.cos(np.pi * step / max(total_steps, 1)))


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
    return max(1, num_examples // batch_size)


def _epoch_batches(data: DeviceData, config: TrainingConfig, generator: torch.Generator, replica: Replica):
    order = torch.randperm(len(data), generator=generator)
    local_size = replica.local_batch_size(config.batch_size)
    mine = slice(replica.rank * local_size, (replica.rank + 1) * local_size)
    for step in range(steps_per_epoch(len(data), config.batch_size)):
        index = order[step * config.batch_size : (step + 1) * config.batch_size]
        offsets = shift_offsets(len(index), config.max_shift_pixels, generator)
        images, labels = data.batch(index[mine])
        images = shift_images(images, None if offsets is None else offsets[mine], config.max_shift_pixels)
        yield step, images.contiguous(memory_format=torch.channels_last), labels


def train_supernet_epoch(
    supernet: Supernet,
    optimizer: torch.optim.Optimizer,
    x: np.ndarray | DeviceData,
    y: np.ndarray | None,
    config: TrainingConfig,
    seed: int,
    epoch: int,
    on_step: Callable[[int, int], None] | None = None,
    replica: Replica = ONE_WORKER,
    mixed_precision: bool = False,
    batchnorm_groups: int = 1,
) -> float:
    """One sandwich-rule epoch over normalised images (numpy `x`, `y` on the CPU, or a `DeviceData` and `y`
    None), the largest subnet alone during the `largest_only_epochs`; returns the largest subnet's mean loss
    over the global batches. The supernet must already be on the data's device.

    `batchnorm_groups` splits each batch into that many equal slices, each normalised by BatchNorm on its own
    ("ghost batches"), with one optimiser step over all of them: one process computing what that many workers
    with worker-local BatchNorm compute together."""
    space = supernet.space

    def students(rng: np.random.Generator) -> list[Arch]:
        if epoch < config.largest_only_epochs:
            return []
        return [space.min_arch()] + [space.sample_arch(rng) for _ in range(config.sandwich_random_subnets)]

    return _sandwich_epoch(supernet, optimizer, x, y, config, epoch_generators(seed, epoch), epoch,
                           space.max_arch(), students, on_step, replica, mixed_precision, batchnorm_groups)


def finetune_zoo_epoch(
    supernet: Supernet,
    optimizer: torch.optim.Optimizer,
    x: np.ndarray | DeviceData,
    y: np.ndarray | None,
    members: list[Arch],
    config: TrainingConfig,
    seed: int,
    epoch: int,
    on_step: Callable[[int, int], None] | None = None,
    mixed_precision: bool = False,
) -> float:
    """Epoch `epoch` (from 0) of the zoo's joint fine-tune: the sandwich rule over `members` only (smallest
    first; the last, the largest, learns from the labels, the first and `sandwich_random_subnets` others drawn
    from the rest are distilled from it), a cosine schedule from the base rate over `zoo_finetune_epochs`,
    draws of their own (after the supernet's epochs). Returns the largest member's mean loss."""
    if not members:
        raise InvalidInputError("the zoo's fine-tune needs at least one chosen subnet", field="members")
    middle = members[1:-1]

    def students(rng: np.random.Generator) -> list[Arch]:
        count = min(config.sandwich_random_subnets, len(middle))
        drawn = [middle[index] for index in sorted(rng.choice(len(middle), count, replace=False))] if count else []
        return members[:1] + drawn if len(members) > 1 else []

    schedule = replace(config, epochs=config.zoo_finetune_epochs)
    return _sandwich_epoch(supernet, optimizer, x, y, schedule, epoch_generators(seed, config.epochs + epoch), epoch,
                           members[-1], students, on_step, ONE_WORKER, mixed_precision, 1)


def _sandwich_epoch(
    supernet: Supernet,
    optimizer: torch.optim.Optimizer,
    x: np.ndarray | DeviceData,
    y: np.ndarray | None,
    config: TrainingConfig,
    generators: tuple[torch.Generator, np.random.Generator],
    epoch: int,
    teacher: Arch,
    students: Callable[[np.random.Generator], list[Arch]],
    on_step: Callable[[int, int], None] | None,
    replica: Replica,
    mixed_precision: bool,
    batchnorm_groups: int,
) -> float:
    """One epoch of sandwich steps: `teacher` on the labels, each of `students(rng)` (drawn anew every step)
    distilled from it, at the cosine rate of step `epoch * steps + step` of `config.epochs`."""
    data = x if isinstance(x, DeviceData) else DeviceData.place(x, y, torch.device("cpu"))
    torch_generator, numpy_generator = generators
    per_epoch = steps_per_epoch(len(data), config.batch_size)
    total_steps = config.epochs * per_epoch
    if replica.local_batch_size(config.batch_size) % batchnorm_groups:
        raise InvalidInputError(
            f"the batch size {config.batch_size} does not split into {batchnorm_groups} equal BatchNorm groups", field="batchnorm_groups"
        )
    supernet.train()
    loss_sum = torch.zeros((), device=data.device)  # summed on the device: no host sync per step
    for step, images, labels in _epoch_batches(data, config, torch_generator, replica):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(config, epoch * per_epoch + step, total_steps)
        optimizer.zero_grad(set_to_none=True)
        step_students = students(numpy_generator)
        for group_images, group_labels in zip(images.chunk(batchnorm_groups), labels.chunk(batchnorm_groups)):
            loss_sum += _sandwich_backward(supernet, group_images, group_labels, teacher, step_students, config,
                                           mixed_precision, 1 / batchnorm_groups)
        if replica.average_gradients is not None:
            replica.average_gradients(supernet)
        nn.utils.clip_grad_norm_(supernet.parameters(), 5.0)
        optimizer.step()
        if on_step is not None:
            on_step(step + 1, per_epoch)
    supernet.set_active(supernet.space.max_arch())
    if replica.sum_over_workers is not None:
        loss_sum = replica.sum_over_workers(loss_sum) / replica.world_size
        _average_batchnorm_statistics(supernet, replica)
    return float(loss_sum) / per_epoch


def _sandwich_backward(
    supernet: Supernet, images: torch.Tensor, labels: torch.Tensor, teacher: Arch, students: list[Arch],
    config: TrainingConfig, mixed_precision: bool, loss_scale: float,
) -> torch.Tensor:
    """Accumulate one sandwich step's gradients on one batch, times `loss_scale`: the teacher (the largest
    subnet) on the labels, then each student distilled from its logits (in-place distillation). Returns the
    teacher's scaled loss, detached."""
    supernet.set_active(teacher)
    with autocast(images.device, mixed_precision):
        teacher_logits = supernet(images)
        loss = F.cross_entropy(teacher_logits, labels) * loss_scale
    loss.backward()
    soft_targets = F.softmax(teacher_logits.detach().float() / config.distillation_temperature, dim=1)
    for arch in students:
        supernet.set_active(arch)
        with autocast(images.device, mixed_precision):
            student_logits = supernet(images)
        student_log_probs = F.log_softmax(student_logits.float() / config.distillation_temperature, dim=1)
        (F.kl_div(student_log_probs, soft_targets, reduction="batchmean") * loss_scale).backward()
    return loss.detach().float()


def _average_batchnorm_statistics(supernet: Supernet, replica: Replica) -> None:
    """With worker-local BatchNorm each worker's running statistics saw its own slices: average them, so every
    worker (and the checkpoint any of them writes) holds the same supernet. (Subnets are recalibrated on
    extraction anyway; this keeps the workers identical.)"""
    for module in supernet.modules():
        if isinstance(module, nn.BatchNorm2d):
            for statistic in (module.running_mean, module.running_var):
                statistic.copy_(replica.sum_over_workers(statistic) / replica.world_size)


def train_from_scratch(
    model: nn.Module, x: np.ndarray, y: np.ndarray, config: TrainingConfig, seed: int, device: torch.device = torch.device("cpu")
) -> nn.Module:
    """Train a standalone net on the labels with the same data order, augmentation and schedule as the supernet."""
    model = model.to(device, memory_format=torch.channels_last)
    data = DeviceData.place(x, y, device)
    optimizer = make_optimizer(model, config)
    per_epoch = steps_per_epoch(len(y), config.batch_size)
    total_steps = config.epochs * per_epoch
    model.train()
    for epoch in range(config.epochs):
        torch_generator, _ = epoch_generators(seed, epoch)
        for step, images, labels in _epoch_batches(data, config, torch_generator, ONE_WORKER):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate_at(config, epoch * per_epoch + step, total_steps)
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(images), labels).backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
    return model
