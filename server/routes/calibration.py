"""Calibration models: what a device times before it registers (public, like the model list)."""

from __future__ import annotations

from flask import Blueprint, Response

from fedzoo.server.calibration_catalog import calibration_catalog
from fedzoo.server.openapi import documented
from fedzoo.server.routes.common import context, json_response, query_args
from fedzoo.server.schemas import CalibrationModel, CalibrationModelList, CalibrationModelListQuery

blueprint = Blueprint("calibration", __name__)


@documented(blueprint, "GET", "/v1/calibration-models",
            summary="The calibration models a device times to register (download each by sha256 from "
                    "GET /v1/blobs/{sha256}; paginated)",
            query=CalibrationModelListQuery, response=CalibrationModelList, errors=(422,))
def list_calibration_models() -> Response:
    query = query_args(CalibrationModelListQuery)
    entries = calibration_catalog(context().store)
    page = entries[query.offset:query.offset + query.limit]
    following = query.offset + len(page)
    return json_response(CalibrationModelList(
        calibration_models=[CalibrationModel(name=e.name, sha256=e.sha256, size_bytes=e.size_bytes) for e in page],
        total=len(entries), limit=query.limit, offset=query.offset,
        next_offset=following if following < len(entries) else None,
    ))
