"""Private rounds over REST: SecAgg+ stages as sub-states of a collecting round, and DP-FedAvg's noise and ledger.

A round whose config has `privacy.secure_aggregation` runs the five stages of `fedzoo.secagg` while it is
`collecting`: when selection closes, the selected devices are numbered 0 .. n-1 (in the order they were
seated) and the stage moves `selection → advertise_keys → share_keys → masked_input → consistency_check →
unmask → done`. Only devices that registered a signing key are seated: their signatures on their keys and on
the survivor set are checked against it here (422 `signature`) and again by their neighbours.
Each stage closes when every device it waits for replied, or at its own deadline (`stage_deadline_s`,
never past the round's); a device that missed a stage is out of the later ones (a dropout, which the
protocol recovers from). At `done` the round aggregates like any other, under the aggregation lease.

The server's protocol state is never kept in memory only: every accepted reply is a row
(`FLSecureMessage`), written in the same transaction as a conditional write on the stage, so a reply
either belongs to a stage that was still open or is refused (409). `SecAggServer` is a deterministic
function of those rows, so any gunicorn worker, or a restarted server, rebuilds it by replaying the closed
stages (cached per stage: a closed stage's rows never change). Closing a stage is again a conditional
UPDATE, so exactly one worker moves it on.

DP-FedAvg (`privacy.dp`): devices clip their delta to `clip_norm` (fixed, or adapted each round from a noised,
centred count: `privacy.dp.adaptive`; under SecAgg+ each device's "not clipped" bit is one more coordinate of its
masked vector, `carries_unclipped_bit`, and the unmasked sum's last coordinate, checked to be a count, is split off
and noised as without SecAgg+); the server adds discrete Gaussian noise drawn from
`os.urandom` (`fedzoo.dp`) to the sum put on an integer grid, which under SecAgg+ is the unmasked sum (the server
never needs a clear update), and divides by `target_clients`. A DP round publishes no contributor count, on its card
or in its read (`published_counts`, `without_dp_counts`). Weights are equal: under SecAgg+ the weight coordinate of
the sum must equal the number of survivors, else the round fails. Without DP, SecAgg+ rounds weigh updates equally
too unless the round keeps FedAvg's example weights, and the unmasked sum must lie within what clipped updates can
add up to (`fedzoo.aggregation.private.check_secure_sum`, docs/privacy.md "Robust rounds under SecAgg+"). The plan's ledger is stored with each
round; a round that would take epsilon past `max_epsilon` does not open.

One ledger per model line (`PrivacyLine`), found from the weights (`privacy_lineage`): a plan on a model continues
the ledger of the DP line its weights were released under or derive from (the same blob under another card, a
parent), or the signed claim's ledger for weights new to this server, so epsilon composes across plans and each card
states the line's total; a plan without DP on such weights is refused. A plan that would take the line past the
operator's lifetime budget (`FEDZOO_DP_LINE_MAX_EPSILON`) is refused before it opens, and one DP plan at a time runs
on a line, so two plans never compose from the same starting point.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
from sqlalchemy import and_, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fedzoo.aggregation.private import DifferentialPrivacy, check_secure_sum, clipped_sum
from fedzoo.aggregation.strategies import Parameters, Strategy
from fedzoo.cards import ModelCard
from fedzoo.dp.accountant import LineEvents, PrivacyLedger, epsilon_of_events, noise_multiplier_for
from fedzoo.dp.noise import AdaptiveClipping, DpFedAvg, adaptive_noise_split
from fedzoo.errors import InvalidInputError
from fedzoo.secagg import SecAggConfig, SecAggServer, dequantise_sum, signatures, unflatten
from fedzoo.secagg.bounds import cohort_config
from fedzoo.secagg.config import MIN_CLIENTS
from fedzoo.secagg.crypto import MASK_DTYPES
from fedzoo.secagg.errors import ProtocolViolation, RoundAborted
from fedzoo.secagg.framing import decode_share_keys, decode_unmask
from fedzoo.secagg.messages import STAGES, from_base64, to_base64
from fedzoo.server import device_certificates
from fedzoo.server.db import Database
from fedzoo.server.errors import Conflict, Forbidden, ValidationFailed
from fedzoo.server.fl import quarantine
from fedzoo.server.fl.distributed_dp import (card_noise, check_distributed_plan, is_distributed, noise_request,
                                             noise_slack, released_mean)
from fedzoo.server.fl.outcome import RoundOutcome, ScreeningTally, SecureAggregationTally, UpdateCounts
from fedzoo.server.fl.tables import (ACTIVE_STATES, FLParticipant, FLPrivateRound, FLRefusedUpload, FLRound,
                                    FLSecureCohort, FLSecureMessage, FLSubnetAssignment, PrivacyLine, SEAT_FAILURES)
from fedzoo.server.fl.privacy_lineage import lineage_claim
from fedzoo.server.fl.schemas import (DpSettings, QuarantinePolicy, RoundConfig, SecureAggregationSettings,
                                     SecureAggregationTask, TaskPrivacy)
from fedzoo.server.tables import DeviceRecord

SELECTION, DONE = "selection", "done"
COLLECT = {"advertise_keys": "collect_keys", "share_keys": "collect_shares", "masked_input": "collect_masked_inputs",
           "consistency_check": "collect_consistency"}
MAX_CACHED_STAGES = 16
# how each stage's stored reply reads back as the dict `SecAggServer` takes (share replies are kept framed)
READ_REPLY: dict[str, Callable[[bytes], dict[str, Any]]] = {
    "advertise_keys": json.loads, "share_keys": decode_share_keys,
    "masked_input": lambda body: {"masked_vector": to_base64(body)}, "consistency_check": json.loads,
    "unmask": decode_unmask}
DEFAULT_DELTA = 1e-5  # a new line's delta: min(this, 1 / n^2) for a fleet of n devices
DP_COUNTS_WITHHELD = "differential privacy: how many devices took part depends on who did"
MIN_COHORT = MIN_CLIENTS  # SecAgg+'s least cohort: of two, each reads the other's input from the sum
SAT_OUT = "sat_out"  # a seated device whose subnet's group was below MIN_COHORT (an `FLRefusedUpload` kind)
SIT_OUT = ("fewer than 3 seated devices train this device's subnet, SecAgg+'s least cohort: no cohort is formed "
           "for it, and this device sits the round out")


@dataclass(frozen=True)
class SeatGroup:
    """What makes seated devices one SecAgg+ cohort: the tensors they train (`name`: '' in a round of one model, the
    training card's id in a zoo-wide round) and the length of that update vector."""

    name: str
    vector_length: int


@dataclass(frozen=True)
class CohortSum:
    """One cohort's unmasked sum, dequantised and checked: what `name`'s devices' updates add up to."""

    name: str
    total: np.ndarray
    total_weight: float
    count: int
    protocol: SecAggConfig
    tally: SecureAggregationTally


def is_private(config: RoundConfig) -> bool:
    return config.privacy.secure_aggregation is not None or config.privacy.dp is not None


def next_stage(stage: str) -> str:
    order = (SELECTION, *STAGES, DONE)
    return order[order.index(stage) + 1]


def secagg_config(settings: SecureAggregationSettings, round_id: int, cohort: int, vector_length: int,
                  clip_range: float, min_clients: int, subnet: int | None = None) -> SecAggConfig:
    """The round's SecAgg+ parameters for a cohort of `cohort` devices (`fedzoo.secagg.bounds.cohort_config`, the
    rule the in-process simulator uses too). Its id, which every signature is bound to, is `fl-round-<round>`, or
    `fl-round-<round>/subnet-<i>` for the i-th cohort of a round with one cohort per subnet."""
    protocol_id = f"fl-round-{round_id}" if subnet is None else f"fl-round-{round_id}/subnet-{subnet}"
    return cohort_config(protocol_id, cohort, vector_length, clip_range, settings.levels,
                         settings.neighbour_count, settings.threshold, min_clients, settings.survivor_fraction)


def check_planned_ring(config: RoundConfig, vector_length: int) -> None:
    """A distributed-noise plan: 422 without SecAgg+, or when the ring of a cohort of any size the round may form (up
    to the selection goal; in a zoo-wide round from `MIN_COHORT`, one cohort per subnet) cannot hold its noised sums
    (`distributed_dp.check_distributed_plan`). Every size: a smaller cohort may get a 16-bit ring where the goal's
    gets 32 bits, and its sums carry more noise per input (its honest floor is a smaller share of it)."""
    settings, dp = config.privacy.secure_aggregation, config.privacy.dp
    if not is_distributed(config):
        return
    if settings is None:
        check_distributed_plan(config, None)
        return
    goal = math.ceil(config.target_clients * (1 + config.over_selection))
    floor = MIN_COHORT if config.zoo is not None else config.min_clients  # as `start_stages` sizes the cohorts
    for cohort in range(min(max(MIN_COHORT, floor), goal), goal + 1):
        check_distributed_plan(config, secagg_config(settings, 0, cohort, vector_length, dp.clip_norm, floor))


def with_calibrated_noise(config: RoundConfig) -> RoundConfig:
    """The config with DP's noise multiplier filled in (the smallest that spends max_epsilon over the plan at its
    sampling probability: `fedzoo.server.fl.sampling`)."""
    dp = config.privacy.dp
    if dp is None:
        return config
    try:
        noise = dp.noise_multiplier or noise_multiplier_for(dp.max_epsilon, dp.delta, config.num_rounds,
                                                            dp.sampling_probability, dp.mechanism)
    except InvalidInputError as error:
        raise InvalidInputError(str(error), field="privacy.dp.max_epsilon") from None
    if dp.adaptive is not None:
        try:
            adaptive_noise_split(noise, config.target_clients, dp.adaptive.clipped_count_stddev)
        except InvalidInputError as error:
            raise InvalidInputError(str(error), field="privacy.dp.adaptive.clipped_count_stddev") from None
    privacy = config.privacy.model_copy(update={"dp": dp.model_copy(update={"noise_multiplier": noise})})
    return config.model_copy(update={"privacy": privacy})


class PrivateRounds:
    """The private part of the round service: stage state, replies, the secure sum, noise and the ledger."""

    def __init__(self, database: Database, clock: Callable[[], datetime], line_max_epsilon: float | None = None,
                 max_delta: float = 1e-5) -> None:
        self.database, self.clock, self.line_max_epsilon, self.max_delta = database, clock, line_max_epsilon, max_delta
        self._replayed: OrderedDict[tuple[int, int, str], tuple[SecAggServer, dict[int, dict[str, Any]]]] = \
            OrderedDict()

    # opening rounds ------------------------------------------------------------------------------

    def with_delta(self, session: Session, config: RoundConfig, card: ModelCard) -> RoundConfig:
        """The DP config with its delta filled in (the line's; for a new line min(1e-5, 1/n^2) for a fleet of n
        devices) and checked against the operator's limit (422 `privacy.dp.delta` above it), and its adaptive
        clipping checked (422 naming the field)."""
        dp = config.privacy.dp
        delta = dp.delta
        if delta is None:
            line = session.get(PrivacyLine, ledger_line(session, card))
            fleet = session.scalar(select(func.count()).select_from(DeviceRecord)) or 1
            delta = line.delta if line is not None else min(DEFAULT_DELTA, fleet ** -2.0)
        if delta > self.max_delta:
            raise InvalidInputError(f"delta={delta:g} is above the server's limit {self.max_delta:g} "
                                    "(FEDZOO_DP_MAX_DELTA): the chance the guarantee fails outright must stay far "
                                    "below one over the number of devices; use a smaller delta",
                                    field="privacy.dp.delta")
        if dp.adaptive is not None and is_distributed(config):
            raise InvalidInputError("adaptive clipping with distributed noise would need the devices to noise the "
                                    "count of unclipped updates too, which they do not: use central noise "
                                    "(privacy.dp.noise \"central\") or a fixed clip_norm", field="privacy.dp.adaptive")
        privacy = config.privacy.model_copy(update={"dp": dp.model_copy(update={"delta": delta})})
        return config.model_copy(update={"privacy": privacy})

    def ledger_for_next_round(self, session: Session, config: RoundConfig, card: ModelCard,
                              previous: FLRound | None, planned_rounds: int) -> PrivacyLedger | None:
        """The plan's ledger for a round about to open on `card`; raises PrivacyBudgetExhausted when one more
        round would pass the plan's budget or the line's (and, for a plan's first round, when the rounds its
        own budget lets it run of `planned_rounds` would pass the line's), Conflict while another DP plan runs
        on the line."""
        dp = config.privacy.dp
        if dp is None:
            if previous is None:
                refuse_plain_plan_on_dp_weights(session, card)
            return None
        row = session.get(FLPrivateRound, previous.id) if previous is not None else None
        if row is not None and (row.ledger_after_json or row.ledger_json):
            ledger = PrivacyLedger.from_dict(json.loads(row.ledger_after_json or row.ledger_json))
            ledger.line_max_epsilon = self.line_max_epsilon  # the operator's budget as it is now
        else:
            ledger = self._start_on_line(session, config, card)
            ledger.require_line_budget(ledger.rounds_within_plan_budget(planned_rounds))
        ledger.require_budget_for_next_round()
        return ledger

    def _start_on_line(self, session: Session, config: RoundConfig, card: ModelCard) -> PrivacyLedger:
        """A new plan's ledger, continuing the line's; the line's row is written first, so two plans opening on
        one line at once are serialised by the database (a row lock on PostgreSQL, the write lock on SQLite)."""
        dp = config.privacy.dp
        line_id = ledger_line(session, card)
        line = session.get(PrivacyLine, line_id)
        if line is None:
            claim = lineage_claim(session, card)
            events, delta, mechanism = inherited_ledger(claim.claim if claim else {}, dp.delta, dp.mechanism)
            line = PrivacyLine(line_id=line_id, delta=delta, mechanism=mechanism, events_json=json.dumps(events),
                               epsilon=epsilon_of_events(events, delta, mechanism), revision=0,
                               updated_at=self.clock())
            session.add(line)
            try:
                session.flush()
            except IntegrityError:
                raise Conflict(f"another plan is opening on model line {line_id!r}; try again",
                               field="model_id", code="line_busy") from None
        else:
            session.execute(update(PrivacyLine).where(PrivacyLine.line_id == line_id)
                            .values(revision=PrivacyLine.revision + 1))
        refuse_busy_lines(session, [line_id])
        refuse_while_a_dp_zoo_plan_runs(session, card.task)
        if (line.delta, line.mechanism) != (dp.delta, dp.mechanism):
            raise InvalidInputError(f"model line {line_id!r} accounts epsilon at delta={line.delta} with "
                                    f"{line.mechanism}; a plan on it must use the same delta and mechanism",
                                    field="privacy.dp.delta")
        return PrivacyLedger(dp.noise_multiplier, dp.sampling_probability, dp.delta, dp.max_epsilon, dp.mechanism,
                             line=line_id, line_events=json.loads(line.events_json),
                             line_max_epsilon=self.line_max_epsilon)

    def record_open(self, session: Session, round_row: FLRound, config: RoundConfig,
                    ledger: PrivacyLedger | None) -> None:
        if is_private(config):
            session.add(FLPrivateRound(
                round_id=round_row.id, stage=SELECTION if config.privacy.secure_aggregation else None,
                ledger_json=json.dumps(ledger.to_dict()) if ledger is not None else None,
                line_id=ledger.line if ledger is not None else None))

    @staticmethod
    def seat_refusal(session: Session, config: RoundConfig, device_id: str) -> str | None:
        """Why the device cannot be seated in a round of this plan, or None: SecAgg+ needs its signing key and the
        operator's valid certificate of it (`fedzoo.server.device_certificates.seat_refusal`)."""
        if config.privacy.secure_aggregation is None:
            return None
        signing_key = session.scalar(select(DeviceRecord.signing_public_key).where(DeviceRecord.id == device_id))
        if signing_key is None:
            return ("signing_key_required: this round runs secure aggregation, which needs the device's signing key; "
                    "register the device again with `signing_public_key` (docs/privacy.md)")
        return device_certificates.seat_refusal(session, device_id, signing_key, datetime.now(timezone.utc))

    def start_stages(self, session: Session, round_row: FLRound, config: RoundConfig,
                     group_of: Callable[[str], SeatGroup]) -> None:
        """Selection closed: group the seated devices into cohorts (`group_of`: one group in a round of one model,
        one per subnet in a zoo-wide round), number each cohort's devices and open advertise_keys for all of them
        (once, whoever gets here first). A group below `MIN_COHORT` forms no cohort: its devices sit out, each
        recorded as a refusal of kind `sat_out` (`sat_out_devices`)."""
        settings = config.privacy.secure_aggregation
        if settings is None:
            return
        claimed = session.execute(
            update(FLPrivateRound).where(FLPrivateRound.round_id == round_row.id, FLPrivateRound.stage == SELECTION)
            .values(stage="advertise_keys", stage_deadline_at=self._stage_deadline(round_row, settings))).rowcount
        if not claimed:
            return
        seated = session.execute(select(FLParticipant.device_id).where(FLParticipant.round_id == round_row.id)
                                 .order_by(FLParticipant.selected_at, FLParticipant.device_id)).scalars().all()
        groups: dict[SeatGroup, list[str]] = {}
        for device_id in seated:
            groups.setdefault(group_of(device_id), []).append(device_id)
        clip_range = config.privacy.dp.clip_norm if config.privacy.dp is not None else settings.clip_range
        per_subnet = any(group.name for group in groups)
        # in a round of one cohort, min_clients is that cohort's floor; with one per subnet it counts them all
        cohort_floor = MIN_COHORT if per_subnet else config.min_clients
        formed = [(group, devices) for group, devices in groups.items() if len(devices) >= MIN_COHORT]
        session.add_all(FLRefusedUpload(round_id=round_row.id, device_id=device_id, kind=SAT_OUT, reason=SIT_OUT,
                                        upload_bytes=0, received_at=self.clock())
                        for devices in groups.values() if len(devices) < MIN_COHORT for device_id in devices)
        for index, (group, devices) in enumerate(formed):
            protocol = secagg_config(settings, round_row.id, len(devices),
                                     group.vector_length + carries_unclipped_bit(config), clip_range,
                                     cohort_floor, index if per_subnet else None)
            session.add(FLSecureCohort(round_id=round_row.id, cohort=index, name=group.name,
                                       participants_json=json.dumps(devices),
                                       secagg_config_json=json.dumps(protocol.to_dict())))

    def _stage_deadline(self, round_row: FLRound, settings: SecureAggregationSettings) -> datetime:
        return min(self.clock() + timedelta(seconds=settings.stage_deadline_s), _aware(round_row.deadline_at))

    # devices: what to do now -----------------------------------------------------------------------

    def task_privacy(self, session: Session, round_row: FLRound, config: RoundConfig, device_id: str,
                     max_examples: int) -> TaskPrivacy | None:
        if not is_private(config):
            return None
        dp = config.privacy.dp
        secure = None
        if config.privacy.secure_aggregation is not None:
            secure = self._stage_view(session, round_row, config, device_id)
        noise = None
        if is_distributed(config) and secure is not None and secure.config is not None:
            noise = noise_request(config, SecAggConfig.from_dict(secure.config)).to_dict()
        return TaskPrivacy(clip_norm=dp.clip_norm if dp is not None else None, equal_weights=equal_weights(config),
                           max_examples=max_examples, secure_aggregation=secure, distributed_noise=noise,
                           unclipped_bit=carries_unclipped_bit(config))

    def _stage_view(self, session: Session, round_row: FLRound, config: RoundConfig,
                    device_id: str) -> SecureAggregationTask:
        row = session.get(FLPrivateRound, round_row.id)
        retry_after_s = config.poll_interval_s
        if row.stage == SELECTION:
            return SecureAggregationTask(stage=SELECTION, client=None, config=None, request=None, reply_url=None,
                                         stage_deadline_at=None, retry_after_s=retry_after_s)
        seat = self._seat(session, round_row.id, device_id)
        deadline = _aware(row.stage_deadline_at) if row.stage_deadline_at is not None else None
        if deadline is not None:
            retry_after_s = max(0.05, min(retry_after_s, (deadline - self.clock()).total_seconds()))
        if seat is None:
            return SecureAggregationTask(stage=row.stage, client=None, config=None, request=None, reply_url=None,
                                         stage_deadline_at=deadline, retry_after_s=round(retry_after_s, 3),
                                         sit_out_reason=SIT_OUT)
        cohort, client = seat
        request = None
        if row.stage in STAGES and not self._replied(session, round_row.id, cohort.cohort, row.stage, client):
            request = self._protocol(session, round_row.id, cohort.cohort, row.stage)[1].get(client)
        return SecureAggregationTask(
            stage=row.stage, client=client, config=json.loads(cohort.secagg_config_json), request=request,
            reply_url=f"/v1/fl/rounds/{round_row.id}/secagg/{row.stage}" if request is not None else None,
            stage_deadline_at=deadline, retry_after_s=round(retry_after_s, 3))

    # devices: replies ------------------------------------------------------------------------------

    def submit(self, device_id: str, round_row: FLRound, stage: str, body: bytes) -> dict[str, Any]:
        """Store one device's reply to the open stage (before saying so); returns the receipt and whether the
        stage now has every reply it waits for."""
        round_id = round_row.id
        with self.database.session() as session:
            row = session.get(FLPrivateRound, round_id)
            if row is None or row.stage is None:
                raise Conflict(f"round {round_id} does not run secure aggregation; upload the update instead",
                               code="not_a_secure_round", field="round_id")
            if session.get(FLParticipant, (round_id, device_id)) is None:
                raise Forbidden(f"device {device_id!r} was not selected for round {round_id}", code="not_selected")
            if round_row.state not in ACTIVE_STATES or row.stage != stage:
                raise Conflict(f"round {round_id} is {round_row.state} at stage {row.stage!r}, not {stage!r}",
                               code="wrong_stage", field="stage")
            seat = self._seat(session, round_id, device_id)
            if seat is None:
                raise Forbidden(f"device {device_id!r} is in none of round {round_id}'s cohorts (seated after they "
                                "were fixed, or in a group too small to form one)", code="not_in_cohort")
            cohort, client = seat[0].cohort, seat[1]
            protocol = SecAggConfig.from_dict(json.loads(seat[0].secagg_config_json))
            server, expected = self._protocol(session, round_id, cohort, stage)
            waiting = self._waiting(session, round_id, stage)
        if client not in expected:
            raise Conflict(f"device {device_id!r} missed an earlier stage of round {round_id} and is out of it",
                           code="dropped_out")
        if stage == "masked_input":
            _check_masked_vector(body, protocol)
        if stage in ("advertise_keys", "consistency_check"):
            _check_signature(body, stage, server, client, expected[client])
        with self.database.session() as session:
            # the same conditional write as closing the stage: a reply either lands in an open stage or is refused
            still_open = session.execute(
                update(FLPrivateRound).where(FLPrivateRound.round_id == round_id, FLPrivateRound.stage == stage,
                                             FLPrivateRound.stage_deadline_at > self.clock())
                .values(stage=stage)).rowcount
            if not still_open:
                raise Conflict(f"stage {stage!r} of round {round_id} has closed", code="wrong_stage", field="stage")
            session.add(FLSecureMessage(round_id=round_id, cohort=cohort, stage=stage, client=client,
                                        device_id=device_id, body=body, received_at=self.clock()))
            try:
                session.flush()
            except IntegrityError:
                raise Conflict(f"device {device_id!r} already replied to {stage!r} in round {round_id}",
                               code="duplicate_reply") from None
            received = session.scalar(select(func.count()).select_from(FLSecureMessage).where(
                FLSecureMessage.round_id == round_id, FLSecureMessage.stage == stage))
        return {"round_id": round_id, "stage": stage, "client": client, "received": received,
                "expected": waiting}

    def record_seat_failures(self, session: Session, round_id: int, policy: QuarantinePolicy | None,
                             now: datetime) -> None:
        """A SecAgg+ round ended: each seated device that missed a stage it was asked for, once that stage closed,
        is recorded as `aborted` (unless it declined), and the cohort's quarantine is reviewed: declined and
        aborted seats count like updates left out (`server.fl.quarantine`)."""
        row = session.get(FLPrivateRound, round_id)
        cohorts = self._cohorts(session, round_id)
        if row is None or row.stage is None or not cohorts:
            return
        closed = STAGES if row.stage == DONE else STAGES[: STAGES.index(row.stage)]
        failed = set(session.scalars(select(FLRefusedUpload.device_id).where(
            FLRefusedUpload.round_id == round_id, FLRefusedUpload.kind.in_(SEAT_FAILURES))))
        replied = {(cohort, stage, client) for cohort, stage, client in session.execute(
            select(FLSecureMessage.cohort, FLSecureMessage.stage, FLSecureMessage.client)
            .where(FLSecureMessage.round_id == round_id))}
        participants: list[str] = []
        for cohort in cohorts:
            devices = json.loads(cohort.participants_json)
            participants += devices
            for stage in closed:
                for client in self._protocol(session, round_id, cohort.cohort, stage)[1]:
                    device_id = devices[client]
                    if (cohort.cohort, stage, client) not in replied and device_id not in failed:
                        failed.add(device_id)
                        session.add(FLRefusedUpload(round_id=round_id, device_id=device_id, kind="aborted",
                                                    upload_bytes=0, received_at=now,
                                                    reason=f"took a SecAgg+ seat and did not answer stage {stage!r}"))
        session.flush()
        quarantine.review(session, round_id, participants, policy, now)

    @staticmethod
    def has_finished(session: Session, round_id: int, device_id: str) -> bool:
        """Whether the device's part of a SecAgg+ round is done (its unmask reply is stored): like an accepted
        update, the round has no more work for it."""
        return session.scalar(select(func.count()).select_from(FLSecureMessage).where(
            FLSecureMessage.round_id == round_id, FLSecureMessage.stage == "unmask",
            FLSecureMessage.device_id == device_id)) > 0

    @staticmethod
    def _replied(session: Session, round_id: int, cohort: int, stage: str, client: int) -> bool:
        return session.get(FLSecureMessage, (round_id, cohort, stage, client)) is not None

    @staticmethod
    def _cohorts(session: Session, round_id: int) -> list[FLSecureCohort]:
        return list(session.scalars(select(FLSecureCohort).where(FLSecureCohort.round_id == round_id)
                                    .order_by(FLSecureCohort.cohort)))

    def _seat(self, session: Session, round_id: int, device_id: str) -> tuple[FLSecureCohort, int] | None:
        """(the device's cohort, its client number there), or None when it is in none."""
        for cohort in self._cohorts(session, round_id):
            participants = json.loads(cohort.participants_json)
            if device_id in participants:
                return cohort, participants.index(device_id)
        return None

    def longest_vector(self, session: Session, round_id: int) -> int | None:
        """The longest update vector of the round's cohorts (None before they are formed)."""
        lengths = [json.loads(cohort.secagg_config_json)["vector_length"]
                   for cohort in self._cohorts(session, round_id)]
        return max(lengths, default=None)

    def _waiting(self, session: Session, round_id: int, stage: str) -> int:
        """How many replies `stage` waits for, over every cohort."""
        return sum(len(self._protocol(session, round_id, cohort.cohort, stage)[1])
                   for cohort in self._cohorts(session, round_id))

    # stages ----------------------------------------------------------------------------------------

    def overdue_stages(self) -> list[tuple[int, str]]:
        """(round, stage) of open stages whose deadline has passed."""
        with self.database.session() as session:
            rows = session.execute(
                select(FLPrivateRound.round_id, FLPrivateRound.stage).join(FLRound, FLRound.id == FLPrivateRound.round_id)
                .where(FLRound.state.in_(ACTIVE_STATES), FLPrivateRound.stage.in_(STAGES),
                       FLPrivateRound.stage_deadline_at <= self.clock())).all()
        return [(round_id, stage) for round_id, stage in rows]

    def close_stage(self, round_id: int, stage: str) -> str | None:
        """Move `stage` on, once (a conditional UPDATE): returns the stage opened, or None when another worker
        did it. Raises RoundAborted when the next stage cannot succeed."""
        with self.database.session() as session:
            round_row = session.get(FLRound, round_id)
            settings = RoundConfig.model_validate_json(round_row.config_json).privacy.secure_aggregation
            opened = next_stage(stage)
            claimed = session.execute(
                update(FLPrivateRound).where(FLPrivateRound.round_id == round_id, FLPrivateRound.stage == stage)
                .values(stage=opened, stage_deadline_at=self._stage_deadline(round_row, settings))).rowcount
        if not claimed:
            return None
        if opened != DONE:
            with self.database.session() as session:
                cohorts = self._cohorts(session, round_id)
                if not cohorts:
                    raise RoundAborted(f"no group of seated devices reached SecAgg+'s least cohort of {MIN_COHORT}",
                                       clients=[])
                for cohort in cohorts:  # every cohort must be able to finish: they advance together
                    protocol = SecAggConfig.from_dict(json.loads(cohort.secagg_config_json))
                    waiting = self._protocol(session, round_id, cohort.cohort, opened)[1]
                    if len(waiting) < protocol.minimum_survivors:
                        named = f" of cohort {cohort.cohort}" if len(cohorts) > 1 else ""
                        raise RoundAborted(f"only {len(waiting)} devices{named} completed {stage!r}; the cohort needs "
                                           f"{protocol.minimum_survivors}", clients=sorted(waiting))
        return opened

    @staticmethod
    def progress(session: Session, round_id: int) -> tuple[int, int] | None:
        """SecAgg+: (masked inputs stored, bytes of every reply stored); None for other rounds."""
        row = session.get(FLPrivateRound, round_id)
        if row is None or row.stage is None:
            return None
        masked = session.scalar(select(func.count()).select_from(FLSecureMessage).where(
            FLSecureMessage.round_id == round_id, FLSecureMessage.stage == "masked_input"))
        sent = session.scalar(select(func.coalesce(func.sum(func.length(FLSecureMessage.body)), 0))
                              .where(FLSecureMessage.round_id == round_id))
        return masked, int(sent)

    def stage_of(self, session: Session, round_id: int) -> str | None:
        row = session.get(FLPrivateRound, round_id)
        return row.stage if row is not None else None

    def _protocol(self, session: Session, round_id: int, cohort: int, stage: str
                  ) -> tuple[SecAggServer, dict[int, dict[str, Any]]]:
        """The cohort's server state after every stage before `stage`, and `stage`'s request for each device of the
        cohort it waits for."""
        key = (round_id, cohort, stage)
        if key not in self._replayed:
            row = session.get(FLSecureCohort, (round_id, cohort))
            participants = json.loads(row.participants_json)
            protocol = SecAggConfig.from_dict(json.loads(row.secagg_config_json))
            server = SecAggServer(protocol, self._signing_keys(session, participants),
                                  self._vouchers(session, participants))
            requests: dict[int, dict[str, Any]] = {client: {"stage": "advertise_keys"}
                                                   for client in range(protocol.num_clients)}
            for done in STAGES[: STAGES.index(stage)]:
                requests = getattr(server, COLLECT[done])(self._replies(session, round_id, cohort, done))
            self._replayed[key] = (server, requests)
            while len(self._replayed) > MAX_CACHED_STAGES:
                self._replayed.popitem(last=False)
        return self._replayed[key]

    @staticmethod
    def _signing_keys(session: Session, participants: list[str]) -> dict[int, bytes]:
        """Client number -> the registered signing key of the device seated under it."""
        keys = dict(session.execute(select(DeviceRecord.id, DeviceRecord.signing_public_key)
                                    .where(DeviceRecord.id.in_(participants))).all())
        return {client: keys[device] for client, device in enumerate(participants) if keys.get(device) is not None}

    @staticmethod
    def _vouchers(session: Session, participants: list[str]) -> dict[int, dict[str, Any]]:
        """Client number -> the seated device's id and the operator's certificate of its key, relayed to its
        neighbours with the key."""
        certificates = device_certificates.certificates_of(session, participants)
        return {client: {"device_id": device, "certificate": certificates[device]}
                for client, device in enumerate(participants) if device in certificates}

    @staticmethod
    def _replies(session: Session, round_id: int, cohort: int, stage: str) -> list[dict[str, Any]]:
        rows = session.scalars(select(FLSecureMessage).where(FLSecureMessage.round_id == round_id,
                                                             FLSecureMessage.cohort == cohort,
                                                             FLSecureMessage.stage == stage)
                               .order_by(FLSecureMessage.client))
        replies = []
        for row in rows:
            replies.append({**READ_REPLY[stage](row.body), "stage": stage, "client": row.client})
        return replies

    # aggregation -----------------------------------------------------------------------------------

    def aggregate(self, round_id: int, config: RoundConfig, base_parameters: Parameters, strategy: Strategy,
                  clear_deltas: list[Callable[[], Parameters]], outcome: RoundOutcome) -> Parameters:
        """The next global parameters, from the unmasked sum (SecAgg+) or the clear deltas clipped again here (DP
        alone), noised under DP; the round's outcome hears the counts and the privacy only when the aggregate is
        made. Raises RoundAborted or InvalidInputError."""
        shapes = {name: value.shape for name, value in base_parameters.items()}
        vector_length = sum(value.size for value in base_parameters.values())
        dp, settings = config.privacy.dp, config.privacy.secure_aggregation
        secure: SecureAggregationTally | None = None
        with self.database.session() as session:
            ledger_json = session.get(FLPrivateRound, round_id).ledger_json
            if settings is not None:
                upload_bytes = self.progress(session, round_id)[1]
        if settings is not None:
            [cohort] = self.unmasked_sums(round_id, config)  # a round of one model runs one cohort
            total, total_weight, count, protocol, secure = (cohort.total, cohort.total_weight, cohort.count,
                                                            cohort.protocol, cohort.tally)
        else:  # DP without SecAgg+: the server sees each delta, and clips it itself rather than trust the device
            count = len(clear_deltas)

        def record(privacy: dict[str, Any], ledger: PrivacyLedger | None) -> None:
            outcome.counts = UpdateCounts(count, count, None)
            outcome.client_reported_metrics = {}
            if secure is not None:
                outcome.secure_aggregation, outcome.upload_bytes = secure, int(upload_bytes)
            outcome.screening = ScreeningTally(count, 0, 0, norm_limit=dp.clip_norm if dp is not None else None)
            outcome.privacy = privacy
            outcome.privacy_ledger = ledger.to_dict() if ledger is not None else None

        if dp is None:
            record(card_privacy(config, None, None), None)
            return strategy.apply_mean_delta(base_parameters, unflatten(total / total_weight, shapes))
        ledger = PrivacyLedger.from_dict(json.loads(ledger_json))
        if is_distributed(config):  # the devices noised the sum: the server adds nothing
            mean = released_mean(total, count, protocol.minimum_survivors, ledger, config.target_clients)
            record(card_privacy(config, ledger, None, card_noise(protocol, noise_request(config, protocol))), ledger)
            return strategy.apply_mean_delta(base_parameters, unflatten(mean, shapes))
        mechanism = DpFedAvg(ledger, config.target_clients, dp.clip_norm, adaptive_clipping(dp))
        private = DifferentialPrivacy(strategy, mechanism)
        if settings is not None:
            parameters = private.apply_noised_secure_sum(base_parameters, total, count, protocol.clip_range,
                                                         protocol.levels)
        else:
            total, unclipped, _ = clipped_sum((load() for load in clear_deltas), dp.clip_norm, vector_length)
            parameters = private.apply_noised_sum(base_parameters, total, unclipped, count)
        record(card_privacy(config, ledger, mechanism), ledger)
        return parameters

    def unmasked_sums(self, round_id: int, config: RoundConfig) -> list[CohortSum]:
        """Every cohort's unmasked sum (SecAgg+), dequantised and within what clipped updates can add up to
        (`check_secure_sum`). Raises RoundAborted or InvalidInputError."""
        unmasked = []
        with self.database.session() as session:
            for cohort in self._cohorts(session, round_id):
                protocol = SecAggConfig.from_dict(json.loads(cohort.secagg_config_json))
                server, _ = self._protocol(session, round_id, cohort.cohort, "unmask")
                result = server.collect_unmask_shares(self._replies(session, round_id, cohort.cohort, "unmask"))
                unmasked.append((cohort.name, protocol, result))
        sums = []
        for name, protocol, result in unmasked:
            total, total_weight = dequantise_sum(result.ring_sum, protocol)
            count = len(result.survivors)
            tally = SecureAggregationTally(
                protocol.num_clients, protocol.neighbour_count, protocol.threshold, protocol.levels,
                protocol.clip_range, count, len(result.dropped),
                {str(client): why for client, why in result.misbehaving.items()})
            slack = noise_slack(protocol, noise_request(config, protocol), count) if is_distributed(config) else 0.0
            check_secure_sum(total, total_weight, count, protocol.clip_range, equal_weights(config), slack,
                             carries_unclipped_bit(config))
            sums.append(CohortSum(name, total, total_weight, count, protocol, tally))
        return sums

    def record_release(self, session: Session, round_id: int, outcome: RoundOutcome) -> None:
        """A noised aggregate left the server (published or refused): the plan's ledger and its line's count
        the round."""
        if outcome.privacy_ledger is not None:
            session.execute(update(FLPrivateRound).where(FLPrivateRound.round_id == round_id)
                            .values(ledger_after_json=json.dumps(outcome.privacy_ledger)))
            ledger = PrivacyLedger.from_dict(outcome.privacy_ledger)
            if ledger.line is not None:
                session.execute(update(PrivacyLine).where(PrivacyLine.line_id == ledger.line).values(
                    events_json=json.dumps(ledger.events()), epsilon=ledger.epsilon_spent, updated_at=self.clock()))


def sat_out_devices(session: Session, round_id: int) -> dict[str, int]:
    """How many seated devices sat a zoo-wide SecAgg+ round out because fewer than `MIN_COHORT` trained their subnet,
    by the training card of that subnet (the operator's record; a DP round's read withholds it: `without_dp_counts`)."""
    return dict(session.execute(
        select(FLSubnetAssignment.training_model_id, func.count()).join(
            FLRefusedUpload, and_(FLRefusedUpload.round_id == FLSubnetAssignment.round_id,
                                  FLRefusedUpload.device_id == FLSubnetAssignment.device_id))
        .where(FLSubnetAssignment.round_id == round_id, FLRefusedUpload.kind == SAT_OUT)
        .group_by(FLSubnetAssignment.training_model_id)).all())


def carries_unclipped_bit(config: RoundConfig) -> bool:
    """Adaptive clipping under SecAgg+: each device appends its "not clipped" bit to the vector it masks
    (`fedzoo.aggregation.private.with_unclipped_bit`), one more coordinate, so the server learns only the count."""
    dp = config.privacy.dp
    return config.privacy.secure_aggregation is not None and dp is not None and dp.adaptive is not None


def cohort_tally(sums: list[CohortSum]) -> SecureAggregationTally:
    """The round's SecAgg+ tally over its cohorts: devices summed, the weakest cohort's k and t (what a device's
    update is protected by at least), misbehaving clients named `<cohort>:<client>`, and each cohort's own."""
    tallies = [cohort.tally for cohort in sums]
    return SecureAggregationTally(
        sum(tally.num_clients for tally in tallies), min(tally.neighbour_count for tally in tallies),
        min(tally.threshold for tally in tallies), tallies[0].levels, tallies[0].clip_range,
        sum(tally.survivors for tally in tallies), sum(tally.dropped for tally in tallies),
        {f"{index}:{client}": why for index, tally in enumerate(tallies) for client, why in tally.misbehaving.items()},
        cohorts=[{"subnet": cohort.name, **cohort.tally.to_dict()} for cohort in sums])


def equal_weights(config: RoundConfig) -> bool:
    """Whether every device's update weighs the same: always under DP; under SecAgg+ unless the round keeps
    FedAvg's example weights (`weight_bound.rule` "examples"), since the server cannot bound each device's weight
    by the round's median when it sees only the sum: equal weights are the bound it can check."""
    return config.privacy.dp is not None or config.weight_bound.rule != "examples"


def adaptive_clipping(dp: DpSettings) -> AdaptiveClipping | None:
    """The plan's adaptive clipping as `fedzoo.dp.noise` runs it (the simulator's code), or None."""
    if dp.adaptive is None:
        return None
    return AdaptiveClipping(dp.adaptive.target_unclipped_quantile, dp.adaptive.clip_learning_rate,
                            dp.adaptive.clipped_count_stddev)


def config_for_round(config: RoundConfig, previous: FLRound | None) -> RoundConfig:
    """Adaptive clipping: the next round of a plan clips at the norm the previous round's noised count moved to."""
    dp = config.privacy.dp
    if dp is None or dp.adaptive is None or previous is None or not previous.outcome_json:
        return config
    claim = (json.loads(previous.outcome_json).get("privacy") or {}).get("dp") or {}
    if "next_clip_norm" not in claim:
        return config
    privacy = config.privacy.model_copy(update={"dp": dp.model_copy(update={"clip_norm": claim["next_clip_norm"]})})
    return config.model_copy(update={"privacy": privacy})


def card_privacy(config: RoundConfig, ledger: PrivacyLedger | None, mechanism: DpFedAvg | None,
                 distributed: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a published card says about the privacy of the plan that made it: the server's `mechanism`, or the
    devices' noise (`distributed`, from `distributed_dp.card_noise`, which names the mechanism and its sensitivity)."""
    settings, dp = config.privacy.secure_aggregation, config.privacy.dp
    record: dict[str, Any] = {"secure_aggregation": settings is not None, "dp": None}
    if ledger is not None and (mechanism is not None or distributed is not None):
        record["dp"] = {"epsilon": ledger.epsilon_spent, "delta": ledger.delta, "accountant": ledger.mechanism,
                        "rounds": ledger.rounds_done, "max_epsilon": ledger.max_epsilon,
                        "plan_epsilon": ledger.plan_epsilon_spent, "line": ledger.line,
                        "line_events": ledger.events(), "line_max_epsilon": ledger.line_max_epsilon,
                        "noise_multiplier": ledger.noise_multiplier, "clip_norm": dp.clip_norm,
                        "sampling_probability": ledger.sampling_probability}
        if distributed is not None:
            record["dp"].update(distributed)
            return record
        record["dp"].update(sensitivity=mechanism.released_sensitivity, mechanism="central-discrete-gaussian",
                            noise="discrete Gaussian from os.urandom")
        if mechanism.adaptive is not None:
            record["dp"].update(next_clip_norm=mechanism.clip_norm,
                                noised_unclipped_fraction=mechanism.released_unclipped_fraction,
                                delta_noise_multiplier=mechanism.delta_noise_multiplier,
                                clipped_count_stddev=mechanism.clipped_count_stddev)
    return record


def published_counts(outcome: RoundOutcome) -> dict[str, Any]:
    """The contributor counts a published card states: exact, or under DP none at all. Any count, even rounded,
    is a function of who took part (with 14 others a card rounded to 10 says 10 without a device and 20 with it),
    and add/remove adjacency makes membership the secret; the noised count adaptive clipping releases is charged
    to the ledger and is the only one a DP round publishes."""
    counts, screening = outcome.counts.to_dict(), outcome.screening.to_dict()
    if not (outcome.privacy or {}).get("dp"):
        return {**counts, "screening": screening}
    return {**{name: None for name in counts}, "screening": {"norm_limit": screening.get("norm_limit")},
            "counts_withheld": DP_COUNTS_WITHHELD}


OUTCOME_COUNTS = ("accepted_updates", "aggregated_updates", "num_examples", "upload_bytes", "declined")
ZOO_COUNTS = ("devices_per_zoo_model", "devices_per_subnet", "coverage", "bytes")  # a zoo-wide round's, by device


def without_dp_counts(view: dict[str, Any]) -> dict[str, Any]:
    """A DP round's view with every membership-dependent figure removed (`published_counts`): the device counts,
    bytes, the screening and SecAgg+ tallies, and a failure's own words (they state how many devices did what)."""
    view = {**view, **{name: None for name in ("selected_devices", "accepted_updates", "upload_bytes",
                                               "declined_devices", "sat_out_devices")},
            "counts_withheld": DP_COUNTS_WITHHELD}
    outcome = dict(view["outcome"] or {})
    if outcome:
        for name in OUTCOME_COUNTS:
            outcome.pop(name, None)
        if "screening" in outcome:
            outcome["screening"] = {"norm_limit": outcome["screening"].get("norm_limit")}
        if "secure_aggregation" in outcome:
            outcome["secure_aggregation"] = {name: value for name, value in outcome["secure_aggregation"].items()
                                             if name in ("neighbour_count", "threshold", "levels", "clip_range")}
        if "zoo" in outcome:
            outcome["zoo"] = {name: value for name, value in outcome["zoo"].items() if name not in ZOO_COUNTS}
        if "failure" in outcome:
            outcome["failure"] = "the round failed (its reason is withheld under DP: it counts devices)"
        view["outcome"] = outcome
    return view


def inherited_ledger(claim: dict[str, Any], delta: float, mechanism: str) -> tuple[LineEvents, float, str]:
    """A ledger line new to this server: the rounds a signed privacy claim says the weights already spent (the
    claim of the card itself, of a card of the same weights or of an ancestor: `lineage_claim`), else none."""
    events = claim.get("line_events")
    if not isinstance(events, list) or not events:
        return [], delta, mechanism
    return events, float(claim.get("delta", delta)), str(claim.get("accountant", mechanism))


def _running_dp_rounds():
    """The DP rounds still running (open to their last release): their plans hold their lines' ledgers."""
    return (select(FLRound).join(FLPrivateRound, FLPrivateRound.round_id == FLRound.id)
            .where(FLPrivateRound.ledger_json.is_not(None), FLRound.state.in_((*ACTIVE_STATES, "aggregating"))))


def refuse_busy_lines(session: Session, line_ids: list[str]) -> None:
    """409 `line_busy` when a DP plan runs on any of `line_ids`: a line's privacy ledger takes one plan at a time
    (each plan checks the line's lifetime budget when it opens, against the line as it stands)."""
    running = session.scalars(_running_dp_rounds().where(FLPrivateRound.line_id.in_(line_ids)).limit(1)).first()
    if running is not None:
        line_id = session.get(FLPrivateRound, running.id).line_id
        raise Conflict(f"model line {line_id!r} has a DP plan running (round {running.id}); a line's privacy "
                       "ledger takes one plan at a time: start this one when that plan ends",
                       field="model_id", code="line_busy")


def refuse_while_a_dp_zoo_plan_runs(session: Session, task: str) -> None:
    """409 `line_busy` while a DP zoo-wide plan runs on `task`: it charges every zoo model's line of the task, not only
    the supernet's line its plan row names."""
    for round_row in session.scalars(_running_dp_rounds().where(FLRound.task == task)):
        if RoundConfig.model_validate_json(round_row.config_json).zoo is not None:
            raise Conflict(f"a DP zoo-wide plan runs on task {task!r} (round {round_row.id}) and charges every zoo "
                           "model's line; a line's privacy ledger takes one plan at a time: start this one when that "
                           "plan ends", field="model_id", code="line_busy")


def ledger_line(session: Session, card: ModelCard) -> str:
    """The ledger a plan on `card` continues: the DP line its weights were released under or descend from
    (`fedzoo.server.fl.privacy_lineage`), else the card's own model line."""
    claim = lineage_claim(session, card)
    return claim.line if claim is not None else card.line_id


def refuse_plain_plan_on_dp_weights(session: Session, card: ModelCard) -> None:
    """422 `privacy.dp`: noiseless rounds on weights of a DP line would publish versions whose line still states a
    finite epsilon; a plan on such weights must be DP too."""
    claim = lineage_claim(session, card)
    if claim is not None:
        raise InvalidInputError(
            f"model {card.id!r} holds weights of DP line {claim.line!r} (epsilon {claim.claim.get('epsilon', '?')} "
            f"stated by {claim.stated_by!r}): a plan on it must set privacy.dp, so the line's epsilon stays true",
            field="privacy.dp")


def _check_masked_vector(body: bytes, protocol: SecAggConfig) -> None:
    expected = (protocol.vector_length + 1) * MASK_DTYPES[protocol.modulus_bits].itemsize
    if len(body) != expected:
        raise InvalidInputError(f"the masked vector must be {protocol.vector_length + 1} little-endian values of "
                                f"{protocol.modulus_bits} bits ({expected} bytes), got {len(body)} bytes",
                                field="masked_vector")


def _check_signature(body: bytes, stage: str, server: SecAggServer, client: int, request: dict[str, Any]) -> None:
    """422 unless the reply's signature is the device's, over its keys and nonce (advertise_keys) or over the
    survivor set it was sent (consistency_check): a reply its neighbours would refuse is never stored."""
    reply = json.loads(body)
    signing_key = server.signing_keys.get(client)
    try:
        signature = from_base64(reply.get("signature"), "signature")
        payload = (server.advertise_payload(client, *(from_base64(reply.get(name), name) for name in
                                                      ("cipher_public_key", "mask_public_key", "nonce")))
                   if stage == "advertise_keys" else server.consistency_payload(client, request["survivors"]))
    except ProtocolViolation:
        signature, payload = b"", b""
    if signing_key is None or not signatures.verify(signing_key, signature, payload):
        raise ValidationFailed(f"the {stage} signature does not verify against this device's registered signing key "
                               "(sign the payload of docs/privacy.md with the key given at registration)",
                               field="signature")


def _aware(moment: datetime) -> datetime:
    """SQLite hands datetimes back without a zone; they were stored as UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)
