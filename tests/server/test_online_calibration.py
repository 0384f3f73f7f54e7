"""Online recalibration from telemetry, the lookup's uncertainty, margin and shortlist, and the calibration
models the server serves: the filter itself on known group scales, then end to end over loopback HTTP."""

from __future__ import annotations

import hashlib
import math
import re

import httpx
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from server_helpers import (
    ADMIN_TOKEN, VIEWER_TOKEN, LiveServer, device_profile, log_in, make_card, tiny_onnx_model,
)

from fedzoo.cli import cli
from fedzoo.edge.calibration_models import CALIBRATION_MODEL_NAMES
from fedzoo.server.tables import ClassLatencyCalibration, DeviceRecord, ModelRecord
from fedzoo.server.online_calibration import (
    CLASS_FACTOR_BOUNDS, MEASURED_LOG_SIGMA, MODEL_FACTOR_BOUNDS, CalibrationState, initial_log_sigma, kalman_update,
    model_factor, relative_residuals,
)
from fedzoo.server.schemas import CalibrationModelList, LookupResponse


def test_reports_teach_the_filter_each_groups_scale():
    """A device 10% slower than its calibration said, unevenly across groups (1.0-1.2x): three reports put
    every model it never reported within ±10%, where the registered scales put under half of them there."""
    rng = np.random.default_rng(3)
    true_scales = np.array([1.15, 1.1, 1.0, 1.2, 1.05, 1.12, 1.0, 1.0])
    costs = rng.uniform(0.0, 1.0, (60, 8)) * (rng.random((60, 8)) < 0.6)
    costs[:, 0] += 0.05  # every model has a per-inference overhead
    costs[:, 6:] = 0.0  # slots the estimator does not use
    reported, held_out = costs[:15], costs[15:]

    def share_within_10pct(scales: np.ndarray) -> float:
        return float(np.mean(np.abs(held_out @ scales / (held_out @ true_scales) - 1.0) <= 0.10))

    scales = np.ones(8)
    state = CalibrationState.initial(tuple(scales), groups=6)
    before, sigma_before = share_within_10pct(scales), state.predicted_log_sigma()
    for count, model_costs in enumerate(reported, start=1):
        measured_ms = float(model_costs @ true_scales) * math.exp(rng.normal(0.0, 0.02))
        scales = kalman_update(state, scales, model_costs, measured_ms)
        if count == 3:
            assert share_within_10pct(scales) == 1.0
    assert before < 0.5
    assert share_within_10pct(scales) == 1.0
    assert state.reports == 15 and state.predicted_log_sigma() < sigma_before
    assert scales[6:] == pytest.approx([1.0, 1.0])  # unused slots never move


def publish(live_server: LiveServer, model_id: str, accuracy: float, reference_ms: float, seed: int,
            task: str = "digits") -> None:
    """A model whose predicted latency on a reference-speed device is `reference_ms` (the card's figure)."""
    blob = tiny_onnx_model(seed=seed)
    card = make_card(blob, model_id, accuracy, 1000, task=task,
                     latency_ms={"reference": {"median_ms": reference_ms, "source": "measured"}})
    assert live_server.publish(card, blob).status_code == 201


def lookup(live_server: LiveServer, token: str, **body) -> dict:
    with live_server.client(token) as client:
        response = client.post("/v1/lookup", json={"task": "digits", **body})
    assert response.status_code == 200, response.text
    LookupResponse.model_validate(response.json())
    return response.json()


def report(live_server: LiveServer, token: str, model_id: str, median_ms: float) -> None:
    with live_server.client(token) as client:
        assert client.post("/v1/telemetry", json={"model_id": model_id, "median_ms": median_ms}).status_code == 201


def device_row(live_server: LiveServer, device_id: str) -> DeviceRecord:
    with live_server.app.extensions["fedzoo"].db.session() as session:
        return session.get(DeviceRecord, device_id)


@pytest.fixture
def three_models(live_server: LiveServer) -> None:
    publish(live_server, "fast", 0.80, 1.0, seed=1)
    publish(live_server, "medium", 0.90, 4.0, seed=2)
    publish(live_server, "slow", 0.95, 10.0, seed=3)


