"""Direction screening: every update is compared with the round's own robust mean, so a plan without a root
set still leaves out an insider that pulls against the rest.

The norm bound and the weight bound keep a flipped update to at most 3 x the median norm at 2 x the median
weight, but it still counts: one insider in twenty, flipping a delta it trained on its shard tiled to 10,000
examples, cost a default plan 4.8 points (issue 48). FLTrust (`fedzoo.server.fl.root_trust`) leaves it out,
but only when the operator gives the server a root set. Here the reference is the coordinate-wise median of the
round's screened deltas (Yin et al. 2018; unweighted, so no claim moves it, and robust while fewer than half
the updates are harmful): an update whose cosine with it is at most `min_cosine` points away from what the
round agrees on and is left out. The threshold is below 0 (-0.05) because late in a plan honest non-IID
updates are about orthogonal to any reference: those stay in (harmless: they add little along the consensus),
and an update left out here points away from it, so it counts towards quarantine.

It needs each update, so it does not run under SecAgg+ (the server sees only the sum), nor with fewer than
`MIN_UPDATES` updates (the median of two is their mean, which a boosted one drags along).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from fedzoo.aggregation.screening import Screened, joined
from fedzoo.aggregation.settings import DirectionScreening
from fedzoo.aggregation.strategies import CoordinateMedian, Parameters

MIN_UPDATES = 3  # a median is robust only with a majority of honest updates: one harmful among three


def delta_norm(delta: Parameters) -> float:
    """The L2 norm of all of a delta's tensors together."""
    return math.sqrt(sum(float(np.vdot(value, value)) for value in delta.values()))


def cosine_between(delta: Parameters, reference: Parameters) -> float:
    """Cosine similarity of a delta with a reference delta over the reference's parameters (0 when either is
    zero)."""
    dot = sum(float(np.vdot(delta[name].astype(np.float64), value.astype(np.float64)))
              for name, value in reference.items())
    length = delta_norm(delta) * delta_norm(reference)
    return dot / length if length > 0 else 0.0


def round_median(decisions: list[Screened], spill_dir: Path | None) -> Parameters:
    """The coordinate-wise median of the screened deltas (as clipped), spilled to disk as the median strategy
    does, so memory stays O(model) whatever the round's size."""
    kept = [decision.update for decision in decisions if decision.update is not None]
    zeros = {name: np.zeros_like(value) for name, value in kept[0].load_delta().items()}
    return CoordinateMedian(spill_dir=spill_dir).aggregate_fit(zeros, kept)


def screen_directions(decisions: list[Screened], settings: DirectionScreening,
                      spill_dir: Path | None) -> tuple[list[Screened], dict[str, Any]]:
    """Leave out every update pointing away from the round's median delta; returns the decisions (in the order
    given) and what the round's outcome says about it. Call only with at least `MIN_UPDATES` updates."""
    reference = round_median(decisions, spill_dir)
    screened, cosines = [], []
    for decision in decisions:
        if decision.update is None:
            screened.append(decision)
            continue
        similarity = cosine_between(decision.update.load_delta(), reference)
        cosines.append(similarity)
        if similarity <= settings.min_cosine:
            reason = (f"cosine {similarity:.3f} with the round's median delta is at most {settings.min_cosine:g}: "
                      "it points away from the other updates, left out")
            screened.append(replace(decision, outcome="rejected", reason=joined(decision.reason, reason), update=None))
        else:
            screened.append(decision)
    return screened, {"reference": "coordinate_median", "min_cosine": settings.min_cosine,
                      "left_out": sum(cosine <= settings.min_cosine for cosine in cosines),
                      "median_cosine": float(np.median(cosines))}  # no extremes: the outcome is public
