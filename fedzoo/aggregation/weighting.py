"""Bounding an update's aggregation weight relative to its round, so that no device buys the round.

A device's example count is its own claim. The per-update cap (`max_examples_per_update`) is a fixed number,
so an insider that trains on its shard tiled to the cap legally claims it and, among devices holding ~150
examples each, takes most of a FedAvg round. The rules here bound the weight by the round itself:

- `median_multiple` (the default): `min(counted examples, k x the median of the round's counted updates)`.
  With k = 2, one device weighs at most twice a typical one, whatever it claims; fewer than half the round's
  updates cannot move the median. The cost on honest non-IID data: a device that really holds more than k x the
  median counts for less than its data, so the mean leans towards the small devices' label mix
  (docs/federated-rounds.md, "Robust rounds", has the measured cost).
- `equal`: every update weighs the same (what DP-FedAvg and SecAgg+ with equal weights do); the largest cost when
  devices really differ in size.
- `examples`: the counted examples alone, FedAvg's weights (only `max_examples_per_update` bounds them).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from fedzoo.aggregation.screening import Screened, joined
from fedzoo.aggregation.settings import WeightBound


def bound_weights(decisions: list[Screened], bound: WeightBound) -> tuple[list[Screened], float | None]:
    """The decisions with each counted update's weight bounded by the rule; returns them (in the order given)
    and the cap applied (None under `examples` and `equal`)."""
    counted = [decision.update.num_examples for decision in decisions if decision.update is not None]
    if bound.rule == "examples" or not counted:
        return decisions, None
    cap = bound.median_multiple * float(np.median(counted)) if bound.rule == "median_multiple" else None
    bounded = []
    for decision in decisions:
        if decision.update is None:
            bounded.append(decision)
            continue
        claimed = decision.update.num_examples
        weight = 1.0 if cap is None else min(float(claimed), cap)
        note = None
        if cap is not None and weight < claimed:
            note = (f"weight capped at {cap:g} examples ({bound.median_multiple:g} x the round's median "
                    f"{cap / bound.median_multiple:g}); {claimed} counted")
        bounded.append(replace(decision, update=replace(decision.update, num_examples=weight),
                               reason=joined(decision.reason, note)))
    return bounded, cap
