"""The operator's view of the server: rounds with their counts and outcome, each participant's fate, the
fleet, a model's lineage and its latency per device class. Read-only queries, one or a few per answer,
sized for thousands of rows (pages, grouped counts, indexed walks)."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fedzoo.errors import NotFoundError
from fedzoo.server.fl.round_context import MAX_ROUND_ID, as_utc
from fedzoo.server.fl.tables import FLParticipant, FLQuarantine, FLRefusedUpload, FLRound, FLUpdate
from fedzoo.server.tables import (
    COST_COLUMNS, SCALE_COLUMNS, DeviceRecord, MeasuredLatency, ModelClassLatency, ModelRecord,
)

MAX_LINEAGE_DEPTH = 1000  # a guard against a parent cycle in hand-made cards


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    total: int
    limit: int
    offset: int

    def as_dict(self, noun: str) -> dict[str, Any]:
        """The list contract: `{noun: [...], total, limit, offset, next_offset}`."""
        following = self.offset + len(self.items)
        return {noun: self.items, "total": self.total, "limit": self.limit, "offset": self.offset,
                "next_offset": following if following < self.total else None}


# rounds ------------------------------------------------------------------------------------------

def _participant_statuses(session: Session, round_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Every selected device of the rounds, with what became of its update (see `Participant`)."""
    if not round_ids:
        return {}
    updates = {(row.round_id, row.device_id): row
               for row in session.scalars(select(FLUpdate).where(FLUpdate.round_id.in_(round_ids)))}
    refusals: dict[tuple[int, str], FLRefusedUpload] = {}
    for refusal in session.scalars(select(FLRefusedUpload).where(FLRefusedUpload.round_id.in_(round_ids))
                                   .order_by(FLRefusedUpload.id)):
        refusals[(refusal.round_id, refusal.device_id)] = refusal  # the latest refusal wins
    participants = session.execute(
        select(FLParticipant.round_id, FLParticipant.device_id, FLParticipant.selected_at, DeviceRecord.device_class)
        .join(DeviceRecord, DeviceRecord.id == FLParticipant.device_id)
        .where(FLParticipant.round_id.in_(round_ids)).order_by(FLParticipant.selected_at, FLParticipant.device_id)
    )
    participants = list(participants)
    quarantined = set(session.scalars(select(FLQuarantine.device_id).where(
        FLQuarantine.device_id.in_({row.device_id for row in participants}), FLQuarantine.released_at.is_(None))))
    by_round: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for round_id, device_id, selected_at, device_class in participants:
        entry = {"device_id": device_id, "device_class": device_class, "selected_at": as_utc(selected_at),
                 "status": "no_update", "reason": None, "num_examples": None, "delta_norm": None,
                 "aggregation_weight": None, "root_cosine": None, "upload_bytes": None, "uploaded_at": None,
                 "quarantined": device_id in quarantined}
        update = updates.get((round_id, device_id))
        refusal = refusals.get((round_id, device_id))
        if update is not None:
            entry.update(status="accepted" if update.screening in (None, "counted") else update.screening,
                         reason=update.screening_reason, num_examples=update.counted_examples,
                         delta_norm=update.delta_norm, aggregation_weight=update.aggregation_weight,
                         root_cosine=update.root_cosine, upload_bytes=update.upload_bytes,
                         uploaded_at=as_utc(update.received_at))
        elif refusal is not None:
            entry.update(status=refusal.kind, reason=refusal.reason, upload_bytes=refusal.upload_bytes,
                         uploaded_at=as_utc(refusal.received_at))
        by_round[round_id].append(entry)
    return by_round


