"""The API's own description and a liveness probe."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify

from fedzoo.server.openapi import documented, openapi_document

blueprint = Blueprint("meta", __name__)


@documented(blueprint, "GET", "/v1/openapi.json", summary="This OpenAPI document")
def openapi() -> Response:
    return jsonify(openapi_document(current_app))


@documented(blueprint, "GET", "/v1/health", summary="Liveness: the server answers")
def health() -> Response:
    return jsonify({"status": "ok"})
