"""The round service: the server drives federated rounds, after Bonawitz et al. 2019 ("Towards
Federated Learning at Scale").

A round moves `open → collecting → aggregating → closed | failed`:

- **open** (selection): devices check in with `GET /v1/fl/task`; an eligible device (its task and,
  if it says so, model family match the round) is selected until `target x (1 + over_selection)`
  devices are, then the round is **collecting**. Devices not selected are told when to come back
  (pace steering: `retry_after_s`).
- **reporting** (open or collecting): each selected device uploads one delta against the round's
  base version. Duplicates and stale deltas are refused with 409; deltas are validated (names,
  shapes, dtypes, finite values, size) before they count. An accepted update's bytes go to the
  blob store and its row to the database before the device hears "accepted", so a restart loses
  none.
- **aggregating**: when `target_clients` updates are in, or at the deadline with at least
  `min_clients`, one worker claims the round (a conditional UPDATE naming it the lease owner, so two
  workers never aggregate the same round). The owner renews its short lease every second while it
  works, so a crashed owner's round is taken over within `AGGREGATION_LEASE_S` seconds, not minutes.
  It screens the updates (`fedzoo.server.fl.screening`: capped weights, norm bound), runs the
  strategy over the deltas streamed from the blob store, measures the aggregate and its parent on the
  round's evaluation set (`fedzoo.server.fl.evaluation`) and publishes the aggregate as a new model
  version only if it is not worse than the parent by more than `max_accuracy_drop`. The closing write
  is again conditional on still owning the lease, so a round is published exactly once. Uploads
  arriving after the claim (stragglers, surplus over-selected devices) get 409.
- **failed**: the deadline passed with fewer than `min_clients` updates, too few passed screening,
  the aggregate held non-finite weights, or it was refused for publication. Either way, if the plan
  has rounds left, the next round opens at once (from the last published model).

Private rounds (`privacy.secure_aggregation`, `privacy.dp`, see `fedzoo.server.fl.secure_rounds`): under
SecAgg+ the collecting state has sub-stages in which devices run the protocol instead of uploading deltas,
and aggregation starts from the unmasked sum; under DP the server adds noise and keeps the plan's ledger.

Deadlines are enforced twice: every call into the service first advances the rounds whose deadline
or lease has passed (`advance`), so the state is right whenever anyone looks, and the serving process
runs `advance` in the background (`fedzoo.server.fl.deadlines`), so an overdue round closes or fails,
and the next one opens, with no traffic at all.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fedzoo.capabilities import UPLOAD_ENCODINGS, Capabilities
from fedzoo.cards import Metrics, ModelCard
from fedzoo.clients.update_codec import decode_update, split_statistics
from fedzoo.dp.accountant import PrivacyBudgetExhausted
from fedzoo.edge.onnx_initializers import read_float_initializers, replace_initializers
from fedzoo.errors import FedzooError, InvalidInputError, NotFoundError
from fedzoo.secagg.errors import RoundAborted
from fedzoo.server.blobstore import BlobStore
from fedzoo.server.db import Database
from fedzoo.server.errors import Conflict, Forbidden, PayloadTooLarge
from fedzoo.server.fl.eligibility import DECLINED, missing_capabilities
from fedzoo.server.fl.evaluation import client_reported_metrics, decide_publication, evaluate
from fedzoo.server.fl.faults import crash_point
from fedzoo.server.fl.models import ACTIVE_STATES, FLParticipant, FLRefusedUpload, FLRound, FLUpdate
from fedzoo.server.fl.schemas import RoundConfig, Task, TaskResponse, TrainingConfig, UpdateMetadata, UploadSpec
from fedzoo.server.fl.running_statistics import aggregate_statistics, training_graph_state, validate_statistics, variance_names
from fedzoo.server.fl.screening import Screened, screen_updates
from fedzoo.server.fl.secure_rounds import DONE, PrivateRounds, is_private, with_calibrated_noise
from fedzoo.server.fl.strategies import (
    ClientUpdate, Parameters, Strategy, make_strategy, require_secure_aggregation_support,
)
from fedzoo.server.latency import LatencyEstimator
from fedzoo.server.models import DeviceRecord
from fedzoo.server import registry
from fedzoo.signing import CardSigningKey, sign_card

log = logging.getLogger(__name__)
AGGREGATION_LEASE_S = 4.0  # renewed every LEASE_RENEWAL_S while the owner works: a crash costs at most this
LEASE_RENEWAL_S = 1.0
DEFAULT_MAX_EXAMPLES_PER_UPDATE = 10_000
IDLE_RETRY_AFTER_S = 30.0
UPLOAD_OVERHEAD_BYTES = 64 * 1024  # npz headers and int8 scales on top of the raw float32 deltas
MAX_ROUND_ID = 2**63 - 1  # SQL BIGINT


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(moment: datetime) -> datetime:
    """SQLite hands datetimes back without a zone; they were stored as UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class RoundBase:
    """What the round needs to know about its base model: the trainable parameters, the BatchNorm running
    statistics devices update (`fedzoo.server.fl.running_statistics`) and where the blobs are."""

    card: ModelCard
    onnx_bytes: bytes
    parameters: Parameters
    statistics: Parameters = field(default_factory=dict)
    variances: frozenset[str] = frozenset()  # the statistics that are running variances

    @property
    def float32_bytes(self) -> int:
        return sum(value.size * 4 for value in (*self.parameters.values(), *self.statistics.values()))


