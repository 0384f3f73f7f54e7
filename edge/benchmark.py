"""Latency of an ONNX model on this device, measured like a profiler: warm-up runs, then repeated
timed batch-1 runs, reporting the median and p90 and the thread count used."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort


@dataclass(frozen=True)
class LatencyMeasurement:
    median_ms: float
    p90_ms: float
    runs: int
    threads: int


def benchmark_model(
    model: str | Path | bytes, threads: int = 1, warmup_runs: int = 10, timed_runs: int = 50
) -> LatencyMeasurement:
    """Median and p90 batch-1 latency of `model` (a path or ONNX bytes) on onnxruntime's CPU provider."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    source = model if isinstance(model, bytes) else str(model)
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    feeds = {}
    for spec in session.get_inputs():
        shape = [1 if not isinstance(dim, int) else dim for dim in spec.shape]
        feeds[spec.name] = np.random.default_rng(0).random(shape, dtype=np.float32)
    for _ in range(warmup_runs):
        session.run(None, feeds)
    timings = np.empty(timed_runs)
    for index in range(timed_runs):
        start = time.perf_counter()
        session.run(None, feeds)
        timings[index] = (time.perf_counter() - start) * 1000.0
    return LatencyMeasurement(
        median_ms=float(np.median(timings)), p90_ms=float(np.percentile(timings, 90)), runs=timed_runs, threads=threads
    )
