"""Enrollment tokens (admin): create (the token is shown once), list (never token material), revoke."""

from __future__ import annotations

from flask import Blueprint, Response

from fedzoo.server import enrollment
from fedzoo.server.openapi import documented
from fedzoo.server.tables import EnrollmentToken, as_utc
from fedzoo.server.routes.common import (
    context, json_body, json_response, next_offset, query_args, require_admin_token,
)
from fedzoo.server.schemas import (
    EnrollmentTokenList, EnrollmentTokenListQuery, EnrollmentTokenRequest, EnrollmentTokenView,
    IssuedEnrollmentToken,
)

blueprint = Blueprint("enrollment", __name__)
TOKEN_ID = {"token_id": {"type": "string", "pattern": "^enr_[0-9a-f]{16}$"}}


def _view_fields(record: EnrollmentToken) -> dict:
    return {"id": record.id, "label": record.label, "device_class": record.device_class,
            "max_uses": record.max_uses, "uses": record.uses, "created_at": as_utc(record.created_at),
            "expires_at": as_utc(record.expires_at),
            "revoked_at": as_utc(record.revoked_at) if record.revoked_at else None,
            "state": enrollment.state(record)}


@documented(blueprint, "POST", "/v1/enrollment-tokens",
            summary="Admin: create an enrollment token (expiry, use count, optional device class and label); "
                    "the token is in this answer only",
            auth="admin", request=EnrollmentTokenRequest, response=IssuedEnrollmentToken, status=201,
            errors=(403, 422))
def create_enrollment_token() -> Response:
    require_admin_token()
    body = json_body(EnrollmentTokenRequest)
    with context().db.session() as session:
        issued = enrollment.create(session, body.expires_in_s, body.max_uses, body.label, body.device_class)
        view = IssuedEnrollmentToken(token=issued.token, **_view_fields(issued.record))
    return json_response(view, status=201)


@documented(blueprint, "GET", "/v1/enrollment-tokens",
            summary="Admin: list enrollment tokens, newest first (ids, uses, expiry; never the tokens)",
            auth="admin", query=EnrollmentTokenListQuery, response=EnrollmentTokenList, errors=(403, 422))
def list_enrollment_tokens() -> Response:
    require_admin_token()
    query = query_args(EnrollmentTokenListQuery)
    with context().db.session() as session:
        records, total = enrollment.list_page(session, query.limit, query.offset)
        views = [EnrollmentTokenView(**_view_fields(record)) for record in records]
    return json_response(EnrollmentTokenList(enrollment_tokens=views, total=total, limit=query.limit,
                                             offset=query.offset,
                                             next_offset=next_offset(query.offset, len(views), total)))


@documented(blueprint, "POST", "/v1/enrollment-tokens/<token_id>/revoke",
            summary="Admin: revoke an enrollment token (devices it enrolled stay registered)",
            auth="admin", response=EnrollmentTokenView, path_params=TOKEN_ID, errors=(403, 404))
def revoke_enrollment_token(token_id: str) -> Response:
    require_admin_token()
    with context().db.session() as session:
        record = enrollment.revoke(session, token_id)
        view = EnrollmentTokenView(**_view_fields(record))
    return json_response(view)