def _round_summary(row: FLRound, participants: list[dict[str, Any]], now: datetime) -> dict[str, Any]:
    outcome = json.loads(row.outcome_json) if row.outcome_json else {}
    evaluation = outcome.get("evaluation") or outcome.get("metrics") or {}
    statuses = [participant["status"] for participant in participants]
    finished_at = as_utc(row.finished_at) if row.finished_at else None
    return {
        "id": row.id, "plan_id": row.plan_id or row.id, "number": row.number, "state": row.state, "task": row.task,
        "base_model_id": row.base_model_id, "selected_devices": len(participants),
        "accepted_updates": statuses.count("accepted") + statuses.count("clipped"),
        "clipped_updates": statuses.count("clipped"), "rejected_updates": statuses.count("rejected"),
        "late_updates": statuses.count("late"), "deadline_at": as_utc(row.deadline_at),
        "created_at": as_utc(row.created_at), "finished_at": finished_at,
        "elapsed_s": round(((finished_at or now) - as_utc(row.created_at)).total_seconds(), 3),
        "outcome": {"closed": "published", "failed": "failed"}.get(row.state),
        "failure_reason": outcome.get("failure"), "result_model_id": row.result_model_id,
        "accuracy": evaluation.get("accuracy"),
    }


def list_rounds(session: Session, now: datetime, state: str | None, task: str | None, plan_id: int | None,
                limit: int, offset: int) -> Page:
    """Rounds newest first, filtered by state, task and plan."""
    query = select(FLRound)
    for column, value in ((FLRound.state, state), (FLRound.task, task), (FLRound.plan_id, plan_id)):
        if value is not None:
            query = query.where(column == value)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = list(session.scalars(query.order_by(FLRound.id.desc()).limit(limit).offset(offset)))
    participants = _participant_statuses(session, [row.id for row in rows])
    return Page([_round_summary(row, participants.get(row.id, []), now) for row in rows], total, limit, offset)


def round_summary(session: Session, round_id: int, now: datetime) -> dict[str, Any]:
    """One round's summary (as listed)."""
    row = _find_round(session, round_id)
    return _round_summary(row, _participant_statuses(session, [round_id]).get(round_id, []), now)


def round_participants(session: Session, round_id: int) -> list[dict[str, Any]]:
    """The devices selected for a round, in selection order, with their update's fate."""
    _find_round(session, round_id)
    return _participant_statuses(session, [round_id]).get(round_id, [])


def _find_round(session: Session, round_id: int) -> FLRound:
    row = session.get(FLRound, round_id) if 1 <= round_id <= MAX_ROUND_ID else None
    if row is None:
        raise NotFoundError(f"no federated round {round_id}")
    return row


# quarantine --------------------------------------------------------------------------------------

QUARANTINE_HISTORY = 20  # the latest updates shown with each quarantined device


def device_update_history(session: Session, device_id: str, limit: int = QUARANTINE_HISTORY) -> list[dict[str, Any]]:
    """A device's latest updates, newest first, with how aggregation decided each one and why."""
    rows = session.scalars(select(FLUpdate).where(FLUpdate.device_id == device_id)
                           .order_by(FLUpdate.id.desc()).limit(limit))
    return [{"round_id": row.round_id, "received_at": as_utc(row.received_at),
             "status": "pending" if row.screening is None else ("accepted" if row.screening == "counted"
                                                                else row.screening),
             "reason": row.screening_reason, "num_examples": row.counted_examples, "delta_norm": row.delta_norm,
             "aggregation_weight": row.aggregation_weight, "root_cosine": row.root_cosine} for row in rows]


def list_quarantined(session: Session, limit: int, offset: int) -> Page:
    """Devices in quarantine now, most recent first, each with its update history and whether it is revoked."""
    query = (select(FLQuarantine, DeviceRecord.device_class, DeviceRecord.revoked_at)
             .join(DeviceRecord, DeviceRecord.id == FLQuarantine.device_id)
             .where(FLQuarantine.released_at.is_(None)))
    total = session.scalar(select(func.count()).select_from(FLQuarantine)
                           .where(FLQuarantine.released_at.is_(None))) or 0
    rows = session.execute(query.order_by(FLQuarantine.quarantined_at.desc(), FLQuarantine.device_id)
                           .limit(limit).offset(offset))
    return Page([{"device_id": row.device_id, "device_class": device_class, "round_id": row.round_id,
                  "reason": row.reason, "quarantined_at": as_utc(row.quarantined_at),
                  "revoked_at": as_utc(revoked_at) if revoked_at else None,
                  "history": device_update_history(session, row.device_id)}
                 for row, device_class, revoked_at in rows], total, limit, offset)


