"""The OpenAPI 3.1 document, generated from the routes themselves so it cannot drift.

How a route gets documented (the federated-learning blueprint uses the same mechanism):

    from flask import Blueprint
    from fedzoo.server.openapi import documented

    blueprint = Blueprint("fl", __name__)

    @documented(blueprint, "POST", "/v1/fl/rounds", summary="Open a round", auth="admin",
                request=RoundConfig, response=RoundState, status=201, errors=(401, 409, 422))
    def open_round():
        ...

`documented` registers the view on the blueprint (`add_url_rule`) and records a `RouteDoc` in
`ROUTE_DOCS`; `openapi_document(app)` turns the docs of every blueprint registered on the app into
paths, with the pydantic models' JSON Schemas as components. `request`, `response` and `query` are
pydantic model classes (`query`'s fields become query parameters); `path_params` gives a JSON Schema
per `<name>` of the rule (default: from the converter, e.g. `<int:round_id>` is an integer); `errors` lists the 4xx statuses the route may return (documented with the
common `ErrorResponse` body; 400/413/415 are added to every route with a body). `auth` is None,
"device", "enrollment", "admin" or "viewer" (bearer tokens; "viewer" routes take the admin token too). Binary
bodies: `request_media_type` / `response_media_type="application/octet-stream"`; a multipart body's parts get their
content types from `request_encoding` (OpenAPI's `encoding` object). A test walks `app.url_map` and fails when a /v1
rule is missing from the document or the document names a route the app does not have.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flask import Blueprint, Flask
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from fedzoo import __version__
from fedzoo.server.schemas import ErrorResponse

OCTET_STREAM = "application/octet-stream"
JSON = "application/json"
_RULE_PARAMETER = re.compile(r"<(?:([a-z_]+):)?([A-Za-z_][A-Za-z0-9_]*)>")
# werkzeug URL converters -> JSON Schema of the path parameter (when `path_params` does not say)
CONVERTER_SCHEMAS = {None: {"type": "string"}, "string": {"type": "string"}, "int": {"type": "integer", "minimum": 0},
                     "float": {"type": "number", "minimum": 0}, "uuid": {"type": "string", "format": "uuid"}}

ERROR_DESCRIPTIONS = {
    400: "malformed request (bad JSON, bad query or header)",
    401: "missing or invalid token",
    403: "not allowed",
    404: "no such resource",
    409: "conflicts with what is stored",
    413: "request body too large",
    415: "wrong Content-Type",
    416: "Range not satisfiable",
    422: "a field has the wrong type or value (see error.field)",
    429: "a rate limit is used up; Retry-After says when to try again",
}

# Gunicorn answers a request line over its limit_request_line (4094 bytes) itself, in HTML, before the app
# runs: the one response that is not JSON.
URI_TOO_LONG = {"description": "the request line (method, path and query) is longer than 4094 bytes; the HTTP "
                               "server answers this itself, with an HTML body, before the API sees the request",
                "content": {"text/html": {"schema": {"type": "string"}}}}


@dataclass(frozen=True)
class RouteDoc:
    """Everything the document says about one (method, rule)."""

    blueprint: str
    method: str
    rule: str
    summary: str
    request: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    status: int = 200
    query: type[BaseModel] | None = None
    auth: str | None = None
    path_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: tuple[int, ...] = ()
    request_media_type: str = JSON
    request_encoding: dict[str, dict[str, Any]] = field(default_factory=dict)  # multipart: each part's contentType
    response_media_type: str = JSON
    extra_responses: dict[int, str] = field(default_factory=dict)
    response_headers: dict[str, str] = field(default_factory=dict)
    description: str | None = None  # rules the schemas cannot state (e.g. across the body and the path)

    @property
    def openapi_path(self) -> str:
        return _RULE_PARAMETER.sub(r"{\2}", self.rule)


ROUTE_DOCS: list[RouteDoc] = []


def documented(blueprint: Blueprint, method: str, rule: str, *, summary: str, **doc: Any) -> Callable:
    """Register the decorated view on `blueprint` for (method, rule) and record its documentation."""

    def decorate(view: Callable) -> Callable:
        blueprint.add_url_rule(rule, endpoint=view.__name__, view_func=view, methods=[method])
        ROUTE_DOCS.append(RouteDoc(blueprint=blueprint.name, method=method.upper(), rule=rule, summary=summary, **doc))
        return view

    return decorate


def app_route_docs(app: Flask) -> list[RouteDoc]:
    """The docs of the routes of every blueprint registered on `app`."""
    return [doc for doc in ROUTE_DOCS if doc.blueprint in app.blueprints]


def _schema_components(docs: list[RouteDoc]) -> tuple[dict[type[BaseModel], dict[str, Any]], dict[str, Any]]:
    models = {ErrorResponse}
    for doc in docs:
        models.update(model for model in (doc.request, doc.response) if model is not None)
    ordered = sorted(models, key=lambda model: model.__name__)
    keyed, definitions = models_json_schema(
        [(model, "validation") for model in ordered], ref_template="#/components/schemas/{model}"
    )
    references = {model: keyed[(model, "validation")] for model in ordered}
    return references, definitions.get("$defs", {})


def _error_response(reference: dict[str, Any], status: int) -> dict[str, Any]:
    return {"description": ERROR_DESCRIPTIONS.get(status, "error"), "content": {JSON: {"schema": reference}}}


def _operation(doc: RouteDoc, references: dict[type[BaseModel], dict[str, Any]]) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": doc.summary, "operationId": f"{doc.blueprint}_{doc.method.lower()}_"
                                 + re.sub(r"[^A-Za-z0-9]+", "_", doc.openapi_path).strip("_")}
    if doc.description:
        operation["description"] = doc.description
    parameters = [
        {"name": name, "in": "path", "required": True,
         "schema": doc.path_params.get(name, CONVERTER_SCHEMAS.get(converter or None, {"type": "string"}))}
        for converter, name in _RULE_PARAMETER.findall(doc.rule)
    ]
    if doc.query is not None:
        for name, info in doc.query.model_fields.items():
            schema = doc.query.model_json_schema()["properties"][name]
            parameters.append({"name": name, "in": "query", "required": info.is_required(), "schema": schema})
    if parameters:
        operation["parameters"] = parameters
    errors = set(doc.errors)
    if doc.request is not None or (doc.request_media_type == OCTET_STREAM and doc.method in ("POST", "PUT")):
        errors |= {400, 413, 415}
        content_schema = references[doc.request] if doc.request is not None else {"type": "string", "format": "binary"}
        media: dict[str, Any] = {"schema": content_schema}
        if doc.request_encoding:
            media["encoding"] = doc.request_encoding
        operation["requestBody"] = {"required": True, "content": {doc.request_media_type: media}}
    if doc.auth == "viewer":  # the operator's read endpoints: the viewer token or the admin token
        operation["security"] = [{"viewerToken": []}, {"adminToken": []}]
        errors.update((401, 429))  # 429: too many failed operator tokens from this address
    elif doc.auth is not None:
        operation["security"] = [{f"{doc.auth}Token": []}]
        errors.update((401, 429) if doc.auth == "admin" else (401,))
    if doc.response_media_type == OCTET_STREAM:
        success_content = {OCTET_STREAM: {"schema": {"type": "string", "format": "binary"}}}
    else:
        success_content = {JSON: {"schema": references[doc.response]}} if doc.response is not None else {}
    success: dict[str, Any] = {"description": "success"}
    if success_content:
        success["content"] = success_content
    if doc.response_headers:
        success["headers"] = {name: {"description": text, "schema": {"type": "string"}}
                              for name, text in doc.response_headers.items()}
    responses: dict[str, Any] = {str(doc.status): success}
    for status, description in doc.extra_responses.items():
        responses[str(status)] = {"description": description}
        if status == 206:
            responses[str(status)]["content"] = success_content
    error_reference = references[ErrorResponse]
    for status in sorted(errors):
        responses[str(status)] = _error_response(error_reference, status)
    responses["414"] = URI_TOO_LONG
    operation["responses"] = responses
    return operation


def openapi_document(app: Flask) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every documented route registered on `app`."""
    docs = app_route_docs(app)
    references, components = _schema_components(docs)
    paths: dict[str, dict[str, Any]] = {}
    for doc in sorted(docs, key=lambda doc: (doc.openapi_path, doc.method)):
        paths.setdefault(doc.openapi_path, {})[doc.method.lower()] = _operation(doc, references)
    return {
        "openapi": "3.1.0",
        "info": {"title": "fedzoo model server", "version": __version__,
                 "description": "Registry of model cards and blobs, device registration, lookup, telemetry."},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "deviceToken": {"type": "http", "scheme": "bearer", "description": "from POST /v1/devices"},
                "enrollmentToken": {"type": "http", "scheme": "bearer",
                                    "description": "from POST /v1/enrollment-tokens (an admin); optional only "
                                                   "while the server enrolls openly (GET /v1/health)"},
                "adminToken": {"type": "http", "scheme": "bearer", "description": "the server's FEDZOO_ADMIN_TOKEN"},
                "viewerToken": {"type": "http", "scheme": "bearer",
                                "description": "the server's FEDZOO_VIEWER_TOKEN (read-only operator's view)"},
            },
        },
    }
