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

DP-FedAvg (`privacy.dp`): devices clip their delta to `clip_norm`; the server adds Gaussian noise to the
sum, which under SecAgg+ is the unmasked sum (the server never needs a clear update), and divides by
`target_clients`. Weights are equal: under SecAgg+ the weight coordinate of the sum must equal the number
of survivors, else the round fails. The plan's ledger is stored with each round; a round that would take
epsilon past `max_epsilon` does not open.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fedzoo.dp.accountant import PrivacyLedger, noise_multiplier_for
from fedzoo.dp.clipping import clip_delta
from fedzoo.dp.noise import DpFedAvg, quantised_sensitivity
from fedzoo.errors import InvalidInputError
from fedzoo.secagg import SecAggConfig, SecAggServer, dequantise_sum, flatten, signatures, unflatten
from fedzoo.secagg.config import least_survivors
from fedzoo.secagg.crypto import MASK_DTYPES
from fedzoo.secagg.errors import ProtocolViolation, RoundAborted
from fedzoo.secagg.framing import decode_share_keys, decode_unmask
from fedzoo.secagg.messages import STAGES, from_base64, to_base64
from fedzoo.server.db import Database
from fedzoo.server.errors import Conflict, Forbidden, ValidationFailed
from fedzoo.server.fl.models import ACTIVE_STATES, FLParticipant, FLPrivateRound, FLRound, FLSecureMessage
from fedzoo.server.fl.schemas import RoundConfig, SecureAggregationSettings, SecureAggregationTask, TaskPrivacy
from fedzoo.server.fl.strategies import Parameters, Strategy
from fedzoo.server.models import DeviceRecord

SELECTION, DONE = "selection", "done"
COLLECT = {"advertise_keys": "collect_keys", "share_keys": "collect_shares", "masked_input": "collect_masked_inputs",
           "consistency_check": "collect_consistency"}
MAX_CACHED_STAGES = 16
# how each stage's stored reply reads back as the dict `SecAggServer` takes (share replies are kept framed)
READ_REPLY: dict[str, Callable[[bytes], dict[str, Any]]] = {
    "advertise_keys": json.loads, "share_keys": decode_share_keys,
    "masked_input": lambda body: {"masked_vector": to_base64(body)}, "consistency_check": json.loads,
    "unmask": decode_unmask}
SAMPLING_PROBABILITY = 1.0  # the server seats whoever checks in: no amplification by sampling (docs/privacy.md)


def is_private(config: RoundConfig) -> bool:
    return config.privacy.secure_aggregation is not None or config.privacy.dp is not None


def next_stage(stage: str) -> str:
    order = (SELECTION, *STAGES, DONE)
    return order[order.index(stage) + 1]


