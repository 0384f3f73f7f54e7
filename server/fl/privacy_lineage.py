"""Epsilon follows the weights, not the card: which DP ledger a model's weights already spend from.

A card's signed privacy claim (`details.federated.privacy.dp`) names the ledger line its weights were released
under. The same weights can reach the registry under another card (re-published or re-imported without the
claim: the same ONNX blob, so the same sha256) or be derived from a DP model (a pruned or INT8 child names its
parent in `parent_id`, and compress copies the claim). Any of those continues the DP line: a plan on it adds to
that line's ledger, never to a fresh one, and a plan without DP on it is refused (its noiseless rounds would sit
under a finite epsilon). What is not caught: the weights re-exported into a different ONNX file and published
with no parent; docs/privacy.md says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from fedzoo.cards import ModelCard
from fedzoo.server.tables import ModelRecord

MAX_LINEAGE_CARDS = 256  # a lineage walk stops here (a registry's chains are far shorter)


@dataclass(frozen=True)
class LineageClaim:
    """The DP claim a model's weights carry, and the card that stated it."""

    line: str
    claim: dict[str, Any]
    stated_by: str


def dp_claim(card: ModelCard) -> dict[str, Any]:
    """The card's own signed DP claim ({} when it has none)."""
    return ((card.details.get("federated") or {}).get("privacy") or {}).get("dp") or {}


def lineage_claim(session: Session, card: ModelCard) -> LineageClaim | None:
    """The DP claim of the nearest card whose weights these are or descend from: the card itself, every card of the
    same blob, then its parents (and their blobs' cards); None when no ancestor was released under DP."""
    pending, seen = [card], set()
    while pending and len(seen) < MAX_LINEAGE_CARDS:
        current = pending.pop(0)
        if current.id in seen:
            continue
        seen.add(current.id)
        claim = dp_claim(current)
        if claim.get("line"):
            return LineageClaim(str(claim["line"]), claim, current.id)
        same_weights = select(ModelRecord.card_json).where(ModelRecord.sha256 == current.sha256,
                                                           ModelRecord.id.not_in(seen))
        pending.extend(ModelCard.from_json(text) for text in session.scalars(same_weights))
        if current.parent_id is not None and current.parent_id not in seen:
            parent = session.scalar(select(ModelRecord.card_json).where(ModelRecord.id == current.parent_id))
            if parent is not None:
                pending.append(ModelCard.from_json(parent))
    return None
