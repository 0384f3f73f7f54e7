"""Inference on the device: an onnxruntime session that checks its input against the model card and applies
the card's normalisation, so a wrong tensor fails with a message naming the problem, not a runtime crash.

Imports only numpy and onnxruntime (the card is read through its attributes, never imported here).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import onnxruntime as ort

from fedzoo.errors import InvalidInputError

if TYPE_CHECKING:
    from fedzoo.cards import ModelCard

GRAPH_OPTIMIZATION_LEVELS: dict[str, ort.GraphOptimizationLevel] = {
    "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
_ORT_ERRORS = ort.capi.onnxruntime_pybind11_state
_LOAD_ERRORS = (_ORT_ERRORS.Fail, _ORT_ERRORS.InvalidGraph, _ORT_ERRORS.InvalidProtobuf, _ORT_ERRORS.NoSuchFile,
                _ORT_ERRORS.InvalidArgument, _ORT_ERRORS.RuntimeException)
ONNX_DTYPES: dict[str, np.dtype] = {"tensor(float)": np.dtype(np.float32), "tensor(int64)": np.dtype(np.int64)}


def session_options(threads: int = 1, graph_optimization: str = "all") -> ort.SessionOptions:
    """Options for a CPU session: `threads` intra-op threads, one inter-op thread, the named optimisation level."""
    if not isinstance(threads, int) or threads < 1:
        raise InvalidInputError(f"threads must be a positive integer, got {threads!r}", field="threads")
    if graph_optimization not in GRAPH_OPTIMIZATION_LEVELS:
        raise InvalidInputError(
            f"unknown graph optimisation level {graph_optimization!r}; "
            f"choose one of {', '.join(GRAPH_OPTIMIZATION_LEVELS)}",
            field="graph_optimization",
        )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = GRAPH_OPTIMIZATION_LEVELS[graph_optimization]
    return options


def create_session(model: str | Path | bytes, threads: int = 1, graph_optimization: str = "all") -> ort.InferenceSession:
    """An onnxruntime CPU session for `model` (a path or ONNX bytes); a bad file is an InvalidInputError."""
    source = bytes(model) if isinstance(model, (bytes, bytearray)) else str(model)
    try:
        return ort.InferenceSession(
            source, session_options(threads, graph_optimization), providers=["CPUExecutionProvider"]
        )
    except _LOAD_ERRORS as error:
        raise InvalidInputError(f"onnxruntime cannot load the model: {error}", field="model") from None


class EdgeSession:
    """A model ready to run on this device: `run(x)` validates, normalises and returns the model's output."""

    def __init__(
        self,
        model: str | Path | bytes,
        card: ModelCard | None = None,
        threads: int = 1,
        graph_optimization: str = "all",
    ) -> None:
        self.session = create_session(model, threads, graph_optimization)
        self.threads = threads
        model_input = self.session.get_inputs()[0]
        self.input_name: str = model_input.name
        self.output_names = [output.name for output in self.session.get_outputs()]
        self.input_shape: list[int | str] = [dim if isinstance(dim, int) else str(dim) for dim in model_input.shape]
        self.input_dtype = ONNX_DTYPES.get(model_input.type, np.dtype(np.float32))
        self.mean: np.ndarray | None = None
        self.std: np.ndarray | None = None
        if card is not None:
            self._adopt_card(card)

    def _adopt_card(self, card: ModelCard) -> None:
        """Take the card's input spec (it must agree with the model) and its normalisation."""
        spec = card.input
        if spec.name != self.input_name:
            raise InvalidInputError(
                f"card input name {spec.name!r} does not match the model's input {self.input_name!r}",
                field="input.name",
            )
        if len(spec.shape) != len(self.input_shape):
            raise InvalidInputError(
                f"card input shape {spec.shape} has rank {len(spec.shape)} but the model's input "
                f"{self.input_shape} has rank {len(self.input_shape)}",
                field="input.shape",
            )
        self.input_shape = list(spec.shape)
        self.input_dtype = np.dtype(spec.dtype)
        if spec.normalisation is not None:
            channels = self.input_shape[1] if len(self.input_shape) > 1 else None
            mean, std = spec.normalisation.mean, spec.normalisation.std
            if isinstance(channels, int) and len(mean) not in (1, channels):
                raise InvalidInputError(
                    f"card normalisation has {len(mean)} means for {channels} input channels",
                    field="input.normalisation",
                )
            broadcast = (1, -1) + (1,) * max(len(self.input_shape) - 2, 0)
            self.mean = np.asarray(mean, np.float32).reshape(broadcast)
            self.std = np.asarray(std, np.float32).reshape(broadcast)

    def validate(self, x: object) -> np.ndarray:
        """`x` as an array if it fits the input spec; otherwise an InvalidInputError naming what is wrong."""
        if not isinstance(x, np.ndarray):
            raise InvalidInputError(
                f"input must be a numpy array, got {type(x).__name__}", field=self.input_name
            )
        if x.dtype != self.input_dtype:
            raise InvalidInputError(
                f"input dtype is {x.dtype}, expected {self.input_dtype} (convert with x.astype(np.{self.input_dtype}))",
                field=self.input_name,
            )
        if x.ndim != len(self.input_shape):
            raise InvalidInputError(
                f"input has shape {list(x.shape)} (rank {x.ndim}), expected rank {len(self.input_shape)} "
                f"shape {self.input_shape}",
                field=self.input_name,
            )
        for axis, (actual, expected) in enumerate(zip(x.shape, self.input_shape)):
            if actual == 0 or (isinstance(expected, int) and actual != expected):
                raise InvalidInputError(
                    f"input has shape {list(x.shape)}, expected {self.input_shape}: dimension {axis} is "
                    f"{actual}, expected {expected if isinstance(expected, int) else 'at least 1'}",
                    field=self.input_name,
                )
        if x.dtype.kind == "f" and not np.isfinite(x).all():
            bad = int(np.size(x) - np.count_nonzero(np.isfinite(x)))
            raise InvalidInputError(f"input has {bad} NaN or infinite values", field=self.input_name)
        return x

    def preprocess(self, x: np.ndarray) -> np.ndarray:
        """Apply the card's `(x - mean) / std`, if it has one."""
        if self.mean is None or self.std is None:
            return x
        return ((x - self.mean) / self.std).astype(self.input_dtype, copy=False)

    def run(self, x: object, normalise: bool = True) -> np.ndarray:
        """The model's first output for a validated (and, by default, normalised) batch `x`."""
        batch = self.validate(x)
        feed = self.preprocess(batch) if normalise else batch
        return self.session.run(self.output_names[:1], {self.input_name: np.ascontiguousarray(feed)})[0]

    def predict(self, x: object, labels: Sequence[str] | None = None) -> list:
        """Arg-max class per example: indices, or the labels given."""
        indices = np.argmax(self.run(x), axis=-1).tolist()
        return [labels[index] for index in indices] if labels is not None else indices
