"""The operator's read endpoints: rounds, a round's participants, the fleet, a model's lineage and latency.
Each needs the viewer or the admin token (`require_reader_token`); none answers with token material."""

from __future__ import annotations

from flask import Blueprint, Response

from fedzoo.cards import IDENTIFIER_PATTERN
from fedzoo.server import operator_view
from fedzoo.server.fl.routes import ROUND_ID, service
from fedzoo.server.openapi import documented
from fedzoo.server.operator_schemas import (
    DeviceClassCounts, DeviceList, DeviceListQuery, ModelLatency, ModelLineage, ParticipantList, RoundList,
    RoundListQuery,
)
from fedzoo.server.routes.common import context, json_response, query_args, require_reader_token

blueprint = Blueprint("operator", __name__)
MODEL_ID = {"model_id": {"type": "string", "pattern": IDENTIFIER_PATTERN}}


@documented(blueprint, "GET", "/v1/fl/rounds", summary="List federated rounds, newest first (filter by state, task, "
            "plan; paginated)", auth="viewer", query=RoundListQuery, response=RoundList, errors=(403, 422))
def list_rounds() -> Response:
    require_reader_token()
    query = query_args(RoundListQuery)
    service().advance()  # states as of now, as GET /v1/fl/rounds/<id> shows them
    with context().db.session() as session:
        page = operator_view.list_rounds(session, service().clock(), query.state, query.task, query.plan_id,
                                         query.limit, query.offset)
    return json_response(RoundList(**page.as_dict("rounds")))


@documented(blueprint, "GET", "/v1/fl/rounds/<int:round_id>/participants",
            summary="The devices selected for a round and what became of each one's update",
            auth="viewer", response=ParticipantList, path_params=ROUND_ID, errors=(403, 404))
def list_participants(round_id: int) -> Response:
    require_reader_token()
    with context().db.session() as session:
        participants = operator_view.round_participants(session, round_id)
    return json_response(ParticipantList(round_id=round_id, participants=participants))


@documented(blueprint, "GET", "/v1/devices", summary="List registered devices (filter by class; paginated; "
            "never any token material)", auth="viewer", query=DeviceListQuery, response=DeviceList,
            errors=(403, 422))
def list_devices() -> Response:
    require_reader_token()
    query = query_args(DeviceListQuery)
    context().last_seen.flush()
    with context().db.session() as session:
        page = operator_view.list_devices(session, query.device_class, query.limit, query.offset)
    return json_response(DeviceList(**page.as_dict("devices")))


@documented(blueprint, "GET", "/v1/devices/classes", summary="How many devices each class has, and when one was "
            "last seen", auth="viewer", response=DeviceClassCounts, errors=(403,))
def device_classes() -> Response:
    require_reader_token()
    context().last_seen.flush()
    with context().db.session() as session:
        counts = operator_view.device_class_counts(session)
    return json_response(DeviceClassCounts(device_classes=counts, total=sum(row["devices"] for row in counts)))


@documented(blueprint, "GET", "/v1/models/<model_id>/lineage",
            summary="A model's ancestors and descendants (parent, pruned, int8, federated versions)",
            auth="viewer", response=ModelLineage, path_params=MODEL_ID, errors=(403, 404))
def model_lineage(model_id: str) -> Response:
    require_reader_token()
    with context().db.session() as session:
        return json_response(ModelLineage(**operator_view.model_lineage(session, model_id)))


@documented(blueprint, "GET", "/v1/models/<model_id>/latency",
            summary="A model's latency per device class: the card's, the server's prediction, devices' telemetry",
            auth="viewer", response=ModelLatency, path_params=MODEL_ID, errors=(403, 404))
def model_latency(model_id: str) -> Response:
    require_reader_token()
    with context().db.session() as session:
        latency = operator_view.model_latency(session, model_id)
    return json_response(ModelLatency(model_id=model_id, **latency))
