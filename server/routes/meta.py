"""The API's own description and a liveness probe."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify

from fedzoo.server.openapi import documented, openapi_document
from fedzoo.server.routes.common import context

blueprint = Blueprint("meta", __name__)


@documented(blueprint, "GET", "/v1/openapi.json", summary="This OpenAPI document")
def openapi() -> Response:
    return jsonify(openapi_document(current_app))


@documented(blueprint, "GET", "/v1/health",
            summary="Liveness: the server answers; open_enrollment says whether devices may register without "
                    "an enrollment token")
def health() -> Response:
    return jsonify({"status": "ok", "open_enrollment": context().config.open_enrollment})
