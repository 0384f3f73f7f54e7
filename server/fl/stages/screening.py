"""Screening: before a strategy sees a round's updates, the server bounds each device's claims
(`fedzoo.aggregation.screening`: capped weights, norm bound, revoked devices), bounds each weight by the round
(`fedzoo.aggregation.weighting`), leaves out updates pointing away from the round's median delta
(`fedzoo.aggregation.direction`), scores each update against its own update on the root set
(`fedzoo.server.fl.root_trust`), and records each decision on the update's row, then applies the quarantine
policy (`fedzoo.server.fl.quarantine`). The round's outcome says which defences ran and why the others did not
(`round_defences`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from fedzoo.aggregation.direction import MIN_UPDATES
from fedzoo.aggregation.robust import screen_round_updates
from fedzoo.aggregation.screening import Screened
from fedzoo.aggregation.strategies import ClientUpdate, make_strategy
from fedzoo.server.fl import quarantine, root_trust
from fedzoo.server.fl.base_models import RoundBase
from fedzoo.server.fl.evaluation import client_reported_metrics
from fedzoo.server.fl.outcome import RoundOutcome, ScreeningTally, UpdateCounts
from fedzoo.server.fl.tables import FLUpdate
from fedzoo.server.fl.round_context import RoundContext
from fedzoo.server.fl.schemas import QuarantinePolicy, RoundConfig, round_training


@dataclass(frozen=True)
class ScreenedRound:
    """The screening decisions (in the rows' order), the updates that count, and the round's outcome so far."""

    screened: list[Screened]
    kept: list[ClientUpdate]
    outcome: RoundOutcome


def root_update(context: RoundContext, base: RoundBase, config: RoundConfig,
                round_number: int) -> root_trust.RootUpdate | None:
    """The server's own update on the plan's root set (None without one), trained as the devices train."""
    if config.root_trust is None:
        return None
    with context.store.open(base.card.training_graph) as stream:
        training_graph = stream.read()
    with context.store.open(config.root_trust.root_sha256) as stream:
        root_npz = stream.read()
    training = round_training(config, round_number, make_strategy(config.strategy).configure_fit(round_number))
    return root_trust.train_root_update(base.onnx_bytes, training_graph, base.card, training, root_npz,
                                        seed=round_number)


def round_defences(config: RoundConfig, screened_updates: int | None) -> dict[str, Any]:
    """Which defences against insiders the round runs (`ran`) and, for each it cannot, why (`not_run`); a
    private round (SecAgg+/DP: `screened_updates` None) sees only the sum, so every per-update defence is out."""
    not_run: dict[str, str] = {}
    if screened_updates is None:
        ran = ["sum_envelope"]  # check_secure_sum: every device clipped to +-clip_range at weight <= 1
        for name in ("norm_bound", "weight_bound", "direction_screening", "root_trust", "quarantine"):
            not_run[name] = "secure aggregation: the server sees only the sum of the updates, never one update"
        if config.root_trust is not None:
            ran.append("aggregate_check")
        else:
            not_run["aggregate_check"] = ("no root set (root_trust.root_sha256): the server has no update of its "
                                          "own to check the sum's direction against")
    else:
        ran = ["norm_bound", "weight_bound"]
        if config.direction_screening is None:
            not_run["direction_screening"] = "turned off by the plan (direction_screening: null)"
        elif screened_updates < MIN_UPDATES:
            not_run["direction_screening"] = (f"{screened_updates} updates passed the norm bound: a median needs at "
                                              f"least {MIN_UPDATES} to outvote one harmful update")
        else:
            ran.append("direction_screening")
        if config.root_trust is not None:
            ran.append("root_trust")
        else:
            not_run["root_trust"] = ("no root set (root_trust.root_sha256): the server has no data of its own "
                                     "to score updates against")
        if config.quarantine is not None:
            ran.append("quarantine")
        else:
            not_run["quarantine"] = "turned off by the plan (quarantine: null)"
    ran.append(f"gate_{config.gate.compare_with}")
    return {"ran": ran, "not_run": not_run}


def screen_round(context: RoundContext, rows: list[FLUpdate], config: RoundConfig,
                 revoked: frozenset[str], root: root_trust.RootUpdate | None,
                 spill_dir: Path | None = None) -> ScreenedRound:
    """Screen a round's stored updates (a revoked device's update never counts), bound their weights, leave out
    those pointing away from the round's median delta and, with a root set, score them against the server's own
    update (`spill_dir`: where the median spills the deltas, as the median strategy does)."""
    updates = [
        ClientUpdate(row.device_id, row.counted_examples or row.num_examples,
                     context.delta_loader(row.blob_sha256), row.delta_norm, json.loads(row.metrics_json))
        for row in rows
    ]
    robust = screen_round_updates(updates, config.norm_bound, config.weight_bound, config.direction_screening,
                                  spill_dir, revoked)
    screened, norm_limit, weight_cap, counted, direction = (robust.decisions, robust.norm_limit, robust.weight_cap,
                                                            robust.counted, robust.direction)
    if root is not None:
        screened = root_trust.score_updates(screened, root, config.root_trust)
    kept = [decision.update for decision in screened if decision.update is not None]
    outcome = RoundOutcome(
        counts=UpdateCounts(len(rows), len(kept),
                            sum(d.original.num_examples for d in screened if d.update is not None)),
        upload_bytes=sum(row.upload_bytes for row in rows),
        screening=tally_screening(screened, norm_limit=norm_limit),
        weight_bound={"rule": config.weight_bound.rule, "cap": weight_cap},
        client_reported_metrics=client_reported_metrics(kept),
        direction_screening=direction,
        root_trust=root_trust.summary(root, screened, config.root_trust) if root is not None else None,
        defences=round_defences(config, counted),
    )
    return ScreenedRound(screened, kept, outcome)


def tally_screening(screened: list[Screened], norm_limit: float | None = None,
                    per_subnet_norm_limit: dict[str, float] | None = None) -> ScreeningTally:
    """The round's screening decisions counted by outcome, with the norm bound (or bounds) they met."""
    counted, clipped, rejected = (sum(d.outcome == outcome for d in screened)
                                  for outcome in ("counted", "clipped", "rejected"))
    return ScreeningTally(counted, clipped, rejected, norm_limit, per_subnet_norm_limit)


def record_screening(session: Session, rows: list[FLUpdate], screened: list[Screened],
                     policy: QuarantinePolicy | None, now: datetime) -> None:
    """Write each update's decision, reason, counted norm, weight and root cosine to its row; then apply the
    quarantine policy to the round's devices."""
    if rows:  # one UPDATE by primary key for the whole round (an executemany)
        session.execute(update(FLUpdate), [
            {"id": row.id, "screening": decision.outcome, "screening_reason": decision.reason,
             "counted_norm": decision.counted_norm,
             "aggregation_weight": decision.update.num_examples if decision.update is not None else None,
             "root_cosine": decision.root_cosine}
            for row, decision in zip(rows, screened)])
    if rows and screened:
        quarantine.review(session, rows[0].round_id, [row.device_id for row in rows], policy, now)
