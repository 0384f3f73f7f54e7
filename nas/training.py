"""Training: the supernet with the sandwich rule and in-place distillation, and single nets from scratch.

Sandwich rule (Yu & Huang, "Universally Slimmable Networks", 2019; BigNAS 2020): every step trains the
largest subnet on the labels, then the smallest and a few random subnets on the largest one's soft
predictions (in-place distillation), accumulating all gradients into one optimiser step. As in
Once-for-All's progressive shrinking, the first `largest_only_epochs` may train the largest subnet alone:
its soft predictions are worth distilling only once it has learnt something, and those epochs cost about
half a sandwich epoch.

Every epoch draws its shuffling, augmentation and subnet samples from generators seeded by
(seed, epoch), so a run resumed from an epoch checkpoint repeats the uninterrupted run exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

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


def epoch_generators(seed: int, epoch: int) -> tuple[torch.Generator, np.random.Generator]:
    """The torch and numpy generators one epoch draws from; the same (seed, epoch) gives the same draws."""
    torch_generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch_generator, np.random.default_rng([seed, epoch])


def random_shift(images: torch.Tensor, max_shift_pixels: int, generator: torch.Generator) -> torch.Tensor:
    """Translate each image by up to `max_shift_pixels` in x and y (zero padding): cheap augmentation for digits."""
    if max_shift_pixels == 0:
        return images
    pad = max_shift_pixels
    padded = F.pad(images, (pad, pad, pad, pad))
    height, width = images.shape[-2:]
    offsets = torch.randint(0, 2 * pad + 1, (images.shape[0], 2), generator=generator)
    return torch.stack(
        [padded[i, :, dy : dy + height, dx : dx + width] for i, (dy, dx) in enumerate(offsets.tolist())]
    )


def make_optimizer(model: nn.Module, config: TrainingConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        model.parameters(), lr=config.learning_rate, momentum=config.momentum, weight_decay=config.weight_decay, nesterov=True
    )


def learning_rate_at(config: TrainingConfig, step: int, total_steps: int) -> float:
    """Cosine decay from the base rate to zero over the whole run."""
    return 0.5 * config.learning_rate * (1.0 + np.cos(np.pi * step / max(total_steps, 1)))


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
    return max(1, num_examples // batch_size)


def _epoch_batches(x: np.ndarray, y: np.ndarray, config: TrainingConfig, generator: torch.Generator):
    order = torch.randperm(len(y), generator=generator)
    for step in range(steps_per_epoch(len(y), config.batch_size)):
        index = order[step * config.batch_size : (step + 1) * config.batch_size]
        images = random_shift(torch.from_numpy(x[index.numpy()]), config.max_shift_pixels, generator)
        yield step, images.contiguous(memory_format=torch.channels_last), torch.from_numpy(y[index.numpy()])


def train_supernet_epoch(
    supernet: Supernet,
    optimizer: torch.optim.Optimizer,
    x: np.ndarray,
    y: np.ndarray,
    config: TrainingConfig,
    seed: int,
    epoch: int,
    on_step: Callable[[int, int], None] | None = None,
) -> float:
    """One sandwich-rule epoch over normalised images `x` (the largest subnet alone during the
    `largest_only_epochs`); returns the largest subnet's mean loss."""
    torch_generator, numpy_generator = epoch_generators(seed, epoch)
    space = supernet.space
    per_epoch = steps_per_epoch(len(y), config.batch_size)
    total_steps = config.epochs * per_epoch
    supernet.train()
    loss_sum = 0.0
    for step, images, labels in _epoch_batches(x, y, config, torch_generator):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(config, epoch * per_epoch + step, total_steps)
        optimizer.zero_grad(set_to_none=True)
        supernet.set_active(space.max_arch())
        teacher_logits = supernet(images)
        loss = F.cross_entropy(teacher_logits, labels)
        loss.backward()
        loss_sum += float(loss.detach())
        if epoch < config.largest_only_epochs:
            students = []
        else:
            students = [space.min_arch()] + [space.sample_arch(numpy_generator) for _ in range(config.sandwich_random_subnets)]
        soft_targets = F.softmax(teacher_logits.detach() / config.distillation_temperature, dim=1)
        for arch in students:
            supernet.set_active(arch)
            student_log_probs = F.log_softmax(supernet(images) / config.distillation_temperature, dim=1)
            F.kl_div(student_log_probs, soft_targets, reduction="batchmean").backward()
        nn.utils.clip_grad_norm_(supernet.parameters(), 5.0)
        optimizer.step()
        if on_step is not None:
            on_step(step + 1, per_epoch)
    supernet.set_active(space.max_arch())
    return loss_sum / per_epoch


def train_from_scratch(
    model: nn.Module, x: np.ndarray, y: np.ndarray, config: TrainingConfig, seed: int
) -> nn.Module:
    """Train a standalone net on the labels with the same data order, augmentation and schedule as the supernet."""
    model = model.to(memory_format=torch.channels_last)
    optimizer = make_optimizer(model, config)
    per_epoch = steps_per_epoch(len(y), config.batch_size)
    total_steps = config.epochs * per_epoch
    model.train()
    for epoch in range(config.epochs):
        torch_generator, _ = epoch_generators(seed, epoch)
        for step, images, labels in _epoch_batches(x, y, config, torch_generator):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate_at(config, epoch * per_epoch + step, total_steps)
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(images), labels).backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
    return model