# devices -----------------------------------------------------------------------------------------

_DEVICE_COLUMNS = (DeviceRecord.id, DeviceRecord.device_class, DeviceRecord.memory_mb, DeviceRecord.profile_json,
                   DeviceRecord.registered_at, DeviceRecord.last_seen_at)  # never token_hash


def list_devices(session: Session, device_class: str | None, limit: int, offset: int) -> Page:
    """Registered devices by class, then id; no token material (it is not even selected)."""
    query = select(*_DEVICE_COLUMNS)
    count = select(func.count()).select_from(DeviceRecord)
    if device_class is not None:
        query = query.where(DeviceRecord.device_class == device_class)
        count = count.where(DeviceRecord.device_class == device_class)
    rows = session.execute(query.order_by(DeviceRecord.device_class, DeviceRecord.id).limit(limit).offset(offset))
    devices = []
    for device_id, cls, memory_mb, profile_json, registered_at, last_seen_at in rows:
        profile = json.loads(profile_json)
        devices.append({"device_id": device_id, "device_class": cls, "platform": profile["platform"],
                        "runtime": profile["runtime"]["onnxruntime"], "runtime_threads": profile["runtime"]["threads"],
                        "memory_mb": memory_mb, "registered_at": as_utc(registered_at),
                        "last_seen_at": as_utc(last_seen_at) if last_seen_at else None})
    return Page(devices, session.scalar(count) or 0, limit, offset)


def device_class_counts(session: Session) -> list[dict[str, Any]]:
    """Devices per class, with the class's most recent last-seen time."""
    rows = session.execute(
        select(DeviceRecord.device_class, func.count(), func.max(DeviceRecord.last_seen_at))
        .group_by(DeviceRecord.device_class).order_by(DeviceRecord.device_class)
    )
    return [{"device_class": cls, "devices": count, "last_seen_at": as_utc(seen) if seen else None}
            for cls, count, seen in rows]


# models ------------------------------------------------------------------------------------------

def model_stage(card: dict[str, Any]) -> str:
    """Where a model comes from: an FL round's result, an INT8 variant, a pruned variant, or a base model."""
    if "federated" in card.get("details", {}):
        return "federated"
    if card.get("precision") == "int8":
        return "int8"
    if card.get("pruning") is not None:
        return "pruned"
    return "base"


def _lineage_node(record: ModelRecord) -> dict[str, Any]:
    card = json.loads(record.card_json)
    return {"id": record.id, "family": record.family, "version": record.version, "task": record.task,
            "precision": record.precision, "stage": model_stage(card), "accuracy": record.accuracy,
            "parent_id": record.parent_id, "published_at": as_utc(record.published_at)}


def _find_model(session: Session, model_id: str) -> ModelRecord:
    record = session.get(ModelRecord, model_id)
    if record is None:
        raise NotFoundError(f"no model {model_id!r} is published")
    return record


def model_lineage(session: Session, model_id: str) -> dict[str, Any]:
    """The model, its ancestors (root first; a parent that was never published ends the walk) and every
    published descendant, breadth-first."""
    record = _find_model(session, model_id)
    seen = {record.id}
    ancestors = []
    parent_id = record.parent_id
    while parent_id is not None and parent_id not in seen and len(ancestors) < MAX_LINEAGE_DEPTH:
        parent = session.get(ModelRecord, parent_id)
        if parent is None:
            break
        ancestors.append(parent)
        seen.add(parent.id)
        parent_id = parent.parent_id
    descendants: list[ModelRecord] = []
    frontier = [record.id]
    while frontier and len(descendants) < MAX_LINEAGE_DEPTH:
        children = [child for child in session.scalars(
            select(ModelRecord).where(ModelRecord.parent_id.in_(frontier)).order_by(ModelRecord.version, ModelRecord.id)
        ) if child.id not in seen]
        seen.update(child.id for child in children)
        descendants.extend(children)
        frontier = [child.id for child in children]
    return {"model": _lineage_node(record), "ancestors": [_lineage_node(row) for row in reversed(ancestors)],
            "descendants": [_lineage_node(row) for row in descendants]}


