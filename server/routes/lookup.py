"""The lookup: which model should this device run?"""

from __future__ import annotations

import json

from flask import Blueprint, Response

from fedzoo.server import lookup
from fedzoo.server.openapi import documented
from fedzoo.server.routes.common import authenticated_rate_limited, context, json_body
from fedzoo.server.schemas import LookupRequest, LookupResponse

blueprint = Blueprint("lookup", __name__)


@documented(blueprint, "POST", "/v1/lookup",
            summary="The most accurate model for a task that fits this device's latency and memory budgets, "
                    "optionally with a margin and a shortlist to time on the device "
                    "(404 no_model_for_task; 409 no_model_fits names the closest)",
            auth="device", request=LookupRequest, response=LookupResponse, errors=(404, 409, 422, 429))
def lookup_model() -> Response:
    server = context()
    with server.db.read() as connection:
        device = authenticated_rate_limited(connection, "lookup")
        body = json_body(LookupRequest)
        query = lookup.LookupQuery(task=body.task, latency_budget_ms=body.latency_budget_ms,
                                   memory_budget_mb=body.memory_budget_mb, min_accuracy=body.min_accuracy,
                                   precision=body.precision, latency_margin_sigmas=body.latency_margin_sigmas,
                                   shortlist_max_models=body.shortlist_max_models)
        result = lookup.lookup(connection, device, query)
    chosen = result.chosen
    # The card is stored as validated JSON; it is embedded as is rather than parsed and re-encoded.
    payload = json.dumps({
        "latency_ms": chosen.latency_ms, "latency_source": chosen.latency_source,
        "latency_basis": chosen.latency_basis, "latency_log_sigma": round(chosen.latency_log_sigma, 6),
        "memory_mb": round(chosen.memory_mb, 3), "reason": result.reason,
        "runner_up": result.runner_up.summary() if result.runner_up else None,
        **({"shortlist": [candidate.shortlist_entry() for candidate in result.shortlist]}
           if result.shortlist is not None else {}),
    })
    return Response('{"model": ' + chosen.card_json + ", " + payload[1:], mimetype="application/json")
