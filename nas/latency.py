"""Latency estimates the search ranks subnets by: measured ONNX Runtime latency on this machine (the
default), or a deterministic MACs model when run-to-run timing noise must not change the result."""

from __future__ import annotations

import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Literal

from torch import nn

from fedzoo.errors import InvalidInputError
from fedzoo.nas.subnet import count_macs

THIS_MACHINE_DEVICE_CLASS = "cloud-x86-1t"


class LatencyEstimator(ABC):
    """How long one batch-1 inference of a subnet takes on one device class."""

    device_class: str
    source: Literal["measured", "predicted"]

    @abstractmethod
    def latency_ms(self, model: nn.Module, input_shape: tuple[int, ...]) -> float:
        """Median batch-1 latency in milliseconds of `model` fed tensors of `input_shape`."""


class MeasuredOnnxLatency(LatencyEstimator):
    """Export to ONNX and time it with ONNX Runtime on this machine at one thread.

    The estimate is the lowest of `repeats` medians: other processes only ever add time, so on a shared
    machine the minimum is the steadier figure to rank candidates by.
    """

    source: Literal["measured", "predicted"] = "measured"

    def __init__(
        self, device_class: str = THIS_MACHINE_DEVICE_CLASS, warmup_runs: int = 5, timed_runs: int = 20, repeats: int = 3
    ) -> None:
        self.device_class, self.warmup_runs, self.timed_runs, self.repeats = device_class, warmup_runs, timed_runs, repeats

    def latency_ms(self, model: nn.Module, input_shape: tuple[int, ...]) -> float:
        from fedzoo.compress.export import export_onnx
        from fedzoo.edge.benchmark import benchmark_model

        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "candidate.onnx"
            export_onnx(model, input_shape, path)
            medians = [
                benchmark_model(path, threads=1, warmup_runs=self.warmup_runs, timed_runs=self.timed_runs).median_ms
                for _ in range(self.repeats)
            ]
        return min(medians)


class KernelPredictedLatency(LatencyEstimator):
    """Export to ONNX and ask the kernel-level predictor of `fedzoo.edge.latency_predictor` (fitted on this
    machine's reference measurements): no timing noise, and no benchmark runs per candidate."""

    source: Literal["measured", "predicted"] = "predicted"

    def __init__(self, device_class: str = THIS_MACHINE_DEVICE_CLASS) -> None:
        self.device_class = device_class
        try:
            from fedzoo.edge.latency_predictor import KernelLatencyPredictor

            self.predictor = KernelLatencyPredictor.load()
        except (ImportError, OSError) as error:
            raise InvalidInputError(
                f"latency source 'predicted' needs the reference model of fedzoo.edge.latency_predictor, "
                f"which is not available here ({error}); use 'measured'",
                field="latency_source",
            ) from None

    def latency_ms(self, model: nn.Module, input_shape: tuple[int, ...]) -> float:
        from fedzoo.compress.export import export_onnx

        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "candidate.onnx"
            export_onnx(model, input_shape, path)
            return float(self.predictor.predict_ms(path))


class MacsLatencyModel(LatencyEstimator):
    """latency = overhead + MACs x time per MAC: deterministic, so searches with it repeat exactly."""

    source: Literal["measured", "predicted"] = "predicted"

    def __init__(self, overhead_ms: float = 0.05, ms_per_million_macs: float = 0.05, device_class: str = THIS_MACHINE_DEVICE_CLASS) -> None:
        self.overhead_ms, self.ms_per_million_macs, self.device_class = overhead_ms, ms_per_million_macs, device_class

    def latency_ms(self, model: nn.Module, input_shape: tuple[int, ...]) -> float:
        return self.overhead_ms + self.ms_per_million_macs * count_macs(model, input_shape) / 1e6


LATENCY_ESTIMATORS: dict[str, type[LatencyEstimator]] = {
    "measured": MeasuredOnnxLatency,
    "predicted": KernelPredictedLatency,
    "macs": MacsLatencyModel,
}


def make_latency_estimator(name: str) -> LatencyEstimator:
    """The estimator registered under `name` (see LATENCY_ESTIMATORS)."""
    if name not in LATENCY_ESTIMATORS:
        raise InvalidInputError(f"unknown latency source {name!r}; use one of {sorted(LATENCY_ESTIMATORS)}", field="latency_source")
    return LATENCY_ESTIMATORS[name]()
