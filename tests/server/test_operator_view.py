"""The operator's read endpoints against a real server on loopback: rounds and participants after a real
plan (late and rejected uploads recorded), the fleet with last-seen times, lineage, latency per class,
auth (viewer or admin only) and bad input."""

from __future__ import annotations

import dataclasses
import hashlib
import time

import httpx
import pytest
from sqlalchemy import select, update
from fl_helpers import device_client, honest_delta, round_config, upload
from server_helpers import (
    ADMIN_TOKEN, VIEWER_TOKEN, config_for_tests, device_profile, make_card, running_live_server, tiny_onnx_model,
)

from fedzoo.clients.errors import ConflictError
from fedzoo.cloud.simulation import Simulation
from fedzoo.device import DeviceProfile
from fedzoo.server import devices
from fedzoo.server.app import prepare_registry
from fedzoo.server.db import Database
from fedzoo.server.devices import LastSeenRecorder
from fedzoo.server.latency import default_estimator
from fedzoo.server.tables import DeviceRecord

READ_ENDPOINTS = ("/v1/fl/rounds", "/v1/fl/rounds/1/participants", "/v1/devices", "/v1/devices/classes",
                  "/v1/models/base/lineage", "/v1/models/base/latency")


def viewer(server) -> httpx.Client:
    return server.client(VIEWER_TOKEN)


def publish_lineage(server) -> None:
    """base -> pruned -> int8, each a real ONNX blob; `base` has its own latency for class pi4."""
    for model_id, parent, fields in (
        ("base", None, {"latency_ms": {"pi4": {"median_ms": 4.0, "source": "measured"}}}),
        ("base-pruned", "base", {"pruning": {"ratio": 0.5, "method": "l1-global"}}),
        ("base-pruned-int8", "base-pruned", {"precision": "int8"}),
    ):
        blob = tiny_onnx_model(seed=len(model_id))
        card = make_card(blob, model_id, 0.9, 1000, parent_id=parent, **fields)
        assert server.publish(card, blob).status_code == 201


@pytest.mark.slow
def test_rounds_and_participants_after_a_real_plan_record_late_and_rejected_updates(federation, tmp_path):
    with running_live_server(config_for_tests(tmp_path)) as server, \
            Simulation(federation, server.base_url, admin_token=ADMIN_TOKEN, cache_root=tmp_path / "devices") as sim:
        sim.publish_base_model()
        sim.register_devices()
        records = sim.run(round_config(num_rounds=2, over_selection=0.34))
        assert [record.state for record in records] == ["closed", "closed"]
        with viewer(server) as client:
            listed = client.get("/v1/fl/rounds", params={"plan_id": records[0].round_id}).json()
            assert (listed["total"], listed["limit"], listed["offset"], listed["next_offset"]) == (2, 50, 0, None)
            newest, first = listed["rounds"]
            assert [newest["id"], first["id"]] == [records[1].round_id, records[0].round_id]
            for summary, record in ((first, records[0]), (newest, records[1])):
                assert summary["plan_id"] == records[0].round_id and summary["outcome"] == "published"
                assert summary["accepted_updates"] == record.accepted_updates == 3
                assert summary["late_updates"] == record.refused  # the over-selected device came too late
                assert summary["selected_devices"] == 3 + record.refused
                assert summary["accuracy"] == pytest.approx(record.accuracy)
                assert summary["result_model_id"] == record.result_model_id
                assert summary["elapsed_s"] > 0 and summary["finished_at"] is not None
            participants = client.get(f"/v1/fl/rounds/{records[1].round_id}/participants").json()["participants"]
            assert len(participants) == newest["selected_devices"]
            accepted = [p for p in participants if p["status"] == "accepted"]
            assert len(accepted) == 3 and all(p["delta_norm"] > 0 and p["upload_bytes"] > 0 for p in accepted)
            assert all(p["num_examples"] == len(federation.client_data(int(p["device_id"].rsplit("-", 1)[1])).y)
                       for p in accepted)
            assert [p["status"] for p in participants if p["status"] != "accepted"] == ["late"] * record.refused
            # lineage runs from the base through both federated versions
            lineage = client.get(f"/v1/models/{federation.card.id}/lineage").json()
            assert [node["id"] for node in lineage["descendants"]] == [r.result_model_id for r in records]
            assert {node["stage"] for node in lineage["descendants"]} == {"federated"}

        # a third plan: a selected device sends a delta against the wrong version: recorded as rejected
        round_id = sim.start_plan(round_config(num_rounds=1, target_clients=2, min_clients=1))
        device = device_client(sim, 0)
        task = device.fl_task("digits")["task"]
        with pytest.raises(ConflictError):
            upload(device, task, honest_delta(federation.model), base_version=task["base_version"] + 7)
        with viewer(server) as client:
            summary = client.get("/v1/fl/rounds", params={"plan_id": round_id}).json()["rounds"][0]
            assert (summary["state"], summary["rejected_updates"], summary["outcome"]) == ("open", 1, None)
            (rejected,) = client.get(f"/v1/fl/rounds/{round_id}/participants").json()["participants"]
            assert rejected["status"] == "rejected" and "version" in rejected["reason"]
            assert client.get("/v1/fl/rounds", params={"state": "open"}).json()["total"] == 1
            devices = client.get("/v1/devices").json()["devices"]
            assert all(device["last_seen_at"] is not None for device in devices)  # every device checked in


