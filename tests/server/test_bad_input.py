"""Bad input of every kind gets the right 4xx with a JSON error naming the problem, and changes nothing:
the registry (every row, every blob file) is compared before and after each request."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest
from server_helpers import (
    ADMIN_TOKEN, LiveServer, device_profile, make_card, running_live_server, config_for_tests, tiny_onnx_model,
)

GOOD_LOOKUP = {"task": "digits", "latency_budget_ms": 10.0}
JSON_HEADERS = {"Content-Type": "application/json"}
OCTET = {"Content-Type": "application/octet-stream"}
MODEL_BYTES = tiny_onnx_model(seed=42)
OTHER_BYTES = tiny_onnx_model(seed=43)
CARD = make_card(MODEL_BYTES, "good", 0.9, 1_000_000)
UNPUBLISHED_BYTES = tiny_onnx_model(seed=44)
UNPUBLISHED_SHA = hashlib.sha256(UNPUBLISHED_BYTES).hexdigest()


def card_json(**changes) -> str:
    data = json.loads(CARD.to_json())
    data.update(changes)
    return json.dumps(data)


# (name, who calls, method, path, request kwargs, expected status, expected error code, expected field)
# who: None (anonymous), "device" (a valid device token), "admin", "enrollment" (a valid enrollment token), or a
# literal bad Authorization header.
CASES = [
    # malformed JSON and wrong content types
    ("truncated json", "device", "POST", "/v1/lookup", {"content": b'{"task": "digits"', "headers": JSON_HEADERS},
     400, "malformed_json", None),
    ("empty body", "device", "POST", "/v1/lookup", {"content": b"", "headers": JSON_HEADERS},
     400, "malformed_json", None),
    ("not utf-8", "device", "POST", "/v1/lookup", {"content": b"\xff\xfe{", "headers": JSON_HEADERS},
     400, "malformed_json", None),
    ("json array", "device", "POST", "/v1/lookup", {"content": b"[1, 2]", "headers": JSON_HEADERS},
     422, "invalid_field", "body"),
    ("form body", "device", "POST", "/v1/lookup", {"content": b"task=digits",
     "headers": {"Content-Type": "application/x-www-form-urlencoded"}}, 415, "unsupported_media_type", "Content-Type"),
    ("device profile as text", "enrollment", "POST", "/v1/devices",
     {"content": json.dumps(device_profile("x")), "headers": {"Content-Type": "text/plain"}},
     415, "unsupported_media_type", "Content-Type"),
    # wrong types and values
    ("budget as string", "device", "POST", "/v1/lookup", {"json": {"task": "digits", "latency_budget_ms": "10"}},
     422, "invalid_field", "latency_budget_ms"),
    ("negative budget", "device", "POST", "/v1/lookup", {"json": {"task": "digits", "latency_budget_ms": -1}},
     422, "invalid_field", "latency_budget_ms"),
    ("nan budget", "device", "POST", "/v1/lookup",
     {"content": b'{"task": "digits", "latency_budget_ms": NaN}', "headers": JSON_HEADERS},
     400, "malformed_json", None),
    ("huge exponent", "device", "POST", "/v1/lookup",
     {"content": b'{"task": "digits", "latency_budget_ms": 1e999}', "headers": JSON_HEADERS},
     400, "malformed_json", None),
    ("integral float is an integer", "enrollment", "POST", "/v1/devices",
     {"json": {**device_profile("phone-1"), "memory_mb": 512.0}}, 409, "device_exists", "device_id"),
    ("missing task", "device", "POST", "/v1/lookup", {"json": {"latency_budget_ms": 10}},
     422, "invalid_field", "task"),
    ("unknown field", "device", "POST", "/v1/lookup", {"json": {**GOOD_LOOKUP, "latency_budget": 3}},
     422, "invalid_field", "latency_budget"),
    ("accuracy above 1", "device", "POST", "/v1/lookup", {"json": {**GOOD_LOOKUP, "min_accuracy": 1.5}},
     422, "invalid_field", "min_accuracy"),
    ("unknown precision", "device", "POST", "/v1/lookup", {"json": {**GOOD_LOOKUP, "precision": "fp16"}},
     422, "invalid_field", "precision"),
    ("task with slash", "device", "POST", "/v1/lookup", {"json": {**GOOD_LOOKUP, "task": "../etc"}},
     422, "invalid_field", "task"),
    ("memory as string", "enrollment", "POST", "/v1/devices", {"json": {**device_profile("d9"), "memory_mb": "512"}},
     422, "invalid_field", "memory_mb"),
    ("device id traversal", "enrollment", "POST", "/v1/devices", {"json": device_profile("../../etc/passwd")},
     422, "invalid_field", "device_id"),
    ("registration nested 1,100 levels", "enrollment", "POST", "/v1/devices",
     {"content": b"[" * 1100 + b"]" * 1100, "headers": JSON_HEADERS}, 400, "malformed_json", None),
    ("lookup nested 1,100 objects", "device", "POST", "/v1/lookup",
     {"content": b'{"a":' * 1100 + b"1" + b"}" * 1100, "headers": JSON_HEADERS}, 400, "malformed_json", None),
    ("calibration timing 1e308 ms", "enrollment", "POST", "/v1/devices",
     {"json": {**device_profile("d9"), "benchmarks": [{"model": "cal-dense-fp32", "median_ms": 1e308}]}},
     422, "invalid_field", "benchmarks.0.median_ms"),
    ("calibration timing 5e-324 ms", "enrollment", "POST", "/v1/devices",
     {"json": {**device_profile("d9"), "benchmarks": [{"model": "cal-dense-fp32", "median_ms": 5e-324}]}},
     422, "invalid_field", "benchmarks.0.median_ms"),
    ("cores zero", "enrollment", "POST", "/v1/devices",
     {"json": {**device_profile("d9"), "cpu": {"model": "x", "cores": 0}}}, 422, "invalid_field", "cpu.cores"),
    ("telemetry threads float", "device", "POST", "/v1/telemetry",
     {"json": {"model_id": "good", "median_ms": 3.0, "threads": 1.5}}, 422, "invalid_field", "threads"),
    ("telemetry zero median", "device", "POST", "/v1/telemetry",
     {"json": {"model_id": "good", "median_ms": 0}}, 422, "invalid_field", "median_ms"),
    ("list limit too big", None, "GET", "/v1/models", {"params": {"limit": 100000}}, 422, "invalid_field", "limit"),
    ("list limit not a number", None, "GET", "/v1/models", {"params": {"limit": "ten"}}, 422, "invalid_field", "limit"),
    ("list unknown filter", None, "GET", "/v1/models", {"params": {"colour": "red"}}, 422, "invalid_field", "colour"),
    ("list repeated filter", None, "GET", "/v1/models?task=a&task=b", {}, 422, "invalid_field", "task"),
    # unknown ids and routes
    ("unknown model", None, "GET", "/v1/models/nope", {}, 404, "not_found", None),
    ("unknown model blob", None, "GET", "/v1/models/nope/blob", {}, 404, "not_found", None),
    ("unknown blob", None, "GET", f"/v1/blobs/{'0' * 64}", {}, 404, "not_found", "sha256"),
    ("unknown route", None, "GET", "/v1/nothing", {}, 404, "not_found", None),
    ("wrong method", None, "DELETE", "/v1/models/good", {}, 405, "method_not_allowed", None),
    ("telemetry for unknown model", "device", "POST", "/v1/telemetry", {"json": {"model_id": "nope", "median_ms": 3}},
     404, "not_found", None),
    # tokens
    ("lookup without token", None, "POST", "/v1/lookup", {"json": GOOD_LOOKUP}, 401, "unauthorized", "Authorization"),
    ("lookup with unknown token", "Bearer not-a-real-token", "POST", "/v1/lookup", {"json": GOOD_LOOKUP},
     401, "invalid_token", "Authorization"),
    ("lookup with basic auth", "Basic dXNlcjpwYXNz", "POST", "/v1/lookup", {"json": GOOD_LOOKUP},
     401, "unauthorized", "Authorization"),
    ("lookup with huge token", "Bearer " + "a" * 5000, "POST", "/v1/lookup", {"json": GOOD_LOOKUP},
     401, "unauthorized", "Authorization"),
    ("telemetry with admin token", "admin", "POST", "/v1/telemetry", {"json": {"model_id": "good", "median_ms": 3}},
     401, "invalid_token", "Authorization"),
    ("publish with device token", "device", "POST", "/v1/models", {"content": card_json(id="new"),
     "headers": JSON_HEADERS}, 401, "invalid_token", "Authorization"),
    ("upload without token", None, "PUT", f"/v1/blobs/{UNPUBLISHED_SHA}", {"content": UNPUBLISHED_BYTES,
     "headers": OCTET}, 401, "unauthorized", "Authorization"),
    # publishing bad cards and blobs
    ("blob bytes do not match sha", "admin", "PUT", f"/v1/blobs/{UNPUBLISHED_SHA}", {"content": OTHER_BYTES,
     "headers": OCTET}, 422, "invalid_field", "sha256"),
    ("blob as json", "admin", "PUT", f"/v1/blobs/{UNPUBLISHED_SHA}", {"content": UNPUBLISHED_BYTES,
     "headers": JSON_HEADERS}, 415, "unsupported_media_type", "Content-Type"),
    ("card for a blob never uploaded", "admin", "POST", "/v1/models",
     {"content": card_json(id="new", sha256=UNPUBLISHED_SHA), "headers": JSON_HEADERS}, 422, "invalid_field", "sha256"),
    ("card with wrong size", "admin", "POST", "/v1/models",
     {"content": card_json(id="new", size_bytes=7), "headers": JSON_HEADERS}, 422, "invalid_field", "size_bytes"),
    ("card with wrong input name", "admin", "POST", "/v1/models",
     {"content": card_json(id="new", input={"name": "x", "shape": ["batch", 16]}), "headers": JSON_HEADERS},
     422, "invalid_field", "input.name"),
    ("card accuracy above 1", "admin", "POST", "/v1/models",
     {"content": card_json(id="new", metrics={"accuracy": 2.0, "num_examples": 3}), "headers": JSON_HEADERS},
     422, "invalid_field", "metrics.accuracy"),
    ("card id traversal", "admin", "POST", "/v1/models",
     {"content": card_json(id="../../x"), "headers": JSON_HEADERS}, 422, "invalid_field", "id"),
    ("card taken id", "admin", "POST", "/v1/models",
     {"content": card_json(family="changed"), "headers": JSON_HEADERS}, 409, "model_exists", "id"),
    # oversized bodies (JSON limit 64 KiB, request limit 4 MiB in these tests)
    ("oversized lookup", "device", "POST", "/v1/lookup",
     {"content": json.dumps({**GOOD_LOOKUP, "pad": "x" * 100_000}), "headers": JSON_HEADERS},
     413, "payload_too_large", None),
    ("oversized registration", "enrollment", "POST", "/v1/devices",
     {"content": b"{" + b" " * 70_000 + b"}", "headers": JSON_HEADERS}, 413, "payload_too_large", None),
    ("oversized blob", "admin", "PUT", f"/v1/blobs/{'1' * 64}", {"content": b"\0" * (5 * 1024 * 1024),
     "headers": OCTET}, 413, "payload_too_large", None),
    # traversal and malformed digests in paths
    ("blob id traversal", None, "GET", "/v1/blobs/..%2F..%2Fregistry.db", {}, 404, "not_found", None),
    ("blob id encoded dots", None, "GET", "/v1/blobs/%2e%2e", {}, 422, "invalid_field", "sha256"),
    ("blob id uppercase", None, "GET", f"/v1/blobs/{'A' * 64}", {}, 422, "invalid_field", "sha256"),
    ("blob id too short", None, "GET", "/v1/blobs/abc", {}, 422, "invalid_field", "sha256"),
    ("upload id traversal", "admin", "PUT", "/v1/blobs/..%2Fregistry.db", {"content": b"x", "headers": OCTET},
     404, "not_found", None),
    ("upload id encoded dots", "admin", "PUT", "/v1/blobs/%2e%2e", {"content": b"x", "headers": OCTET},
     422, "invalid_field", "sha256"),
    ("model id traversal", None, "GET", "/v1/models/..%2F..%2Fregistry.db", {}, 404, None, None),
    ("double slash path", None, "GET", "/v1/blobs//etc/passwd", {}, 404, "not_found", None),
    # enrollment and token lifecycle
    ("registration without enrollment", None, "POST", "/v1/devices", {"json": device_profile("d9")},
     401, "enrollment_required", "Authorization"),
    ("registration with a made-up token", "Bearer not-an-enrollment-token", "POST", "/v1/devices",
     {"json": device_profile("d9")}, 401, "invalid_enrollment_token", "Authorization"),
    ("registration with a device token", "device", "POST", "/v1/devices", {"json": device_profile("d9")},
     401, "invalid_enrollment_token", "Authorization"),
    ("registration with a malformed header", "Basic dXNlcjpwYXNz", "POST", "/v1/devices",
     {"json": device_profile("d9")}, 401, "unauthorized", "Authorization"),
    ("enrollment max_uses zero", "admin", "POST", "/v1/enrollment-tokens", {"json": {"max_uses": 0}},
     422, "invalid_field", "max_uses"),
    ("enrollment expiry as string", "admin", "POST", "/v1/enrollment-tokens", {"json": {"expires_in_s": "3600"}},
     422, "invalid_field", "expires_in_s"),
    ("enrollment expiry too short", "admin", "POST", "/v1/enrollment-tokens", {"json": {"expires_in_s": 1}},
     422, "invalid_field", "expires_in_s"),
    ("enrollment class traversal", "admin", "POST", "/v1/enrollment-tokens", {"json": {"device_class": "../x"}},
     422, "invalid_field", "device_class"),
    ("enrollment unknown field", "admin", "POST", "/v1/enrollment-tokens", {"json": {"uses": 3}},
     422, "invalid_field", "uses"),
    ("enrollment token by a device", "device", "POST", "/v1/enrollment-tokens", {"json": {}},
     401, "invalid_token", "Authorization"),
    ("enrollment list anonymous", None, "GET", "/v1/enrollment-tokens", {}, 401, "unauthorized", "Authorization"),
    ("enrollment list limit zero", "admin", "GET", "/v1/enrollment-tokens", {"params": {"limit": 0}},
     422, "invalid_field", "limit"),
    ("enrollment revoke unknown", "admin", "POST", "/v1/enrollment-tokens/enr_0000000000000000/revoke", {},
     404, "not_found", None),
    ("enrollment revoke by a device", "device", "POST", "/v1/enrollment-tokens/enr_0000000000000000/revoke", {},
     401, "invalid_token", "Authorization"),
    ("token rotation anonymous", None, "POST", "/v1/devices/phone-1/token", {}, 401, "unauthorized",
     "Authorization"),
    ("token rotation for another device", "device", "POST", "/v1/devices/phone-2/token", {},
     403, "not_this_device", "device_id"),
    ("token rotation with a made-up token", "Bearer made-up", "POST", "/v1/devices/phone-1/token", {},
     401, "invalid_token", "Authorization"),
    ("device revoke by a device", "device", "POST", "/v1/devices/phone-1/revoke", {},
     401, "invalid_token", "Authorization"),
    ("device revoke unknown", "admin", "POST", "/v1/devices/nobody/revoke", {}, 404, "not_found", None),
    # ranges
    ("range past the end", None, "GET", "/v1/models/good/blob", {"headers": {"Range": "bytes=999999-"}},
     416, "range_not_satisfiable", "Range"),
    ("range not bytes", None, "GET", "/v1/models/good/blob", {"headers": {"Range": "lines=1-2"}},
     400, "bad_request", "Range"),
    ("two ranges", None, "GET", "/v1/models/good/blob", {"headers": {"Range": "bytes=0-1,4-5"}},
     400, "bad_request", "Range"),
    ("garbage range", None, "GET", "/v1/models/good/blob", {"headers": {"Range": "bytes=x-y"}},
     400, "bad_request", "Range"),
]


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory) -> LiveServer:
    """One server for the whole table: every case must leave it as it was, which the snapshots check."""
    with running_live_server(config_for_tests(tmp_path_factory.mktemp("bad-input"))) as server:
        yield server


@pytest.fixture(scope="module")
def seeded(shared_server: LiveServer) -> dict[str, str]:
    assert shared_server.publish(CARD, MODEL_BYTES).status_code == 201
    return {"device": f"Bearer {shared_server.register(device_profile('phone-1'))}", "admin": f"Bearer {ADMIN_TOKEN}",
            "enrollment": f"Bearer {shared_server.enrollment_token()}"}


@pytest.fixture
def live_server(shared_server: LiveServer) -> LiveServer:
    return shared_server


@pytest.mark.parametrize(("who", "method", "path", "kwargs", "status", "code", "field"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_request_is_refused_and_changes_nothing(live_server, seeded, who, method, path, kwargs, status, code,
                                                    field):
    kwargs = {**kwargs, "headers": dict(kwargs.get("headers", {}))}
    if who is not None:
        kwargs["headers"]["Authorization"] = seeded.get(who, who)
    before = live_server.snapshot()
    with httpx.Client(base_url=live_server.base_url, timeout=30) as client:
        response = client.request(method, path, **kwargs)
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) >= {"code", "message", "field"} and error["message"]
    if code is not None:
        assert error["code"] == code
    assert error["field"] == field
    assert live_server.snapshot() == before


def test_a_registry_that_refused_everything_still_serves(live_server, seeded):
    with httpx.Client(base_url=live_server.base_url, headers={"Authorization": seeded["device"]}) as client:
        for _, who, method, path, kwargs, *_ in CASES[:5]:
            client.request(method, path, **kwargs)
        answer = client.post("/v1/lookup", json=GOOD_LOOKUP)
        download = client.get("/v1/models/good/blob")
    assert answer.status_code == 200 and answer.json()["model"]["id"] == "good"
    assert hashlib.sha256(download.content).hexdigest() == CARD.sha256


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]"])
def test_a_part_that_is_not_an_object_names_the_part_itself(text):
    from pydantic import ValidationError

    from fedzoo.server.fl.schemas import UpdateMetadata
    from fedzoo.server.routes.common import validation_error

    with pytest.raises(ValidationError) as invalid:
        UpdateMetadata.model_validate_json(text)
    failure = validation_error(invalid.value, "metadata")
    assert failure.field == "metadata" and "None" not in str(failure)


def test_a_chunked_upload_past_the_request_limit_is_413_not_a_truncated_422(live_server, seeded):
    limit = live_server.config.max_request_bytes  # 4 MiB here, 64 MiB by default: the probe sent 65 MiB
    oversized = b"\1" * (limit + 1024 * 1024)
    digest = hashlib.sha256(oversized).hexdigest()

    def chunks():  # a generator body: httpx sends it chunked, with no Content-Length
        for start in range(0, len(oversized), 256 * 1024):
            yield oversized[start : start + 256 * 1024]

    before = live_server.snapshot()
    with httpx.Client(base_url=live_server.base_url, timeout=60) as client:
        answer = client.put(f"/v1/blobs/{digest}", content=chunks(),
                            headers={**OCTET, "Authorization": seeded["admin"]})
        assert answer.status_code == 413 and answer.json()["error"]["code"] == "payload_too_large"
        assert "close" in answer.headers["Connection"]  # the rest of the body may still be on the wire
        exact = b"\2" * limit  # a chunked body of exactly the limit is whole, and accepted
        accepted = client.put(f"/v1/blobs/{hashlib.sha256(exact).hexdigest()}", content=iter([exact]),
                              headers={**OCTET, "Authorization": seeded["admin"]})
        assert accepted.status_code == 201, accepted.text
    added = set(live_server.snapshot()["blobs"]) - set(before["blobs"])  # the refused one left nothing behind
    assert [path.rsplit("/", 1)[-1] for path in added] == [accepted.json()["sha256"]]


def test_an_error_before_the_body_was_read_closes_the_connection_so_the_next_request_works(live_server, seeded):
    with httpx.Client(base_url=live_server.base_url, timeout=30) as client:
        refused = client.post("/v1/lookup", content=b"{" + b" " * 200_000 + b"}", headers=JSON_HEADERS)
        assert refused.status_code == 401 and "close" in refused.headers["Connection"]
        assert client.get("/v1/health").status_code == 200  # a fresh connection, not the half-read one
        too_large = client.post("/v1/lookup", content=b"x" * 100_000,
                                headers={**JSON_HEADERS, "Authorization": seeded["device"]})
        assert too_large.status_code == 413 and "close" in too_large.headers["Connection"]
        assert client.post("/v1/lookup", json=GOOD_LOOKUP,
                           headers={"Authorization": seeded["device"]}).status_code == 200
