"""The dashboard in headless Chromium against a real server fed by real calls: a two-round plan run by
real clients, published lineages, telemetry, registrations. Pages, tables and Chart.js's own data are
compared with the JSON API; every test also checks that nothing came from another origin and that the
console stayed free of errors (the strict CSP would log any inline script or style it blocked)."""

from __future__ import annotations

import hashlib
import re

import pytest
from fl_helpers import round_config
from server_helpers import ADMIN_TOKEN, VIEWER_TOKEN, device_profile, make_card, tiny_onnx_model

from fedzoo.cloud.simulation import Simulation

pytestmark = pytest.mark.slow


def number_cells(texts: list[str]) -> list[float]:
    return [float(re.sub(r"[^0-9.eE+-]", "", text)) for text in texts]


def api(server, path: str, **params):
    with server.client(VIEWER_TOKEN) as client:
        response = client.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def expect(locator):
    from playwright.sync_api import expect as playwright_expect  # the dev extra; the chromium fixture checks it

    return playwright_expect(locator)


def test_round_page_after_a_real_two_round_plan(browser_page, live_server, federation, tmp_path):
    with Simulation(federation, live_server.base_url, admin_token=ADMIN_TOKEN, cache_root=tmp_path / "devices") as sim:
        sim.publish_base_model()
        sim.register_devices()
        records = sim.run(round_config(num_rounds=2, over_selection=0.34))
        assert [record.state for record in records] == ["closed", "closed"]
        browser_page.log_in(VIEWER_TOKEN)
        browser_page.open(f"/ui/rounds/{records[1].round_id}")
        page = browser_page.page

        participants = api(live_server, f"/v1/fl/rounds/{records[1].round_id}/participants")["participants"]
        rows = page.locator("#participants-table tbody tr")
        assert rows.count() == len(participants) == records[1].accepted_updates + records[1].refused
        assert page.locator("#participants-table tr[data-status=accepted]").count() == records[1].accepted_updates
        assert set(browser_page.column("#participants-table tbody td:first-child")) == \
            {p["device_id"] for p in participants}
        # the accuracy chart: two points, equal to the table and to each round's server-side measurement
        (chart_points,) = browser_page.chart_data("accuracy-chart")
        table_points = [float(value) for value in
                        page.locator("#accuracy-table td.accuracy").evaluate_all("cells => cells.map(c => c.dataset.value)")]
        assert len(chart_points) == 2
        assert chart_points == pytest.approx(table_points)
        assert chart_points == pytest.approx([record.accuracy for record in records])

        # a new plan: its page shows "open", and the state cell turns "closed" by polling alone
        round_id = sim.start_plan(round_config(num_rounds=1, target_clients=2, min_clients=1))
        browser_page.open(f"/ui/rounds/{round_id}")
        assert page.inner_text("#round-state") == "open"
        record = sim.run_round(round_id)
        assert record.state == "closed"
        expect(page.locator("#round-state")).to_have_text("closed", timeout=20_000)
        assert page.get_attribute("#round-state", "hx-trigger") is None  # polling stops with the round
    browser_page.assert_clean()


def publish_zoo(server) -> None:
    """base -> pruned -> int8, plus models with and without a latency for class pi4."""
    cards = [
        ("base", None, 0.90, {"latency_ms": {"pi4": {"median_ms": 8.0, "source": "measured"}}}),
        ("base-pruned", "base", 0.88, {"pruning": {"ratio": 0.5, "method": "l1-global"},
                                       "latency_ms": {"pi4": {"median_ms": 5.0, "source": "measured"}}}),
        ("base-pruned-int8", "base-pruned", 0.87, {"precision": "int8",
                                                   "latency_ms": {"pi4": {"median_ms": 2.5, "source": "predicted"}}}),
        ("slow-and-poor", None, 0.70, {"latency_ms": {"pi4": {"median_ms": 9.0, "source": "measured"}}}),
        ("no-pi4-latency", None, 0.95, {"latency_ms": {"phone": {"median_ms": 3.0, "source": "measured"}}}),
    ]
    for seed, (model_id, parent, accuracy, fields) in enumerate(cards):
        blob = tiny_onnx_model(seed=seed)
        assert server.publish(make_card(blob, model_id, accuracy, 1000, parent_id=parent, **fields), blob).status_code == 201