def validate_delta(delta: Parameters, base: Parameters) -> float:
    """Check a decoded delta against the base parameters and return its L2 norm; errors name the tensor."""
    missing, unexpected = sorted(set(base) - set(delta)), sorted(set(delta) - set(base))
    if missing or unexpected:
        raise InvalidInputError(
            f"the delta must hold exactly the round's trainable parameters; missing {missing}, unexpected {unexpected}",
            field=(missing or unexpected)[0],
        )
    squared = 0.0
    for name, value in delta.items():
        if value.shape != base[name].shape:
            raise InvalidInputError(f"delta {name!r} has shape {value.shape}, the parameter {base[name].shape}", field=name)
        if value.dtype != np.float32:
            raise InvalidInputError(f"delta {name!r} has dtype {value.dtype}, expected float32", field=name)
        if not np.all(np.isfinite(value)):
            raise InvalidInputError(f"delta {name!r} holds NaN or infinite values", field=name)
        squared += float(np.vdot(value, value))
    return math.sqrt(squared)


# Refusals that say nothing about a selected device's update: not selected, no such round, a repeated upload.
UNRECORDED_REFUSALS = ("not_selected", "duplicate_update")


def refusal_kind(error: FedzooError) -> str | None:
    """How the operator's view records a refused upload: `late` when the round no longer took updates,
    `rejected` for a bad update, None when there is nothing to record about the device's update."""
    code = getattr(error, "code", None)
    if isinstance(error, NotFoundError) or code in UNRECORDED_REFUSALS:
        return None
    return "late" if code == "round_not_accepting" else "rejected"


def _find_round(session: Session, round_id: int) -> FLRound:
    """The round with this id, or 404; ids past the database's 64-bit integers name no round (not a 500)."""
    round_row = session.get(FLRound, round_id) if 1 <= round_id <= MAX_ROUND_ID else None
    if round_row is None:
        raise NotFoundError(f"no federated round {round_id}")
    return round_row