def test_the_fleet_lists_devices_with_counts_and_last_seen_and_no_token_material(live_server):
    tokens = [live_server.register(device_profile(f"phone-{i}", device_class="phone")) for i in range(3)]
    tokens.append(live_server.register(device_profile("pi-0", device_class="pi4")))
    tokens.append(live_server.register(device_profile("unclassed")))
    with live_server.client(tokens[0]) as device:  # an authenticated request marks the device as seen
        device.post("/v1/lookup", json={"task": "digits", "latency_budget_ms": 10})
    with viewer(live_server) as client:
        first = client.get("/v1/devices", params={"limit": 2}).json()
        second = client.get("/v1/devices", params={"limit": 2, "offset": first["next_offset"]}).json()
        everything = client.get("/v1/devices", params={"limit": 200}).json()
        phones = client.get("/v1/devices", params={"device_class": "phone"}).json()
        counts = client.get("/v1/devices/classes").json()
        texts = [response.text for response in (client.get("/v1/devices"), client.get("/v1/devices/classes"))]
    assert (first["total"], len(first["devices"]), first["next_offset"], second["offset"]) == (5, 2, 2, 2)
    assert [d["device_id"] for d in first["devices"] + second["devices"]] == \
        [d["device_id"] for d in everything["devices"]][:4]
    assert {d["device_id"] for d in phones["devices"]} == {"phone-0", "phone-1", "phone-2"}
    seen = {d["device_id"]: d["last_seen_at"] for d in everything["devices"]}
    assert seen["phone-0"] is not None and seen["phone-1"] is None
    assert everything["devices"][0]["runtime"] == "1.32.0"
    assert {(row["device_class"], row["devices"]) for row in counts["device_classes"]} == \
        {("phone", 3), ("pi4", 1), (None, 1)} and counts["total"] == 5
    for token in tokens:
        assert all(token not in text and hashlib.sha256(token.encode()).hexdigest() not in text for text in texts)
    assert all("token" not in key for key in everything["devices"][0])


def test_lineage_walks_ancestors_and_descendants_and_latency_compares_card_prediction_and_telemetry(live_server):
    publish_lineage(live_server)
    tokens = [live_server.register(device_profile(f"pi-{i}", device_class="pi4", slowdown=2.0)) for i in range(2)]
    for token, median_ms in zip(tokens, (5.0, 7.0)):
        with live_server.client(token) as device:
            assert device.post("/v1/telemetry", json={"model_id": "base", "median_ms": median_ms}).status_code == 201
    with viewer(live_server) as client:
        middle = client.get("/v1/models/base-pruned/lineage").json()
        root = client.get("/v1/models/base/lineage").json()
        latency = client.get("/v1/models/base/latency").json()
        unmeasured = client.get("/v1/models/base-pruned-int8/latency").json()
    assert [n["id"] for n in middle["ancestors"]] == ["base"]
    assert [n["id"] for n in middle["descendants"]] == ["base-pruned-int8"]
    assert [(n["id"], n["stage"]) for n in [root["model"], *root["descendants"]]] == \
        [("base", "base"), ("base-pruned", "pruned"), ("base-pruned-int8", "int8")]
    (pi4,) = latency["device_classes"]
    assert (pi4["device_class"], pi4["card_ms"], pi4["card_source"]) == ("pi4", 4.0, "measured")
    assert (pi4["measured_ms"], pi4["devices_measured"], pi4["reports"]) == (6.0, 2, 2)
    assert pi4["predicted_ms"] > 0
    assert (latency["fleet_latency_factor"], latency["fleet_factor_devices"]) == (None, 0)  # one model each: none
    (pi4_int8,) = unmeasured["device_classes"]
    assert (pi4_int8["card_ms"], pi4_int8["measured_ms"], pi4_int8["devices_measured"]) == (None, None, 0)