def test_a_report_recalibrates_the_devices_next_lookup(live_server, three_models):
    token = live_server.register(device_profile("d1"))  # calibrated at the reference's speed
    first = lookup(live_server, token, latency_budget_ms=5.0)
    assert first["model"]["id"] == "medium" and first["latency_ms"] == pytest.approx(4.0)
    assert first["latency_log_sigma"] == pytest.approx(initial_log_sigma(), abs=1e-6)

    report(live_server, token, "fast", 2.0)  # the device is really 2x slower than its calibration said
    second = lookup(live_server, token, latency_budget_ms=5.0)
    assert second["model"]["id"] == "fast" and second["latency_basis"] == "device_telemetry"
    assert second["latency_log_sigma"] == MEASURED_LOG_SIGMA
    medium = lookup(live_server, token, latency_budget_ms=100.0, min_accuracy=0.85, precision="fp32")["runner_up"]
    assert medium["model_id"] == "medium" and 4.0 * 1.25 < medium["latency_ms"] < 4.0 * 1.5
    assert medium["latency_log_sigma"] > initial_log_sigma()  # a report this far off: less sure, not more

    scales_after_one = device_row(live_server, "d1").scale_0
    report(live_server, token, "fast", 9.0)  # a repeat of one model says nothing new about the others
    assert device_row(live_server, "d1").scale_0 == scales_after_one
    assert device_row(live_server, "d1").latency_reports == 1


def test_a_report_as_predicted_shrinks_the_uncertainty(live_server, three_models):
    token = live_server.register(device_profile("d2"))
    report(live_server, token, "fast", 1.05)
    medium = lookup(live_server, token, latency_budget_ms=100.0, min_accuracy=0.85, precision="fp32")["runner_up"]
    assert medium["latency_ms"] == pytest.approx(4.0 * 1.05, rel=0.03)
    assert medium["latency_log_sigma"] < initial_log_sigma()


def test_the_class_learns_from_several_devices_only_and_within_bounds(live_server, three_models):
    tokens = [live_server.register(device_profile(f"pi-{index}", device_class="pi4")) for index in range(5)]
    fresh = tokens[4]
    report(live_server, tokens[0], "fast", 2.0)
    report(live_server, tokens[1], "fast", 2.0)
    assert lookup(live_server, fresh, latency_budget_ms=5.0)["latency_ms"] == pytest.approx(4.0)  # 2 devices: no
    report(live_server, tokens[2], "fast", 2.0)
    assert lookup(live_server, fresh, latency_budget_ms=5.0)["model"]["id"] == "fast"  # medium now over 5 ms
    everything = lookup(live_server, fresh, latency_budget_ms=100.0, min_accuracy=0.85)
    assert everything["runner_up"]["latency_ms"] > 4.0 * 1.25  # the class's median correction applies

    report(live_server, tokens[3], "fast", 500.0)  # one device's extreme claim
    with live_server.app.extensions["fedzoo"].db.session() as session:
        factor = session.get(ClassLatencyCalibration, "pi4").factor_0
    assert factor <= CLASS_FACTOR_BOUNDS[1]
    assert lookup(live_server, fresh, latency_budget_ms=100.0, min_accuracy=0.85)["runner_up"]["latency_ms"] == \
        pytest.approx(everything["runner_up"]["latency_ms"], rel=0.15)  # the median barely moved
    other_class = live_server.register(device_profile("phone-1", device_class="phone"))
    assert lookup(live_server, other_class, latency_budget_ms=5.0)["latency_ms"] == pytest.approx(4.0)


def model_row(live_server: LiveServer, model_id: str) -> ModelRecord:
    with live_server.app.extensions["fedzoo"].db.session() as session:
        return session.get(ModelRecord, model_id)


def medium_and_fast_ms(live_server: LiveServer, token: str) -> tuple[float, float]:
    """The lookup's latency of "medium" (the runner-up above 0.85) and of "fast" (the choice under 3 ms)."""
    medium = lookup(live_server, token, latency_budget_ms=100.0, min_accuracy=0.85, precision="fp32")["runner_up"]
    fast = lookup(live_server, token, latency_budget_ms=3.0)
    assert medium["model_id"] == "medium" and fast["model"]["id"] == "fast"
    return medium["latency_ms"], fast["latency_ms"]