class RoundService:
    """Creates rounds, selects devices, admits updates and aggregates; all state in the database."""

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
    ) -> None:
        self.database, self.store, self.estimator, self.clock = database, store, estimator, clock
        self.signing_key = signing_key  # signs every version a round publishes
        self.aggregation_lease_s = aggregation_lease_s
        self.spill_dir = spill_dir
        self.max_examples_per_update = max_examples_per_update
        # who holds an aggregation lease: unique per service instance, readable in the database
        self.owner_id = f"{socket.gethostname()[:32]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        if spill_dir is not None:
            spill_dir.mkdir(parents=True, exist_ok=True)
        self._base_models: dict[str, RoundBase] = {}
        self.private = PrivateRounds(database, clock)
        self._parent_metrics: dict[tuple[str, str], Metrics] = {}

    # base models ---------------------------------------------------------------------------------

    def base_model(self, session: Session, model_id: str) -> RoundBase:
        """The card, ONNX bytes and trainable parameters of a published model (cached: blobs are immutable)."""
        card = ModelCard.from_dict(registry.get_card(session, model_id))
        cached = self._base_models.get(card.sha256)
        if cached is not None:
            return cached
        if card.training_graph is None:
            raise InvalidInputError(
                f"model {model_id!r} has no training graph, so devices cannot fine-tune it", field="model_id"
            )
        with self.store.open(card.sha256) as stream:
            onnx_bytes = stream.read()
        with self.store.open(card.training_graph) as stream:
            names, statistic_names = training_graph_state(stream.read())
        initializers = read_float_initializers(onnx_bytes)
        missing = [name for name in (*names, *statistic_names) if name not in initializers]
        if missing:
            raise InvalidInputError(
                f"the training graph of {model_id!r} trains {missing}, which are not initializers of its model",
                field="model_id",
            )
        base = RoundBase(card, onnx_bytes, {name: initializers[name] for name in names},
                         {name: initializers[name] for name in statistic_names},
                         frozenset(variance_names(onnx_bytes)) if statistic_names else frozenset())
        if len(self._base_models) >= 8:
            self._base_models.pop(next(iter(self._base_models)))
        self._base_models[card.sha256] = base
        return base

    # admin: rounds --------------------------------------------------------------------------------

    def create_round(self, config: RoundConfig) -> int:
        """Open the first round of a plan of `config.num_rounds` rounds; returns its id."""
        strategy = make_strategy(config.strategy)  # refuse a bad strategy now, not at aggregation
        if is_private(config):
            require_secure_aggregation_support(strategy)  # DP, too, needs only the equal-weighted sum
            self._check_secure_cohort(config)
            config = with_calibrated_noise(config)
        if config.max_examples_per_update is None:  # record the cap in force, so the round's config says it
            config = config.model_copy(update={"max_examples_per_update": self.max_examples_per_update})
        with self.database.session() as session:
            base = self.base_model(session, config.model_id)
            self._check_evaluation_set(config.evaluation_sha256, base.card)
            try:
                round_row = self._open_round(session, config, base.card, number=1, remaining=config.num_rounds,
                                             previous=None)
            except PrivacyBudgetExhausted as error:
                raise InvalidInputError(str(error), field="privacy.dp.max_epsilon") from None
            return round_row.id

    @staticmethod
    def _check_secure_cohort(config: RoundConfig) -> None:
        """SecAgg+ needs a cohort of at least 3 (2 could each subtract the other's input from the sum)."""
        goal = math.ceil(config.target_clients * (1 + config.over_selection))
        if config.privacy.secure_aggregation is not None and goal < 3:
            raise InvalidInputError(f"secure aggregation needs at least 3 selected devices; target_clients x "
                                    f"(1 + over_selection) is {goal}", field="privacy.secure_aggregation")

    def _check_evaluation_set(self, sha256: str, card: ModelCard) -> None:
        """The evaluation blob must be an `.npz` of images `x` shaped like the model's input and labels `y`."""
        if not self.store.exists(sha256):
            raise InvalidInputError(f"evaluation_sha256 names blob {sha256}, which is not uploaded",
                                    field="evaluation_sha256")
        try:
            with self.store.open(sha256) as stream, np.load(io.BytesIO(stream.read()), allow_pickle=False) as archive:
                x_shape, y_shape = archive["x"].shape, archive["y"].shape
        except (KeyError, ValueError, OSError) as error:
            raise InvalidInputError(f"the evaluation blob is not an .npz with arrays 'x' and 'y': {error}",
                                    field="evaluation_sha256") from None
        expected = tuple(dim for dim in card.input.shape[1:])
        if len(x_shape) != len(card.input.shape) or x_shape[1:] != expected or y_shape != x_shape[:1] or not y_shape[0]:
            raise InvalidInputError(
                f"the evaluation set has x {x_shape} and y {y_shape}; the model needs x (N, {', '.join(map(str, expected))}) "
                "and y (N,) with N >= 1", field="evaluation_sha256")

    def _open_round(
        self, session: Session, config: RoundConfig, card: ModelCard, number: int, remaining: int, previous: FLRound | None
    ) -> FLRound:
        ledger = self.private.ledger_for_next_round(session, config, previous)  # raises when over budget
        now = self.clock()
        round_row = FLRound(
            task=card.task,
            family=card.family,
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
        self.private.record_open(session, round_row, config, ledger)
        return round_row

    # devices: check-in ---------------------------------------------------------------------------

    def check_in(self, device_id: str, task: str, family: str | None = None,
                 capabilities: Capabilities = Capabilities()) -> TaskResponse:
        """Select the device for a round it is capable of and return its task, or tell it when to come back."""
        self.advance()
        with self.database.session() as session:
            query = select(FLRound).where(FLRound.task == task, FLRound.state.in_(ACTIVE_STATES)).order_by(FLRound.id)
            if family is not None:
                query = query.where(FLRound.family == family)
            rounds = list(session.scalars(query))
            incapable, refusal = [], None
            for round_row in rounds:
                if self._has_update(session, round_row.id, device_id) or self.private.has_finished(
                        session, round_row.id, device_id) or self._declined(session, round_row.id, device_id):
                    continue
                if session.get(FLParticipant, (round_row.id, device_id)) is not None:
                    return TaskResponse(task=self._task(session, round_row, device_id), retry_after_s=None)
                if round_row.state == "open":
                    config = RoundConfig.model_validate_json(round_row.config_json)
                    refusal = self.private.seat_refusal(session, config, device_id)
                    if refusal is not None:  # what the device is (keyless) before what it says it can do
                        continue
                    missing = missing_capabilities(config, capabilities)
                    if missing:
                        incapable.append(f"round {round_row.id} needs {' and '.join(missing)}")
                        continue
                    self._select(session, round_row, device_id)
                    return TaskResponse(task=self._task(session, round_row, device_id), retry_after_s=None)
            if incapable and refusal is None:
                return TaskResponse(task=None, retry_after_s=IDLE_RETRY_AFTER_S,
                                    reason=f"{'; '.join(incapable)}, which this device did not declare "
                                           "(GET /v1/fl/task's secure_aggregation, dp_clipping, encodings)")
            if rounds:
                config = RoundConfig.model_validate_json(rounds[0].config_json)
                remaining_s = (as_utc(rounds[0].deadline_at) - self.clock()).total_seconds()
                return TaskResponse(
                    task=None,
                    retry_after_s=round(max(0.1, min(config.poll_interval_s, remaining_s)), 3),
                    reason=refusal or "the current round has selected its devices; ask again for the next one",
                )
            return TaskResponse(task=None, retry_after_s=IDLE_RETRY_AFTER_S, reason=f"no round is running for task {task!r}")

    @staticmethod
    def _has_update(session: Session, round_id: int, device_id: str) -> bool:
        return session.scalar(
            select(func.count()).select_from(FLUpdate).where(FLUpdate.round_id == round_id, FLUpdate.device_id == device_id)
        ) > 0

    @staticmethod
    def _declined(session: Session, round_id: int, device_id: str) -> bool:
        return session.scalar(select(func.count()).select_from(FLRefusedUpload).where(
            FLRefusedUpload.round_id == round_id, FLRefusedUpload.device_id == device_id,
            FLRefusedUpload.kind == DECLINED)) > 0

    def decline(self, device_id: str, round_id: int, reason: str, message: str) -> dict[str, Any]:
        """A selected device will not do the round's task: recorded with its reason, and the round no longer offers
        it to the device. Its seat stays taken (under SecAgg+ it misses the stages: a dropout)."""
        with self.database.session() as session:
            _find_round(session, round_id)
            if session.get(FLParticipant, (round_id, device_id)) is None:
                raise Forbidden(f"device {device_id!r} was not selected for round {round_id}; only a selected device "
                                "declines its task", field="round_id", code="not_selected")
            if not self._declined(session, round_id, device_id):
                session.add(FLRefusedUpload(round_id=round_id, device_id=device_id, kind=DECLINED,
                                            reason=f"{reason}: {message}"[:2000], upload_bytes=0,
                                            received_at=self.clock()))
        return {"round_id": round_id, "reason": reason}

    def _select(self, session: Session, round_row: FLRound, device_id: str) -> None:
        """Seat the device; at the selection goal the round stops selecting. Concurrent check-ins may seat a
        device or two past the goal, which is harmless: reports beyond the target are refused anyway."""
        config = RoundConfig.model_validate_json(round_row.config_json)
        goal = math.ceil(config.target_clients * (1 + config.over_selection))
        session.add(FLParticipant(round_id=round_row.id, device_id=device_id, selected_at=self.clock()))
        session.flush()
        if self._count(session, FLParticipant, round_row.id) >= goal:
            round_row.state = "collecting"
            base = self.base_model(session, round_row.base_model_id)
            self.private.start_stages(session, round_row, config, sum(v.size for v in base.parameters.values()))

    @staticmethod
    def _count(session: Session, table: type, round_id: int) -> int:
        return session.scalar(select(func.count()).select_from(table).where(table.round_id == round_id)) or 0

    def _task(self, session: Session, round_row: FLRound, device_id: str) -> Task:
        config = RoundConfig.model_validate_json(round_row.config_json)
        base = self.base_model(session, round_row.base_model_id)
        strategy_fields = make_strategy(config.strategy).configure_fit(round_row.number)
        return Task(
            round_id=round_row.id,
            round_number=round_row.number,
            model_id=base.card.id,
            base_version=round_row.base_version,
            model_sha256=base.card.sha256,
            model_url=f"/v1/models/{base.card.id}/blob",
            training_graph_sha256=base.card.training_graph,
            training_graph_url=f"/v1/blobs/{base.card.training_graph}",
            deadline_at=as_utc(round_row.deadline_at),
            training=TrainingConfig(
                local_epochs=config.local_epochs,
                batch_size=config.batch_size,
                learning_rate=config.learning_rate * config.learning_rate_decay ** (round_row.number - 1),
                optimizer=config.optimizer,
                momentum=config.momentum,
                **strategy_fields,
            ),
            upload=UploadSpec(
                url=f"/v1/fl/rounds/{round_row.id}/updates",
                encodings=list(UPLOAD_ENCODINGS),
                max_bytes=self.max_upload_bytes(base),
            ),
            privacy=self.private.task_privacy(session, round_row, config, device_id,
                                              config.max_examples_per_update or self.max_examples_per_update),
        )

    @staticmethod
    def max_upload_bytes(base: RoundBase) -> int:
        return base.float32_bytes + UPLOAD_OVERHEAD_BYTES

    def max_masked_vector_bytes(self, round_id: int) -> int:
        """The most a masked vector of this round can be: 4 bytes a value (its exact size is checked later)."""
        with self.database.session() as session:
            return self.max_upload_bytes(self.base_model(session, _find_round(session, round_id).base_model_id))

    # devices: reporting --------------------------------------------------------------------------

    def submit_update(self, device_id: str, round_id: int, metadata: UpdateMetadata, data: bytes) -> dict[str, Any]:
        """Admit one device's delta, or refuse it naming why (a selected device's refusal is recorded for the
        operator as late or rejected); aggregates when the target is reached."""
        try:
            return self._admit_update(device_id, round_id, metadata, data)
        except FedzooError as error:
            self._record_refusal(device_id, round_id, error, len(data))
            raise

    def _record_refusal(self, device_id: str, round_id: int, error: FedzooError, upload_bytes: int) -> None:
        kind = refusal_kind(error)
        if kind is None:
            return
        try:
            with self.database.session() as session:
                session.add(FLRefusedUpload(round_id=round_id, device_id=device_id, kind=kind, reason=str(error)[:2000],
                                            upload_bytes=upload_bytes, received_at=self.clock()))
        except Exception:  # the device must still hear why it was refused
            log.exception("could not record the refused upload of device %s in round %s", device_id, round_id)

    def _admit_update(self, device_id: str, round_id: int, metadata: UpdateMetadata, data: bytes) -> dict[str, Any]:
        self.advance()
        with self.database.session() as session:
            round_row = _find_round(session, round_id)
            if session.get(FLParticipant, (round_id, device_id)) is None:
                raise Forbidden(f"device {device_id!r} was not selected for round {round_id}; ask GET /v1/fl/task",
                                code="not_selected")
            if self._has_update(session, round_id, device_id):
                raise self._duplicate(device_id, round_id)
            if round_row.state not in ACTIVE_STATES:
                raise self._not_accepting(round_id, round_row.state)
            if metadata.base_version != round_row.base_version:
                raise Conflict(
                    f"the update was computed against version {metadata.base_version}, but round {round_id} "
                    f"fine-tunes version {round_row.base_version} of {round_row.base_model_id!r}",
                    field="base_version", code="stale_update",
                )
            base = self.base_model(session, round_row.base_model_id)
            config = RoundConfig.model_validate_json(round_row.config_json)
            if config.privacy.secure_aggregation is not None:
                raise Conflict(f"round {round_id} runs secure aggregation: reply to its stages "
                               f"(/v1/fl/rounds/{round_id}/secagg/<stage>) instead of uploading a delta",
                               code="secure_round")
        target = config.target_clients
        counted_examples = min(metadata.num_examples, config.max_examples_per_update or metadata.num_examples)
        limit = self.max_upload_bytes(base)
        if len(data) > limit:
            raise PayloadTooLarge(f"the update has {len(data)} bytes; this round's model allows at most {limit}",
                                  field="delta")
        delta, encoding = decode_update(data, max_decoded_bytes=limit)
        delta, statistics = split_statistics(delta)
        norm = validate_delta(delta, base.parameters)
        validate_statistics(statistics, base.statistics)
        for name, value in metadata.metrics.items():
            if not math.isfinite(value):
                raise InvalidInputError(f"metric {name!r} is {value}; metrics must be finite", field=f"metrics.{name}")
        blob = self.store.put(data)  # content-addressed: a refused upload leaves at most an unreferenced blob
        with self.database.session() as session:
            # Re-check the state in the same write as the insert: this conditional UPDATE and the aggregation
            # claim both write the round row, so they serialise, and an update that gets 201 is always one
            # the aggregation reads.
            still_active = session.execute(
                update(FLRound)
                .where(FLRound.id == round_id, FLRound.state.in_(ACTIVE_STATES), FLRound.deadline_at > self.clock())
                .values(state=FLRound.state)
            ).rowcount
            if not still_active:
                raise self._not_accepting(round_id, session.get(FLRound, round_id).state)
            session.add(FLUpdate(
                round_id=round_id, device_id=device_id, blob_sha256=blob, encoding=encoding, upload_bytes=len(data),
                num_examples=metadata.num_examples, counted_examples=counted_examples, delta_norm=norm,
                metrics_json=json.dumps(metadata.metrics), received_at=self.clock(),
            ))
            try:
                session.flush()
            except IntegrityError:
                raise self._duplicate(device_id, round_id) from None
            accepted = self._count(session, FLUpdate, round_id)
        crash_point("upload.stored")
        if accepted >= target:
            try:
                self._aggregate_if_claimed(round_id)
            except Exception:  # the update is stored and counts: say so; the lease lets another try again
                log.exception("aggregating round %s failed; it is retried when the lease runs out", round_id)
        with self.database.session() as session:
            state = session.get(FLRound, round_id).state
        return {"round_id": round_id, "device_id": device_id, "accepted_updates": accepted,
                "counted_examples": counted_examples, "upload_bytes": len(data), "encoding": encoding,
                "round_state": state}

    @staticmethod
    def _duplicate(device_id: str, round_id: int) -> Conflict:
        return Conflict(f"device {device_id!r} already sent its update for round {round_id}", code="duplicate_update")

    @staticmethod
    def _not_accepting(round_id: int, state: str) -> Conflict:
        return Conflict(
            f"round {round_id} is {state} and takes no more updates (its deadline passed or it has its target)",
            code="round_not_accepting", round_state=state,
        )

    # deadlines, aggregation ----------------------------------------------------------------------

    def advance(self) -> None:
        """Move every round whose deadline or aggregation lease has passed to its next state."""
        for round_id, stage in self.private.overdue_stages():
            self._close_secure_stage(round_id, stage)
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
                accepted = self._count(session, FLUpdate, round_id)
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
                        self._fail(session, round_row, self._deadline_failure(session, round_row, config, accepted))
                    continue
            self._aggregate_if_claimed(round_id)

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
        self.advance()
        with self.database.session() as session:
            round_row = _find_round(session, round_id)
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
            self._fail_active(round_id, f"secure aggregation aborted after {stage!r}: {error}")
            return
        if opened == DONE:
            try:
                self._aggregate_if_claimed(round_id)
            except Exception:  # every reply is stored: the round is aggregated again when the lease runs out
                log.exception("aggregating round %s failed; it is retried when the lease runs out", round_id)

    def _fail_active(self, round_id: int, reason: str) -> None:
        """Fail a round still collecting (a conditional claim: one worker does it) and go on with the plan."""
        with self.database.session() as session:
            claimed = session.execute(
                update(FLRound).where(FLRound.id == round_id, FLRound.state.in_(ACTIVE_STATES)).values(state="failed")
            ).rowcount
            if claimed:
                round_row = session.get(FLRound, round_id)
                session.refresh(round_row)
                self._fail(session, round_row, reason)

    def _aggregate_if_claimed(self, round_id: int) -> None:
        now = self.clock()
        lease_until = now + timedelta(seconds=self.aggregation_lease_s)
        with self.database.session() as session:
            claimed = session.execute(
                update(FLRound)
                .where(FLRound.id == round_id, or_(
                    FLRound.state.in_(ACTIVE_STATES),
                    (FLRound.state == "aggregating") & (FLRound.aggregation_lease_until <= now),
                ))
                .values(state="aggregating", aggregation_lease_until=lease_until, aggregation_owner=self.owner_id)
            ).rowcount
        if claimed:
            crash_point("aggregation.claimed")
            with self._renewing_lease(round_id):
                self._aggregate(round_id)

    @contextmanager
    def _renewing_lease(self, round_id: int) -> Iterator[None]:
        """Renew this service's aggregation lease on the round every LEASE_RENEWAL_S while the block runs."""
        stopped = threading.Event()

        def renew() -> None:
            while not stopped.wait(min(LEASE_RENEWAL_S, self.aggregation_lease_s / 4)):
                try:
                    with self.database.session() as session:
                        session.execute(
                            update(FLRound).where(FLRound.id == round_id, FLRound.state == "aggregating",
                                                  FLRound.aggregation_owner == self.owner_id)
                            .values(aggregation_lease_until=self.clock() + timedelta(seconds=self.aggregation_lease_s))
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

    def _finish_if_owner(self, session: Session, round_id: int, state: str) -> FLRound | None:
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

    def _aggregate(self, round_id: int) -> None:
        with self.database.session() as session:
            round_row = session.get(FLRound, round_id)
            config = RoundConfig.model_validate_json(round_row.config_json)
            base = self.base_model(session, round_row.base_model_id)
            rows = list(session.scalars(select(FLUpdate).where(FLUpdate.round_id == round_id).order_by(FLUpdate.id)))
            revoked = frozenset(session.scalars(select(DeviceRecord.id).where(
                DeviceRecord.id.in_({row.device_id for row in rows}), DeviceRecord.revoked_at.is_not(None))))
            previous_state = round_row.strategy_state_sha256
        strategy = make_strategy(config.strategy, self.spill_dir)
        if previous_state is not None:
            strategy.load_state(self._load_npz(previous_state))
        if is_private(config):
            screened: list[Screened] = []
            summary: dict[str, Any] = {"strategy": strategy.name, "upload_bytes": sum(row.upload_bytes for row in rows)}
            aggregate = lambda: self._private_aggregate(round_id, config, base, rows, strategy, summary)  # noqa: E731
        else:
            updates = [
                ClientUpdate(row.device_id, row.counted_examples or row.num_examples,
                             self._delta_loader(row.blob_sha256), row.delta_norm, json.loads(row.metrics_json))
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
            if len(kept) < config.min_clients:
                self._refuse(round_id, rows, screened, summary,
                             f"only {len(kept)} of {len(rows)} updates passed screening; "
                             f"the round needs {config.min_clients}")
                return
            summary["strategy"] = strategy.name
            aggregate = lambda: strategy.aggregate_fit(base.parameters, kept)  # noqa: E731
        try:
            parameters = aggregate()
            if not all(np.all(np.isfinite(value)) for value in parameters.values()):
                raise InvalidInputError(f"the {strategy.name} aggregate holds NaN or infinite weights")
            statistics: Parameters = {}
            if base.statistics and not is_private(config):  # under SecAgg+/DP the statistics stay the parent's
                blobs = {row.device_id: row.blob_sha256 for row in rows}
                statistics, summary["running_statistics"] = aggregate_statistics(
                    base.statistics, kept, lambda update: self._delta_loader(blobs[update.device_id], statistics=True)(),
                    config.norm_bound, base.variances)
            onnx_bytes = replace_initializers(base.onnx_bytes, {**parameters, **statistics})
            with self.store.open(config.evaluation_sha256) as stream:
                evaluation_npz = stream.read()
            measured = evaluate(onnx_bytes, base.card, evaluation_npz)
            parent = self._parent_evaluation(base, config.evaluation_sha256, evaluation_npz)
        except FedzooError as error:  # a bad result (or an aborted SecAgg+), not a crash: fail cleanly and go on
            self._refuse(round_id, rows, screened, summary, f"aggregation failed: {error}")
            return
        decision = decide_publication(measured, parent, config.max_accuracy_drop)
        summary.update(evaluation=measured.model_dump(), parent_evaluation=parent.model_dump(),
                       publication={"published": decision.publish, "reason": decision.reason})
        if not decision.publish:
            summary["refused_model_sha256"] = self.store.put(onnx_bytes)
            self._refuse(round_id, rows, screened, summary, f"the aggregate was not published: {decision.reason}")
            return
        sha256 = self.store.put(onnx_bytes)
        crash_point("aggregation.publishing")
        with self.database.session() as session:
            round_row = self._finish_if_owner(session, round_id, "closed")
            if round_row is None:
                return
            self.private.record_release(session, round_id, summary)
            self._record_screening(session, rows, screened)
            card = self._publish(session, round_row, base, sha256, len(onnx_bytes), measured, summary)
            self._close(session, round_row, card, strategy, summary)

    def _private_aggregate(self, round_id: int, config: RoundConfig, base: RoundBase, rows: list[FLUpdate],
                           strategy: Strategy, summary: dict[str, Any]) -> Parameters:
        """SecAgg+ and/or DP: the parameters from the secure sum or the clipped deltas; fills in the summary."""
        parameters, private_summary = self.private.aggregate(
            round_id, config, base.parameters, strategy, [self._delta_loader(row.blob_sha256) for row in rows])
        summary.update(private_summary)
        return parameters

    def _parent_evaluation(self, base: RoundBase, evaluation_sha256: str, evaluation_npz: bytes) -> Metrics:
        """The parent measured on the same set as the aggregate (cached: both blobs are immutable)."""
        key = (base.card.sha256, evaluation_sha256)
        if key not in self._parent_metrics:
            self._parent_metrics[key] = evaluate(base.onnx_bytes, base.card, evaluation_npz)
        return self._parent_metrics[key]

    def _refuse(self, round_id: int, rows: list[FLUpdate], screened: list[Screened], summary: dict[str, Any],
                reason: str) -> None:
        """Fail the round with its outcome recorded (a bad result, not a crash) and go on with the plan."""
        with self.database.session() as session:
            round_row = self._finish_if_owner(session, round_id, "failed")
            if round_row is not None:
                self.private.record_release(session, round_id, summary)
                self._record_screening(session, rows, screened)
                self._fail(session, round_row, reason, summary)

    @staticmethod
    def _record_screening(session: Session, rows: list[FLUpdate], screened: list[Screened]) -> None:
        for row, decision in zip(rows, screened):
            session.execute(update(FLUpdate).where(FLUpdate.id == row.id).values(
                screening=decision.outcome, screening_reason=decision.reason, counted_norm=decision.counted_norm))

    def _close(self, session: Session, round_row: FLRound, card: ModelCard, strategy: Strategy,
               summary: dict[str, Any]) -> None:
        config = RoundConfig.model_validate_json(round_row.config_json)
        round_row.state = "closed"
        round_row.result_model_id = card.id
        round_row.finished_at = self.clock()
        round_row.aggregation_lease_until = None
        state = strategy.state()
        if state:
            round_row.strategy_state_sha256 = self._save_npz(state)
        round_row.outcome_json = json.dumps({"metrics": card.metrics.model_dump(), **summary})
        self._open_next(session, round_row, config, card)

    def _delta_loader(self, blob_sha256: str, statistics: bool = False) -> Callable[[], Parameters]:
        """A loader of an update's parameter deltas, or of its running-statistic deltas."""
        def load() -> Parameters:
            with self.store.open(blob_sha256) as stream:
                return split_statistics(decode_update(stream.read())[0])[1 if statistics else 0]

        return load

    def _load_npz(self, sha256: str) -> Parameters:
        with self.store.open(sha256) as stream, np.load(io.BytesIO(stream.read()), allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}

    def _save_npz(self, arrays: Parameters) -> str:
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        return self.store.put(buffer.getvalue())

    def _publish(self, session: Session, round_row: FLRound, base: RoundBase, sha256: str, size_bytes: int,
                 measured: Metrics, summary: dict[str, Any]) -> ModelCard:
        """Register the aggregate as the next version: its metrics are the server's measurement; what the
        devices said about themselves travels in `details.federated.client_reported_metrics`."""
        version = base.card.version + 1
        card = base.card.model_copy(update={
            "id": f"{base.card.family}-v{version}-r{round_row.id}"[:128],
            "version": version,
            "parent_id": base.card.id,
            "sha256": sha256,
            "size_bytes": size_bytes,
            "metrics": measured,
            "created_at": self.clock(),
            "details": {**base.card.details, "federated": {
                "round_id": round_row.id, "round_number": round_row.number, "strategy": summary["strategy"],
                "accepted_updates": summary["accepted_updates"], "aggregated_updates": summary["aggregated_updates"],
                "num_examples": summary["num_examples"], "screening": summary["screening"],
                "metrics_source": "the server's evaluation set (held out, measured on the server)",
                "parent_evaluation": summary["parent_evaluation"],
                "client_reported_metrics": summary["client_reported_metrics"], "base_model_id": base.card.id,
                **({"privacy": summary["privacy"]} if "privacy" in summary else {}),
            }},
        })
        card = sign_card(ModelCard.from_dict(card.model_dump(exclude={"signature"})), self.signing_key,
                         now=self.clock())
        registry.publish(session, self.store, self.estimator, card)
        return card

    def _fail(self, session: Session, round_row: FLRound, reason: str, summary: dict[str, Any] | None = None) -> None:
        round_row.state = "failed"
        round_row.finished_at = self.clock()
        round_row.aggregation_lease_until = None
        round_row.outcome_json = json.dumps({"failure": reason, **(summary or {})})
        config = RoundConfig.model_validate_json(round_row.config_json)
        card = ModelCard.from_dict(registry.get_card(session, round_row.base_model_id))
        self._open_next(session, round_row, config, card)

    def _open_next(self, session: Session, round_row: FLRound, config: RoundConfig, card: ModelCard) -> None:
        if round_row.rounds_remaining > 1:
            try:
                self._open_round(session, config, card, round_row.number + 1, round_row.rounds_remaining - 1, round_row)
            except PrivacyBudgetExhausted as error:  # the plan stops here; the round says why
                round_row.outcome_json = json.dumps({**json.loads(round_row.outcome_json or "{}"),
                                                     "plan_stopped": str(error)})

    # reading -------------------------------------------------------------------------------------

    def round_view(self, round_id: int) -> dict[str, Any]:
        """Everything about one round: state, configuration, counts, bytes on the wire and outcome."""
        self.advance()
        with self.database.session() as session:
            round_row = _find_round(session, round_id)
            upload_bytes = session.scalar(
                select(func.coalesce(func.sum(FLUpdate.upload_bytes), 0)).where(FLUpdate.round_id == round_id)
            )
            accepted = self._count(session, FLUpdate, round_id)
            secure = self.private.progress(session, round_id)
            if secure is not None:  # under SecAgg+ the updates are the masked inputs; bytes are every stage's
                accepted, upload_bytes = secure
            next_round = session.scalar(select(FLRound.id).where(FLRound.previous_round_id == round_id))
            return {
                "id": round_row.id, "number": round_row.number, "rounds_remaining": round_row.rounds_remaining,
                "state": round_row.state, "task": round_row.task, "family": round_row.family,
                "base_model_id": round_row.base_model_id, "base_version": round_row.base_version,
                "config": json.loads(round_row.config_json), "created_at": as_utc(round_row.created_at),
                "deadline_at": as_utc(round_row.deadline_at),
                "finished_at": as_utc(round_row.finished_at) if round_row.finished_at else None,
                "selected_devices": self._count(session, FLParticipant, round_id),
                "accepted_updates": accepted, "upload_bytes": int(upload_bytes),
                "result_model_id": round_row.result_model_id,
                "outcome": json.loads(round_row.outcome_json) if round_row.outcome_json else None,
                "next_round_id": next_round,
                "declined_devices": session.scalar(select(func.count()).select_from(FLRefusedUpload).where(
                    FLRefusedUpload.round_id == round_id, FLRefusedUpload.kind == DECLINED)) or 0,
            }

