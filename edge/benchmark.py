"""Latency of an ONNX model on this device, measured like a profiler: a session with recorded options,
warm-up runs, then repeated timed batch-1 runs, reporting the median and p90 (robust to the odd slow run
on a shared CPU) plus the spread, and the thread count used."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from fedzoo.edge.runtime import ONNX_DTYPES, create_session
from fedzoo.errors import InvalidInputError


@dataclass(frozen=True)
class LatencyMeasurement:
    median_ms: float
    p90_ms: float
    runs: int
    threads: int
    mean_ms: float = 0.0
    min_ms: float = 0.0
    max_ms: float = 0.0
    warmup_runs: int = 0
    graph_optimization: str = "all"
    input_shape: tuple[int, ...] = ()
    runs_per_sample: int = 1  # back-to-back runs averaged into each of the `runs` timed samples

    def to_dict(self) -> dict:
        """The measurement as plain JSON-ready values."""
        return asdict(self)


def benchmark_model(
    model: str | Path | bytes,
    threads: int = 1,
    warmup_runs: int = 10,
    timed_runs: int = 50,
    *,
    input_shape: Sequence[int] | None = None,
    graph_optimization: str = "all",
) -> LatencyMeasurement:
    """Median and p90 latency of one `session.run` of `model` (a path or ONNX bytes) on onnxruntime's CPU
    provider. Symbolic input dimensions are 1 (batch-1) unless `input_shape` gives the whole shape."""
    if timed_runs < 1 or warmup_runs < 0:
        raise InvalidInputError(
            f"need timed_runs >= 1 and warmup_runs >= 0, got {timed_runs} and {warmup_runs}", field="timed_runs"
        )
    session = create_session(model, threads, graph_optimization)
    feeds = _random_feeds(session, input_shape)
    for _ in range(warmup_runs):
        session.run(None, feeds)
    timings = np.empty(timed_runs)
    for index in range(timed_runs):
        start = time.perf_counter()
        session.run(None, feeds)
        timings[index] = (time.perf_counter() - start) * 1000.0
    return _measurement(timings, threads, warmup_runs, graph_optimization, _feed_shape(feeds))


def _measurement(
    timings_ms: np.ndarray,
    threads: int,
    warmup_runs: int,
    graph_optimization: str,
    input_shape: tuple[int, ...],
    runs_per_sample: int = 1,
) -> LatencyMeasurement:
    return LatencyMeasurement(
        median_ms=float(np.median(timings_ms)),
        p90_ms=float(np.percentile(timings_ms, 90)),
        runs=int(timings_ms.size),
        threads=threads,
        mean_ms=float(timings_ms.mean()),
        min_ms=float(timings_ms.min()),
        max_ms=float(timings_ms.max()),
        warmup_runs=warmup_runs,
        graph_optimization=graph_optimization,
        input_shape=input_shape,
        runs_per_sample=runs_per_sample,
    )


def _random_feeds(session: object, input_shape: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """Seeded random inputs for every model input; the first may take `input_shape`."""
    rng = np.random.default_rng(0)
    feeds = {}
    for index, spec in enumerate(session.get_inputs()):  # type: ignore[attr-defined]
        shape = _concrete_shape(spec.shape, input_shape if index == 0 else None)
        feeds[spec.name] = rng.random(shape).astype(ONNX_DTYPES.get(spec.type, np.dtype(np.float32)))
    return feeds


def _feed_shape(feeds: Mapping[str, np.ndarray]) -> tuple[int, ...]:
    return tuple(next(iter(feeds.values())).shape) if feeds else ()


def _concrete_shape(model_shape: Sequence[object], requested: Sequence[int] | None) -> tuple[int, ...]:
    """The model's input shape with symbolic dims set to 1, or `requested` if it is compatible."""
    if requested is None:
        return tuple(dim if isinstance(dim, int) else 1 for dim in model_shape)
    requested = tuple(int(dim) for dim in requested)
    compatible = len(requested) == len(model_shape) and all(
        size >= 1 and (not isinstance(dim, int) or dim == size) for size, dim in zip(requested, model_shape)
    )
    if not compatible:
        raise InvalidInputError(
            f"input_shape {list(requested)} does not fit the model's input {list(model_shape)}", field="input_shape"
        )
    return requested


def benchmark_models_interleaved(
    models: Mapping[str, str | Path | bytes],
    threads: int = 1,
    rounds: int = 5,
    runs_per_round: int = 20,
    warmup_runs: int = 10,
    graph_optimization: str = "all",
    rewarm_runs: int = 3,
    min_sample_ms: float = 0.0,
) -> dict[str, LatencyMeasurement]:
    """Latency of several models measured in interleaved rounds (every model a few runs, then the next round),
    so slow spells of a shared CPU hit all models alike instead of whichever model was running then.
    Each turn starts with `rewarm_runs` untimed runs, since caches hold the previous model: the first timed
    run after a switch was 3.5% slower than the fourth with one re-warm run, 1.1% with two, 0.7% with three
    (medians over 64 models; a bias of the interleaving itself, which the median of 2 runs a turn keeps).
    With `min_sample_ms`, each timed sample is the mean of as many back-to-back runs as take at least that
    long (counted from the fastest warm-up run: a new session's first runs are slow, and a run throttled by a
    quota is slow by its wait): under a CPU quota a single short run either fits in the quota or waits out a
    throttled gap, and only a sample spanning many quota periods shows the device's speed."""
    sessions = {name: create_session(model, threads, graph_optimization) for name, model in models.items()}
    feeds = {name: _random_feeds(session) for name, session in sessions.items()}
    timings: dict[str, list[float]] = {name: [] for name in sessions}
    runs_per_sample: dict[str, int] = {}
    for name, session in sessions.items():
        warmup_ms = []
        for _ in range(max(warmup_runs, 1 if min_sample_ms > 0 else 0)):
            start = time.perf_counter()
            session.run(None, feeds[name])
            warmup_ms.append((time.perf_counter() - start) * 1000.0)
        fastest_ms = min(warmup_ms, default=0.0)
        runs_per_sample[name] = max(1, int(np.ceil(min_sample_ms / fastest_ms))) if min_sample_ms > 0 else 1
    for _ in range(rounds):
        for name, session in sessions.items():
            for _ in range(rewarm_runs):  # re-warm caches after the other models ran
                session.run(None, feeds[name])
            for _ in range(runs_per_round):
                start = time.perf_counter()
                for _ in range(runs_per_sample[name]):
                    session.run(None, feeds[name])
                timings[name].append((time.perf_counter() - start) * 1000.0 / runs_per_sample[name])
    return {
        name: _measurement(
            np.asarray(values), threads, warmup_runs, graph_optimization, _feed_shape(feeds[name]), runs_per_sample[name]
        )
        for name, values in timings.items()
    }
