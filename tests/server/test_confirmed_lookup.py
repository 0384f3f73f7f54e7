"""The SDK's device-confirmed lookup against a real server on loopback: real ONNX models timed on this CPU.

The tiny classifier runs in about 0.01 ms here and the dense calibration model in about 0.15 ms, so a
0.06 ms budget separates them by a wide margin even on a loaded machine; the cards' reference latencies
make the server's predictions wrong on purpose."""

from __future__ import annotations

import pytest
from server_helpers import LiveServer, device_profile, make_card, tiny_onnx_model

from fedzoo.clients.client import FedzooClient
from fedzoo.clients.confirmation import ConfirmationPolicy
from fedzoo.device import DeviceProfile
from fedzoo.edge.calibration_models import calibration_model

BUDGET_MS = 0.06


def publish(live_server: LiveServer, model_id: str, accuracy: float, predicted_ms: float, blob: bytes) -> None:
    card = make_card(blob, model_id, accuracy, 1000,
                     latency_ms={"reference": {"median_ms": predicted_ms, "source": "measured"}})
    assert live_server.publish(card, blob).status_code == 201


@pytest.fixture
def client(live_server: LiveServer, tmp_path) -> FedzooClient:
    sdk = FedzooClient(live_server.base_url, cache_dir=tmp_path / "cache")
    sdk.register(DeviceProfile.model_validate(device_profile("d1")), live_server.enrollment_token())  # at the reference's speed
    yield sdk
    sdk.close()


def measured_ids(answer: dict) -> list[tuple[str, bool]]:
    return [(measurement["model_id"], measurement["fits"]) for measurement in answer["measurements"]]


def test_confirmation_finds_a_more_accurate_model_the_predictor_ruled_out(live_server, client):
    publish(live_server, "best", 0.95, 0.065, tiny_onnx_model(seed=2))  # predicted just over the budget
    publish(live_server, "dense", 0.90, 0.04, calibration_model("cal-dense-fp32"))  # predicted to fit; does not
    publish(live_server, "small", 0.80, 0.01, tiny_onnx_model(seed=1))
    assert client.lookup("digits", BUDGET_MS)["model"]["id"] == "dense"

    answer = client.lookup_confirmed("digits", BUDGET_MS)
    assert answer["model"]["id"] == "best" and answer["confirmed"] and answer["latency_source"] == "measured"
    assert measured_ids(answer) == [("best", True)] and answer["latency_ms"] <= BUDGET_MS
    assert answer["bytes_downloaded"] > 0 and answer["seconds_spent"] < 2.0 and answer["lookups"] == 1
    with live_server.client(client.token) as http:  # the timing was reported: the server now knows it
        assert http.post("/v1/lookup", json={"task": "digits", "latency_budget_ms": BUDGET_MS}).json()[
            "latency_basis"] == "device_telemetry"


def test_a_choice_that_measures_too_slow_is_replaced_after_asking_again(live_server, client):
    publish(live_server, "dense", 0.90, 0.04, calibration_model("cal-dense-fp32"))
    publish(live_server, "small", 0.80, 0.01, tiny_onnx_model(seed=1))

    answer = client.lookup_confirmed("digits", BUDGET_MS)
    assert measured_ids(answer) == [("dense", False), ("small", True)]
    assert answer["model"]["id"] == "small" and answer["confirmed"] and answer["lookups"] == 2
    assert client.lookup("digits", BUDGET_MS)["model"]["id"] == "small"  # predictor-only agrees now


def test_the_policy_bounds_bytes_and_seconds_and_says_what_it_skipped(live_server, client):
    publish(live_server, "dense", 0.90, 0.04, calibration_model("cal-dense-fp32"))
    publish(live_server, "small", 0.80, 0.01, tiny_onnx_model(seed=1))

    few_bytes = client.lookup_confirmed("digits", BUDGET_MS, policy=ConfirmationPolicy(max_download_bytes=1000))
    assert few_bytes["model"]["id"] == "dense" and not few_bytes["confirmed"]
    assert few_bytes["measurements"] == [] and few_bytes["bytes_downloaded"] == 0
    assert [skip["model_id"] for skip in few_bytes["skipped"]] == ["dense"] and "bytes" in few_bytes["skipped"][0]["reason"]

    no_time = client.lookup_confirmed("digits", BUDGET_MS, policy=ConfirmationPolicy(max_seconds=0.0))
    assert not no_time["confirmed"] and no_time["measurements"] == [] and "s left" in no_time["skipped"][0]["reason"]


def test_a_device_without_onnx_calibrates_on_the_served_models_and_registers(live_server, tmp_path):
    from fedzoo.edge.calibration_models import calibration_models
    from fedzoo.edge.device_profile import collect_device_profile

    with FedzooClient(live_server.base_url, cache_dir=tmp_path / "cache") as sdk:
        served = sdk.calibration_models()
        assert served == calibration_models()
        profile = collect_device_profile("no-onnx-device", calibration_models=served)
        assert [benchmark.model for benchmark in profile.benchmarks] == list(served)
        assert sdk.register(profile, live_server.enrollment_token())["latency_scales_basis"]
