"""A round's robust screening in the order the server runs it: the norm bound, the weight bound, then direction
screening against the round's median delta (when it is on and enough updates passed); FLTrust, which needs the
server's own root set, is the server's to add after these (`fedzoo.server.fl.root_trust`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedzoo.aggregation.direction import MIN_UPDATES, screen_directions
from fedzoo.aggregation.screening import Screened, screen_updates
from fedzoo.aggregation.settings import DirectionScreening, NormBound, WeightBound
from fedzoo.aggregation.strategies import ClientUpdate
from fedzoo.aggregation.weighting import bound_weights


@dataclass(frozen=True)
class ScreenedUpdates:
    """Every update's decision (in the order given) and what the round's outcome says about the screening."""

    decisions: list[Screened]
    norm_limit: float
    weight_cap: float | None
    counted: int  # updates that passed the norm and weight bounds (direction screening ran on these)
    direction: dict[str, Any] | None  # direction screening's outcome, None when it did not run

    @property
    def kept(self) -> list[ClientUpdate]:
        """The updates the strategy aggregates, as screened (clipped, weight bounded)."""
        return [decision.update for decision in self.decisions if decision.update is not None]


def screen_round_updates(updates: list[ClientUpdate], norm_bound: NormBound, weight_bound: WeightBound,
                         direction_screening: DirectionScreening | None, spill_dir: Path | None = None,
                         revoked_device_ids: frozenset[str] = frozenset()) -> ScreenedUpdates:
    """Bound each update's norm and weight, then leave out those pointing away from the round's median delta."""
    decisions, norm_limit = screen_updates(updates, norm_bound, revoked_device_ids)
    decisions, weight_cap = bound_weights(decisions, weight_bound)
    counted = sum(decision.update is not None for decision in decisions)
    direction = None
    if direction_screening is not None and counted >= MIN_UPDATES:
        decisions, direction = screen_directions(decisions, direction_screening, spill_dir)
    return ScreenedUpdates(decisions, norm_limit, weight_cap, counted, direction)