@pytest.mark.parametrize("path", READ_ENDPOINTS)
def test_only_the_viewer_and_admin_tokens_read_the_operators_view(live_server, path):
    publish_lineage(live_server)
    device_token = live_server.register(device_profile("d1"))
    with live_server.client() as anonymous, live_server.client(device_token) as device:
        for client in (anonymous, device):
            response = client.get(path)
            assert response.status_code == 401 and response.json()["error"]["field"] == "Authorization"
    for token in (VIEWER_TOKEN, ADMIN_TOKEN):
        with live_server.client(token) as client:
            assert client.get(path).status_code in (200, 404)  # round 1 does not exist: 404 after auth


def test_the_operators_view_is_closed_when_no_operator_token_is_set(tmp_path):
    config = dataclasses.replace(config_for_tests(tmp_path), admin_token=None,
                                 viewer_token=None)
    with running_live_server(config) as server, server.client("anything") as client:
        response = client.get("/v1/devices")
    assert response.status_code == 403 and response.json()["error"]["code"] == "viewer_disabled"


@pytest.mark.parametrize(("path", "params", "field"), [
    ("/v1/fl/rounds", {"limit": "0"}, "limit"),
    ("/v1/fl/rounds", {"offset": "-1"}, "offset"),
    ("/v1/fl/rounds", {"state": "finished"}, "state"),
    ("/v1/fl/rounds", {"plan_id": "first"}, "plan_id"),
    ("/v1/fl/rounds", {"task": "no spaces"}, "task"),
    ("/v1/fl/rounds", {"colour": "red"}, "colour"),
    ("/v1/devices", {"device_class": "a/b"}, "device_class"),
    ("/v1/devices", {"limit": "201"}, "limit"),
])
def test_bad_query_arguments_are_refused_naming_the_field(live_server, path, params, field):
    with viewer(live_server) as client:
        response = client.get(path, params=params)
    assert response.status_code == 422 and response.json()["error"]["field"] == field


@pytest.mark.parametrize("path", ["/v1/fl/rounds/99/participants", "/v1/fl/rounds/99999999999999999999/participants",
                                  "/v1/models/ghost/lineage", "/v1/models/ghost/latency"])
def test_unknown_rounds_and_models_are_404(live_server, path):
    with viewer(live_server) as client:
        response = client.get(path)
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_last_seen_times_are_noted_once_per_resolution_and_written_together_by_the_timer(tmp_path):
    config = config_for_tests(tmp_path)
    prepare_registry(config, default_estimator())
    database = Database(config.database_url)
    with database.session() as session:
        for device_id in ("a", "b", "c"):
            devices.register(session, default_estimator(), DeviceProfile.model_validate(device_profile(device_id)))

    def seen_times() -> dict[str, object]:
        with database.read() as connection:
            return dict(connection.execute(select(DeviceRecord.id, DeviceRecord.last_seen_at)).all())

    # no request waits for the write: with a timer that cannot fire during the test, nothing is written yet
    held = LastSeenRecorder(database.engine, resolution_s=60.0, flush_interval_s=3600.0)
    held.seen("c")
    assert seen_times() == {"a": None, "b": None, "c": None}
    held.flush()
    assert seen_times()["c"] is not None
    with database.session() as session:  # start again from no last-seen times
        session.execute(update(DeviceRecord).values(last_seen_at=None))
    recorder = LastSeenRecorder(database.engine, resolution_s=60.0, flush_interval_s=0.3)
    recorder.seen("a")
    recorder.seen("b")
    deadline = time.monotonic() + 10.0  # the timer writes them with no further call
    while None in ((times := seen_times())["a"], times["b"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert times["a"] is not None and times["b"] is not None and times["c"] is None
    recorder.seen("a")  # within the resolution: not noted again
    recorder.seen("c")
    recorder.flush()  # what the fleet view does before reading
    after = seen_times()
    assert after["a"] == times["a"] and after["c"] is not None
    database.dispose()
