"""Publishing and reading models: cards in the database, their blobs in the blob store.

A card is accepted only when every blob it names (model, training graph, artifacts) is already in the
store, the model blob has the card's `size_bytes` and is an ONNX model whose input is the card's
input. Publishing the same card twice is a no-op; a different card under a taken id is a conflict,
so nothing already published is ever overwritten.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from fedzoo.cards import ModelCard
from fedzoo.device import DeviceProfile
from fedzoo.errors import InvalidInputError, NotFoundError
from fedzoo.server import online_calibration, revocations
from fedzoo.server.blobstore import BlobStore
from fedzoo.server.errors import Conflict
from fedzoo.server.latency import LatencyEstimator, ModelCosts, slot_values
from fedzoo.server.lookup import estimate_memory_mb
from fedzoo.server.tables import (
    COST_COLUMNS, SCALE_COLUMNS, ClassLatencyCalibration, DeviceRecord, MeasuredLatency, ModelClassLatency,
    ModelRecord,
)
from fedzoo.zoo import Zoo


@dataclass(frozen=True)
class PublishResult:
    card: ModelCard
    created: bool


@dataclass(frozen=True)
class ModelPage:
    cards: list[dict[str, Any]]
    total: int
    limit: int
    offset: int


def check_onnx_blob(card: ModelCard, model_bytes: bytes) -> None:
    """The model blob must be an ONNX model with the card's input name (onnx is a server dependency)."""
    import onnx

    try:
        model = onnx.load_model_from_string(model_bytes)
    except Exception as error:  # onnx raises DecodeError and others for bytes that are not a model
        raise InvalidInputError(f"blob {card.sha256} is not an ONNX model: {error}", field="sha256") from None
    input_names = [value.name for value in model.graph.input]
    if card.input.name not in input_names:
        raise InvalidInputError(
            f"the card's input.name {card.input.name!r} is not an input of the ONNX model (it has {input_names})",
            field="input.name",
        )


def check_card_blobs(card: ModelCard, store: BlobStore) -> bytes:
    """Every blob the card names must be stored, and the model blob must match the card; returns its bytes."""
    named = {"sha256": card.sha256, **{f"artifacts.{kind}": digest for kind, digest in card.artifacts.items()}}
    if card.training_graph is not None:
        named["training_graph"] = card.training_graph
    for field, digest in named.items():
        if not store.exists(digest):
            raise InvalidInputError(f"{field} names blob {digest}, which is not uploaded yet (PUT /v1/blobs/{digest})",
                                    field=field)
    stored_bytes = store.size(card.sha256)
    if stored_bytes != card.size_bytes:
        raise InvalidInputError(
            f"size_bytes is {card.size_bytes} but the model blob has {stored_bytes} bytes", field="size_bytes"
        )
    with store.open(card.sha256) as stream:
        model_bytes = stream.read()
    check_onnx_blob(card, model_bytes)
    return model_bytes


def card_record(card: ModelCard, costs: ModelCosts, latency_signature: str) -> ModelRecord:
    """The database row of a card, with its lookup columns precomputed."""
    return ModelRecord(
        id=card.id,
        family=card.family,
        parent_id=card.parent_id,
        version=card.version,
        line_id=card.line_id,
        task=card.task,
        precision=card.precision,
        accuracy=card.metrics.accuracy,
        size_bytes=card.size_bytes,
        macs=card.macs,
        params=card.params,
        sha256=card.sha256,
        memory_mb=estimate_memory_mb(card),
        reference_latency_ms=costs.reference_ms,
        latency_cost_basis=costs.basis[:200],
        latency_signature=latency_signature,
        card_json=card.model_dump_json(),
        **dict(zip(COST_COLUMNS, slot_values(costs.costs_ms, 0.0))),
    )


def publish(session: Session, store: BlobStore, estimator: LatencyEstimator, card: ModelCard) -> PublishResult:
    """Register a card whose blobs are stored; idempotent for an identical card, 409 for a different one.
    The card's `unsigned` measurements are the server's to fill when serving it (`served_card`): not stored."""
    card = card.model_copy(update={"unsigned": {}})
    existing = session.get(ModelRecord, card.id)
    if existing is not None:
        if ModelCard.model_validate_json(existing.card_json).model_dump() == card.model_dump():
            return PublishResult(card, created=False)
        raise Conflict(f"model {card.id!r} is already published with a different card; publish a new id or version",
                       field="id", code="model_exists")
    holder = session.scalar(select(ModelRecord.id).where(ModelRecord.line_id == card.line_id,
                                                         ModelRecord.version == card.version))
    if holder is not None:  # devices accept one card per line and version: a second would be refused or confused
        raise Conflict(f"version {card.version} of line {card.line_id!r} is already published as {holder!r}; "
                       f"publish it as version {next_line_version(session, card.line_id)}", field="version",
                       code="version_taken")
    model_bytes = check_card_blobs(card, store)
    record = card_record(card, estimator.model_costs(card, model_bytes), estimator.signature)
    record.revoked_by_list = revocations.revoking_version(session, card.id, card.sha256)
    online_calibration.inherit_model_factor(session, record)  # a federated version: its parent's graph
    session.add(record)
    session.flush()  # the model row first: the latency rows reference it
    session.add_all(
        ModelClassLatency(model_id=card.id, device_class=device_class, median_ms=latency.median_ms,
                          source=latency.source)
        for device_class, latency in card.latency_ms.items()
    )
    session.flush()
    return PublishResult(card, created=True)


