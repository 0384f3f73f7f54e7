"""The Flask application: settings, registry and blob store wired to the v1 blueprints.

Blueprints are registered from `BLUEPRINTS`, one place. Every error leaves as
`{"error": {"code", "message", "field"}}` with a 4xx status (500 `internal_error` for bugs).
"""

from __future__ import annotations

import logging

from flask import Flask, Response, current_app, json, request
from werkzeug.exceptions import HTTPException

from fedzoo.errors import FedzooError
from fedzoo.server import migrations, registry
from fedzoo.server.blobstore import FileBlobStore
from fedzoo.server.card_keys import FleetKeys
from fedzoo.server.config import ServerConfig
from fedzoo.server.context import ServerContext
from fedzoo.server.db import Database
from fedzoo.server.devices import LastSeenRecorder
from fedzoo.server.errors import APIError, from_domain_error
from fedzoo.server import dashboard
from fedzoo.server.fl import routes as fl_routes
from fedzoo.server.latency import LatencyEstimator, default_estimator
from fedzoo.server.ratelimit import RateLimiter
from fedzoo.server.routes import (
    blobs, calibration, device_certificates, devices, enrollment, keys, lookup, meta, models, operator,
    privacy_terms, quarantine, revocations,
)
from fedzoo.server.routes.common import EXTENSION_KEY

BLUEPRINTS = [
    meta.blueprint,
    models.blueprint,
    blobs.blueprint,
    devices.blueprint,
    device_certificates.blueprint,
    enrollment.blueprint,
    lookup.blueprint,
    calibration.blueprint,
    fl_routes.blueprint,
    keys.blueprint,
    revocations.blueprint,
    privacy_terms.blueprint,
    operator.blueprint,  # after fl: it reads through the round service the fl blueprint creates
    quarantine.blueprint,
    dashboard.blueprint,  # /ui, the operator's pages over the same services
]

# HTTP errors raised by Flask/werkzeug itself (routing, size limit), as API error codes.
WERKZEUG_CODES = {
    400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large",
    415: "unsupported_media_type", 416: "range_not_satisfiable",
}

log = logging.getLogger(__name__)


def _error_response(error: APIError) -> Response:
    response = Response(json.dumps(error.to_dict()), status=error.status, mimetype="application/json")
    response.headers.update(error.headers())
    return response


def _register_error_handlers(app: Flask) -> None:
    @app.errorhandler(FedzooError)
    def domain_error(error: FedzooError) -> Response:
        return _error_response(from_domain_error(error))

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> Response:
        status = error.code or 500
        api_error = APIError(error.description or error.name, code=WERKZEUG_CODES.get(status, "http_error"))
        api_error.status = status
        response = _error_response(api_error)
        if status == 405 and error.valid_methods:
            response.headers["Allow"] = ", ".join(error.valid_methods)
        return response

    @app.errorhandler(Exception)
    def unexpected_error(error: Exception) -> Response:
        log.exception("unhandled error")
        api_error = APIError("the server failed; the request did not change anything", code="internal_error")
        api_error.status = 500
        return _error_response(api_error)


def _body_left_unread() -> bool:
    """Whether some of the request body may still be on the wire: an early 401 or 413 answers before
    reading it. Werkzeug's stream counts what a view read; of a chunked body nothing can be known."""
    if request.content_length:
        if request.content_length > (current_app.config["MAX_CONTENT_LENGTH"] or request.content_length):
            return True
        return not getattr(request.stream, "is_exhausted", True)
    return request.headers.get("Transfer-Encoding", "").lower() == "chunked"


def _close_after_unread_body(response: Response) -> Response:
    """An error answered before the body was read ends the connection (`Connection: close`): reusing it
    would read the rest of the body as the next request. `fedzoo serve` makes gunicorn honour the header."""
    if response.status_code >= 400 and _body_left_unread():
        response.headers["Connection"] = "close"
    return response


def prepare_registry(config: ServerConfig, estimator: LatencyEstimator) -> tuple[int, int]:
    """Once per start, before serving: migrate to head, then recompute latency estimates a different
    estimator made; returns (models, devices) recomputed."""
    migrations.upgrade(config.database_url)
    database = Database(config.database_url)
    try:
        with database.session() as session:
            return registry.refresh_latency_estimates(session, FileBlobStore(config.blob_dir), estimator)
    finally:
        database.dispose()


def create_app(config: ServerConfig | None = None, estimator: LatencyEstimator | None = None,
               migrate: bool = True) -> Flask:
    """The server for `config` (default: from the environment). `migrate` runs `prepare_registry` first;
    gunicorn workers pass False because the master already did."""
    config = config or ServerConfig.from_env()
    estimator = estimator or default_estimator()
    if migrate:
        prepare_registry(config, estimator)
    app = Flask(__name__, static_folder=None)  # no static route: nothing but the blob store serves files
    app.config["MAX_CONTENT_LENGTH"] = config.max_request_bytes
    app.json.sort_keys = False
    database = Database(config.database_url)
    app.extensions[EXTENSION_KEY] = ServerContext(
        config=config,
        db=database,
        store=FileBlobStore(config.blob_dir, fsync=config.fsync_blobs),
        estimator=estimator,
        limiter=RateLimiter(config.rate_limits,
                            config.rate_limit_storage_uri or f"sqlite:///{config.data_dir / 'rate-limits.db'}"),
        keys=FleetKeys.from_config(config),
        last_seen=LastSeenRecorder(database.engine),
    )
    if config.open_enrollment:  # each worker says it: no one should find out from a stranger's device
        log.warning("OPEN ENROLLMENT: FEDZOO_OPEN_ENROLLMENT is on; anyone who reaches this server can register "
                    "devices without an enrollment token. Use it for labs and demos only.")
    for blueprint in BLUEPRINTS:
        app.register_blueprint(blueprint)
    _register_error_handlers(app)
    app.after_request(_close_after_unread_body)
    return app
