"""The quarantine of devices whose updates kept being left out (`fedzoo.server.fl.quarantine`): the operator
lists them with their history (viewer or admin token) and releases one (admin); revoking one for good is
`POST /v1/devices/<device_id>/revoke`."""

from __future__ import annotations

from flask import Blueprint, Response

from fedzoo.server import operator_view
from fedzoo.server.fl import quarantine
from fedzoo.server.fl.round_context import as_utc
from fedzoo.server.fl.routes import service
from fedzoo.server.openapi import documented
from fedzoo.server.operator_schemas import PageQuery, QuarantineList, QuarantineRelease
from fedzoo.server.routes.common import context, json_response, query_args, require_admin_token, require_reader_token
from fedzoo.server.routes.devices import DEVICE_ID

blueprint = Blueprint("quarantine", __name__)


@documented(blueprint, "GET", "/v1/fl/quarantine", summary="Devices in quarantine, each with its latest updates "
            "and how aggregation decided them (paginated)", auth="viewer", query=PageQuery, response=QuarantineList,
            errors=(403, 422))
def list_quarantined() -> Response:
    require_reader_token()
    query = query_args(PageQuery)
    with context().db.session() as session:
        page = operator_view.list_quarantined(session, query.limit, query.offset)
    return json_response(QuarantineList(**page.as_dict("devices")))


@documented(blueprint, "POST", "/v1/fl/quarantine/<device_id>/release",
            summary="Admin: release a quarantined device; it may be selected again and its earlier exclusions no "
                    "longer count", auth="admin", response=QuarantineRelease, path_params=DEVICE_ID,
            errors=(403, 404))
def release(device_id: str) -> Response:
    require_admin_token()
    with context().db.session() as session:
        row = quarantine.release(session, device_id, service().clock())
        return json_response(QuarantineRelease(device_id=row.device_id, released_at=as_utc(row.released_at)))
