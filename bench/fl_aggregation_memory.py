"""Aggregation memory from 10 to 1,000 updates: streaming strategies stay O(model), spilling ones are bounded.

The updates are real upload archives (`fedzoo.update_codec`, float32) of the MNIST MLP's shapes
(784-64-10, 50,890 parameters) stored in a `FileBlobStore`, loaded lazily exactly as the round service
does. Peak Python heap during `aggregate_fit` is measured with tracemalloc (numpy reports its buffers to
it); the memory map the median and trimmed mean spill to lives on disk and is read in blocks of at most
`working_memory_bytes`.

    .venv/bin/python bench/fl_aggregation_memory.py
"""

from __future__ import annotations

import tempfile
import time
import tracemalloc

import numpy as np

from fedzoo.update_codec import decode_update, encode_update
from fedzoo.server.blobstore import FileBlobStore
from fedzoo.aggregation.strategies import (
    ClientUpdate, CoordinateMedian, FedAdam, FedAvg, MultiKrum, NormClipping, TrimmedMean,
)

SHAPES = {"fc1.weight": (784, 64), "fc1.bias": (64,), "fc2.weight": (64, 10), "fc2.bias": (10,)}
WORKING_MEMORY_BYTES = 8 * 1024 * 1024
COUNTS = (10, 100, 1000)


def make_updates(store: FileBlobStore, count: int, rng: np.random.Generator) -> list[ClientUpdate]:
    updates = []
    for index in range(count):
        delta = {name: rng.normal(0, 0.01, size=shape).astype(np.float32) for name, shape in SHAPES.items()}
        digest = store.put(encode_update(delta))
        norm = float(np.sqrt(sum(np.sum(value.astype(np.float64) ** 2) for value in delta.values())))

        def load(digest=digest):
            with store.open(digest) as stream:
                return decode_update(stream.read())[0]

        updates.append(ClientUpdate(f"device-{index}", int(rng.integers(20, 300)), load, norm))
    return updates


def main() -> None:
    rng = np.random.default_rng(0)
    base = {name: rng.normal(size=shape).astype(np.float32) for name, shape in SHAPES.items()}
    model_mib = sum(value.nbytes for value in base.values()) / 2**20
    strategies = {
        "fedavg": lambda: FedAvg(),
        "fedadam": lambda: FedAdam(),
        "norm_clipping": lambda: NormClipping(),
        "median": lambda: CoordinateMedian(working_memory_bytes=WORKING_MEMORY_BYTES),
        "trimmed_mean": lambda: TrimmedMean(trim_fraction=0.2, working_memory_bytes=WORKING_MEMORY_BYTES),
        "multi_krum": lambda: MultiKrum(working_memory_bytes=WORKING_MEMORY_BYTES),
    }
    print(f"model {model_mib:.3f} MiB float32; median/trimmed mean/multi-Krum working memory {WORKING_MEMORY_BYTES / 2**20:.0f} MiB")
    print(f"{'updates':>8} {'all updates in RAM':>19} " + " ".join(f"{name:>22}" for name in strategies))
    peaks: dict[str, list[float]] = {name: [] for name in strategies}
    with tempfile.TemporaryDirectory(prefix="fedzoo-aggregation-") as folder:
        store = FileBlobStore(folder)
        updates = make_updates(store, max(COUNTS), rng)
        for count in COUNTS:
            cells = []
            for name, make in strategies.items():
                strategy = make()
                tracemalloc.start()
                started = time.perf_counter()
                strategy.aggregate_fit(base, updates[:count])
                elapsed = time.perf_counter() - started
                _, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
                peaks[name].append(peak / 2**20)
                cells.append(f"{peak / 2**20:7.2f} MiB {elapsed:6.2f} s")
            print(f"{count:>8} {count * model_mib:15.1f} MiB " + " ".join(f"{cell:>22}" for cell in cells))
    print("peak at 1,000 updates / peak at 10 updates:")
    for name, values in peaks.items():
        print(f"  {name:<14} {values[-1] / values[0]:.2f}x  (peak {values[-1] / model_mib:.1f}x the model size)")


if __name__ == "__main__":
    main()
