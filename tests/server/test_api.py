"""The REST API end to end over a real loopback HTTP server: publish, list, download, register,
telemetry and lookup."""

from __future__ import annotations

import hashlib

import pytest
from server_helpers import ADMIN_TOKEN, LiveServer, device_profile, make_card, tiny_onnx_model

from fedzoo.server.schemas import (
    DeviceRegistration, LookupResponse, ModelList, PublishResponse, TelemetryResponse,
)


@pytest.fixture
def published(live_server: LiveServer) -> dict[str, tuple]:
    """Three digits models (fast/ok, medium/better, slow/best) and one int8, each with its blob."""
    models = {}
    for index, (model_id, accuracy, macs, precision) in enumerate([
        ("fast", 0.80, 1_000_000, "fp32"),    # 1.05 ms on the reference
        ("medium", 0.90, 4_000_000, "fp32"),  # 4.05 ms
        ("slow", 0.95, 20_000_000, "fp32"),   # 20.05 ms
        ("medium-int8", 0.89, 4_000_000, "int8"),
    ]):
        blob = tiny_onnx_model(seed=index)
        card = make_card(blob, model_id, accuracy, macs, precision=precision)
        response = live_server.publish(card, blob)
        assert response.status_code == 201, response.text
        models[model_id] = (card, blob)
    return models


def test_publish_is_idempotent_and_refuses_a_different_card_under_a_taken_id(live_server, published):
    card, blob = published["fast"]
    again = live_server.publish(card, blob)
    assert again.status_code == 200 and PublishResponse.model_validate(again.json()).created is False
    changed = card.model_copy(update={"family": "other"})
    before = live_server.snapshot()
    conflict = live_server.publish(changed, blob)
    assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "model_exists"
    assert live_server.snapshot() == before


def test_list_filters_and_paginates(live_server, published):
    with live_server.client() as client:
        everything = ModelList.model_validate(client.get("/v1/models").json())
        assert everything.total == 4 and [card.id for card in everything.models][:3] == ["slow", "medium", "medium-int8"]
        int8 = client.get("/v1/models", params={"precision": "int8"}).json()
        assert [card["id"] for card in int8["models"]] == ["medium-int8"]
        first = client.get("/v1/models", params={"limit": 3}).json()
        second = client.get("/v1/models", params={"limit": 3, "offset": first["next_offset"]}).json()
        assert first["next_offset"] == 3 and second["next_offset"] is None
        assert {c["id"] for c in first["models"] + second["models"]} == set(published)
        assert client.get("/v1/models", params={"task": "mnist"}).json()["total"] == 0


def test_get_card_round_trips(live_server, published):
    card, _ = published["medium"]
    with live_server.client() as client:
        response = client.get("/v1/models/medium")
    assert response.status_code == 200
    assert response.json()["sha256"] == card.sha256 and response.json()["metrics"]["accuracy"] == 0.90


