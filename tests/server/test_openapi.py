"""The OpenAPI document matches the routes: every /v1 rule is documented and every documented
operation exists; the document is valid OpenAPI; responses conform to the documented schemas."""

from __future__ import annotations

import re

import httpx
import pytest
from server_helpers import device_profile, make_card, tiny_onnx_model

from fedzoo.server.openapi import openapi_document

IMPLICIT_METHODS = {"HEAD", "OPTIONS"}


def rule_operations(app) -> set[tuple[str, str]]:
    operations = set()
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/v1/"):
            continue
        path = re.sub(r"<(?:[a-z_]+:)?([A-Za-z_][A-Za-z0-9_]*)>", r"{\1}", rule.rule)
        operations |= {(method, path) for method in rule.methods - IMPLICIT_METHODS}
    return operations


def document_operations(document) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in document["paths"].items() for method in item}


def test_every_route_is_documented_and_every_documented_route_exists(live_server):
    with live_server.client() as client:
        document = client.get("/v1/openapi.json").json()
    routes = rule_operations(live_server.app)
    assert routes == document_operations(document)
    assert {("POST", "/v1/lookup"), ("GET", "/v1/models/{model_id}/blob"), ("PUT", "/v1/blobs/{sha256}")} <= routes
    assert not any(rule.rule.startswith("/static") for rule in live_server.app.url_map.iter_rules())


def test_the_document_is_valid_openapi_and_its_references_resolve(live_server):
    document = openapi_document(live_server.app)
    assert document["openapi"].startswith("3.1")
    schemas = document["components"]["schemas"]
    text = repr(document)
    for name in set(re.findall(r"#/components/schemas/([A-Za-z0-9_]+)", text)):
        assert name in schemas, f"dangling reference to {name}"
    lookup = document["paths"]["/v1/lookup"]["post"]
    assert lookup["security"] == [{"deviceToken": []}]
    assert {"200", "401", "404", "409", "413", "415", "422"} <= set(lookup["responses"])
    blob = document["paths"]["/v1/models/{model_id}/blob"]["get"]
    assert {"200", "206", "304", "416"} <= set(blob["responses"])
    jsonschema_rs = pytest.importorskip("jsonschema_rs")  # installed with schemathesis
    definitions = pytest.importorskip("schemathesis.specs.openapi.definitions")
    jsonschema_rs.validator_for(definitions.OPENAPI_31).validate(document)


def test_responses_conform_to_the_documented_schemas(live_server):
    jsonschema_rs = pytest.importorskip("jsonschema_rs")

    document = openapi_document(live_server.app)
    blob = tiny_onnx_model(seed=3)
    card = make_card(blob, "m1", 0.9, 1000)
    assert live_server.publish(card, blob).status_code == 201
    token = live_server.register(device_profile("d1"))
    with httpx.Client(base_url=live_server.base_url, headers={"Authorization": f"Bearer {token}"}) as client:
        exchanges = [
            ("/v1/models", "get", client.get("/v1/models")),
            ("/v1/models/{model_id}", "get", client.get("/v1/models/m1")),
            ("/v1/lookup", "post", client.post("/v1/lookup", json={"task": "digits", "latency_budget_ms": 50})),
            ("/v1/lookup", "post", client.post("/v1/lookup", json={"task": "digits", "latency_budget_ms": 1e-3})),
            ("/v1/telemetry", "post", client.post("/v1/telemetry", json={"model_id": "m1", "median_ms": 1.5})),
            ("/v1/devices", "post", client.post("/v1/devices", json=device_profile("d2"))),  # 401: not enrollment
            ("/v1/devices/{device_id}/token", "post", client.post("/v1/devices/d1/token")),
            ("/v1/devices/{device_id}/token", "post", client.post("/v1/devices/other/token")),
            ("/v1/models/{model_id}", "get", client.get("/v1/models/none")),
        ]
    with live_server.enroller() as enroller:
        exchanges.append(("/v1/devices", "post", enroller.post("/v1/devices", json=device_profile("d3"))))
    with live_server.admin() as admin:
        created = admin.post("/v1/enrollment-tokens", json={"max_uses": 2, "label": "bench"})
        exchanges += [
            ("/v1/enrollment-tokens", "post", created),
            ("/v1/enrollment-tokens", "get", admin.get("/v1/enrollment-tokens")),
            ("/v1/enrollment-tokens/{token_id}/revoke", "post",
             admin.post(f"/v1/enrollment-tokens/{created.json()['id']}/revoke")),
            ("/v1/devices/{device_id}/revoke", "post", admin.post("/v1/devices/d3/revoke")),
            ("/v1/devices/{device_id}/revoke", "post", admin.post("/v1/devices/nobody/revoke")),
        ]
    for path, method, response in exchanges:
        documented = document["paths"][path][method]["responses"]
        assert str(response.status_code) in documented, (path, response.status_code)
        schema = documented[str(response.status_code)]["content"]["application/json"]["schema"]
        validator = jsonschema_rs.validator_for({**schema, "components": document["components"]})
        validator.validate(response.json())


def test_the_document_states_the_html_414_and_the_rules_across_fields(live_server):
    with httpx.Client(base_url=live_server.base_url) as client:
        document = client.get("/v1/openapi.json").json()
    operations = [operation for path in document["paths"].values() for operation in path.values()]
    assert all("text/html" in operation["responses"]["414"]["content"] for operation in operations)
    schemas = document["components"]["schemas"]
    assert "at least `min_clients`" in schemas["RoundConfig"]["description"]
    assert "positive integer" in schemas["ModelCardRequest"]["description"]
    upload = document["paths"]["/v1/blobs/{sha256}"]["put"]
    assert "sha256 must equal the path's" in upload["description"] and "413" in upload["responses"]
    # that gunicorn really answers 414 in HTML is checked in test_gunicorn.py
