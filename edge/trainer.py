"""On-device training with the stock onnxruntime: run the cloud-built training graph, step in numpy.

The training graph (see `fedzoo.graphs.autodiff`, docs/training-graphs.md) takes `x`, `y` and the
trainable parameters as inputs and returns `loss` and `grad.<name>`; the parameters live here as numpy
arrays, the optimizer updates them between runs. A graph built with `batch_norm="training"` also takes
BatchNorm running statistics as inputs and returns their updated values as `running.<name>`: they live
here too (`statistics`), replaced by the outputs after every step, never touched by the optimizer. Parameters travel as `.npz` keyed by initializer name, and are written
back into the inference model by rewriting its initializers at the protobuf level
(`fedzoo.edge.onnx_initializers`), so a device needs onnxruntime and numpy only: no torch, no onnx.
Inputs are fed as the model expects them (already normalised with the card's statistics).
"""

from __future__ import annotations

import io
import os
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import (
    Fail,
    InvalidArgument,
    InvalidGraph,
    InvalidProtobuf,
    RuntimeException,
)

from fedzoo.edge.onnx_initializers import read_float_initializers, replace_initializers
from fedzoo.edge.optimizers import Optimizer
from fedzoo.errors import InvalidInputError

INPUT_NAME, TARGET_NAME, LOSS_NAME, GRADIENT_PREFIX, RUNNING_PREFIX = "x", "y", "loss", "grad.", "running."
_TARGET_DTYPES = {"tensor(int64)": np.int64, "tensor(float)": np.float32}
_ORT_LOAD_ERRORS = (Fail, InvalidArgument, InvalidGraph, InvalidProtobuf)
_ORT_RUN_ERRORS = (Fail, InvalidArgument, RuntimeException)


def _model_bytes(model: str | Path | bytes) -> bytes:
    return model if isinstance(model, bytes) else Path(model).read_bytes()


