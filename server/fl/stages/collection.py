"""Collection (reporting, while a round is open or collecting): each selected device uploads one delta against
the round's base version. Duplicates and stale deltas are refused with 409; deltas are validated (names,
shapes, dtypes, finite values, size) before they count. An accepted update's bytes go to the blob store and
its row to the database before the device hears "accepted", so a restart loses none. A selected device's
refused upload is recorded for the operator as late or rejected."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy.exc import IntegrityError

from fedzoo.aggregation.running_statistics import validate_statistics
from fedzoo.aggregation.strategies import Parameters
from fedzoo.errors import FedzooError, InvalidInputError, NotFoundError
from fedzoo.server.errors import Conflict, Forbidden, PayloadTooLarge
from fedzoo.server.fl import sampling
from fedzoo.server.fl.base_models import max_upload_bytes
from fedzoo.server.fl.faults import crash_point
from fedzoo.server.fl.tables import ACTIVE_STATES, FLParticipant, FLRefusedUpload, FLRound, FLUpdate
from fedzoo.server.fl.round_context import RoundContext, count_rows, find_round, has_update, lock_round_before_deadline
from fedzoo.server.fl.schemas import RoundConfig, UpdateMetadata
from fedzoo.update_codec import decode_update, split_statistics

log = logging.getLogger(__name__)

# Refusals that say nothing about a selected device's update: not selected, no such round, a repeated upload.
UNRECORDED_REFUSALS = ("not_selected", "duplicate_update")


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


def refusal_kind(error: FedzooError) -> str | None:
    """How the operator's view records a refused upload: `late` when the round no longer took updates,
    `rejected` for a bad update, None when there is nothing to record about the device's update."""
    code = getattr(error, "code", None)
    if isinstance(error, NotFoundError) or code in UNRECORDED_REFUSALS:
        return None
    return "late" if code == "round_not_accepting" else "rejected"


def duplicate_update(device_id: str, round_id: int) -> Conflict:
    return Conflict(f"device {device_id!r} already sent its update for round {round_id}", code="duplicate_update")


def not_accepting(round_id: int, state: str) -> Conflict:
    return Conflict(
        f"round {round_id} is {state} and takes no more updates (its deadline passed or it has its target)",
        code="round_not_accepting", round_state=state,
    )


@dataclass(frozen=True)
class Admitted:
    """A stored update: the receipt the device gets, and whether the round now has its target."""

    receipt: dict[str, Any]
    target_reached: bool


class Collection:
    """Admits (or refuses, recording why) the deltas selected devices upload."""

    def __init__(self, context: RoundContext) -> None:
        self.context = context

    def submit(self, device_id: str, round_id: int, metadata: UpdateMetadata, data: bytes) -> Admitted:
        """Admit one device's delta, or refuse it naming why (a selected device's refusal is recorded for the
        operator as late or rejected)."""
        try:
            return self._admit(device_id, round_id, metadata, data)
        except FedzooError as error:
            self._record_refusal(device_id, round_id, error, len(data))
            raise

    def _record_refusal(self, device_id: str, round_id: int, error: FedzooError, upload_bytes: int) -> None:
        kind = refusal_kind(error)
        if kind is None:
            return
        try:
            with self.context.database.session() as session:
                session.add(FLRefusedUpload(round_id=round_id, device_id=device_id, kind=kind, reason=str(error)[:2000],
                                            upload_bytes=upload_bytes, received_at=self.context.clock()))
        except Exception:  # the device must still hear why it was refused
            log.exception("could not record the refused upload of device %s in round %s", device_id, round_id)

    def _admit(self, device_id: str, round_id: int, metadata: UpdateMetadata, data: bytes) -> Admitted:
        context = self.context
        with context.database.session() as session:
            round_row = find_round(session, round_id)
            if session.get(FLParticipant, (round_id, device_id)) is None:
                raise Forbidden(f"device {device_id!r} was not selected for round {round_id}; ask GET /v1/fl/task",
                                code="not_selected")
            if has_update(session, round_id, device_id):
                raise duplicate_update(device_id, round_id)
            if round_row.state not in ACTIVE_STATES:
                raise not_accepting(round_id, round_row.state)
            if metadata.base_version != round_row.base_version:
                raise Conflict(
                    f"the update was computed against version {metadata.base_version}, but round {round_id} "
                    f"fine-tunes version {round_row.base_version} of {round_row.base_model_id!r}",
                    field="base_version", code="stale_update",
                )
            config = RoundConfig.model_validate_json(round_row.config_json)
            base = context.bases.get(session, context.device_model_id(session, round_row, config, device_id))
            if config.privacy.secure_aggregation is not None:
                raise Conflict(f"round {round_id} runs secure aggregation: reply to its stages "
                               f"(/v1/fl/rounds/{round_id}/secagg/<stage>) instead of uploading a delta",
                               code="secure_round")
        target = config.target_clients
        counted_examples = min(metadata.num_examples, config.max_examples_per_update or metadata.num_examples)
        limit = max_upload_bytes(base)
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
        blob = context.store.put(data)  # content-addressed: a refused upload leaves at most an unreferenced blob
        with context.database.session() as session:
            # Re-check the state in the same write as the insert: this conditional UPDATE and the aggregation
            # claim both write the round row, so they serialise, and an update that gets 201 is always one
            # the aggregation reads.
            if not lock_round_before_deadline(session, round_id, ACTIVE_STATES, context.clock()):
                raise not_accepting(round_id, session.get(FLRound, round_id).state)
            session.add(FLUpdate(
                round_id=round_id, device_id=device_id, blob_sha256=blob, encoding=encoding, upload_bytes=len(data),
                num_examples=metadata.num_examples, counted_examples=counted_examples, delta_norm=norm,
                metrics_json=json.dumps(metadata.metrics), received_at=context.clock(),
            ))
            try:
                session.flush()
            except IntegrityError:
                raise duplicate_update(device_id, round_id) from None
            accepted = count_rows(session, FLUpdate, round_id)
            if sampling.is_sampled(config):  # a random cohort: complete when selection closed and all uploaded
                target_reached = sampling.cohort_complete(session, session.get(FLRound, round_id), config.min_clients)
            else:
                target_reached = accepted >= target
        crash_point("upload.stored")
        return Admitted({"round_id": round_id, "device_id": device_id, "accepted_updates": accepted,
                         "counted_examples": counted_examples, "upload_bytes": len(data), "encoding": encoding},
                        target_reached)
