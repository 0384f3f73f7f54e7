"""Latency estimates the search ranks subnets by: measured ONNX Runtime latency on this machine, the
kernel-level latency predictor (deterministic, and cheap per candidate), or a MACs model. Which one a build
uses is its preset's choice; zoo cards always carry measured latency."""

from __future__ import annotations

import json
import re
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Literal

import numpy as np
from torch import nn

from fedzoo.errors import InvalidInputError
from fedzoo.nas.subnet import Subnet, count_macs

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
        from fedzoo.edge.benchmark import benchmark_model

        with tempfile.TemporaryDirectory() as folder:
            path = _exported(model, input_shape, folder)
            medians = [
                benchmark_model(path, threads=1, warmup_runs=self.warmup_runs, timed_runs=self.timed_runs).median_ms
                for _ in range(self.repeats)
            ]
        return min(medians)


class KernelPredictedLatency(LatencyEstimator):
    """The kernel-level predictor of `fedzoo.edge.latency_predictor` (fitted on this machine's reference
    measurements): no timing noise, so the same seed gives the same search, and no benchmark runs.

    The predictor sums costs over a model's fused kernels, and a subnet's kernels are those of its fixed
    parts (stem, head, classifier) plus each block's own, which depend only on the block's layers and input
    resolution (`subnet_part_keys`). So the kernel features of each part are kept in a table, filled from the
    exported ONNX of the first subnet that has it; later subnets made of known parts are estimated without an
    export (under 1 ms of CPU instead of ~200 ms), and get the estimate the predictor gives on their exported ONNX.
    """

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
        self.part_features: dict[str, dict[str, np.ndarray]] = {}  # part key -> its kernel features
        self.exports = 0  # subnets exported to fill the table (the rest were estimated from it)

    def latency_ms(self, model: nn.Module, input_shape: tuple[int, ...]) -> float:
        if not isinstance(model, Subnet):  # no parts to tabulate: predict on its export
            with tempfile.TemporaryDirectory() as folder:
                return float(self.predictor.predict_ms(_exported(model, input_shape, folder)))
        keys = subnet_part_keys(model, input_shape)
        if any(key not in self.part_features for key in keys):
            self._add_parts(model, input_shape, keys)
        total: dict[str, np.ndarray] = {}
        for key in keys:
            for kernel_key, values in self.part_features[key].items():
                total[kernel_key] = total.get(kernel_key, 0.0) + values
        return self.predictor.predict_from_features(total)

    def _add_parts(self, model: Subnet, input_shape: tuple[int, ...], keys: list[str]) -> None:
        """Export `model` and enter each part's kernels: a kernel belongs to block i when its first ONNX node
        was exported from `blocks.i` (torch names nodes by module path), else to the fixed parts."""
        from fedzoo.edge.kernels import split_kernels
        from fedzoo.edge.latency_predictor import features_of_kernels

        with tempfile.TemporaryDirectory() as folder:
            kernels = split_kernels(_exported(model, input_shape, folder), self.predictor.all_plain_layout)
        self.exports += 1
        parts: list[list] = [[] for _ in keys]
        for kernel in kernels:
            block = _BLOCK_NODE.search(kernel.name)
            parts[int(block.group(1)) + 1 if block else 0].append(kernel)
        for key, part in zip(keys, parts):
            self.part_features[key] = features_of_kernels(part)


_BLOCK_NODE = re.compile(r"/blocks/blocks\.(\d+)/")


def subnet_part_keys(model: Subnet, input_shape: tuple[int, ...]) -> list[str]:
    """Keys of a subnet's parts, its fixed parts first, then each block in order. A key spells out what the
    part's kernels depend on: its layers (conv weight shapes, strides, groups, activations), its input
    resolution and whether it adds a residual; read off the modules, so a pruned subnet keys as it is."""
    resolution = int(input_shape[-1])

    def describe(module: nn.Module) -> list:
        nonlocal resolution
        layers: list = [resolution]
        for layer in module.modules():
            if isinstance(layer, nn.Conv2d):
                layers.append([list(layer.weight.shape), list(layer.stride), layer.groups])
                resolution = -(-resolution // layer.stride[0])  # padding kernel // 2: ceil(resolution / stride)
            elif isinstance(layer, nn.Linear):
                layers.append(list(layer.weight.shape))
            elif not list(layer.children()):
                layers.append(type(layer).__name__)
        return layers

    stem = describe(model.stem)
    blocks = [describe(block) + [block.use_residual] for block in model.blocks]
    fixed = json.dumps([list(input_shape[1:]), stem, describe(model.head), describe(model.classifier)])
    return [fixed] + [f"{fixed} {json.dumps(block)}" for block in blocks]


def _exported(model: nn.Module, input_shape: tuple[int, ...], folder: str) -> Path:
    from fedzoo.nas.export import export_onnx

    path = Path(folder) / "candidate.onnx"
    export_onnx(model, input_shape, path)
    return path


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
