"""Screening updates before aggregation: the server never takes a device's word for its weight.

A device says how many examples it trained on and sends a delta; both are its own claims. Before a
strategy sees them the server bounds them:

- **weight**: an update counts for `min(num_examples, max_examples_per_update)` examples (the cap is
  applied when the update is stored, and recorded as `counted_examples`);
- **norm**: an update whose L2 norm exceeds `median_multiple` x the median norm of the round's updates
  (or the absolute `max_norm`) is clipped to that bound (its delta scaled down, as in Sun et al. 2019,
  "Can You Really Backdoor Federated Learning?") or left out, per the round's `norm_bound.action`.
  The median is robust while fewer than half of the round's updates are outliers.

The server records each decision on the update's row (`screening`, `screening_reason`, `counted_norm`);
the in-process engine (`fedzoo.cloud.inprocess`) runs the same functions on updates held in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from fedzoo.aggregation.settings import NormBound
from fedzoo.aggregation.strategies import ClientUpdate, Parameters


REVOKED_REASON = "the device was revoked by the operator"


@dataclass(frozen=True)
class Screened:
    """One update after screening: what the strategy gets (None when rejected) and why."""

    original: ClientUpdate
    outcome: str  # "counted", "clipped" or "rejected" (the server's SCREENING_OUTCOMES)
    reason: str | None
    update: ClientUpdate | None  # its num_examples is the weight the strategy gives it
    root_cosine: float | None = None  # FLTrust: cosine with the server's own update (fedzoo.server.fl.root_trust)

    @property
    def counted_norm(self) -> float | None:
        return self.update.norm if self.update is not None else None


def norm_limit(norms: list[float], bound: NormBound) -> float:
    """The largest L2 norm an update of this round may have: k x the median, capped by `max_norm`."""
    limit = bound.median_multiple * float(np.median(norms)) if norms else float("inf")
    return min(limit, bound.max_norm) if bound.max_norm is not None else limit


def scaled(load_delta, factor: float):
    """A loader of the delta multiplied by `factor` (a clipped update)."""
    def load() -> Parameters:
        return {name: (value * np.float32(factor)).astype(np.float32) for name, value in load_delta().items()}

    return load


def screen_updates(updates: list[ClientUpdate], bound: NormBound,
                   revoked_device_ids: frozenset[str] = frozenset()) -> tuple[list[Screened], float]:
    """Decide, for every update, whether it counts as sent, clipped to the bound or rejected (always, when
    its device was revoked after sending it); returns the decisions (in the order given) and the norm limit
    used."""
    limit = norm_limit([update.norm for update in updates if update.device_id not in revoked_device_ids], bound)
    decisions = []
    for update in updates:
        if update.device_id in revoked_device_ids:
            decisions.append(Screened(update, "rejected", REVOKED_REASON, None))
            continue
        if update.norm <= limit:
            decisions.append(Screened(update, "counted", None, update))
            continue
        reason = (f"L2 norm {update.norm:.6g} exceeds the round's bound {limit:.6g} "
                  f"({bound.median_multiple:g} x the median norm" + (f", at most {bound.max_norm:g})" if bound.max_norm
                                                                    else ")"))
        if bound.action == "reject":
            decisions.append(Screened(update, "rejected", reason, None))
        else:
            factor = limit / update.norm
            clipped = replace(update, load_delta=scaled(update.load_delta, factor), norm=limit)
            decisions.append(Screened(update, "clipped", f"{reason}; scaled by {factor:.3g}", clipped))
    return decisions, limit


def joined(*reasons: str | None) -> str | None:
    """Several decisions about one update as one recorded reason."""
    return "; ".join(reason for reason in reasons if reason) or None
