"""Model cards: list, get, publish (admin)."""

from __future__ import annotations

import json

from flask import Blueprint, Response

from fedzoo.cards import IDENTIFIER_PATTERN, ModelCard
from fedzoo.server import registry
from fedzoo.server.openapi import documented
from fedzoo.server.routes.common import (
    context, json_body, json_response, next_offset, query_args, require_admin_token,
)
from fedzoo.server.schemas import ModelCardRequest, ModelList, ModelListQuery, PublishResponse

blueprint = Blueprint("models", __name__)
MODEL_ID = {"model_id": {"type": "string", "pattern": IDENTIFIER_PATTERN}}


def _json(payload: object, status: int = 200) -> Response:
    return Response(json.dumps(payload), status=status, mimetype="application/json")


@documented(blueprint, "GET", "/v1/models", summary="List model cards (filter by task, precision; paginated)",
            query=ModelListQuery, response=ModelList, errors=(422,))
def list_models() -> Response:
    query = query_args(ModelListQuery)
    with context().db.session() as session:
        page = registry.list_cards(session, query.task, query.precision, query.limit, query.offset)
    return _json({"models": page.cards, "total": page.total, "limit": page.limit, "offset": page.offset,
                  "next_offset": next_offset(page.offset, len(page.cards), page.total)})


@documented(blueprint, "GET", "/v1/models/<model_id>", summary="One model card", response=ModelCard,
            path_params=MODEL_ID, errors=(404,))
def get_model(model_id: str) -> Response:
    with context().db.session() as session:
        return _json(registry.get_served_card(session, model_id))


@documented(blueprint, "POST", "/v1/models", summary="Publish a card whose blobs were uploaded (PUT /v1/blobs); a signed "
            "card must verify against the trusted keys (GET /v1/keys), an unsigned one is refused when "
            "FEDZOO_REQUIRE_SIGNED_CARDS is on",
            auth="admin", request=ModelCardRequest, response=PublishResponse, status=201,
            extra_responses={200: "this exact card was already published"}, errors=(403, 409, 422))
def publish_model() -> Response:
    require_admin_token()
    card = ModelCard.model_validate(json_body(ModelCardRequest, strict=False).model_dump())
    server = context()
    server.keys.check_publishable(card)
    with server.db.session() as session:
        result = registry.publish(session, server.store, server.estimator, card)
    return json_response(PublishResponse(card=result.card, created=result.created),
                         status=201 if result.created else 200)
