"""The operator's signed privacy terms: devices read the newest (with their token; they verify it against their
pinned operator keys before every task), the operator's tokens too; the admin uploads a new version signed
offline (`fedzoo keys sign-privacy-terms`)."""

from __future__ import annotations

import json

from flask import Blueprint, Response

from fedzoo.server import privacy_terms
from fedzoo.server.errors import NotFound, Unauthorized
from fedzoo.server.openapi import documented
from fedzoo.server.routes.common import (
    calling_device, context, json_body, json_response, require_admin_token, require_reader_token,
)
from fedzoo.server.schemas import PrivacyTermsStored, SignedPrivacyTerms, SignedPrivacyTermsView

blueprint = Blueprint("privacy_terms", __name__)


@documented(blueprint, "GET", "/v1/privacy-terms", summary="The operator's newest signed privacy terms: the model "
            "lines devices train on only under distributed DP, and the least noise multiplier they accept there",
            auth="device", response=SignedPrivacyTermsView, errors=(401, 404))
def newest_privacy_terms() -> Response:
    try:
        calling_device()
    except Unauthorized:
        require_reader_token()  # the operator's tokens read them too
    with context().db.session() as session:
        record = privacy_terms.newest(session)
        if record is None:
            raise NotFound("the operator has not published privacy terms", code="no_privacy_terms")
        document = json.loads(record.document_json)
    return json_response(SignedPrivacyTermsView.model_validate(document))


@documented(blueprint, "POST", "/v1/privacy-terms",
            summary="Admin: upload privacy terms the operator signed offline; their version must be newer than the "
                    "newest held", auth="admin", request=SignedPrivacyTerms, response=PrivacyTermsStored,
            status=201, errors=(401, 403, 409, 422))
def upload_privacy_terms() -> Response:
    require_admin_token()
    body = json_body(SignedPrivacyTerms)
    with context().db.session() as session:
        terms = privacy_terms.store(session, body.model_dump(), context().keys.operator_keys)
    return json_response(PrivacyTermsStored(version=terms.version, lines=sorted(terms.lines)), status=201)
