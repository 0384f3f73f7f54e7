"""Zoo-wide rounds (`POST /v1/fl/zoo-rounds`, docs/zoo-federated.md): every seated device trains the subnet of the
zoo model its budget affords, and the round improves the one supernet every zoo model shares; the round kind
(`fedzoo.server.fl.round_kinds`) over `fedzoo.server.fl.zoo_plan.ZooPlan`, which knows the supernet.

Closing a round: screening per subnet and per-element aggregation onto the supernet in the clear, or under
SecAgg+ every subnet cohort's unmasked sum combined per element (noised per cohort under DP,
`fedzoo.server.fl.zoo_privacy`); then every zoo model re-extracted and measured, and the new supernet and the
zoo models that pass the gate published. This runs as a background job of the claiming worker (no request waits
for the zoo's re-publication); the round view shows its progress (`publication`).
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.orm import Session

from fedzoo.aggregation.strategies import Strategy
from fedzoo.cards import ModelCard
from fedzoo.dp.accountant import PrivacyBudgetExhausted
from fedzoo.errors import FedzooError, InvalidInputError
from fedzoo.server.fl.faults import crash_point
from fedzoo.server.fl.lifecycle import RoundLifecycle
from fedzoo.server.fl.outcome import RoundOutcome, UpdateCounts
from fedzoo.server.fl.round_context import RoundContext
from fedzoo.server.fl.round_kinds import RoundEnd, check_evaluation_set, check_secure_cohort, with_example_cap
from fedzoo.server.fl.schemas import RoundConfig
from fedzoo.server.fl.secure_rounds import SeatGroup, check_planned_ring, cohort_tally, with_calibrated_noise
from fedzoo.server.fl.stages.screening import record_screening, round_defences
from fedzoo.server.fl.tables import FLRound, FLUpdate
from fedzoo.server.fl.zoo_plan import Supernet, ZooOutcome, ZooPlan
from fedzoo.server.fl.zoo_privacy import charge_zoo_lines, check_zoo_lines, longest_subnet, zoo_noise


class ZooRounds:
    """The zoo-wide round kind (`fedzoo.server.fl.round_kinds.RoundKind`)."""

    closes_in_background = True  # re-extracting and measuring every zoo model takes seconds to minutes

    def __init__(self, context: RoundContext, lifecycle: RoundLifecycle, zoo: ZooPlan) -> None:
        self.context, self.lifecycle, self.zoo = context, lifecycle, zoo
        self.end = RoundEnd(context, lifecycle)

    def open_plan(self, session: Session, config: RoundConfig, strategy: Strategy) -> tuple[RoundConfig, ModelCard]:
        config = with_example_cap(config, self.context)
        check_secure_cohort(config)
        supernet = self.zoo.check_plan(session, config, strategy)
        private = self.context.private
        if config.privacy.dp is not None:
            config = with_calibrated_noise(private.with_delta(session, config, supernet.card))
            archs = [member.arch for member in self.zoo.members(session, supernet)]
            check_planned_ring(config, longest_subnet(supernet.space, supernet.weights, archs))
            try:
                check_zoo_lines(session, self.zoo.zoo_models(session, supernet), config, private.line_max_epsilon)
            except PrivacyBudgetExhausted as error:
                raise InvalidInputError(str(error), field="privacy.dp.max_epsilon") from None
        check_evaluation_set(self.context.store, config.evaluation_sha256, supernet.card)
        self.zoo.measure_task(session, supernet, config.evaluation_sha256)  # lookup ranks on this set
        return config, supernet.card

    def terms_lines(self, session: Session, config: RoundConfig, card: ModelCard) -> list[str]:
        return self.zoo.terms_lines(session, self.zoo.supernet(session, card.id), config.zoo)

    def seat(self, session: Session, round_row: FLRound, config: RoundConfig, device_id: str) -> bool:
        """Only with a subnet that fits the device's budget (recorded as its assignment)."""
        return self.zoo.assign(session, round_row, config, device_id) is not None

    def seat_group(self, session: Session, round_row: FLRound, device_id: str) -> SeatGroup:
        """One SecAgg+ cohort per subnet (`ZooPlan.seat_group`)."""
        return self.zoo.seat_group(session, round_row.id, device_id)

    def close(self, round_id: int, config: RoundConfig, rows: list[FLUpdate], revoked: frozenset[str],
              strategy: Strategy) -> None:
        private, clock = self.context.private, self.context.clock
        with self.context.database.session() as session:
            round_row = session.get(FLRound, round_id)
            supernet = self.zoo.supernet(session, round_row.base_model_id)
            screening = self.zoo.screen(session, rows, config, revoked)
            members = self.zoo.members(session, supernet)
            secure = private.progress(session, round_id)  # SecAgg+: (masked inputs, bytes of every reply)
            variants = {member.id: self.zoo.int8_variants(session, supernet, member) for member in members}
        started = clock()
        progress: dict[str, Any] = {"started_at": started.isoformat(), "zoo_models_total": len(members)}

        def report(stage: str, **fields: Any) -> None:
            progress.update(stage=stage, **fields)
            self.lifecycle.record_publication(round_id, progress)

        if secure is None and len(screening.kept) < config.min_clients:
            report("refused")
            self.end.refuse(round_id, rows, screening.screened, screening.outcome,
                            f"only {len(screening.kept)} of {len(rows)} updates passed screening; "
                            f"the round needs {config.min_clients}")
            return
        aggregated: ZooOutcome | None = None
        try:
            report("aggregating")
            if secure is not None:
                aggregated = self._aggregate_cohorts(round_id, config, supernet, strategy, secure[1])
            else:
                aggregated = self.zoo.aggregate(round_id, config, supernet, rows, screening, strategy)
            publication = self.zoo.re_extract(config, supernet, aggregated.weights, members, variants,
                                              lambda done: report("re-extracting", zoo_models_done=done,
                                                                  zoo_models_total=len(members)))
        except FedzooError as error:  # a noised aggregate made before the failure is charged (`record_release`)
            report("refused")
            self.end.refuse(round_id, rows, screening.screened,
                            aggregated.outcome if aggregated else screening.outcome, f"aggregation failed: {error}")
            return
        report("publishing", zoo_models_done=len(members))
        crash_point("aggregation.publishing")
        with self.context.database.session() as session:
            round_row = self.lifecycle.finish_if_owner(session, round_id, "closed")
            if round_row is None:
                return
            private.record_release(session, round_id, aggregated.outcome)
            record_screening(session, rows, aggregated.screened, config.quarantine, clock())
            claims = charge_zoo_lines(session, self.zoo.zoo_models(session, supernet), aggregated.outcome, clock)
            card = self.zoo.publish(session, round_row, supernet, aggregated.weights, publication, aggregated.outcome,
                                    claims)
            finished = clock()
            round_row.publication_json = json.dumps({
                **progress, "stage": "published", "finished_at": finished.isoformat(),
                "seconds": round((finished - started).total_seconds(), 3), "new_versions": len(publication.new_cards)})
            self.lifecycle.close(session, round_row, card, strategy, aggregated.outcome)

    def _aggregate_cohorts(self, round_id: int, config: RoundConfig, supernet: Supernet, strategy: Strategy,
                           upload_bytes: int) -> ZooOutcome:
        """Under SecAgg+: every cohort's unmasked sum combined per element (`ZooPlan.aggregate_cohorts`), the
        round's devices counted over the cohorts. Raises RoundAborted or InvalidInputError."""
        sums = self.context.private.unmasked_sums(round_id, config)
        survivors = sum(cohort.count for cohort in sums)
        if survivors < config.min_clients:
            raise InvalidInputError(f"the cohorts' sums hold {survivors} devices' updates; the round needs "
                                    f"{config.min_clients}")
        outcome = RoundOutcome(counts=UpdateCounts(survivors, survivors, None), upload_bytes=upload_bytes,
                               secure_aggregation=cohort_tally(sums), defences=round_defences(config, None))
        with self.context.database.session() as session:
            archs = [member.arch for member in self.zoo.members(session, supernet)]
        noise = zoo_noise(self.context.database, round_id, config, supernet.space, supernet.weights, archs, sums,
                          outcome)
        return self.zoo.aggregate_cohorts(round_id, config, supernet, sums, strategy, outcome, upload_bytes, noise)
