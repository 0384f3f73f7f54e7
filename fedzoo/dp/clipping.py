"""Client-side clipping for DP-FedAvg: every device bounds its own influence before anything leaves it.

Clipping on the device (not on the server) is what lets DP compose with secure aggregation: the
server only sees a sum, so it could not clip the individual updates even if it wanted to.
"""

from __future__ import annotations

import math

import numpy as np

from fedzoo.errors import InvalidInputError


def l2_norm(delta: dict[str, np.ndarray]) -> float:
    """The L2 norm of all of a delta's tensors together."""
    return math.sqrt(sum(float(np.sum(np.square(value, dtype=np.float64))) for value in delta.values()))


def clip_delta(delta: dict[str, np.ndarray], clip_norm: float) -> tuple[dict[str, np.ndarray], bool]:
    """The delta scaled down to L2 norm `clip_norm` if longer, and whether it was within the bound already
    (the bit adaptive clipping counts)."""
    if not math.isfinite(clip_norm) or clip_norm <= 0:
        raise InvalidInputError(f"clip_norm must be a positive number, got {clip_norm}", field="clip_norm")
    norm = l2_norm(delta)
    if not math.isfinite(norm):
        raise InvalidInputError("the delta holds NaN or infinite values", field="delta")
    scale = min(1.0, clip_norm / norm) if norm > 0 else 1.0
    return {name: (np.asarray(value, dtype=np.float32) * np.float32(scale)) for name, value in delta.items()}, norm <= clip_norm
