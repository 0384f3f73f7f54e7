"""The round service: the server drives federated rounds, after Bonawitz et al. 2019 ("Towards
Federated Learning at Scale"). `RoundService` composes the stages of a round (`fedzoo.server.fl.stages`:
selection, collection, screening, aggregation, publication) and its lifecycle (`fedzoo.server.fl.lifecycle`).

A round moves `open → collecting → aggregating → closed | failed`:

- **open** (selection): devices check in with `GET /v1/fl/task`; an eligible device (its task and,
  if it says so, model family match the round) is selected until `target x (1 + over_selection)`
  devices are, then the round is **collecting**. Devices not selected are told when to come back
  (pace steering: `retry_after_s`). A sampled DP plan seats each device by a secret coin until its
  selection window ends (`fedzoo.server.fl.sampling`), then collects.
- **reporting** (open or collecting): each selected device uploads one delta against the round's
  base version. Duplicates and stale deltas are refused with 409; deltas are validated (names,
  shapes, dtypes, finite values, size) before they count. An accepted update's bytes go to the
  blob store and its row to the database before the device hears "accepted", so a restart loses
  none.
- **aggregating**: when `target_clients` updates are in (a sampled round: when selection closed and every
  seated device uploaded), or at the deadline with at least
  `min_clients`, one worker claims the round (a conditional UPDATE naming it the lease owner, so two
  workers never aggregate the same round). The owner renews its short lease every second while it
  works, so a crashed owner's round is taken over within `AGGREGATION_LEASE_S` seconds, not minutes.
  It screens the updates (`fedzoo.aggregation.screening`: capped weights, norm bound; robust rounds: weights
  bounded by the round's median, direction screening against the round's median delta, FLTrust scoring
  against a root set, docs/federated-rounds.md; the outcome's `defences` names what ran), runs the
  strategy over the deltas streamed from the blob store, measures the aggregate and its parent on the
  round's evaluation set (`fedzoo.server.fl.evaluation`) and publishes the aggregate as a new model
  version only if it is not worse than the plan's best version (or an anchor) by more than
  `max_accuracy_drop`; devices whose updates keep being left out are quarantined. The closing write
  is again conditional on still owning the lease, so a round is published exactly once. Uploads
  arriving after the claim (stragglers, surplus over-selected devices) get 409. A zoo-wide round's
  aggregation and publication run as a background job of the claiming worker, under the same lease
  (`fedzoo.server.fl.background`): no request waits for the zoo's re-publication, and the round view
  shows its progress (`publication`).
- **failed**: the deadline passed with fewer than `min_clients` updates, too few passed screening,
  the aggregate held non-finite weights, or it was refused for publication. Either way, if the plan
  has rounds left, the next round opens at once (from the last published model).

Private rounds (`privacy.secure_aggregation`, `privacy.dp`, see `fedzoo.server.fl.secure_rounds`): under
SecAgg+ the collecting state has sub-stages in which devices run the protocol instead of uploading deltas,
and aggregation starts from the unmasked sum; under DP the server adds noise and keeps the plan's ledger.

Deadlines are enforced twice: calls into the service first advance the rounds whose deadline or lease
has passed (`advance`), so the state is right whenever anyone looks, and the serving process runs
`advance` in the background (`fedzoo.server.fl.deadlines`), so an overdue round closes or fails, and the
next one opens, with no traffic at all. Device requests (check-ins, uploads, SecAgg+ replies) advance at
most once per `DEVICE_ADVANCE_INTERVAL_S` of the service's clock: at fleet scale they are nearly every
request, and the deadline itself is checked where it matters, in the same write that admits an update or
seats a device.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from fedzoo.aggregation.strategies import make_strategy
from fedzoo.capabilities import Capabilities
from fedzoo.cards import ModelCard
from fedzoo.dp.accountant import PrivacyBudgetExhausted
from fedzoo.errors import InvalidInputError
from fedzoo.secagg.errors import RoundAborted
from fedzoo.server.blobstore import BlobStore
from fedzoo.server.config import DEFAULT_DP_MAX_DELTA
from fedzoo.server.db import Database
from fedzoo.server.fl.background import BackgroundRounds
from fedzoo.server.fl.base_models import BaseModels, RoundBase, max_upload_bytes
from fedzoo.server.fl.eligibility import DECLINED
from fedzoo.server.fl.faults import crash_point
from fedzoo.server.fl.lifecycle import AGGREGATION_LEASE_S, RoundLifecycle
from fedzoo.server.fl.tables import ACTIVE_STATES, FLParticipant, FLRefusedUpload, FLRound, FLUpdate
from fedzoo.server.fl.round_context import RoundContext, as_utc, count_rows, find_round, utc_now
from fedzoo.server.fl.round_kinds import RoundKind
from fedzoo.server.fl.sampling import check_sampling
from fedzoo.server.fl.schemas import RoundConfig, TaskResponse, UpdateMetadata
from fedzoo.server.fl.secure_rounds import DONE, PrivateRounds, sat_out_devices, without_dp_counts
from fedzoo.server.fl.single_model_rounds import SingleModelRounds
from fedzoo.server.fl.stages.aggregation import Aggregation
from fedzoo.server.fl.stages.collection import Collection
from fedzoo.server.fl.stages.publication import Publication
from fedzoo.server.fl.stages.selection import Selection
from fedzoo.server.fl.zoo_plan import ZooPlan, is_zoo
from fedzoo.server.fl.zoo_rounds import ZooRounds
from fedzoo.server.latency import LatencyEstimator
from fedzoo.server.tables import DeviceRecord
from fedzoo.signing import CardSigningKey

log = logging.getLogger(__name__)
DEFAULT_MAX_EXAMPLES_PER_UPDATE = 10_000
DEVICE_ADVANCE_INTERVAL_S = 0.25  # device requests move overdue rounds on at most this often, per process


class RoundService:
    """Creates rounds and drives each through its stages; all state in the database."""

    def __init__(
        self,
        database: Database,
        store: BlobStore,
        estimator: LatencyEstimator,
        signing_key: CardSigningKey,
        clock: Callable[[], datetime] = utc_now,
        aggregation_lease_s: float = AGGREGATION_LEASE_S,
        spill_dir: Path | None = None,
        max_examples_per_update: int = DEFAULT_MAX_EXAMPLES_PER_UPDATE,
        dp_line_max_epsilon: float | None = None,
        dp_max_delta: float = DEFAULT_DP_MAX_DELTA,
    ) -> None:
        self.database, self.store, self.clock = database, store, clock
        self._next_device_advance_at: datetime | None = None
        self.context = RoundContext(database, store, clock, BaseModels(store),
                                    PrivateRounds(database, clock, dp_line_max_epsilon, dp_max_delta),
                                    max_examples_per_update)
        self.private = self.context.private
        self.lifecycle = RoundLifecycle(self.context, self.terms_lines, aggregation_lease_s)
        self.collection = Collection(self.context)
        self.aggregation = Aggregation(self.context, spill_dir)
        self.publication = Publication(self.context, estimator, signing_key)
        self.single_model_rounds = SingleModelRounds(self.context, self.lifecycle, self.aggregation, self.publication)
        self.zoo_rounds = ZooRounds(self.context, self.lifecycle, ZooPlan(self.context, estimator, signing_key))
        self.selection = Selection(self.context, self.kind_of)
        self.background = BackgroundRounds()

    def base_model(self, session: Session, model_id: str) -> RoundBase:
        """The card, ONNX bytes and trainable parameters of a published model (cached: blobs are immutable)."""
        return self.context.bases.get(session, model_id)

    # admin: rounds --------------------------------------------------------------------------------

    def kind_of(self, config: RoundConfig) -> RoundKind:
        """The round kind that runs a plan (`fedzoo.server.fl.round_kinds`): zoo-wide, or of one model."""
        return self.zoo_rounds if is_zoo(config) else self.single_model_rounds

    def terms_lines(self, session: Session, config: RoundConfig, card: ModelCard) -> list[str]:
        """The model lines a round of the plan on `card` touches, checked against the operator's privacy terms
        (`RoundKind.terms_lines`)."""
        return self.kind_of(config).terms_lines(session, config, card)

    def create_round(self, config: RoundConfig) -> int:
        """Open the first round of a plan of `config.num_rounds` rounds; returns its id."""
        strategy = make_strategy(config.strategy)  # refuse a bad strategy now, not at aggregation
        check_sampling(config)
        with self.database.session() as session:
            config, card = self.kind_of(config).open_plan(session, config, strategy)
            try:
                round_row = self.lifecycle.open_round(session, config, card, number=1, remaining=config.num_rounds,
                                                      previous=None)
            except PrivacyBudgetExhausted as error:
                raise InvalidInputError(str(error), field="privacy.dp.max_epsilon") from None
            return round_row.id

    # devices: selection and collection -------------------------------------------------------------

    def check_in(self, device_id: str, task: str, family: str | None = None,
                 capabilities: Capabilities = Capabilities()) -> TaskResponse:
        """Select the device for a round it is capable of and return its task, or tell it when to come back."""
        self._advance_for_device()
        return self.selection.check_in(device_id, task, family, capabilities)

    def decline(self, device_id: str, round_id: int, reason: str, message: str) -> dict[str, Any]:
        """A selected device will not do the round's task (`Selection.decline`)."""
        return self.selection.decline(device_id, round_id, reason, message)

    @staticmethod
    def max_upload_bytes(base: RoundBase) -> int:
        return max_upload_bytes(base)

    def max_masked_vector_bytes(self, round_id: int) -> int:
        """The most a masked vector of this round can be: 4 bytes a value of its longest cohort's vector (its exact
        size is checked later); before cohorts exist, what an update of the round's model can be."""
        with self.database.session() as session:
            round_row = find_round(session, round_id)  # 404 for a round id that is no round's, before any query
            longest = self.private.longest_vector(session, round_id)
            if longest is not None:
                return 4 * (longest + 1)
            return max_upload_bytes(self.base_model(session, round_row.base_model_id))

    def submit_update(self, device_id: str, round_id: int, metadata: UpdateMetadata, data: bytes) -> dict[str, Any]:
        """Admit one device's delta, or refuse it naming why (a selected device's refusal is recorded for the
        operator as late or rejected); aggregates when the target is reached."""
        self._advance_for_device()
        admitted = self.collection.submit(device_id, round_id, metadata, data)
        if admitted.target_reached:
            try:
                self._aggregate_if_claimed(round_id)
            except Exception:  # the update is stored and counts: say so; the lease lets another try again
                log.exception("aggregating round %s failed; it is retried when the lease runs out", round_id)
        with self.database.session() as session:
            state = session.get(FLRound, round_id).state
        return {**admitted.receipt, "round_state": state}

    # deadlines ----------------------------------------------------------------------------------------

    def advance(self) -> None:
        """Move every round whose deadline or aggregation lease has passed to its next state."""
        for round_id, stage in self.private.overdue_stages():
            self._close_secure_stage(round_id, stage)
        for round_id in self.selection.sampled_rounds_ready():
            self._aggregate_if_claimed(round_id)
        now = self.clock()
        with self.database.session() as session:
            due = list(session.scalars(
                select(FLRound.id).where(or_(
                    FLRound.state.in_(ACTIVE_STATES) & (FLRound.deadline_at <= now),
                    (FLRound.state == "aggregating") & (FLRound.aggregation_lease_until <= now),
                ))
            ))
        for round_id in due:
            with self.database.session() as session:
                round_row = session.get(FLRound, round_id)
                accepted = count_rows(session, FLUpdate, round_id)
                config = RoundConfig.model_validate_json(round_row.config_json)
                if round_row.state in ACTIVE_STATES and not self._ready(session, round_row, config, accepted):
                    # claim the failure with a conditional UPDATE: of several workers (or the background
                    # deadline check and a request) exactly one fails the round and opens the next
                    claimed = session.execute(
                        update(FLRound).where(FLRound.id == round_id, FLRound.state.in_(ACTIVE_STATES))
                        .values(state="failed")
                    ).rowcount
                    if claimed:
                        session.refresh(round_row)
                        self.lifecycle.fail(session, round_row,
                                            self._deadline_failure(session, round_row, config, accepted))
                    continue
            self._aggregate_if_claimed(round_id)

    def _advance_for_device(self) -> None:
        """`advance()`, unless this process did within the last `DEVICE_ADVANCE_INTERVAL_S` (two queries a
        request otherwise: 14% of the server's time in a round of 200 devices)."""
        now = self.clock()
        if self._next_device_advance_at is not None and now < self._next_device_advance_at:
            return
        self._next_device_advance_at = now + timedelta(seconds=DEVICE_ADVANCE_INTERVAL_S)
        self.advance()

    def _ready(self, session: Session, round_row: FLRound, config: RoundConfig, accepted: int) -> bool:
        """Whether a round at its deadline has what aggregation needs: enough updates, or a finished SecAgg+."""
        if config.privacy.secure_aggregation is not None:
            return self.private.stage_of(session, round_row.id) == DONE
        return accepted >= config.min_clients

    def _deadline_failure(self, session: Session, round_row: FLRound, config: RoundConfig, accepted: int) -> str:
        if config.privacy.secure_aggregation is not None:
            return (f"secure aggregation was at stage {self.private.stage_of(session, round_row.id)!r} when the "
                    "round's deadline passed")
        return f"only {accepted} of the minimum {config.min_clients} updates arrived by the deadline"

    # devices: SecAgg+ stages -----------------------------------------------------------------------

    def submit_secure_reply(self, device_id: str, round_id: int, stage: str, body: bytes) -> dict[str, Any]:
        """Store a device's reply to a SecAgg+ stage; closes the stage when it has every reply it waits for."""
        self._advance_for_device()
        with self.database.session() as session:
            round_row = find_round(session, round_id)
            session.expunge(round_row)
        receipt = self.private.submit(device_id, round_row, stage, body)
        if receipt["received"] >= receipt["expected"]:
            self._close_secure_stage(round_id, stage)
        with self.database.session() as session:
            receipt["round_state"] = session.get(FLRound, round_id).state
            receipt["current_stage"] = self.private.stage_of(session, round_id)
        return receipt

    def _close_secure_stage(self, round_id: int, stage: str) -> None:
        """Move a SecAgg+ stage on (once, whichever worker gets here first); at the end, aggregate; a stage
        that leaves too few devices fails the round."""
        try:
            opened = self.private.close_stage(round_id, stage)
        except RoundAborted as error:
            self.lifecycle.fail_active(round_id, f"secure aggregation aborted after {stage!r}: {error}")
            return
        if opened == DONE:
            try:
                self._aggregate_if_claimed(round_id)
            except Exception:  # every reply is stored: the round is aggregated again when the lease runs out
                log.exception("aggregating round %s failed; it is retried when the lease runs out", round_id)

    # screening, aggregation, publication -----------------------------------------------------------

    def _aggregate_if_claimed(self, round_id: int) -> None:
        """Aggregate the round if this call claims it: as a background job (`fedzoo.server.fl.background`) where
        its kind closes in the background, so no request waits for a zoo's publication."""
        if not self.lifecycle.claim_aggregation(round_id):
            return
        crash_point("aggregation.claimed")
        with self.database.session() as session:
            kind = self.kind_of(RoundConfig.model_validate_json(session.get(FLRound, round_id).config_json))
        if kind.closes_in_background:
            self.lifecycle.record_publication(round_id, {"stage": "queued"})
            self.background.start(round_id, lambda: self._aggregate_with_lease(round_id))
        else:
            self._aggregate_with_lease(round_id)

    def _aggregate_with_lease(self, round_id: int) -> None:
        with self.lifecycle.renewing_lease(round_id):
            self._aggregate(round_id)

    def _aggregate(self, round_id: int) -> None:
        """The round's updates, its devices revoked since and its strategy, handed to its kind to close."""
        with self.database.session() as session:
            round_row = session.get(FLRound, round_id)
            config = RoundConfig.model_validate_json(round_row.config_json)
            rows = list(session.scalars(select(FLUpdate).where(FLUpdate.round_id == round_id).order_by(FLUpdate.id)))
            revoked = frozenset(session.scalars(select(DeviceRecord.id).where(
                DeviceRecord.id.in_({row.device_id for row in rows}), DeviceRecord.revoked_at.is_not(None))))
            previous_state = round_row.strategy_state_sha256
        strategy = self.aggregation.strategy(config, previous_state)
        self.kind_of(config).close(round_id, config, rows, revoked, strategy)

    # reading -------------------------------------------------------------------------------------

    def round_view(self, round_id: int) -> dict[str, Any]:
        """Everything about one round: state, configuration, counts, bytes on the wire and outcome."""
        self.advance()
        with self.database.session() as session:
            round_row = find_round(session, round_id)
            upload_bytes = session.scalar(
                select(func.coalesce(func.sum(FLUpdate.upload_bytes), 0)).where(FLUpdate.round_id == round_id)
            )
            accepted = count_rows(session, FLUpdate, round_id)
            secure = self.private.progress(session, round_id)
            if secure is not None:  # under SecAgg+ the updates are the masked inputs; bytes are every stage's
                accepted, upload_bytes = secure
            next_round = session.scalar(select(FLRound.id).where(FLRound.previous_round_id == round_id))
            view = {
                "id": round_row.id, "number": round_row.number, "rounds_remaining": round_row.rounds_remaining,
                "state": round_row.state, "task": round_row.task, "family": round_row.family,
                "base_model_id": round_row.base_model_id, "base_version": round_row.base_version,
                "config": json.loads(round_row.config_json), "created_at": as_utc(round_row.created_at),
                "deadline_at": as_utc(round_row.deadline_at),
                "finished_at": as_utc(round_row.finished_at) if round_row.finished_at else None,
                "selected_devices": count_rows(session, FLParticipant, round_id),
                "accepted_updates": accepted, "upload_bytes": int(upload_bytes),
                "result_model_id": round_row.result_model_id,
                "outcome": json.loads(round_row.outcome_json) if round_row.outcome_json else None,
                "next_round_id": next_round,
                "publication": json.loads(round_row.publication_json) if round_row.publication_json else None,
                "declined_devices": session.scalar(select(func.count()).select_from(FLRefusedUpload).where(
                    FLRefusedUpload.round_id == round_id, FLRefusedUpload.kind == DECLINED)) or 0,
                "sat_out_devices": sat_out_devices(session, round_id),
            }
        return without_dp_counts(view) if view["config"]["privacy"]["dp"] else view
