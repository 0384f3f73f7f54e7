"""Rounds of one model (`POST /v1/fl/rounds`): every seated device trains the round's model, and the aggregate is
published as that model's next version if it passes the accuracy gate (`fedzoo.server.fl.round_kinds`).

Closing a round: the root set's own update (FLTrust, when configured), screening (in the clear: norm and weight
bounds, direction, root scores, `fedzoo.server.fl.stages.screening`; a private round has no clear update to screen
and relies on the unmasked sum's checks instead), the strategy over the kept deltas or the private layer over the
unmasked sum (`fedzoo.server.fl.stages.aggregation`), then the gate and publication
(`fedzoo.server.fl.stages.publication`).
"""

from __future__ import annotations

import time

from sqlalchemy.orm import Session

from fedzoo.aggregation.screening import Screened
from fedzoo.aggregation.strategies import ClientUpdate, Strategy, require_secure_aggregation_support
from fedzoo.cards import ModelCard
from fedzoo.errors import FedzooError, InvalidInputError, NotFoundError
from fedzoo.server import registry
from fedzoo.server.fl.faults import crash_point
from fedzoo.server.fl.lifecycle import RoundLifecycle
from fedzoo.server.fl.outcome import RoundOutcome
from fedzoo.server.fl.round_context import RoundContext
from fedzoo.server.fl.round_kinds import RoundEnd, check_evaluation_set, check_secure_cohort, with_example_cap
from fedzoo.server.fl.schemas import RoundConfig
from fedzoo.server.fl.secure_rounds import (SeatGroup, check_planned_ring, is_private, ledger_line,
                                           with_calibrated_noise)
from fedzoo.server.fl.stages.aggregation import Aggregation
from fedzoo.server.fl.stages.publication import Publication
from fedzoo.server.fl.stages.screening import record_screening, root_update, round_defences, screen_round
from fedzoo.server.fl.tables import FLRound, FLUpdate


class SingleModelRounds:
    """The round kind of one model (`fedzoo.server.fl.round_kinds.RoundKind`)."""

    closes_in_background = False  # one model is measured and published within the closing request

    def __init__(self, context: RoundContext, lifecycle: RoundLifecycle, aggregation: Aggregation,
                 publication: Publication) -> None:
        self.context, self.lifecycle = context, lifecycle
        self.aggregation, self.publication = aggregation, publication
        self.end = RoundEnd(context, lifecycle)

    def open_plan(self, session: Session, config: RoundConfig, strategy: Strategy) -> tuple[RoundConfig, ModelCard]:
        if is_private(config):
            require_secure_aggregation_support(strategy)  # DP, too, needs only the equal-weighted sum
            check_secure_cohort(config)
        config = with_example_cap(config, self.context)
        base = self.context.bases.get(session, config.model_id)
        if config.privacy.dp is not None:
            config = with_calibrated_noise(self.context.private.with_delta(session, config, base.card))
            check_planned_ring(config, sum(value.size for value in base.parameters.values()))
        check_evaluation_set(self.context.store, config.evaluation_sha256, base.card)
        if config.root_trust is not None:
            check_evaluation_set(self.context.store, config.root_trust.root_sha256, base.card,
                                 "root_trust.root_sha256")
        if config.gate.anchor_model_id is not None:
            try:
                registry.model_sha256(session, config.gate.anchor_model_id)
            except NotFoundError:
                raise InvalidInputError(f"the gate's anchor {config.gate.anchor_model_id!r} is not a published "
                                        "model", field="gate.anchor_model_id") from None
        return config, base.card

    def terms_lines(self, session: Session, config: RoundConfig, card: ModelCard) -> list[str]:
        """The model's line (devices check the terms for it) and the ledger line the plan charges (`ledger_line`:
        the DP line its weights descend from, where that is another)."""
        return [card.line_id, ledger_line(session, card)]

    def seat(self, session: Session, round_row: FLRound, config: RoundConfig, device_id: str) -> bool:
        return True  # every device trains the round's model

    def seat_group(self, session: Session, round_row: FLRound, device_id: str) -> SeatGroup:
        """One SecAgg+ cohort for the whole round, over the model's trainable parameters."""
        base = self.context.bases.get(session, round_row.base_model_id)
        return SeatGroup("", sum(value.size for value in base.parameters.values()))

    def close(self, round_id: int, config: RoundConfig, rows: list[FLUpdate], revoked: frozenset[str],
              strategy: Strategy) -> None:
        started = time.perf_counter()
        database = self.context.database
        with database.session() as session:
            round_row = session.get(FLRound, round_id)
            round_number, plan_id = round_row.number, round_row.plan_id
            base = self.context.bases.get(session, round_row.base_model_id)
        try:
            root = root_update(self.context, base, config, round_number)
        except FedzooError as error:
            self.end.refuse(round_id, rows, [], RoundOutcome(strategy=strategy.name),
                            f"the root set cannot score updates: {error}")
            return
        kept: list[ClientUpdate] = []
        if is_private(config):
            screened: list[Screened] = []
            outcome = RoundOutcome(strategy=strategy.name, upload_bytes=sum(row.upload_bytes for row in rows),
                                   defences=round_defences(config, None))
        else:
            screening = screen_round(self.context, rows, config, revoked, root, self.aggregation.spill_dir)
            screened, kept, outcome = screening.screened, screening.kept, screening.outcome
            if len(kept) < config.min_clients:
                self.end.refuse(round_id, rows, screened, outcome,
                                f"only {len(kept)} of {len(rows)} updates passed screening; "
                                f"the round needs {config.min_clients}")
                return
            outcome.strategy = strategy.name
        try:
            aggregate = self.aggregation.aggregate(round_id, config, base, rows, kept, strategy, outcome, root)
            candidate = self.publication.candidate(base, aggregate, config.evaluation_sha256)
            reference = self.publication.reference(plan_id, round_id, config, base, candidate)
        except FedzooError as error:  # a bad result (or an aborted SecAgg+), not a crash: fail cleanly and go on
            self.end.refuse(round_id, rows, screened, outcome, f"aggregation failed: {error}")
            return
        outcome.server_seconds = round(time.perf_counter() - started, 4)
        decision = self.publication.decide(candidate, reference, config.max_accuracy_drop, outcome)
        if not decision.publish:
            outcome.refused_model_sha256 = self.context.store.put(candidate.onnx_bytes)
            self.end.refuse(round_id, rows, screened, outcome, f"the aggregate was not published: {decision.reason}")
            return
        sha256 = self.context.store.put(candidate.onnx_bytes)
        crash_point("aggregation.publishing")
        with database.session() as session:
            round_row = self.lifecycle.finish_if_owner(session, round_id, "closed")
            if round_row is None:
                return
            self.context.private.record_release(session, round_id, outcome)
            record_screening(session, rows, screened, config.quarantine, self.context.clock())
            card = self.publication.publish(session, round_row, base, sha256, len(candidate.onnx_bytes),
                                            candidate.measured, outcome)
            self.lifecycle.close(session, round_row, card, strategy, outcome)