class Trainer:
    """Fine-tunes the trainable parameters of one training graph with one optimizer.

    `parameters` holds a value for every trainable parameter and running statistic of the graph (extra
    entries are ignored); `threads` is onnxruntime's intra-op thread count.
    """

    def __init__(
        self,
        training_graph: str | Path | bytes,
        parameters: Mapping[str, np.ndarray],
        optimizer: Optimizer,
        threads: int = 1,
        memory_arena: bool = True,
    ) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # The arena keeps the activations' memory from step to step; without it, malloc hands much of it back
        # and the next step page-faults it in again (6-7k faults per step of bench/train_benchmark.py's subnet).
        # A memory pattern would size the arena for a whole run at once. Measured over 20 steps, 1 thread:
        # arena without pattern 61 ms/step, 108 MB peak RSS; no arena 81-87 ms, 120 MB; arena with pattern
        # 55-68 ms, 146 MB. `memory_arena=False` gives part of it back between steps, for those page faults.
        options.enable_cpu_mem_arena = memory_arena
        options.enable_mem_pattern = False
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            self._session = ort.InferenceSession(
                _model_bytes(training_graph), options, providers=["CPUExecutionProvider"]
            )
        except _ORT_LOAD_ERRORS as error:
            raise InvalidInputError(f"onnxruntime cannot load the training graph: {error}") from None
        inputs = {spec.name: spec for spec in self._session.get_inputs()}
        if INPUT_NAME not in inputs or TARGET_NAME not in inputs:
            raise InvalidInputError(f"not a training graph: inputs {sorted(inputs)} lack {INPUT_NAME!r}/{TARGET_NAME!r}")
        self._target_dtype = _TARGET_DTYPES.get(inputs[TARGET_NAME].type)
        if self._target_dtype is None:
            raise InvalidInputError(f"training graph target {TARGET_NAME!r} has unsupported type {inputs[TARGET_NAME].type}")
        outputs = {spec.name for spec in self._session.get_outputs()}
        state_names = [name for name in inputs if name not in (INPUT_NAME, TARGET_NAME)]
        self.statistic_names = [name for name in state_names if RUNNING_PREFIX + name in outputs]
        self.parameter_names = [name for name in state_names if name not in self.statistic_names]
        missing = [name for name in state_names if name not in parameters]
        if missing:
            raise InvalidInputError(f"no value given for trainable parameters {missing}", field=missing[0])
        for name in state_names:
            expected, given = tuple(inputs[name].shape), np.shape(parameters[name])
            if given != expected:
                raise InvalidInputError(f"parameter {name!r} has shape {given}, the graph expects {expected}", field=name)
        self.parameters = {name: np.array(parameters[name], dtype=np.float32) for name in self.parameter_names}
        self.statistics = {name: np.array(parameters[name], dtype=np.float32) for name in self.statistic_names}
        self._output_names = [
            LOSS_NAME, *(GRADIENT_PREFIX + name for name in self.parameter_names),
            *(RUNNING_PREFIX + name for name in self.statistic_names),
        ]  # fmt: skip
        self.optimizer = optimizer

    @classmethod
    def from_inference_model(
        cls,
        training_graph: str | Path | bytes,
        inference_model: str | Path | bytes,
        optimizer: Optimizer,
        threads: int = 1,
        memory_arena: bool = True,
    ) -> Trainer:
        """A trainer starting from the parameters stored in the inference model the graph was built from."""
        parameters = read_float_initializers(_model_bytes(inference_model))
        return cls(training_graph, parameters, optimizer, threads, memory_arena)

    def _feeds(self, features: np.ndarray, targets: np.ndarray) -> dict[str, np.ndarray]:
        features = np.ascontiguousarray(features, dtype=np.float32)
        targets = np.ascontiguousarray(targets, dtype=self._target_dtype)
        if len(features) != len(targets) or len(features) == 0:
            raise InvalidInputError(f"need as many targets as inputs (>0), got {len(features)} and {len(targets)}")
        return {INPUT_NAME: features, TARGET_NAME: targets, **self.parameters, **self.statistics}

    def run_batch(self, features: np.ndarray, targets: np.ndarray) -> tuple[float, dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The batch loss, every parameter's gradient and the updated running statistics, changing nothing."""
        try:
            loss, *values = self._session.run(self._output_names, self._feeds(features, targets))
        except _ORT_RUN_ERRORS as error:  # e.g. a label outside [0, classes) or images of the wrong shape
            raise InvalidInputError(f"onnxruntime rejected the training batch: {error}") from None
        count = len(self.parameter_names)
        return float(loss), dict(zip(self.parameter_names, values[:count])), dict(zip(self.statistic_names, values[count:]))

    def loss_and_gradients(self, features: np.ndarray, targets: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        """The batch loss and the gradient of every trainable parameter, without changing anything."""
        loss, gradients, _ = self.run_batch(features, targets)
        return loss, gradients

    def apply(self, gradients: Mapping[str, np.ndarray], statistics: Mapping[str, np.ndarray]) -> None:
        """One optimizer step with these gradients, and the running statistics of the same batch adopted."""
        self.optimizer.step(self.parameters, gradients)
        self.statistics.update(statistics)

    def step(self, features: np.ndarray, targets: np.ndarray) -> float:
        """One optimizer step on one batch (and the running statistics' update); returns the batch loss before it."""
        loss, gradients, statistics = self.run_batch(features, targets)
        self.apply(gradients, statistics)
        return loss

    def train_epoch(self, features: np.ndarray, targets: np.ndarray, batch_size: int, seed: int = 0) -> float:
        """One pass over the data in shuffled batches; returns the example-weighted mean loss."""
        if batch_size < 1:
            raise InvalidInputError(f"batch_size must be >= 1, got {batch_size}", field="batch_size")
        order = np.random.default_rng(seed).permutation(len(features))
        total = 0.0
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            total += self.step(features[batch], targets[batch]) * len(batch)
        return total / len(order)

    def fit(self, features: np.ndarray, targets: np.ndarray, epochs: int, batch_size: int, seed: int = 0) -> list[float]:
        """Train for `epochs` epochs (a different shuffle each); returns each epoch's mean loss."""
        return [self.train_epoch(features, targets, batch_size, seed + epoch) for epoch in range(epochs)]


# parameters on disk and in the inference model -------------------------------------------------


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    # Like fedzoo.zoo.atomic_write_bytes, kept here so the device side does not import pydantic.
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def save_parameters(path: str | Path, parameters: Mapping[str, np.ndarray]) -> None:
    """Write parameters as an uncompressed `.npz` keyed by initializer name (atomically)."""
    path = Path(path)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, array in parameters.items():
            with archive.open(f"{name}.npy", "w") as member:
                np.lib.format.write_array(member, np.asarray(array), allow_pickle=False)
    _atomic_write_bytes(path, buffer.getvalue())


def load_parameters(path: str | Path) -> dict[str, np.ndarray]:
    """Parameters from a `.npz` written by `save_parameters` (or `numpy.savez`)."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise InvalidInputError(f"{path} is not a parameter .npz file: {error}") from None


def write_parameters(
    inference_model: str | Path | bytes, parameters: Mapping[str, np.ndarray], output_path: str | Path | None = None
) -> bytes:
    """The inference model with its initializers replaced by `parameters`; also written to `output_path` if given."""
    updated = replace_initializers(_model_bytes(inference_model), parameters)
    if output_path is not None:
        _atomic_write_bytes(Path(output_path), updated)
    return updated


def training_graph_state(training_graph: bytes) -> tuple[list[str], list[str]]:
    """The training graph's trainable parameters and running statistics, in input order (docs/training-graphs.md):
    every input but `x` and `y`; a statistic is an input with a `running.<name>` output."""
    import onnx

    graph = onnx.load_model_from_string(training_graph).graph
    outputs = {value.name for value in graph.output}
    state = [value.name for value in graph.input if value.name not in (INPUT_NAME, TARGET_NAME)]
    statistics = [name for name in state if RUNNING_PREFIX + name in outputs]
    return [name for name in state if name not in statistics], statistics


def variance_names(onnx_bytes: bytes) -> set[str]:
    """The initializers that are a BatchNormalization's running variance (its fifth input)."""
    import onnx

    graph = onnx.load_model_from_string(onnx_bytes).graph
    return {node.input[4] for node in graph.node if node.op_type == "BatchNormalization" and len(node.input) > 4}
