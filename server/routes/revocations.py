"""The operator's one signed revocation list (cards and device keys): devices fetch the newest (public: it is
signed, and devices verify it against their pinned operator keys, before loading a card and before each SecAgg+
round); the admin uploads a new version signed offline (`fedzoo keys revoke`, `fedzoo devices revoke-keys`)."""

from __future__ import annotations

import json

from flask import Blueprint, Response

from fedzoo.server import revocations
from fedzoo.server.errors import NotFound
from fedzoo.server.openapi import documented
from fedzoo.server.routes.common import context, json_body, json_response, require_admin_token
from fedzoo.server.schemas import RevocationListStored, RevocationListView, SignedRevocationList

blueprint = Blueprint("revocations", __name__)


@documented(blueprint, "GET", "/v1/revocations", summary="The operator's newest signed revocation list: cards "
            "(by id or model sha256) devices must not load, device signing keys (by fingerprint) no device accepts "
            "as a SecAgg+ neighbour", response=RevocationListView, errors=(404,))
def newest_revocation_list() -> Response:
    with context().db.session() as session:
        record = revocations.newest(session)
        if record is None:
            raise NotFound("the operator has not published a revocation list", code="no_revocation_list")
        document = json.loads(record.document_json)
    return json_response(RevocationListView.model_validate(document))


@documented(blueprint, "POST", "/v1/revocations",
            summary="Admin: upload a revocation list the operator signed offline; its version must be newer than "
                    "the newest held", auth="admin", request=SignedRevocationList, response=RevocationListStored,
            status=201, errors=(403, 409, 422))
def upload_revocation_list() -> Response:
    require_admin_token()
    body = json_body(SignedRevocationList)
    with context().db.session() as session:
        listed = revocations.store(session, body.model_dump(), context().keys.operator_keys)
    return json_response(RevocationListStored(version=listed.version, revoked_card_ids=len(listed.card_ids),
                                              revoked_card_sha256s=len(listed.card_sha256s),
                                              revoked_device_keys=len(listed.device_key_fingerprints)), status=201)
