"""The calibration models the server serves, so a device without `onnx` (which building them needs) can
time them and register: built once per process from `fedzoo.edge.calibration_models` (deterministic,
about 0.5 MB in all), stored in the blob store and downloaded like any blob (GET /v1/blobs/<sha256>)."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

from fedzoo.server.blobstore import BlobStore


@dataclass(frozen=True)
class CalibrationModelEntry:
    name: str
    sha256: str
    size_bytes: int


@functools.cache
def _calibration_models() -> dict[str, bytes]:
    from fedzoo.edge.calibration_models import calibration_models

    return calibration_models()


def calibration_catalog(store: BlobStore) -> list[CalibrationModelEntry]:
    """Every calibration model, in the predictor's order, each stored in `store` (a no-op once stored)."""
    entries = []
    for name, data in _calibration_models().items():
        sha256 = hashlib.sha256(data).hexdigest()
        if not store.exists(sha256):
            store.put(data, expected_sha256=sha256)
        entries.append(CalibrationModelEntry(name, sha256, len(data)))
    return entries