def test_registry_lineage_pareto_and_predicted_vs_measured(browser_page, live_server):
    publish_zoo(live_server)
    tokens = [live_server.register(device_profile(f"pi-{i}", device_class="pi4")) for i in range(2)]
    for token, median_ms in zip(tokens, (6.0, 7.0)):
        with live_server.client(token) as device:
            assert device.post("/v1/telemetry", json={"model_id": "base-pruned", "median_ms": median_ms}).status_code == 201
    browser_page.log_in(VIEWER_TOKEN)
    page = browser_page.page

    browser_page.open("/ui/models?limit=2")
    listed = api(live_server, "/v1/models", limit=2)
    assert browser_page.column("#models-table tbody td:first-child") == [card["id"] for card in listed["models"]]
    page.click("#next-page")
    page.wait_for_load_state()
    assert browser_page.column("#models-table tbody td:first-child") == \
        [card["id"] for card in api(live_server, "/v1/models", limit=2, offset=2)["models"]]

    browser_page.open("/ui/models/base-pruned")
    lineage = [(row.get_attribute("data-relation"), row.get_attribute("data-model-id"))
               for row in page.locator("#lineage-table tbody tr").all()]
    assert lineage == [("ancestor", "base"), ("this model", "base-pruned"), ("descendant", "base-pruned-int8")]
    latency = api(live_server, "/v1/models/base-pruned/latency")["device_classes"]
    (pi4,) = latency
    assert pi4["measured_ms"] == 6.5 and pi4["card_ms"] == 5.0
    assert number_cells(browser_page.column("#latency-table td.measured-ms")) == [6.5]
    card_bars, predicted_bars, measured_bars = browser_page.chart_data("latency-chart")
    assert (card_bars, measured_bars) == ([5.0], [6.5]) and predicted_bars == pytest.approx([pi4["predicted_ms"]])

    browser_page.open("/ui/zoo?task=digits&device_class=pi4&budget_ms=6")
    with_pi4 = [card["id"] for card in api(live_server, "/v1/models", task="digits")["models"]
                if "pi4" in card["latency_ms"]]
    points, front, budget = browser_page.chart_data("pareto-chart")
    assert len(points) == len(with_pi4) == 4 == page.locator("#pareto-table tbody tr").count()
    front_rows = page.locator("#pareto-table tr[data-on-front=true]").evaluate_all(
        "rows => rows.map(r => r.dataset.modelId)")
    assert front_rows == ["base-pruned-int8", "base-pruned", "base"]  # slow-and-poor is dominated
    assert [point["x"] for point in front] == [2.5, 5.0, 8.0]
    assert {point["x"] for point in budget} == {6}
    browser_page.assert_clean()


def test_fleet_counts_match_the_registrations(browser_page, live_server):
    for index in range(3):
        live_server.register(device_profile(f"phone-{index}", device_class="phone"))
    live_server.register(device_profile("pi-0", device_class="pi4"))
    browser_page.log_in(ADMIN_TOKEN)
    browser_page.open("/ui/fleet")
    counts = {row["device_class"]: row["devices"] for row in api(live_server, "/v1/devices/classes")["device_classes"]}
    page = browser_page.page
    shown = dict(zip(page.locator("#classes-table tbody tr").evaluate_all("rows => rows.map(r => r.dataset.deviceClass)"),
                     [int(text) for text in browser_page.column("#classes-table td.devices")]))
    assert shown == counts == {"phone": 3, "pi4": 1}
    (chart_counts,) = browser_page.chart_data("fleet-chart")
    assert chart_counts == [3, 1]
    assert page.locator("#devices-table tbody tr").count() == 4
    browser_page.open("/ui/")
    assert page.inner_text("#count-devices") == "4"
    browser_page.assert_clean()


def test_auth_login_roles_and_no_token_material_in_any_page(browser_page, live_server):
    publish_zoo(live_server)
    device_token = live_server.register(device_profile("phone-0", device_class="phone"))
    page = browser_page.page

    browser_page.open("/ui/rounds")  # no cookie: the login form
    assert "/ui/login" in page.url and page.locator("#login-form").count() == 1
    browser_page.log_in(device_token)  # a device token opens nothing
    assert page.locator("#login-error").count() == 1 and "/ui/login" in page.url
    browser_page.open("/ui/fleet")
    assert "/ui/login" in page.url

    browser_page.log_in(VIEWER_TOKEN)
    assert page.inner_text("#role") == "viewer"
    secrets = [device_token, hashlib.sha256(device_token.encode()).hexdigest(), VIEWER_TOKEN, ADMIN_TOKEN]
    for path in ("/ui/", "/ui/models", "/ui/models/base", "/ui/zoo", "/ui/rounds", "/ui/fleet"):
        response = browser_page.open(path)
        assert response.status == 200 and "/ui/login" not in page.url
        assert not any(secret in page.content() for secret in secrets)
    cookies = {cookie["name"]: cookie for cookie in page.context.cookies()}
    assert not any(secret in cookie["value"] for cookie in cookies.values() for secret in secrets)
    assert (cookies["fedzoo_ui"]["httpOnly"], cookies["fedzoo_ui"]["sameSite"]) == (True, "Strict")

    page.click("header form button[type=submit]")  # log out
    page.wait_for_load_state()
    browser_page.open("/ui/models")
    assert "/ui/login" in page.url
    # the one error: the browser logs the refused login's 401
    browser_page.assert_clean(("Failed to load resource: the server responded with a status of 401 (UNAUTHORIZED)",))
