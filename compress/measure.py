"""What a variant is worth: test-split accuracy and loss under ONNX Runtime, batch-1 latency, file size.

Every number the gate compares is measured here, parent and variant alike, in the same run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from fedzoo.cards import Normalisation
from fedzoo.edge.benchmark import LatencyMeasurement, benchmark_model, benchmark_models_interleaved

DEVICE_CLASS = "cloud-x86-1t"
_EVALUATION_BATCH = 256
_ROUNDS = 5  # side-by-side latency: this many interleaved rounds


@dataclass(frozen=True)
class Measurement:
    accuracy: float  # fraction in [0, 1]
    loss: float
    num_examples: int
    latency_median_ms: float
    latency_p90_ms: float
    size_bytes: int


def normalise(images: np.ndarray, normalisation: Normalisation | None) -> np.ndarray:
    """Apply a card's per-channel `(x - mean) / std` to images in [0, 1]."""
    if normalisation is None:
        return images.astype(np.float32)
    mean = np.asarray(normalisation.mean, dtype=np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(normalisation.std, dtype=np.float32).reshape(1, -1, 1, 1)
    return ((images - mean) / std).astype(np.float32)


def evaluate_onnx(path: str | Path, images: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Accuracy (fraction) and mean cross-entropy of the ONNX classifier on already-normalised images."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    correct, loss_sum = 0, 0.0
    for start in range(0, len(images), _EVALUATION_BATCH):
        logits = session.run(None, {input_name: images[start : start + _EVALUATION_BATCH]})[0].astype(np.float64)
        batch_labels = labels[start : start + _EVALUATION_BATCH]
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        loss_sum += float(-log_probabilities[np.arange(len(batch_labels)), batch_labels].sum())
        correct += int((logits.argmax(axis=1) == batch_labels).sum())
    return correct / len(labels), loss_sum / len(labels)


def _measurement(path: str | Path, images: np.ndarray, labels: np.ndarray, latency: LatencyMeasurement) -> Measurement:
    """A model's accuracy and size on top of its already-taken `latency`."""
    accuracy, loss = evaluate_onnx(path, images, labels)
    return Measurement(
        accuracy=accuracy,
        loss=loss,
        num_examples=len(labels),
        latency_median_ms=latency.median_ms,
        latency_p90_ms=latency.p90_ms,
        size_bytes=Path(path).stat().st_size,
    )


def measure(path: str | Path, images: np.ndarray, labels: np.ndarray, timed_runs: int = 50) -> Measurement:
    """Accuracy on (normalised) `images`, batch-1 single-thread ORT latency and size of the file at `path`."""
    return _measurement(path, images, labels, benchmark_model(path, threads=1, timed_runs=timed_runs))


def measure_side_by_side(
    paths: dict[str, Path], images: np.ndarray, labels: np.ndarray, timed_runs: int = 50
) -> dict[str, Measurement]:
    """`measure` for several models, their latency taken in interleaved rounds so that a busy spell of a
    shared CPU hits them all alike: the figures are fit for ratios between them."""
    latency = benchmark_models_interleaved(paths, threads=1, rounds=_ROUNDS, runs_per_round=max(1, timed_runs // _ROUNDS))
    return {name: _measurement(path, images, labels, latency[name]) for name, path in paths.items()}
