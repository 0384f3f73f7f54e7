"""Short fine-tuning that lets a pruned network recover, optionally distilling from its unpruned parent
(Hinton et al. 2015: match the parent's softened logits as well as the labels)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class FineTuning:
    epochs: int = 8  # 4 left the smallest MNIST model 1.3 points down at 30% pruning; 8 recovered it to 0.5
    learning_rate: float = 3e-3
    batch_size: int = 64
    distillation_weight: float = 0.5  # share of the loss from the teacher; 0 = labels only
    temperature: float = 4.0
    seed: int = 0


def fine_tune(
    model: nn.Module, images: np.ndarray, labels: np.ndarray, config: FineTuning = FineTuning(),
    teacher: nn.Module | None = None,
) -> nn.Module:
    """Train `model` in place on normalised `images` with Adam and a cosine schedule; return it in eval mode."""
    generator = torch.Generator().manual_seed(config.seed)
    x = torch.from_numpy(images.astype(np.float32))
    y = torch.from_numpy(labels.astype(np.int64))
    teacher = copy.deepcopy(teacher).eval() if teacher is not None and config.distillation_weight > 0 else None
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate)
    steps = config.epochs * ((len(x) + config.batch_size - 1) // config.batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(1, steps))
    model.train()
    for _epoch in range(config.epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), config.batch_size):
            batch = order[start : start + config.batch_size]
            logits = model(x[batch])
            loss = F.cross_entropy(logits, y[batch])
            if teacher is not None:
                with torch.no_grad():
                    soft_targets = F.softmax(teacher(x[batch]) / config.temperature, dim=1)
                distillation = F.kl_div(F.log_softmax(logits / config.temperature, dim=1), soft_targets, reduction="batchmean")
                loss = (1 - config.distillation_weight) * loss + config.distillation_weight * config.temperature**2 * distillation
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    return model.eval()
