"""A deterministic byte stream for the cross-language noise vectors: never for real noise.

`tests/vectors/distributed_noise_vectors.json` fixes how a device scales, rounds and noises its update; for both
SDKs to produce the same ring values from the same draws, the draws come from this stream instead of the operating
system: block i is SHA-256(seed || u64 big-endian i), the blocks read one after another with nothing skipped.
"""

from __future__ import annotations

import hashlib

from fedzoo.dp.discrete_gaussian import SecureRandom


class SeededStream(SecureRandom):
    """`SecureRandom`'s draws from SHA-256 in counter mode over `seed` (reproducible: tests and vectors only)."""

    def __init__(self, seed: bytes) -> None:
        super().__init__()
        self._seed = seed
        self._counter = 0
        self._pending = b""

    def _bytes(self, count: int) -> bytes:
        while len(self._pending) < count:
            self._pending += hashlib.sha256(self._seed + self._counter.to_bytes(8, "big")).digest()
            self._counter += 1
        chunk, self._pending = self._pending[:count], self._pending[count:]
        return chunk
