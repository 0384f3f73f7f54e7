"""Test vectors for distributed DP's device encoding (`fedzoo.dp.distributed`), shared by the Python and Java SDKs.

The randomness of a real device comes from the operating system; here it comes from `fedzoo.dp.seeded_stream`
(SHA-256 in counter mode over a fixed seed), so `python tests/vectors/distributed_noise_vectors.py` rewrites
`distributed_noise_vectors.json` identically and a second SDK that reproduces every case scales, rounds, bounds and
noises its update exactly as Python does. The vectors fix the encoding, not the randomness:

- `stream`: the stream's first 48 bytes, and `below` draws (rejection sampling) from a fresh stream;
- `discrete_gaussian`: draws of N_Z(0, sigma^2) (CKS's exact sampler) from a fresh stream, sigma^2 as a fraction;
- `cases`: a clipped update (`vector`, float64), the round's `clip_norm`, `levels`, `modulus_bits` and noise request
  (`noise`: z and the survivors it is calibrated for); what both SDKs derive from them (`norm_bound_squared`,
  `sigma_squared` as [numerator, denominator], `ring_bits_needed` for `cohort`, `equivalent_noise_multiplier`), and
  the ring values the device sends (`ring`, before masking) from a fresh stream over `seed`.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from fedzoo.dp.discrete_gaussian import sample_discrete_gaussian
from fedzoo.dp.distributed import (DistributedNoise, device_sigma_squared, equivalent_noise_multiplier,
                                   noised_ring_input, norm_bound_squared, ring_bits_needed, round_conditionally)
from fedzoo.dp.seeded_stream import SeededStream

VECTORS_PATH = Path(__file__).with_name("distributed_noise_vectors.json")
CASES = [  # name, dimension, clip_norm, levels, modulus_bits, z, survivors, cohort
    ("int8_grid_16_bit_ring", 6, 0.5, 127, 16, 1.1, 3, 5),
    ("finest_grid_32_bit_ring", 10, 2.0, 32767, 32, 0.8, 5, 8),
    ("coarse_grid_tight_bound", 8, 1.0, 3, 16, 0.5, 4, 4),
    ("redrawn_rounding", 16, 1.0, 2, 16, 0.7, 3, 6),  # every coordinate half a step: the first rounding is refused
]
REDRAWN = "redrawn_rounding"


def _vector(name: str, dimension: int, clip_norm: float) -> np.ndarray:
    if name == REDRAWN:
        return np.full(dimension, clip_norm / np.sqrt(dimension))
    rng = np.random.default_rng(sum(name.encode()))
    vector = rng.normal(size=dimension)
    return vector * (clip_norm / np.linalg.norm(vector)) * (1 - 1e-12)  # on the clip norm: the tightest case


class _CountingStream(SeededStream):
    """The seeded stream, counting the roundings drawn (each reads 4 bytes a coordinate in one piece)."""

    def __init__(self, seed: bytes, dimension: int) -> None:
        super().__init__(seed)
        self.dimension, self.roundings = dimension, 0

    def read(self, count: int) -> bytes:
        self.roundings += count == 4 * self.dimension
        return super().read(count)


def _attempts(seed: str, vector: np.ndarray, clip_norm: float, levels: int) -> int:
    """How many roundings `round_conditionally` draws for this case."""
    stream = _CountingStream(seed.encode(), vector.size)
    round_conditionally(vector * (levels / clip_norm), norm_bound_squared(levels, vector.size), stream)
    return stream.roundings


def _seed(name: str, vector: np.ndarray, clip_norm: float, levels: int) -> str:
    """The case's name, or for `REDRAWN` the first `name-i` whose first rounding the bound refuses."""
    if name != REDRAWN:
        return name
    return next(f"{name}-{i}" for i in range(1000) if _attempts(f"{name}-{i}", vector, clip_norm, levels) > 1)


def distributed_noise_vectors() -> dict[str, Any]:
    stream = SeededStream(b"stream")
    head = stream.read(48).hex()
    below = SeededStream(b"below")
    gaussian = SeededStream(b"discrete-gaussian")
    sigma_squared = Fraction(1234567, 2**20)
    cases = []
    for name, dimension, clip_norm, levels, bits, z, survivors, cohort in CASES:
        vector = _vector(name, dimension, clip_norm)
        noise = DistributedNoise(z, survivors)
        sigma = device_sigma_squared(noise, levels, dimension)
        seed = _seed(name, vector, clip_norm, levels)
        ring = noised_ring_input(vector, clip_norm, levels, bits, noise, SeededStream(seed.encode()))
        cases.append({"name": name, "seed": seed, "rounding_attempts": _attempts(seed, vector, clip_norm, levels),
                      "vector": vector.tolist(), "clip_norm": clip_norm, "levels": levels,
                      "modulus_bits": bits, "noise": noise.to_dict(), "cohort": cohort,
                      "norm_bound_squared": norm_bound_squared(levels, dimension),
                      "sigma_squared": [sigma.numerator, sigma.denominator],
                      "ring_bits_needed": ring_bits_needed(levels, cohort, sigma),
                      "equivalent_noise_multiplier": equivalent_noise_multiplier(noise, levels, dimension),
                      "ring": ring.tolist()})
    return {"stream": {"seed": "stream", "first_48_bytes": head,
                       "below": {"seed": "below", "bounds": [1, 2, 3, 255, 256, 1000, 2**40 + 3],
                                 "values": [below.below(b) for b in (1, 2, 3, 255, 256, 1000, 2**40 + 3)]}},
            "discrete_gaussian": {"seed": "discrete-gaussian",
                                  "sigma_squared": [sigma_squared.numerator, sigma_squared.denominator],
                                  "values": [sample_discrete_gaussian(sigma_squared, gaussian) for _ in range(12)]},
            "cases": cases}


def vectors_text() -> str:
    return json.dumps(distributed_noise_vectors(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    VECTORS_PATH.write_text(vectors_text())