def test_download_sends_etag_sha256_and_honours_range_and_if_none_match(live_server, published):
    card, blob = published["slow"]
    with live_server.client() as client:
        whole = client.get("/v1/models/slow/blob")
        assert whole.status_code == 200 and whole.content == blob
        assert whole.headers["ETag"] == f'"{card.sha256}"' and whole.headers["X-Content-SHA256"] == card.sha256
        assert hashlib.sha256(whole.content).hexdigest() == card.sha256

        part = client.get("/v1/models/slow/blob", headers={"Range": "bytes=10-19"})
        assert part.status_code == 206 and part.content == blob[10:20]
        assert part.headers["Content-Range"] == f"bytes 10-19/{len(blob)}"

        # resume: the rest from byte 100, then the two pieces equal the blob
        rest = client.get("/v1/models/slow/blob", headers={"Range": "bytes=100-"})
        assert rest.status_code == 206 and blob[:100] + rest.content == blob
        tail = client.get(f"/v1/blobs/{card.sha256}", headers={"Range": "bytes=-5"})
        assert tail.status_code == 206 and tail.content == blob[-5:]
        # RFC 9110 §14.1.2: a suffix longer than the blob selects the whole blob (the probe's -50000)
        longer = client.get(f"/v1/blobs/{card.sha256}", headers={"Range": f"bytes=-{len(blob) + 50_000}"})
        assert longer.status_code == 206 and longer.content == blob
        assert longer.headers["Content-Range"] == f"bytes 0-{len(blob) - 1}/{len(blob)}"
        beyond = client.get(f"/v1/blobs/{card.sha256}", headers={"Range": f"bytes=10-{len(blob) + 99}"})
        assert beyond.status_code == 206 and beyond.content == blob[10:]

        past_end = client.get("/v1/models/slow/blob", headers={"Range": f"bytes={len(blob)}-{len(blob) + 10}"})
        assert past_end.status_code == 416 and past_end.headers["Content-Range"] == f"bytes */{len(blob)}"
        assert past_end.json()["error"]["code"] == "range_not_satisfiable"

        cached = client.get("/v1/models/slow/blob", headers={"If-None-Match": f'"{card.sha256}"'})
        assert cached.status_code == 304 and cached.content == b""
        stale = client.get("/v1/models/slow/blob", headers={"If-None-Match": '"0000"'})
        assert stale.status_code == 200 and stale.content == blob

        head = client.head("/v1/models/slow/blob")
        assert head.status_code == 200 and head.content == b"" and head.headers["Content-Length"] == str(len(blob))
        # If-Range with another version's ETag: the range is ignored and the whole current blob is sent
        changed = client.get("/v1/models/slow/blob", headers={"Range": "bytes=0-9", "If-Range": '"feed"'})
        assert changed.status_code == 200 and changed.content == blob
        same = client.get("/v1/models/slow/blob", headers={"Range": "bytes=0-9", "If-Range": f'"{card.sha256}"'})
        assert same.status_code == 206 and same.content == blob[:10]


def test_register_returns_a_token_that_is_stored_only_as_a_hash(live_server):
    with live_server.enroller() as client:
        response = client.post("/v1/devices", json=device_profile("phone-1", slowdown=2.0))
    assert response.status_code == 201
    registration = DeviceRegistration.model_validate(response.json())
    assert registration.latency_scales == {"all": pytest.approx(2.0)}
    stored = repr(live_server.snapshot()["devices"])
    assert registration.token not in stored and hashlib.sha256(registration.token.encode()).hexdigest() in stored


def test_registering_a_taken_device_id_is_a_conflict_and_keeps_the_old_token(live_server, published):
    token = live_server.register(device_profile("phone-1"))
    with live_server.enroller() as client:
        again = client.post("/v1/devices", json=device_profile("phone-1"))
    assert again.status_code == 409 and again.json()["error"] == {
        "code": "device_exists", "field": "device_id",
        "message": "device 'phone-1' is already registered; use the token it was given",
    }
    with live_server.client(token) as device:
        assert device.post("/v1/lookup", json={"task": "digits", "latency_budget_ms": 100}).status_code == 200


def lookup(live_server: LiveServer, token: str, **body) -> tuple[int, dict]:
    with live_server.client(token) as client:
        response = client.post("/v1/lookup", json=body)
    return response.status_code, response.json()


def test_lookup_picks_the_most_accurate_model_within_the_predicted_budget(live_server, published):
    token = live_server.register(device_profile("phone-1", slowdown=2.0))  # medium: 8.1 ms, slow: 40.1 ms
    status, body = lookup(live_server, token, task="digits", latency_budget_ms=10.0)
    assert status == 200
    answer = LookupResponse.model_validate(body)
    assert answer.model.id == "medium" and answer.latency_source == "predicted"
    assert answer.latency_basis == "predictor" and answer.latency_ms == pytest.approx(8.1)
    assert answer.runner_up is not None and answer.runner_up.model_id == "medium-int8"
    assert "accuracy 0.9000" in answer.reason and "predictor" in answer.reason

    status, body = lookup(live_server, token, task="digits", latency_budget_ms=10.0, precision="int8")
    assert status == 200 and body["model"]["id"] == "medium-int8" and body["runner_up"] is None

    status, body = lookup(live_server, token, task="digits", latency_budget_ms=100.0)
    assert status == 200 and body["model"]["id"] == "slow"