def model_latency(session: Session, model_id: str) -> dict[str, Any]:
    """Per device class: the card's latency, the server's prediction (median over the class's devices) and
    the devices' telemetry (median over the class's devices of each device's median); and the model's fleet
    latency factor (`online_calibration.update_model_factors`), which the predictions include."""
    record = _find_model(session, model_id)
    card_latency = {row.device_class: row for row in session.scalars(
        select(ModelClassLatency).where(ModelClassLatency.model_id == model_id))}
    measured: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for device_class, median_ms, reports in session.execute(
        select(DeviceRecord.device_class, MeasuredLatency.median_ms, MeasuredLatency.reports)
        .join(DeviceRecord, DeviceRecord.id == MeasuredLatency.device_id)
        .where(MeasuredLatency.model_id == model_id, DeviceRecord.device_class.is_not(None))
    ):
        measured[device_class].append((median_ms, reports))
    predicted_expression = (record.latency_factor or 1.0) * sum(getattr(record, cost) * getattr(DeviceRecord, scale)
                                                                for cost, scale in zip(COST_COLUMNS, SCALE_COLUMNS))
    predicted: dict[str, list[float]] = defaultdict(list)
    for device_class, predicted_ms in session.execute(
        select(DeviceRecord.device_class, predicted_expression).where(DeviceRecord.device_class.is_not(None))
    ):
        predicted[device_class].append(predicted_ms)
    classes = sorted(set(card_latency) | set(measured) | set(predicted))
    rows = [{
        "device_class": device_class,
        "card_ms": card_latency[device_class].median_ms if device_class in card_latency else None,
        "card_source": card_latency[device_class].source if device_class in card_latency else None,
        "predicted_ms": statistics.median(predicted[device_class]) if predicted[device_class] else None,
        "measured_ms": (statistics.median(ms for ms, _ in measured[device_class])
                        if measured[device_class] else None),
        "devices_measured": len(measured[device_class]),
        "reports": sum(reports for _, reports in measured[device_class]),
    } for device_class in classes]
    return {"device_classes": rows, "fleet_latency_factor": record.latency_factor,
            "fleet_factor_devices": record.latency_factor_devices}


# overview and zoo -----------------------------------------------------------------------------------

def active_round_count(session: Session) -> int:
    """Rounds not yet closed or failed."""
    return session.scalar(select(func.count()).select_from(FLRound)
                          .where(FLRound.state.in_(("open", "collecting", "aggregating")))) or 0


def zoo_choices(session: Session) -> tuple[list[str], list[str]]:
    """The tasks with published models and the device classes some card has a latency for."""
    tasks = list(session.scalars(select(ModelRecord.task).distinct().order_by(ModelRecord.task)))
    classes = list(session.scalars(select(ModelClassLatency.device_class).distinct()
                                   .order_by(ModelClassLatency.device_class)))
    return tasks, classes


def pareto_points(session: Session, task: str, device_class: str) -> list[dict[str, Any]]:
    """Every model of `task` with a latency for `device_class`, fastest first, each marked whether it is on
    the Pareto front (no model at most as fast is at least as accurate)."""
    rows = session.execute(
        select(ModelRecord.id, ModelRecord.accuracy, ModelRecord.precision, ModelClassLatency.median_ms,
               ModelClassLatency.source)
        .join(ModelClassLatency, ModelClassLatency.model_id == ModelRecord.id)
        .where(ModelRecord.task == task, ModelClassLatency.device_class == device_class)
        .order_by(ModelClassLatency.median_ms, ModelRecord.accuracy.desc(), ModelRecord.id)
    )
    points, best_accuracy = [], -1.0
    for model_id, accuracy, precision, latency_ms, source in rows:
        on_front = accuracy > best_accuracy
        best_accuracy = max(best_accuracy, accuracy)
        points.append({"model_id": model_id, "accuracy": accuracy, "precision": precision,
                       "latency_ms": latency_ms, "source": source, "on_front": on_front})
    return points
