"""A round's lifecycle in the database: opening it (and the plan's next one), the aggregation lease, and
closing or failing it.

When a round has its target updates, or is at its deadline with at least `min_clients`, one worker claims it
(a conditional UPDATE naming it the lease owner, so two workers never aggregate the same round). The owner
renews its short lease every second while it works, so a crashed owner's round is taken over within
`AGGREGATION_LEASE_S` seconds, not minutes. The closing write is again conditional on still owning the
lease, so a round is published exactly once. Either way a round ends, if the plan has rounds left, the next
round opens at once (from the last published model).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

from sqlalchemy import or_, update
from sqlalchemy.orm import Session

from fedzoo.aggregation.strategies import Strategy
from fedzoo.cards import ModelCard
from fedzoo.dp.accountant import PrivacyBudgetExhausted
from fedzoo.server import registry
from fedzoo.server.errors import BreaksPrivacyTerms
from fedzoo.server.fl.outcome import RoundOutcome
from fedzoo.server.fl.tables import ACTIVE_STATES, FLRound
from fedzoo.server.fl.round_context import RoundContext
from fedzoo.server.fl.schemas import RoundConfig
from fedzoo.server.fl.secure_rounds import config_for_round
from fedzoo.server.fl.terms_gate import check_plan_terms
from fedzoo.server.fl.zoo_plan import round_identity

log = logging.getLogger(__name__)
AGGREGATION_LEASE_S = 4.0  # renewed every LEASE_RENEWAL_S while the owner works: a crash costs at most this
LEASE_RENEWAL_S = 1.0
TermsLines = Callable[[Session, RoundConfig, ModelCard], list[str]]  # the lines a plan's round touches (its kind's)


class RoundLifecycle:
    """Opens, claims, closes and fails rounds; every change of state is a conditional write."""

    def __init__(self, context: RoundContext, terms_lines: TermsLines,
                 aggregation_lease_s: float = AGGREGATION_LEASE_S) -> None:
        self.context, self.terms_lines = context, terms_lines
        self.aggregation_lease_s = aggregation_lease_s
        # who holds an aggregation lease: unique per service instance, readable in the database
        self.owner_id = f"{socket.gethostname()[:32]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"

    def open_round(self, session: Session, config: RoundConfig, card: ModelCard, number: int, remaining: int,
                   previous: FLRound | None) -> FLRound:
        """Open round `number` of a plan on `card`; raises `PrivacyBudgetExhausted` when over the ε budget, and
        `BreaksPrivacyTerms` when the operator's newest privacy terms cover a line it touches and every device would
        refuse its tasks (`fedzoo.server.fl.terms_gate`: checked for every round, since terms may arrive mid-plan)."""
        config = config_for_round(config, previous)  # adaptive clipping: the clip norm the last round moved to
        check_plan_terms(session, config, lambda: self.terms_lines(session, config, card))
        ledger = self.context.private.ledger_for_next_round(session, config, card, previous, remaining)  # raises over budget
        now = self.context.clock()
        task, family = round_identity(card)
        round_row = FLRound(
            task=task,
            family=family,
            number=number,
            rounds_remaining=remaining,
            previous_round_id=previous.id if previous else None,
            state="open",
            base_model_id=card.id,
            base_version=card.version,
            config_json=config.model_copy(update={"model_id": card.id}).model_dump_json(),
            created_at=now,
            deadline_at=now + timedelta(seconds=config.deadline_s),
            strategy_state_sha256=previous.strategy_state_sha256 if previous else None,
        )
        session.add(round_row)
        session.flush()
        round_row.plan_id = previous.plan_id if previous else round_row.id
        self.context.private.record_open(session, round_row, config, ledger)
        return round_row

    def claim_aggregation(self, round_id: int) -> bool:
        """Take the round's aggregation lease if it is active, or its owner's lease ran out."""
        now = self.context.clock()
        lease_until = now + timedelta(seconds=self.aggregation_lease_s)
        with self.context.database.session() as session:
            return bool(session.execute(
                update(FLRound)
                .where(FLRound.id == round_id, or_(
                    FLRound.state.in_(ACTIVE_STATES),
                    (FLRound.state == "aggregating") & (FLRound.aggregation_lease_until <= now),
                ))
                .values(state="aggregating", aggregation_lease_until=lease_until, aggregation_owner=self.owner_id)
            ).rowcount)

    @contextmanager
    def renewing_lease(self, round_id: int) -> Iterator[None]:
        """Renew this service's aggregation lease on the round every LEASE_RENEWAL_S while the block runs."""
        stopped = threading.Event()

        def renew() -> None:
            while not stopped.wait(min(LEASE_RENEWAL_S, self.aggregation_lease_s / 4)):
                try:
                    with self.context.database.session() as session:
                        session.execute(
                            update(FLRound).where(FLRound.id == round_id, FLRound.state == "aggregating",
                                                  FLRound.aggregation_owner == self.owner_id)
                            .values(aggregation_lease_until=self.context.clock()
                                    + timedelta(seconds=self.aggregation_lease_s))
                        )
                except Exception:  # a missed renewal only risks a takeover, which the closing write detects
                    log.exception("renewing the aggregation lease of round %s failed", round_id)

        renewer = threading.Thread(target=renew, name=f"fedzoo-fl-lease-{round_id}", daemon=True)
        renewer.start()
        try:
            yield
        finally:
            stopped.set()
            renewer.join()

    def record_publication(self, round_id: int, progress: dict[str, Any]) -> None:
        """Write a background publication's progress to the round, if this service still holds its lease."""
        with self.context.database.session() as session:
            session.execute(
                update(FLRound).where(FLRound.id == round_id, FLRound.state == "aggregating",
                                      FLRound.aggregation_owner == self.owner_id)
                .values(publication_json=json.dumps(progress))
            )

    def finish_if_owner(self, session: Session, round_id: int, state: str) -> FLRound | None:
        """Move the round out of `aggregating` only if this service still holds its lease: of two services
        that both aggregated (one stalled past its lease), exactly one publishes."""
        owned = session.execute(
            update(FLRound).where(FLRound.id == round_id, FLRound.state == "aggregating",
                                  FLRound.aggregation_owner == self.owner_id)
            .values(state=state)
        ).rowcount
        if not owned:
            log.warning("round %s: the aggregation lease passed to another server; this result is dropped", round_id)
            return None
        return session.get(FLRound, round_id)

    def fail_active(self, round_id: int, reason: str) -> None:
        """Fail a round still collecting (a conditional claim: one worker does it) and go on with the plan."""
        with self.context.database.session() as session:
            claimed = session.execute(
                update(FLRound).where(FLRound.id == round_id, FLRound.state.in_(ACTIVE_STATES)).values(state="failed")
            ).rowcount
            if claimed:
                round_row = session.get(FLRound, round_id)
                session.refresh(round_row)
                self.fail(session, round_row, reason)

    def close(self, session: Session, round_row: FLRound, card: ModelCard, strategy: Strategy,
              outcome: RoundOutcome) -> None:
        """Record a published round's result and the strategy's state, and open the plan's next round."""
        config = RoundConfig.model_validate_json(round_row.config_json)
        round_row.state = "closed"
        round_row.result_model_id = card.id
        round_row.finished_at = self.context.clock()
        round_row.aggregation_lease_until = None
        state = strategy.state()
        if state:
            round_row.strategy_state_sha256 = self.context.save_npz(state)
        round_row.outcome_json = replace(outcome, metrics=card.metrics.model_dump()).to_json()
        self.context.private.record_seat_failures(session, round_row.id, config.quarantine, self.context.clock())
        self.open_next(session, round_row, config, card)

    def fail(self, session: Session, round_row: FLRound, reason: str, outcome: RoundOutcome | None = None) -> None:
        """Record why the round failed, and open the plan's next round from the base it had."""
        round_row.state = "failed"
        round_row.finished_at = self.context.clock()
        round_row.aggregation_lease_until = None
        round_row.outcome_json = replace(outcome or RoundOutcome(), failure=reason).to_json()
        config = RoundConfig.model_validate_json(round_row.config_json)
        self.context.private.record_seat_failures(session, round_row.id, config.quarantine, self.context.clock())
        card = ModelCard.from_dict(registry.get_card(session, round_row.base_model_id))
        self.open_next(session, round_row, config, card)

    def open_next(self, session: Session, round_row: FLRound, config: RoundConfig, card: ModelCard) -> None:
        if round_row.rounds_remaining > 1:
            try:
                self.open_round(session, config, card, round_row.number + 1, round_row.rounds_remaining - 1, round_row)
            except (PrivacyBudgetExhausted, BreaksPrivacyTerms) as error:  # the plan stops here; the round says why
                round_row.outcome_json = json.dumps({**json.loads(round_row.outcome_json or "{}"),
                                                     "plan_stopped": str(error)})