def test_the_fleet_learns_a_models_own_latency_from_several_devices_only(live_server, three_models):
    """Devices of different speeds all find "medium" 20% slower than its prediction relative to "fast": after
    three of them, a fresh device of no known class is predicted exactly that, and its own report of it as
    predicted leaves its scales alone. A federated version of "medium" starts with its factor. A revoked
    device's word stops counting."""
    def report_both(device_id: str, slowdown: float) -> str:
        token = live_server.register(device_profile(device_id, slowdown=slowdown, device_class=f"cpu-{device_id}"))
        report(live_server, token, "fast", 1.0 * slowdown)
        report(live_server, token, "medium", 4.0 * slowdown * 1.2)
        return token

    fresh = live_server.register(device_profile("fresh"))
    report_both("d1", 1.0)
    report_both("d2", 1.5)
    assert medium_and_fast_ms(live_server, fresh) == pytest.approx((4.0, 1.0))  # two devices: no factor
    report_both("d3", 2.0)
    assert medium_and_fast_ms(live_server, fresh) == pytest.approx((4.0 * 1.2, 1.0 / 1.2))
    with live_server.admin() as admin:  # the operator's view shows it, and its predictions include it
        medium_view = admin.get("/v1/models/medium/latency").json()
    assert medium_view["fleet_latency_factor"] == pytest.approx(1.2) and medium_view["fleet_factor_devices"] == 3
    d1_row = next(row for row in medium_view["device_classes"] if row["device_class"] == "cpu-d1")
    assert d1_row["predicted_ms"] == pytest.approx(d1_row["measured_ms"], rel=0.10)  # without the factor: 12% under
    table = CliRunner().invoke(cli, ["models", "latency", "medium", "--server", live_server.base_url],
                               env={"FEDZOO_VIEWER_TOKEN": ADMIN_TOKEN, "COLUMNS": "200"}, catch_exceptions=False)
    assert "fleet latency factor x1.200 from 3 devices" in table.stdout
    with httpx.Client(base_url=live_server.base_url) as browser:
        log_in(browser, VIEWER_TOKEN)
        page = browser.get("/ui/models/medium").text
    factor_line = " ".join(re.search(r'<p id="fleet-latency-factor">(.*?)</p>', page, re.S).group(1).split())
    assert factor_line.startswith("Fleet latency factor: ×1.2 on every device") and "from 3 devices" in factor_line
    assert model_row(live_server, "slow").latency_factor is None  # nobody ran it

    report(live_server, fresh, "medium", 4.8)  # as the fleet said: nothing left for its own scales to learn
    assert device_row(live_server, "fresh").scale_0 == pytest.approx(1.0, abs=1e-6)

    v2 = tiny_onnx_model(seed=2, hidden=8)  # a federated version: the parent's graph, new weights
    v2_card = make_card(v2, "medium-v2", 0.91, 1000, version=2, parent_id="medium",
                        latency_ms={"reference": {"median_ms": 4.0, "source": "measured"}})
    assert live_server.publish(v2_card, v2).status_code == 201
    assert model_row(live_server, "medium-v2").latency_factor == pytest.approx(1.2)
    pruned = tiny_onnx_model(seed=4, hidden=4)  # another graph: another latency, no factor of its parent's
    assert live_server.publish(make_card(pruned, "medium-pruned", 0.5, 500, parent_id="medium", latency_ms={
        "reference": {"median_ms": 2.0, "source": "measured"}}), pruned).status_code == 201
    assert model_row(live_server, "medium-pruned").latency_factor is None
    v2_answer = lookup(live_server, fresh, latency_budget_ms=100.0, min_accuracy=0.905, precision="fp32")
    assert v2_answer["runner_up"]["model_id"] == "medium-v2"
    assert v2_answer["runner_up"]["latency_ms"] == pytest.approx(4.0 * 1.2)

    with live_server.admin() as admin:
        assert admin.post("/v1/devices/d3/revoke").status_code == 200
    report(live_server, live_server.register(device_profile("d4")), "medium", 4.0)  # refreshes medium's factor
    assert model_row(live_server, "medium").latency_factor is None  # d1, d2 left (d4 ran one model only)
    second_fresh = live_server.register(device_profile("fresh-2"))
    back = lookup(live_server, second_fresh, latency_budget_ms=4.5)  # 4.8 ms with the factor: over the budget
    assert (back["model"]["id"], back["latency_ms"]) == ("medium", pytest.approx(4.0))


@given(st.lists(st.tuples(st.floats(-20, 20), st.floats(-20, 20), st.integers(1, 1000)), max_size=60))
def test_a_models_factor_stays_within_bounds_whatever_the_devices_claim(residuals):
    factor = model_factor(relative_residuals(residuals))
    if sum(count >= 2 for _, _, count in residuals) < 3:
        assert factor is None
    else:
        assert MODEL_FACTOR_BOUNDS[0] <= factor <= MODEL_FACTOR_BOUNDS[1]


