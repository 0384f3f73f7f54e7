"""The fleet's public card-signing keys: what devices pin (no authentication: public keys are public)."""

from __future__ import annotations

from flask import Blueprint, Response

from fedzoo.server.openapi import documented
from fedzoo.server.routes.common import context, json_response
from fedzoo.server.schemas import KeySet

blueprint = Blueprint("keys", __name__)


@documented(blueprint, "GET", "/v1/keys", summary="Public keys whose card signatures devices should accept: the "
            "server's own (federated versions) and the operator keys it trusts", response=KeySet)
def list_keys() -> Response:
    return json_response(KeySet.model_validate(context().keys.trusted.to_json()))