def test_lookup_prefers_this_devices_measured_latency(live_server, published):
    token = live_server.register(device_profile("phone-1", slowdown=2.0))
    with live_server.client(token) as device:
        for median_ms in (30.0, 5.0, 6.0):  # median 6.0: "slow" measured far faster than predicted
            response = device.post("/v1/telemetry", json={"model_id": "slow", "median_ms": median_ms, "threads": 1})
            assert response.status_code == 201
        assert TelemetryResponse.model_validate(response.json()).measured_median_ms == 6.0
    status, body = lookup(live_server, token, task="digits", latency_budget_ms=10.0)
    assert status == 200 and body["model"]["id"] == "slow"
    assert body["latency_source"] == "measured" and body["latency_basis"] == "device_telemetry"
    assert body["latency_ms"] == 6.0 and "measured" in body["reason"]
    # another device of the same speed still gets the predicted choice
    other = live_server.register(device_profile("phone-2", slowdown=2.0))
    assert lookup(live_server, other, task="digits", latency_budget_ms=10.0)[1]["model"]["id"] == "medium"


def test_lookup_uses_the_cards_latency_for_the_devices_class(live_server):
    blob = tiny_onnx_model(seed=7)
    card = make_card(blob, "classy", 0.99, 50_000_000,  # 50 ms predicted, but 3 ms measured on class "pi4"
                     latency_ms={"pi4": {"median_ms": 3.0, "source": "measured"}})
    assert live_server.publish(card, blob).status_code == 201
    pi = live_server.register(device_profile("pi-1", device_class="pi4"))
    laptop = live_server.register(device_profile("laptop-1"))
    status, body = lookup(live_server, pi, task="digits", latency_budget_ms=5.0)
    assert status == 200 and body["latency_basis"] == "card_device_class" and body["latency_source"] == "predicted"
    status, body = lookup(live_server, laptop, task="digits", latency_budget_ms=5.0)
    assert status == 409 and body["error"]["closest"]["model_id"] == "classy"


def test_lookup_respects_memory_and_accuracy_floors(live_server, published):
    token = live_server.register(device_profile("phone-1", memory_mb=16))  # below the 16 MB runtime overhead
    status, body = lookup(live_server, token, task="digits", latency_budget_ms=1000.0)
    assert status == 409 and body["error"]["code"] == "no_model_fits"
    status, body = lookup(live_server, token, task="digits", latency_budget_ms=1000.0, memory_budget_mb=64)
    assert status == 200 and body["model"]["id"] == "slow" and body["memory_mb"] < 64
    status, body = lookup(live_server, token, task="digits", latency_budget_ms=2.0, memory_budget_mb=64,
                          min_accuracy=0.85)
    assert status == 409
    closest = body["error"]["closest"]
    assert closest["model_id"] in {"medium", "medium-int8", "fast"} and "closest" in body["error"]["message"]


def test_lookup_for_an_unknown_task_is_404_and_nothing_fitting_is_409_naming_the_closest(live_server, published):
    token = live_server.register(device_profile("phone-1", slowdown=2.0))
    status, body = lookup(live_server, token, task="speech", latency_budget_ms=10.0)
    assert status == 404 and body["error"]["code"] == "no_model_for_task" and body["error"]["field"] == "task"
    status, body = lookup(live_server, token, task="digits", latency_budget_ms=1.0)
    assert status == 409 and body["error"]["code"] == "no_model_fits"
    assert body["error"]["closest"]["model_id"] == "fast" and body["error"]["closest"]["latency_ms"] == pytest.approx(2.1)


def test_telemetry_for_an_unknown_model_is_404_and_stores_nothing(live_server, published):
    token = live_server.register(device_profile("phone-1"))
    before = live_server.snapshot()
    with live_server.client(token) as device:
        response = device.post("/v1/telemetry", json={"model_id": "nope", "median_ms": 3.0})
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert live_server.snapshot() == before


def test_publishing_needs_the_admin_token(live_server):
    blob = tiny_onnx_model(seed=1)
    card = make_card(blob, "m", 0.5, 10)
    with live_server.client("wrong-token") as client:
        response = client.put(f"/v1/blobs/{card.sha256}", content=blob,
                              headers={"Content-Type": "application/octet-stream"})
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_token"
    assert ADMIN_TOKEN not in response.text