def test_a_models_factor_is_the_median_against_each_devices_other_models():
    """Three devices of different speeds each ran the model and two others; it was 10% slower than their
    other models on each. A fourth device's 10x claim does not move the median; three such claims take it to
    the bound, no further."""
    def device(speed: float, model_ratio: float) -> tuple[float, float, int]:
        residuals = [math.log(model_ratio) + speed, speed, speed]  # the model's first, then two others
        return residuals[0], sum(residuals) / len(residuals), len(residuals)

    honest = [device(speed, 1.1) for speed in (0.0, 0.5, -0.3)]
    assert model_factor(relative_residuals(honest[:2])) is None
    assert model_factor(relative_residuals(honest)) == pytest.approx(1.1)
    assert model_factor(relative_residuals(honest + [device(0.0, 10.0)])) == pytest.approx(1.1)  # two honest middles
    assert model_factor(relative_residuals([device(0.0, 10.0)] * 3)) == MODEL_FACTOR_BOUNDS[1]


def test_a_margin_and_a_shortlist(live_server, three_models):
    token = live_server.register(device_profile("d1"))
    sigma = initial_log_sigma()
    plain = lookup(live_server, token, latency_budget_ms=4.3)
    assert plain["model"]["id"] == "medium" and "shortlist" not in plain
    margin = lookup(live_server, token, latency_budget_ms=4.3, latency_margin_sigmas=1.0)
    assert 4.0 * math.exp(sigma) > 4.3 and margin["model"]["id"] == "fast" and "1 sigma" in margin["reason"]
    shortlisted = lookup(live_server, token, latency_budget_ms=4.3, latency_margin_sigmas=1.0, shortlist_max_models=4)
    assert [entry["model_id"] for entry in shortlisted["shortlist"]] == ["medium", "fast"]  # slow: 10 ms, too far
    entry = shortlisted["shortlist"][0]
    assert entry["sha256"] and entry["size_bytes"] > 0 and entry["latency_log_sigma"] == pytest.approx(sigma, abs=1e-6)
    assert [e["model_id"] for e in lookup(live_server, token, latency_budget_ms=9.0, shortlist_max_models=4,
                                          latency_margin_sigmas=1.0)["shortlist"]] == ["slow", "medium"]
    only_choice = lookup(live_server, token, latency_budget_ms=9.0, shortlist_max_models=1)
    assert [e["model_id"] for e in only_choice["shortlist"]] == ["medium"]


@pytest.mark.parametrize("field,value", [
    ("latency_margin_sigmas", -1.0), ("latency_margin_sigmas", 5.5), ("latency_margin_sigmas", "1"),
    ("shortlist_max_models", 0), ("shortlist_max_models", 17), ("shortlist_max_models", 2.5),
    ("shortlist_max_models", True),
])
def test_bad_margin_or_shortlist_is_422_naming_the_field(live_server, three_models, field, value):
    token = live_server.register(device_profile("d1"))
    before = live_server.snapshot()
    with live_server.client(token) as client:
        response = client.post("/v1/lookup", json={"task": "digits", "latency_budget_ms": 5.0, field: value})
    assert response.status_code == 422 and response.json()["error"]["field"] == field
    assert live_server.snapshot() == before


def test_calibration_models_are_listed_and_downloadable_without_a_token(live_server):
    with live_server.client() as client:
        listing = CalibrationModelList.model_validate(client.get("/v1/calibration-models").json())
        assert [entry.name for entry in listing.calibration_models] == list(CALIBRATION_MODEL_NAMES)
        assert listing.total == len(CALIBRATION_MODEL_NAMES) and listing.next_offset is None
        for entry in listing.calibration_models[:2]:
            blob = client.get(f"/v1/blobs/{entry.sha256}")
            assert blob.status_code == 200 and hashlib.sha256(blob.content).hexdigest() == entry.sha256
            assert len(blob.content) == entry.size_bytes
        first = client.get("/v1/calibration-models", params={"limit": 3}).json()
        second = client.get("/v1/calibration-models", params={"limit": 3, "offset": 3}).json()
        assert first["next_offset"] == 3 and [e["name"] for e in second["calibration_models"]] == \
            list(CALIBRATION_MODEL_NAMES[3:6])
    # public by design (a device times them before it has a token); a wrong token is not an admission
    with live_server.client("not-a-valid-token") as client:
        assert client.get("/v1/calibration-models").status_code == 200


@pytest.mark.parametrize("query,field", [
    ("limit=0", "limit"), ("limit=201", "limit"), ("offset=-1", "offset"), ("limit=many", "limit"),
    ("limit=1&limit=2", "limit"), ("task=digits", "task"),
])
def test_bad_calibration_model_queries_are_422_naming_the_field(live_server, query, field):
    with live_server.client() as client:
        response = client.get(f"/v1/calibration-models?{query}")
    assert response.status_code == 422 and response.json()["error"]["field"] == field
