"""Bodies of the operator's read endpoints (rounds, participants, devices, lineage, latency per class).

Lists have the shape of `GET /v1/models`: `{"<items>": [...], "total", "limit", "offset", "next_offset"}`.
No body here has a field for a token or a token's hash: what cannot be serialised cannot leak.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field

from fedzoo.cards import IDENTIFIER_PATTERN
from fedzoo.server.fl.round_context import MAX_ROUND_ID
from fedzoo.server.schemas import Response, StrictRequest

RoundState = Literal["open", "collecting", "aggregating", "closed", "failed"]
ParticipantStatus = Literal["accepted", "clipped", "rejected", "late", "declined", "aborted", "sat_out", "no_update"]
ModelStage = Literal["base", "pruned", "int8", "federated"]


class PageQuery(StrictRequest):
    model_config = ConfigDict(extra="forbid", strict=False)  # query strings are text: "50" means 50

    limit: int = Field(default=50, ge=1, le=200)
    offset: int = Field(default=0, ge=0, le=10_000_000)


class RoundListQuery(PageQuery):
    state: RoundState | None = None
    task: str | None = Field(default=None, pattern=IDENTIFIER_PATTERN)
    plan_id: int | None = Field(default=None, ge=1, le=MAX_ROUND_ID, description="the id of the plan's first round")


class DeviceListQuery(PageQuery):
    device_class: str | None = Field(default=None, pattern=IDENTIFIER_PATTERN)


class RoundSummary(Response):
    id: int
    plan_id: int = Field(description="the id of the first round of the plan this round belongs to")
    number: int = Field(description="1 for the plan's first round, then 2, 3, ...")
    state: RoundState
    task: str
    base_model_id: str
    selected_devices: int
    accepted_updates: int = Field(description="updates stored and not rejected by screening (clipped included)")
    clipped_updates: int
    rejected_updates: int = Field(description="devices whose update was refused as invalid or screened out")
    late_updates: int = Field(description="devices whose update arrived after the round stopped taking updates")
    deadline_at: datetime
    created_at: datetime
    finished_at: datetime | None
    elapsed_s: float = Field(description="from creation to finish, or to now while the round runs")
    outcome: Literal["published", "failed"] | None = Field(description="null while the round runs")
    failure_reason: str | None
    result_model_id: str | None = Field(description="the model version the round published")
    accuracy: float | None = Field(description="the aggregate's accuracy on the server's evaluation set")


class RoundList(Response):
    rounds: list[RoundSummary]
    total: int
    limit: int
    offset: int
    next_offset: int | None = Field(description="offset of the next page, or null on the last page")


class Participant(Response):
    device_id: str
    device_class: str | None
    selected_at: datetime
    status: ParticipantStatus = Field(description="no_update: selected, nothing received (yet); aborted: took a "
                                                    "SecAgg+ seat and missed a stage it was asked for; sat_out: "
                                                    "seated in a zoo-wide SecAgg+ round whose subnet had fewer than "
                                                    "3 devices, so no cohort")
    reason: str | None = Field(description="why an update was clipped, rejected or late, how its weight was bounded "
                                           "and scored, or why the device declined the task")
    num_examples: int | None = Field(description="the examples the server counted (the device's claim, capped)")
    delta_norm: float | None
    aggregation_weight: float | None = Field(description="its weight in the aggregate: counted examples bounded by "
                                                         "the round, times its root-set cosine; null: left out")
    root_cosine: float | None = Field(description="cosine with the server's own update on the root set (FLTrust)")
    upload_bytes: int | None
    uploaded_at: datetime | None
    quarantined: bool = Field(description="the device is quarantined now (GET /v1/fl/quarantine)")


class ParticipantList(Response):
    round_id: int
    participants: list[Participant]


class UpdateHistoryItem(Response):
    round_id: int
    received_at: datetime
    status: Literal["pending", "accepted", "clipped", "rejected"] = Field(description="pending: not aggregated yet")
    reason: str | None
    num_examples: int | None
    delta_norm: float
    aggregation_weight: float | None
    root_cosine: float | None


class QuarantinedDevice(Response):
    device_id: str
    device_class: str | None
    round_id: int = Field(description="the round whose decision quarantined the device")
    reason: str
    quarantined_at: datetime
    revoked_at: datetime | None = Field(description="set once the operator revoked the device")
    history: list[UpdateHistoryItem] = Field(description="its latest updates, newest first")


class QuarantineList(Response):
    devices: list[QuarantinedDevice]
    total: int
    limit: int
    offset: int
    next_offset: int | None = Field(description="offset of the next page, or null on the last page")


class QuarantineRelease(Response):
    device_id: str
    released_at: datetime


class DeviceSummary(Response):
    device_id: str
    device_class: str | None
    platform: str
    runtime: str = Field(description="the device's ONNX Runtime version")
    runtime_threads: int
    memory_mb: int
    registered_at: datetime
    last_seen_at: datetime | None = Field(description="last authenticated request (to the minute); null: never")


class DeviceList(Response):
    devices: list[DeviceSummary]
    total: int
    limit: int
    offset: int
    next_offset: int | None = Field(description="offset of the next page, or null on the last page")


class DeviceClassCount(Response):
    device_class: str | None = Field(description="null: devices that named no class")
    devices: int
    last_seen_at: datetime | None


class DeviceClassCounts(Response):
    device_classes: list[DeviceClassCount]
    total: int


class LineageNode(Response):
    id: str
    family: str
    version: int
    task: str
    precision: str
    stage: ModelStage = Field(description="federated (an FL round's result), int8, pruned, or base")
    accuracy: float
    parent_id: str | None
    published_at: datetime


class ModelLineage(Response):
    model: LineageNode
    ancestors: list[LineageNode] = Field(description="root first, ending with the model's parent")
    descendants: list[LineageNode] = Field(description="breadth-first: every model listed after its parent")


class ClassLatency(Response):
    device_class: str
    card_ms: float | None = Field(description="the card's latency for the class (what the publisher says)")
    card_source: Literal["measured", "predicted"] | None
    predicted_ms: float | None = Field(description="the server's predictor, median over the class's devices")
    measured_ms: float | None = Field(description="telemetry: median over the class's devices of their medians")
    devices_measured: int
    reports: int


class ModelLatency(Response):
    model_id: str
    device_classes: list[ClassLatency]
    fleet_latency_factor: float | None = Field(
        description="what every device's prediction of the model is multiplied by: the median over its devices of "
                    "measured / predicted relative to their other models (none below 3 such devices)")
    fleet_factor_devices: int = Field(description="how many devices the factor rests on")
