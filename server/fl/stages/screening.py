"""Screening: before a strategy sees a round's updates, the server bounds each device's claims
(`fedzoo.server.fl.screening`: capped weights, norm bound, revoked devices) and records each decision on
the update's row."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from fedzoo.server.fl.evaluation import client_reported_metrics
from fedzoo.server.fl.models import FLUpdate
from fedzoo.server.fl.round_context import RoundContext
from fedzoo.server.fl.schemas import RoundConfig
from fedzoo.server.fl.screening import Screened, screen_updates
from fedzoo.server.fl.strategies import ClientUpdate


@dataclass(frozen=True)
class ScreenedRound:
    """The screening decisions (in the rows' order), the updates that count, and the round's summary so far."""

    screened: list[Screened]
    kept: list[ClientUpdate]
    summary: dict[str, Any]


def screen_round(context: RoundContext, rows: list[FLUpdate], config: RoundConfig,
                 revoked: frozenset[str]) -> ScreenedRound:
    """Screen a round's stored updates (a revoked device's update never counts)."""
    updates = [
        ClientUpdate(row.device_id, row.counted_examples or row.num_examples,
                     context.delta_loader(row.blob_sha256), row.delta_norm, json.loads(row.metrics_json))
        for row in rows
    ]
    screened, norm_limit = screen_updates(updates, config.norm_bound, revoked)
    kept = [decision.update for decision in screened if decision.update is not None]
    summary = {
        "accepted_updates": len(rows), "aggregated_updates": len(kept),
        "num_examples": sum(update.num_examples for update in kept),
        "upload_bytes": sum(row.upload_bytes for row in rows),
        "screening": {"norm_limit": norm_limit,
                      **{outcome: sum(d.outcome == outcome for d in screened)
                         for outcome in ("counted", "clipped", "rejected")}},
        "client_reported_metrics": client_reported_metrics(kept),
    }
    return ScreenedRound(screened, kept, summary)


def record_screening(session: Session, rows: list[FLUpdate], screened: list[Screened]) -> None:
    """Write each update's screening outcome, reason and counted norm to its row."""
    for row, decision in zip(rows, screened):
        session.execute(update(FLUpdate).where(FLUpdate.id == row.id).values(
            screening=decision.outcome, screening_reason=decision.reason, counted_norm=decision.counted_norm))