def secagg_config(settings: SecureAggregationSettings, round_id: int, cohort: int, vector_length: int,
                  clip_range: float, min_clients: int) -> SecAggConfig:
    """The round's SecAgg+ parameters for a cohort of `cohort` devices: k capped below the cohort, t above k/2,
    and devices refuse to unmask a sum of fewer than max(3, t, min_clients) inputs (all of a cohort of 3)."""
    neighbour_count = min(settings.neighbour_count, (cohort - 1) // 2 * 2)
    threshold = max(neighbour_count // 2 + 1, min(settings.threshold or 0, neighbour_count))
    return SecAggConfig(f"fl-round-{round_id}", cohort, neighbour_count, threshold, vector_length, clip_range,
                        settings.levels, minimum_survivors=min(cohort, max(least_survivors(threshold), min_clients)))


def with_calibrated_noise(config: RoundConfig) -> RoundConfig:
    """The config with DP's noise multiplier filled in (the smallest that spends max_epsilon over the plan)."""
    dp = config.privacy.dp
    if dp is None or dp.noise_multiplier is not None:
        return config
    noise = noise_multiplier_for(dp.max_epsilon, dp.delta, config.num_rounds, SAMPLING_PROBABILITY, dp.mechanism)
    privacy = config.privacy.model_copy(update={"dp": dp.model_copy(update={"noise_multiplier": noise})})
    return config.model_copy(update={"privacy": privacy})


class PrivateRounds:
    """The private part of the round service: stage state, replies, the secure sum, noise and the ledger."""

    def __init__(self, database: Database, clock: Callable[[], datetime]) -> None:
        self.database, self.clock = database, clock
        self._replayed: OrderedDict[tuple[int, str], tuple[SecAggServer, dict[int, dict[str, Any]]]] = OrderedDict()

    # opening rounds ------------------------------------------------------------------------------

    def ledger_for_next_round(self, session: Session, config: RoundConfig, previous: FLRound | None
                              ) -> PrivacyLedger | None:
        """The plan's ledger for a round about to open; raises PrivacyBudgetExhausted when one more round
        would pass the budget (the round then does not open)."""
        dp = config.privacy.dp
        if dp is None:
            return None
        row = session.get(FLPrivateRound, previous.id) if previous is not None else None
        if row is not None and (row.ledger_after_json or row.ledger_json):
            ledger = PrivacyLedger.from_dict(json.loads(row.ledger_after_json or row.ledger_json))
        else:
            ledger = PrivacyLedger(dp.noise_multiplier, SAMPLING_PROBABILITY, dp.delta, dp.max_epsilon, dp.mechanism)
        ledger.require_budget_for_next_round()
        return ledger

    def record_open(self, session: Session, round_row: FLRound, config: RoundConfig,
                    ledger: PrivacyLedger | None) -> None:
        if is_private(config):
            session.add(FLPrivateRound(
                round_id=round_row.id, stage=SELECTION if config.privacy.secure_aggregation else None,
                ledger_json=json.dumps(ledger.to_dict()) if ledger is not None else None))

    @staticmethod
    def seat_refusal(session: Session, config: RoundConfig, device_id: str) -> str | None:
        """Why the device cannot be seated in a round of this plan, or None: SecAgg+ needs its signing key."""
        if config.privacy.secure_aggregation is None:
            return None
        if session.scalar(select(DeviceRecord.signing_public_key).where(DeviceRecord.id == device_id)) is None:
            return ("signing_key_required: this round runs secure aggregation, which needs the device's signing key; "
                    "register the device again with `signing_public_key` (docs/privacy.md)")
        return None

    def start_stages(self, session: Session, round_row: FLRound, config: RoundConfig, vector_length: int) -> None:
        """Selection closed: number the seated devices and open advertise_keys (once, whoever gets here first)."""
        settings = config.privacy.secure_aggregation
        if settings is None:
            return
        seated = session.execute(select(FLParticipant.device_id).where(FLParticipant.round_id == round_row.id)
                                 .order_by(FLParticipant.selected_at, FLParticipant.device_id)).scalars().all()
        clip_range = config.privacy.dp.clip_norm if config.privacy.dp is not None else settings.clip_range
        protocol = secagg_config(settings, round_row.id, len(seated), vector_length, clip_range, config.min_clients)
        session.execute(
            update(FLPrivateRound).where(FLPrivateRound.round_id == round_row.id, FLPrivateRound.stage == SELECTION)
            .values(stage="advertise_keys", stage_deadline_at=self._stage_deadline(round_row, settings),
                    participants_json=json.dumps(list(seated)), secagg_config_json=json.dumps(protocol.to_dict())))

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
        return TaskPrivacy(clip_norm=dp.clip_norm if dp is not None else None, equal_weights=dp is not None,
                           max_examples=max_examples, secure_aggregation=secure)

    def _stage_view(self, session: Session, round_row: FLRound, config: RoundConfig,
                    device_id: str) -> SecureAggregationTask:
        row = session.get(FLPrivateRound, round_row.id)
        retry_after_s = config.poll_interval_s
        if row.stage == SELECTION:
            return SecureAggregationTask(stage=SELECTION, client=None, config=None, request=None, reply_url=None,
                                         stage_deadline_at=None, retry_after_s=retry_after_s)
        participants = json.loads(row.participants_json)
        client = participants.index(device_id) if device_id in participants else None
        request = None
        if row.stage in STAGES and client is not None and not self._replied(session, round_row.id, row.stage, client):
            request = self._protocol(session, round_row.id, row.stage)[1].get(client)
        deadline = _aware(row.stage_deadline_at) if row.stage_deadline_at is not None else None
        if deadline is not None:
            retry_after_s = max(0.05, min(retry_after_s, (deadline - self.clock()).total_seconds()))
        return SecureAggregationTask(
            stage=row.stage, client=client, config=json.loads(row.secagg_config_json), request=request,
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
            participants = json.loads(row.participants_json)
            if device_id not in participants:
                raise Forbidden(f"device {device_id!r} was seated after round {round_id}'s cohort was fixed",
                                code="not_in_cohort")
            client = participants.index(device_id)
            protocol = SecAggConfig.from_dict(json.loads(row.secagg_config_json))
            server, expected = self._protocol(session, round_id, stage)
        if client not in expected:
            raise Conflict(f"device {device_id!r} missed an earlier stage of round {round_id} and is out of it",
                           code="dropped_out")
        if stage == "masked_input":
            _check_masked_vector(body, protocol)
        if stage in ("advertise_keys", "consistency_check"):
            _check_signature(body, stage, protocol, client, server.signing_keys.get(client), expected[client])
        with self.database.session() as session:
            # the same conditional write as closing the stage: a reply either lands in an open stage or is refused
            still_open = session.execute(
                update(FLPrivateRound).where(FLPrivateRound.round_id == round_id, FLPrivateRound.stage == stage,
                                             FLPrivateRound.stage_deadline_at > self.clock())
                .values(stage=stage)).rowcount
            if not still_open:
                raise Conflict(f"stage {stage!r} of round {round_id} has closed", code="wrong_stage", field="stage")
            session.add(FLSecureMessage(round_id=round_id, stage=stage, client=client, device_id=device_id, body=body,
                                        received_at=self.clock()))
            try:
                session.flush()
            except IntegrityError:
                raise Conflict(f"device {device_id!r} already replied to {stage!r} in round {round_id}",
                               code="duplicate_reply") from None
            received = session.scalar(select(func.count()).select_from(FLSecureMessage).where(
                FLSecureMessage.round_id == round_id, FLSecureMessage.stage == stage))
        return {"round_id": round_id, "stage": stage, "client": client, "received": received,
                "expected": len(expected)}

    @staticmethod
    def has_finished(session: Session, round_id: int, device_id: str) -> bool:
        """Whether the device's part of a SecAgg+ round is done (its unmask reply is stored): like an accepted
        update, the round has no more work for it."""
        return session.scalar(select(func.count()).select_from(FLSecureMessage).where(
            FLSecureMessage.round_id == round_id, FLSecureMessage.stage == "unmask",
            FLSecureMessage.device_id == device_id)) > 0

    @staticmethod
    def _replied(session: Session, round_id: int, stage: str, client: int) -> bool:
        return session.get(FLSecureMessage, (round_id, stage, client)) is not None

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
                row = session.get(FLPrivateRound, round_id)
                protocol = SecAggConfig.from_dict(json.loads(row.secagg_config_json))
                waiting = self._protocol(session, round_id, opened)[1]
            if len(waiting) < protocol.minimum_survivors:
                raise RoundAborted(f"only {len(waiting)} devices completed {stage!r}; the round needs "
                                   f"{protocol.minimum_survivors}", clients=sorted(waiting))
        return opened

    def stage_complete(self, round_id: int, stage: str) -> bool:
        with self.database.session() as session:
            row = session.get(FLPrivateRound, round_id)
            if row is None or row.stage != stage:
                return False
            received = session.scalar(select(func.count()).select_from(FLSecureMessage).where(
                FLSecureMessage.round_id == round_id, FLSecureMessage.stage == stage))
            return received >= len(self._protocol(session, round_id, stage)[1])

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

    def _protocol(self, session: Session, round_id: int, stage: str) -> tuple[SecAggServer, dict[int, dict[str, Any]]]:
        """The server state after every stage before `stage`, and `stage`'s request for each device it waits for."""
        key = (round_id, stage)
        if key not in self._replayed:
            row = session.get(FLPrivateRound, round_id)
            protocol = SecAggConfig.from_dict(json.loads(row.secagg_config_json))
            server = SecAggServer(protocol, self._signing_keys(session, round_id))
            requests: dict[int, dict[str, Any]] = {client: {"stage": "advertise_keys"}
                                                   for client in range(protocol.num_clients)}
            for done in STAGES[: STAGES.index(stage)]:
                requests = getattr(server, COLLECT[done])(self._replies(session, round_id, done))
            self._replayed[key] = (server, requests)
            while len(self._replayed) > MAX_CACHED_STAGES:
                self._replayed.popitem(last=False)
        return self._replayed[key]

    @staticmethod
    def _signing_keys(session: Session, round_id: int) -> dict[int, bytes]:
        """Client number -> the registered signing key of the device seated under it."""
        participants = json.loads(session.get(FLPrivateRound, round_id).participants_json)
        keys = dict(session.execute(select(DeviceRecord.id, DeviceRecord.signing_public_key)
                                    .where(DeviceRecord.id.in_(participants))).all())
        return {client: keys[device] for client, device in enumerate(participants) if keys.get(device) is not None}

    @staticmethod
    def _replies(session: Session, round_id: int, stage: str) -> list[dict[str, Any]]:
        rows = session.scalars(select(FLSecureMessage).where(FLSecureMessage.round_id == round_id,
                                                             FLSecureMessage.stage == stage)
                               .order_by(FLSecureMessage.client))
        replies = []
        for row in rows:
            replies.append({**READ_REPLY[stage](row.body), "stage": stage, "client": row.client})
        return replies

    # aggregation -----------------------------------------------------------------------------------

    def aggregate(self, round_id: int, config: RoundConfig, base_parameters: Parameters, strategy: Strategy,
                  clear_deltas: list[Callable[[], Parameters]]) -> tuple[Parameters, dict[str, Any]]:
        """The next global parameters and the round's summary: from the unmasked sum (SecAgg+) or the clear
        deltas clipped again here (DP alone), noised under DP. Raises RoundAborted or InvalidInputError."""
        shapes = {name: value.shape for name, value in base_parameters.items()}
        vector_length = sum(value.size for value in base_parameters.values())
        dp, settings = config.privacy.dp, config.privacy.secure_aggregation
        summary: dict[str, Any] = {"num_examples": None, "client_reported_metrics": {}}
        sensitivity = None
        with self.database.session() as session:
            row = session.get(FLPrivateRound, round_id)
            ledger_json = row.ledger_json
            if settings is not None:
                protocol = SecAggConfig.from_dict(json.loads(row.secagg_config_json))
                server, _ = self._protocol(session, round_id, "unmask")
                result = server.collect_unmask_shares(self._replies(session, round_id, "unmask"))
                upload_bytes = self.progress(session, round_id)[1]
        if settings is not None:
            total, total_weight = dequantise_sum(result.ring_sum, protocol)
            count = len(result.survivors)
            summary["secure_aggregation"] = {
                "num_clients": protocol.num_clients, "neighbour_count": protocol.neighbour_count,
                "threshold": protocol.threshold, "levels": protocol.levels, "clip_range": protocol.clip_range,
                "survivors": count, "dropped": len(result.dropped),
                "misbehaving": {str(client): why for client, why in result.misbehaving.items()}}
            summary["upload_bytes"] = int(upload_bytes)
            if dp is not None:
                if not math.isclose(total_weight, count):
                    raise InvalidInputError(f"the weights of the {count} survivors sum to {total_weight:.3f}: under "
                                            "DP every update must weigh the same (1)", field="weight")
                sensitivity = quantised_sensitivity(protocol.clip_range, protocol.clip_range / protocol.levels,
                                                    vector_length)
            mean_or_sum = total if dp is not None else total / total_weight
        else:  # DP without SecAgg+: the server sees each delta, and clips it itself rather than trust the device
            count = len(clear_deltas)
            mean_or_sum = np.zeros(vector_length)
            for load in clear_deltas:
                mean_or_sum += flatten(clip_delta(load(), dp.clip_norm)[0])
        summary.update(accepted_updates=count, aggregated_updates=count,
                       screening={"norm_limit": dp.clip_norm if dp is not None else None, "counted": count,
                                  "clipped": 0, "rejected": 0})
        if dp is not None:
            ledger = PrivacyLedger.from_dict(json.loads(ledger_json))
            mechanism = DpFedAvg(ledger, config.target_clients, dp.clip_norm)
            mean = mechanism.noised_mean(mean_or_sum, sensitivity=sensitivity)
            summary["privacy_ledger"] = ledger.to_dict()
        else:
            mean, ledger = mean_or_sum, None
        summary["privacy"] = card_privacy(config, ledger, sensitivity)
        return strategy.apply_mean_delta(base_parameters, unflatten(mean, shapes)), summary

    @staticmethod
    def record_release(session: Session, round_id: int, summary: dict[str, Any]) -> None:
        """A noised aggregate left the server (published or refused): the plan's ledger counts the round."""
        if "privacy_ledger" in summary:
            session.execute(update(FLPrivateRound).where(FLPrivateRound.round_id == round_id)
                            .values(ledger_after_json=json.dumps(summary["privacy_ledger"])))


def card_privacy(config: RoundConfig, ledger: PrivacyLedger | None, sensitivity: float | None) -> dict[str, Any]:
    """What a published card says about the privacy of the plan that made it."""
    settings, dp = config.privacy.secure_aggregation, config.privacy.dp
    record: dict[str, Any] = {"secure_aggregation": settings is not None, "dp": None}
    if ledger is not None:
        record["dp"] = {"epsilon": ledger.epsilon_spent, "delta": ledger.delta, "accountant": ledger.mechanism,
                        "rounds": ledger.rounds_done, "max_epsilon": ledger.max_epsilon,
                        "noise_multiplier": ledger.noise_multiplier, "clip_norm": dp.clip_norm,
                        "sensitivity": sensitivity or dp.clip_norm,
                        "sampling_probability": ledger.sampling_probability}
    return record


def _check_masked_vector(body: bytes, protocol: SecAggConfig) -> None:
    expected = (protocol.vector_length + 1) * MASK_DTYPES[protocol.modulus_bits].itemsize
    if len(body) != expected:
        raise InvalidInputError(f"the masked vector must be {protocol.vector_length + 1} little-endian values of "
                                f"{protocol.modulus_bits} bits ({expected} bytes), got {len(body)} bytes",
                                field="masked_vector")


def _check_signature(body: bytes, stage: str, protocol: SecAggConfig, client: int, signing_key: bytes | None,
                     request: dict[str, Any]) -> None:
    """422 unless the reply's signature is the device's, over its keys (advertise_keys) or over the survivor set it
    was sent (consistency_check): a reply its neighbours would refuse is never stored."""
    reply = json.loads(body)
    try:
        signature = from_base64(reply.get("signature"), "signature")
        payload = (signatures.advertise_payload(protocol, client, from_base64(reply["cipher_public_key"], "key"),
                                                from_base64(reply["mask_public_key"], "key"))
                   if stage == "advertise_keys" else
                   signatures.consistency_payload(protocol, client, request["survivors"]))
    except ProtocolViolation:
        signature, payload = b"", b""
    if signing_key is None or not signatures.verify(signing_key, signature, payload):
        raise ValidationFailed(f"the {stage} signature does not verify against this device's registered signing key "
                               "(sign the payload of docs/privacy.md with the key given at registration)",
                               field="signature")


def _aware(moment: datetime) -> datetime:
    """SQLite hands datetimes back without a zone; they were stored as UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)
