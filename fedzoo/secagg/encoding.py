"""Updates in and out of the ring Z_{2^bits} that SecAgg+ sums in.

Additive masking needs a finite group; a power-of-two ring makes the arithmetic numpy's own uint16 or
uint32 overflow. A client clips each coordinate to +-clip_range, scales it by its weight, and rounds it
stochastically (unbiased) to an integer in [-levels, levels]; with levels = 127 these are exactly the
int8 update encoding's values, with one scale for the whole round (clip_range / 127) instead of one
per tensor, since the server can only undo a scale every client shares. Its weight travels as one
more coordinate, an integer in [1, levels], so the server learns the sum of weights along with the
sum of weighted deltas and divides. The ring is large enough that no sum wraps around (see
`SecAggConfig.modulus_bits`): the unmasked sum is exact.
"""

from __future__ import annotations

import math

import numpy as np

from fedzoo.errors import InvalidInputError
from fedzoo.secagg.config import SecAggConfig


def flatten(delta: dict[str, np.ndarray]) -> np.ndarray:
    """The delta's tensors, in sorted name order, as one float64 vector."""
    return np.concatenate([np.asarray(delta[name], dtype=np.float64).reshape(-1) for name in sorted(delta)])


def unflatten(vector: np.ndarray, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """`flatten`'s inverse for tensors of the given shapes (float32)."""
    sizes = [math.prod(shapes[name]) for name in sorted(shapes)]
    if sum(sizes) != vector.size:
        raise InvalidInputError(f"vector has {vector.size} values, the shapes need {sum(sizes)}", field="vector")
    result, start = {}, 0
    for name, size in zip(sorted(shapes), sizes):
        result[name] = vector[start : start + size].reshape(shapes[name]).astype(np.float32)
        start += size
    return result


def example_weight(num_examples: int, max_examples: int) -> float:
    """FedAvg's weight under SecAgg+: examples capped at `max_examples`, as a fraction of it (in (0, 1])."""
    if max_examples < 1 or num_examples < 1:
        raise InvalidInputError(f"num_examples and max_examples must be at least 1, got {num_examples} and "
                                f"{max_examples}", field="num_examples")
    return min(num_examples, max_examples) / max_examples


def quantise(vector: np.ndarray, config: SecAggConfig, weight: float = 1.0,
             rng: np.random.Generator | None = None) -> np.ndarray:
    """The client's input to the protocol: `vector_length` weighted, clipped, quantised values plus the
    weight, as elements of Z_{2^bits} (uint16 or uint32)."""
    vector = np.asarray(vector, dtype=np.float64)
    if vector.shape != (config.vector_length,):
        raise InvalidInputError(f"vector must have shape ({config.vector_length},), got {vector.shape}", field="vector")
    if not np.all(np.isfinite(vector)):
        raise InvalidInputError("vector holds NaN or infinite values", field="vector")
    if not 0 < weight <= 1:
        raise InvalidInputError(f"weight must lie in (0, 1], got {weight}", field="weight")
    rng = rng if rng is not None else np.random.default_rng()
    weight_level = max(1, round(weight * config.levels))
    scaled = np.clip(vector, -config.clip_range, config.clip_range) * (weight_level / config.clip_range)
    floor = np.floor(scaled)
    levels = floor + (rng.random(scaled.shape) < scaled - floor)  # stochastic rounding: E[levels] = scaled
    levels = np.clip(levels, -config.levels, config.levels).astype(np.int64)
    return _to_ring(np.append(levels, weight_level), config)


def dequantise_sum(ring_sum: np.ndarray, config: SecAggConfig) -> tuple[np.ndarray, float]:
    """From the unmasked sum: (the sum of weighted deltas, the sum of weights), so mean = first / second."""
    if ring_sum.shape != (config.vector_length + 1,):
        raise InvalidInputError(f"sum must have shape ({config.vector_length + 1},), got {ring_sum.shape}",
                                field="ring_sum")
    signed = ring_sum.astype(np.int64)
    half = 2 ** (config.modulus_bits - 1)
    signed = np.where(signed >= half, signed - 2**config.modulus_bits, signed)
    total_weight = signed[-1] / config.levels
    return signed[:-1] * (config.clip_range / config.levels), float(total_weight)


def _to_ring(values: np.ndarray, config: SecAggConfig) -> np.ndarray:
    dtype = np.uint16 if config.modulus_bits == 16 else np.uint32
    return (values % 2**config.modulus_bits).astype(dtype)