def next_line_version(session: Session, line_id: str) -> int:
    """The version a new card of line `line_id` takes: one past the line's newest published version (whichever
    plan or round published it), so two plans on one base never publish the same version."""
    newest = session.scalar(select(func.max(ModelRecord.version)).where(ModelRecord.line_id == line_id))
    return (newest or 0) + 1


def import_zoo(session: Session, store: BlobStore, estimator: LatencyEstimator, zoo_dir: str | Path,
               check_card: Callable[[ModelCard], None]) -> list[PublishResult]:
    """Copy a zoo directory's blobs into the store and publish its cards (already-published ones are skipped).
    Every card passes `check_card` (its signature) before anything is stored."""
    zoo = Zoo(zoo_dir)
    cards = zoo.cards()
    for card in cards:
        check_card(card)
    results = []
    for card in cards:
        digests = [card.sha256, *card.artifacts.values()]
        if card.training_graph is not None:
            digests.append(card.training_graph)
        for digest in digests:
            if not store.exists(digest):
                with open(zoo.blob_path(digest), "rb") as stream:
                    store.put(stream.read(), expected_sha256=digest)
        results.append(publish(session, store, estimator, card))
    return results


def get_card(session: Session, model_id: str) -> dict[str, Any]:
    """The card of a published model as a JSON object, as published; NotFoundError if there is none."""
    return json.loads(_find_record(session, model_id).card_json)


def get_served_card(session: Session, model_id: str) -> dict[str, Any]:
    """The card as devices and operators get it: with the server's current measurements under `unsigned`."""
    return served_card(_find_record(session, model_id))


def served_card(record: ModelRecord) -> dict[str, Any]:
    """A stored card plus `unsigned`: what the server measured of the model since it was published (the
    fleet latency factor; its accuracy on a zoo plan's evaluation set, which lookup ranks by) and whether lookup
    retired it (`retired_by`) or the operator's revocation list revokes it (`revoked_by_list`, its version), outside
    the card's signature and never acted on by a device (which checks the signed list itself)."""
    return {**json.loads(record.card_json), "unsigned": {
        "fleet_latency_factor": record.latency_factor, "fleet_factor_devices": record.latency_factor_devices,
        "retired_by": record.retired_by, "revoked_by_list": record.revoked_by_list,
        "server_evaluation": None if record.evaluation_sha256 is None else {
            "accuracy": record.accuracy, "evaluation_sha256": record.evaluation_sha256}}}


def _find_record(session: Session, model_id: str) -> ModelRecord:
    record = session.get(ModelRecord, model_id)
    if record is None:
        raise NotFoundError(f"no model {model_id!r} is published")
    return record


def model_sha256(session: Session, model_id: str) -> str:
    """The digest of a published model's ONNX blob."""
    digest = session.scalar(select(ModelRecord.sha256).where(ModelRecord.id == model_id))
    if digest is None:
        raise NotFoundError(f"no model {model_id!r} is published")
    return digest


def list_cards(session: Session, task: str | None, precision: str | None, limit: int, offset: int) -> ModelPage:
    """Cards ordered by task, then accuracy (best first), then id; filtered and paginated."""
    query = select(ModelRecord)
    count = select(func.count()).select_from(ModelRecord)
    for column, value in ((ModelRecord.task, task), (ModelRecord.precision, precision)):
        if value is not None:
            query = query.where(column == value)
            count = count.where(column == value)
    query = query.order_by(ModelRecord.task, ModelRecord.accuracy.desc(), ModelRecord.id).limit(limit).offset(offset)
    cards = [served_card(record) for record in session.scalars(query)]
    return ModelPage(cards=cards, total=session.scalar(count) or 0, limit=limit, offset=offset)


def refresh_latency_estimates(session: Session, store: BlobStore, estimator: LatencyEstimator) -> tuple[int, int]:
    """Recompute the costs of models and the scales of devices that another estimator computed (so a new
    predictor never mixes with old numbers: what telemetry learnt on top of them is dropped too); returns
    (models, devices) recomputed."""
    stale_models = session.scalars(select(ModelRecord).where(ModelRecord.latency_signature != estimator.signature))
    model_count = 0
    for record in stale_models:
        card = ModelCard.model_validate_json(record.card_json)
        with store.open(record.sha256) as stream:
            costs = estimator.model_costs(card, stream.read())
        record.reference_latency_ms = costs.reference_ms
        record.latency_cost_basis = costs.basis[:200]
        record.latency_signature = estimator.signature
        for column, value in zip(COST_COLUMNS, slot_values(costs.costs_ms, 0.0)):
            setattr(record, column, value)
        model_count += 1
    stale_devices = session.scalars(select(DeviceRecord).where(DeviceRecord.latency_signature != estimator.signature))
    device_count = 0
    for record in stale_devices:
        scales = estimator.device_scales(DeviceProfile.model_validate_json(record.profile_json))
        record.latency_scales_basis = scales.basis[:200]
        record.latency_signature = estimator.signature
        for column, value in zip(SCALE_COLUMNS, slot_values(scales.scales, 1.0)):
            setattr(record, column, value)
        record.latency_calibration_json, record.latency_log_sigma = None, None  # telemetry refined the old scales
        record.latency_reports, record.latency_calibrated_at = 0, None
        device_count += 1
    if device_count:
        session.execute(delete(ClassLatencyCalibration))
    if model_count or device_count:  # residuals against the old costs or scales say nothing of the new ones
        session.execute(update(MeasuredLatency).values(log_residual=None))
        session.execute(update(ModelRecord).values(latency_factor=None, latency_factor_devices=0))
    session.flush()
    return model_count, device_count
