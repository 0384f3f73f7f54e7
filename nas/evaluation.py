"""Scoring one candidate subnet: extract it from the supernet, recalibrate its BN statistics, measure
validation accuracy and loss, MACs, params and latency. A plain function of (context, arch) so any executor
(in-process or Ray) can run it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from fedzoo.nas.latency import LatencyEstimator
from fedzoo.nas.space import Arch
from fedzoo.nas.subnet import count_macs, count_params, evaluate_accuracy, recalibrate_batchnorm
from fedzoo.nas.supernet import Supernet, extract_subnet


@dataclass
class EvaluationContext:
    """What every candidate evaluation shares: the trained supernet and the (normalised) data it needs."""

    supernet: Supernet
    calibration_x: np.ndarray
    validation_x: np.ndarray
    validation_y: np.ndarray
    latency_estimator: LatencyEstimator
    device: str = "cpu"  # where subnets are calibrated and scored (latency is always measured on the CPU)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (1, *self.validation_x.shape[1:])


@dataclass
class Candidate:
    """One evaluated subnet; `accuracy` and `loss` are on the validation split (the test split is kept for the cards)."""

    arch: Arch
    accuracy: float
    loss: float
    latency_ms: float
    macs: int
    params: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        return cls(**data)

    @property
    def point(self) -> tuple[float, float]:
        """The search's two objectives, (higher is better, lower is better): minus the validation
        cross-entropy, and latency. Cross-entropy rather than accuracy because accuracy on a few hundred
        images moves in steps of a whole image and its noise hides the differences between subnets: a
        front on it stops at the first small subnet that happens to score high."""
        return (-self.loss, self.latency_ms)


def prepare_subnet(
    supernet: Supernet, arch: Arch, calibration_x: np.ndarray, device: torch.device = torch.device("cpu")
) -> torch.nn.Module:
    """The standalone subnet for `arch` on `device` with BN statistics of its own (channels-last for fast CPU
    runs; `.cpu().to(memory_format=torch.contiguous_format)` before saving or exporting it). The supernet
    stays where it is: the subnet is extracted there and moved."""
    subnet = extract_subnet(supernet, arch).to(device, memory_format=torch.channels_last)
    recalibrate_batchnorm(subnet, calibration_x)
    return subnet.eval()


def evaluate_candidate(context: EvaluationContext, arch: Arch) -> Candidate:
    """Validation accuracy, MACs, params and latency of one subnet."""
    torch.set_num_threads(1)
    subnet = prepare_subnet(context.supernet, arch, context.calibration_x, torch.device(context.device))
    accuracy, loss = evaluate_accuracy(subnet, context.validation_x, context.validation_y)
    subnet = subnet.cpu().to(memory_format=torch.contiguous_format)
    return Candidate(
        arch=arch,
        accuracy=accuracy,
        loss=loss,
        latency_ms=context.latency_estimator.latency_ms(subnet, context.input_shape),
        macs=count_macs(subnet, context.input_shape),
        params=count_params(subnet),
    )
