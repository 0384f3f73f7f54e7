"""Robust rounds against insiders: weights bounded by the round, updates scored against the server's own
update on a root set (FLTrust), the gate against the plan's best version, and quarantine with its operator
endpoints and dashboard page. Real server on loopback, real SQLite, real onnxruntime, real digits data."""

from __future__ import annotations

import io
import json
import re
import sqlite3

import httpx
import numpy as np
import pytest
from click.testing import CliRunner
from fl_helpers import OPEN_GATE, honest_delta, round_config, selected_tasks, upload
from server_helpers import log_in

from fedzoo.aggregation.private import check_secure_sum
from fedzoo.aggregation.screening import Screened
from fedzoo.aggregation.strategies import ClientUpdate
from fedzoo.aggregation.weighting import bound_weights
from fedzoo.cards import Metrics
from fedzoo.cli import cli, main
from fedzoo.edge.local_training import train_locally
from fedzoo.update_codec import split_statistics
from fedzoo.server.testing import LoopbackServer
from fedzoo.edge.onnx_initializers import read_float_initializers
from fedzoo.errors import InvalidInputError
from fedzoo.edge.local_training import train_locally
from fedzoo.server.fl.evaluation import GateReference, best_published, decide_publication
from fedzoo.server.fl.root_trust import RootUpdate, check_aggregate, train_root_update
from fedzoo.server.fl.schemas import RootTrust, TrainingConfig, WeightBound
from fedzoo.update_codec import split_statistics

ROOT_ALONE = None  # direction_screening off: the root-set tests pin FLTrust's own decisions
VIEWER_TOKEN = "robust-rounds-viewer-token-0123456789"


@pytest.fixture
def server(tmp_path):
    with LoopbackServer(tmp_path / "server", viewer_token=VIEWER_TOKEN) as running:
        yield running


def _root_set(federation, count=150) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, x=federation.split.validation.x[:count], y=federation.split.validation.y[:count])
    return buffer.getvalue()


def _trained_delta(federation, task, index):
    delta, _ = train_locally(federation.training_graph, federation.model, federation.card, task["training"],
                             federation.client_data(index), seed=index)
    return split_statistics(delta)[0]


def _rows(server, round_id):
    with sqlite3.connect(server.data_dir / "registry.db") as connection:
        return connection.execute(
            "SELECT device_id, counted_examples, delta_norm, screening, screening_reason, counted_norm, "
            "aggregation_weight, root_cosine FROM fl_updates WHERE round_id = ? ORDER BY id", (round_id,)).fetchall()


def _get(server, path, token=VIEWER_TOKEN):
    return httpx.get(f"{server.url}{path}", headers={"Authorization": f"Bearer {token}"} if token else {})


def _post(server, path, token):
    return httpx.post(f"{server.url}{path}", headers={"Authorization": f"Bearer {token}"} if token else {})


# weights bounded by the round -----------------------------------------------------------------------------


def _screened(*examples):
    return [Screened(update, "counted", None, update)
            for update in (ClientUpdate(f"device-{index}", count, dict, 1.0) for index, count in enumerate(examples))]


def test_a_claimed_example_count_weighs_at_most_k_times_the_rounds_median():
    decisions, cap = bound_weights(_screened(150, 140, 160, 10_000), WeightBound(median_multiple=2.0))
    assert cap == pytest.approx(2 * 155) and [d.update.num_examples for d in decisions] == [150, 140, 160, 310]
    assert "weight capped at 310" in decisions[3].reason and decisions[0].reason is None
    equal, _ = bound_weights(_screened(150, 10_000), WeightBound(rule="equal"))
    assert [d.update.num_examples for d in equal] == [1.0, 1.0]
    unbounded, cap = bound_weights(_screened(150, 10_000), WeightBound(rule="examples"))
    assert cap is None and [d.update.num_examples for d in unbounded] == [150, 10_000]


def test_the_round_publishes_the_weights_it_recorded(simulation, federation, server):
    round_id = simulation.start_plan(round_config(min_clients=3, target_clients=3, max_accuracy_drop=OPEN_GATE))
    devices, tasks = selected_tasks(simulation, 3)
    for device, task, (scale, examples) in zip(devices, tasks, ((0.001, 10), (0.002, 10), (0.003, 10_000))):
        upload(device, task, honest_delta(federation.model, scale), num_examples=examples)
    view = simulation.admin.fl_round(round_id)
    parameters = read_float_initializers(simulation.admin.download_model(
        simulation.admin.card(view["result_model_id"])).read_bytes())
    base = read_float_initializers(federation.model)
    for name, value in parameters.items():  # weights 10, 10 and 2 x median = 20 (not 10,000)
        np.testing.assert_allclose(value, base[name] + (0.001 * 10 + 0.002 * 10 + 0.003 * 20) / 40, atol=1e-6)
    assert [row[6] for row in _rows(server, round_id)] == [10, 10, 20]
    assert view["outcome"]["weight_bound"] == {"rule": "median_multiple", "cap": 20.0}
    participants = _get(server, f"/v1/fl/rounds/{round_id}/participants").json()["participants"]
    capped = next(p for p in participants if p["num_examples"] == 10_000)
    assert capped["aggregation_weight"] == 20 and "weight capped at 20" in capped["reason"]


# the server's own data as the root of trust ----------------------------------------------------------------


def test_a_flipped_insider_is_left_out_and_the_honest_part_is_published(simulation, federation, server):
    root_sha = simulation.admin.publish_blob(_root_set(federation), server.admin_token)
    round_id = simulation.start_plan(round_config(min_clients=3, target_clients=4, max_accuracy_drop=OPEN_GATE,
                                                  root_trust={"root_sha256": root_sha},
                                                  direction_screening=ROOT_ALONE))
    devices, tasks = selected_tasks(simulation, 4)
    deltas = [_trained_delta(federation, task, index) for index, task in enumerate(tasks)]
    for index in range(3):
        upload(devices[index], tasks[index], deltas[index], num_examples=len(federation.shards[index]))
    flipped = {name: -3 * value for name, value in deltas[3].items()}
    upload(devices[3], tasks[3], flipped, num_examples=10_000)
    view = simulation.admin.fl_round(round_id)
    assert view["state"] == "closed", view["outcome"]
    rows = _rows(server, round_id)
    insider = next(row for row in rows if row[0] == simulation_device(simulation, 3))
    honest = [row for row in rows if row is not insider]
    assert insider[3] == "rejected" and "cosine" in insider[4] and "left out" in insider[4]
    assert insider[7] < 0 and insider[6] is None
    assert all(row[3] in ("counted", "clipped") and 0 < row[7] < 1 for row in honest)
    # the aggregate is the mean of the recorded decisions: weight x (counted norm / sent norm) x delta
    sent = dict(zip((simulation_device(simulation, index) for index in range(3)), deltas[:3]))
    total = sum(row[6] for row in honest)
    base = read_float_initializers(federation.model)
    parameters = read_float_initializers(simulation.admin.download_model(
        simulation.admin.card(view["result_model_id"])).read_bytes())
    for name, value in parameters.items():
        expected = base[name] + sum(row[6] * row[5] / row[2] * sent[row[0]][name] for row in honest) / total
        np.testing.assert_allclose(value, expected, atol=1e-5)
    trust = view["outcome"]["root_trust"]
    assert trust["left_out"] == 1 and trust["root_examples"] == 150 and trust["root_update_norm"] > 0
    card = simulation.admin.card(view["result_model_id"])
    assert card.details["federated"]["root_trust"]["left_out"] == 1
    participants = {p["device_id"]: p for p in _get(server, f"/v1/fl/rounds/{round_id}/participants").json()[
        "participants"]}
    assert participants[insider[0]]["status"] == "rejected" and participants[insider[0]]["root_cosine"] < 0


def simulation_device(simulation, index):
    return f"sim-device-{index}"


def test_the_aggregate_check_under_secure_aggregation():
    root = RootUpdate({"w": np.array([1.0, 0.0], np.float32)}, 1.0, 10, 0.0)
    base = {"w": np.zeros(2, np.float32)}
    with pytest.raises(InvalidInputError, match="cosine -1.000"):
        check_aggregate(base, {"w": np.array([-0.5, 0.0], np.float32)}, root, RootTrust(root_sha256="a" * 64))
    bounded, found = check_aggregate(base, {"w": np.array([3.0, 4.0], np.float32)}, root,
                                     RootTrust(root_sha256="a" * 64, max_norm_ratio=2.0))
    np.testing.assert_allclose(bounded["w"], [1.2, 1.6], rtol=1e-6)  # norm 5 scaled to 2 x the root's 1
    assert found["aggregate_cosine"] == pytest.approx(0.6) and found["scaled_by"] == pytest.approx(0.4)


# no ratchet ------------------------------------------------------------------------------------------------


def test_the_gate_compares_with_the_plans_best_version_not_the_parent():
    parent = Metrics(accuracy=0.73, split="evaluation", num_examples=100)
    outcomes = [("base", "v2", {"parent_evaluation": {"accuracy": 0.75}, "evaluation": {"accuracy": 0.74}}),
                ("v2", "v3", {"parent_evaluation": {"accuracy": 0.74}, "evaluation": {"accuracy": 0.73}}),
                ("v3", None, {"parent_evaluation": {"accuracy": 0.73}, "failure": "refused"})]
    best = best_published("v3", parent, outcomes)
    assert (best.model_id, best.accuracy) == ("base", 0.75)
    candidate = Metrics(accuracy=0.72, split="evaluation", num_examples=100)
    assert decide_publication(candidate, GateReference("v3", 0.73, "parent"), 0.02).publish  # the ratchet
    refused = decide_publication(candidate, best, 0.02)
    assert not refused.publish and "the plan's best version base (0.7500)" in refused.reason


def test_a_round_is_gated_against_the_best_version_of_its_plan(simulation, federation):
    round_id = simulation.start_plan(round_config(min_clients=2, target_clients=2, num_rounds=2,
                                                  max_accuracy_drop=OPEN_GATE))
    devices, tasks = selected_tasks(simulation, 2)
    for device, task in zip(devices, tasks):  # a wrecked model, published through the open gate
        upload(device, task, honest_delta(federation.model, 5.0))
    first = simulation.admin.fl_round(round_id)
    base_accuracy = first["outcome"]["parent_evaluation"]["accuracy"]
    assert first["state"] == "closed" and first["outcome"]["evaluation"]["accuracy"] < base_accuracy
    devices, tasks = selected_tasks(simulation, 2)
    for device, task in zip(devices, tasks):
        upload(device, task, honest_delta(federation.model, 0.0))
    second = simulation.admin.fl_round(first["next_round_id"])
    assert second["base_model_id"] == first["result_model_id"]
    assert second["outcome"]["gate"] == {"compare_with": "best", "model_id": federation.card.id,
                                         "accuracy": base_accuracy}


def test_an_anchor_is_the_reference_when_the_operator_names_one(simulation, federation):
    round_id = simulation.start_plan(round_config(min_clients=2, target_clients=2, max_accuracy_drop=OPEN_GATE,
                                                  gate={"compare_with": "anchor",
                                                        "anchor_model_id": federation.card.id}))
    devices, tasks = selected_tasks(simulation, 2)
    for device, task in zip(devices, tasks):
        upload(device, task, honest_delta(federation.model, 0.001))
    gate = simulation.admin.fl_round(round_id)["outcome"]["gate"]
    assert (gate["compare_with"], gate["model_id"]) == ("anchor", federation.card.id)


@pytest.mark.parametrize("overrides, field", [
    ({"gate": {"compare_with": "anchor"}}, "gate"),
    ({"gate": {"compare_with": "best", "anchor_model_id": "digits-mlp16-v1"}}, "gate"),
    ({"gate": {"compare_with": "anchor", "anchor_model_id": "no-such-model"}}, "gate.anchor_model_id"),
    ({"root_trust": {"root_sha256": "0" * 64}}, "root_trust.root_sha256"),
    ({"root_trust": {"root_sha256": "0" * 64, "min_cosine": -0.5}}, "root_trust.min_cosine"),
    ({"weight_bound": {"rule": "median_multiple", "median_multiple": 0.5}}, "weight_bound.median_multiple"),
    ({"quarantine": {"max_exclusions": 6, "window_updates": 5}}, "quarantine"),
    ({"direction_screening": {"min_cosine": 1.0}}, "direction_screening.min_cosine"),
    ({"direction_screening": {"reference": "mean"}}, "direction_screening.reference"),
])
def test_bad_robustness_settings_are_refused_naming_the_field(simulation, server, overrides, field):
    config = {"model_id": simulation.federation.card.id, "evaluation_sha256": simulation.evaluation_sha256,
              **round_config(**overrides)}
    answer = httpx.post(f"{server.url}/v1/fl/rounds", json=config,
                        headers={"Authorization": f"Bearer {server.admin_token}"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["field"] == field


# quarantine ------------------------------------------------------------------------------------------------


def _quarantine_device_2(simulation, federation):
    """A plan of two rounds whose first leaves device 2's outlying update out, quarantining it (1 of 1)."""
    round_id = simulation.start_plan(round_config(min_clients=2, target_clients=3, num_rounds=2,
                                                  max_accuracy_drop=OPEN_GATE, norm_bound={"action": "reject"},
                                                  quarantine={"max_exclusions": 1, "window_updates": 1}))
    devices, tasks = selected_tasks(simulation, 3)
    upload(devices[0], tasks[0], honest_delta(federation.model, 0.001))
    upload(devices[1], tasks[1], honest_delta(federation.model, 0.002))
    upload(devices[2], tasks[2], honest_delta(federation.model, 50.0))
    return round_id, devices


def test_a_repeatedly_excluded_device_is_quarantined_listed_and_released(simulation, federation, server):
    round_id, devices = _quarantine_device_2(simulation, federation)
    answer = devices[2].fl_task("digits")
    assert answer["task"] is None and "quarantined" in answer["reason"]
    listed = _get(server, "/v1/fl/quarantine").json()
    assert listed["total"] == 1 and listed["next_offset"] is None
    entry = listed["devices"][0]
    assert (entry["device_id"], entry["round_id"], entry["revoked_at"]) == ("sim-device-2", round_id, None)
    assert "1 of its last 1 updates were left out" in entry["reason"]
    assert entry["history"][0]["status"] == "rejected" and "exceeds the round's bound" in entry["history"][0]["reason"]
    participants = _get(server, f"/v1/fl/rounds/{round_id}/participants").json()["participants"]
    assert {p["device_id"]: p["quarantined"] for p in participants} == {
        "sim-device-0": False, "sim-device-1": False, "sim-device-2": True}
    released = _post(server, "/v1/fl/quarantine/sim-device-2/release", server.admin_token)
    assert released.status_code == 200 and released.json()["device_id"] == "sim-device-2"
    assert _get(server, "/v1/fl/quarantine").json()["total"] == 0
    assert devices[2].fl_task("digits")["task"] is not None  # selected again by the plan's second round
    again = _post(server, "/v1/fl/quarantine/sim-device-2/release", server.admin_token)
    assert again.status_code == 404 and again.json()["error"]["code"] == "not_found"


def test_quarantine_endpoints_need_their_tokens(simulation, federation, server):
    _quarantine_device_2(simulation, federation)
    for token, status in ((None, 401), ("wrong-token", 401), (simulation.tokens[0], 401)):
        assert _get(server, "/v1/fl/quarantine", token).status_code == status
    for token in (None, "wrong-token", simulation.tokens[0], VIEWER_TOKEN):  # a viewer reads, never releases
        answer = _post(server, "/v1/fl/quarantine/sim-device-2/release", token)
        assert answer.status_code in (401, 403) and "error" in answer.json()
    assert _get(server, "/v1/fl/quarantine").json()["total"] == 1  # nothing was released


@pytest.mark.parametrize("query, field", [("limit=0", "limit"), ("offset=-1", "offset"), ("limit=x", "limit"),
                                          ("colour=red", "colour")])
def test_quarantine_list_bad_queries_name_the_field(server, query, field):
    answer = _get(server, f"/v1/fl/quarantine?{query}")
    assert answer.status_code == 422 and answer.json()["error"]["field"] == field


def test_the_dashboard_shows_the_quarantine_and_an_admin_revokes_from_there(simulation, federation, server):
    round_id, devices = _quarantine_device_2(simulation, federation)
    with httpx.Client(base_url=server.url) as viewer:
        log_in(viewer, VIEWER_TOKEN)
        page = viewer.get("/ui/quarantine")
        assert page.status_code == 200 and 'data-device-id="sim-device-2"' in page.text
        assert "Revoke" not in page.text  # a viewer sees the history, not the buttons
        form_token = re.search(r'name="form_token" value="([^"]+)"', page.text).group(1)
        refused = viewer.post("/ui/quarantine/sim-device-2/revoke", data={"form_token": form_token})
        assert refused.status_code == 403
        round_page = viewer.get(f"/ui/rounds/{round_id}")
        assert "(quarantined)" in round_page.text and "exceeds the round" in round_page.text
    with httpx.Client(base_url=server.url) as admin:
        log_in(admin, server.admin_token)
        page = admin.get("/ui/quarantine")
        form_token = re.search(r'name="form_token" value="([^"]+)"', page.text).group(1)
        assert admin.post("/ui/quarantine/sim-device-2/revoke", data={"form_token": "forged"}).status_code == 403
        done = admin.post("/ui/quarantine/sim-device-2/revoke", data={"form_token": form_token})
        assert done.status_code == 302
        assert "Revoked" in admin.get("/ui/quarantine").text
    entry = _get(server, "/v1/fl/quarantine").json()["devices"][0]
    assert entry["revoked_at"] is not None
    assert _get(server, "/v1/fl/quarantine", simulation.tokens[2]).status_code == 401  # its token is refused


def test_the_cli_lists_releases_and_revokes_quarantined_devices(simulation, federation, server, capsys, monkeypatch):
    _quarantine_device_2(simulation, federation)
    viewer = {"FEDZOO_VIEWER_TOKEN": VIEWER_TOKEN, "FEDZOO_ADMIN_TOKEN": ""}
    listed = CliRunner().invoke(cli, ["fl", "quarantine", "list", "--server", server.url, "--format", "json"],
                                env=viewer, catch_exceptions=False)
    assert json.loads(listed.stdout) == _get(server, "/v1/fl/quarantine").json()
    table = CliRunner().invoke(cli, ["fl", "quarantine", "list", "--server", server.url], env=viewer,
                               catch_exceptions=False)
    assert "sim-device-2" in table.stdout and "rejected" in table.stdout
    for name, value in viewer.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_:  # the viewer token cannot release: a message, not a traceback
        main(["fl", "quarantine", "release", "sim-device-2", "--server", server.url, "--token", VIEWER_TOKEN])
    captured = capsys.readouterr()
    assert exit_.value.code == 1 and "HTTP 401 invalid_token" in captured.err and "Traceback" not in captured.err
    monkeypatch.setenv("FEDZOO_ADMIN_TOKEN", server.admin_token)
    released = CliRunner().invoke(cli, ["fl", "quarantine", "release", "sim-device-2", "--server", server.url],
                                  catch_exceptions=False)
    assert released.exit_code == 0 and released.stdout.startswith("released sim-device-2 at ")
    revoked = CliRunner().invoke(cli, ["fl", "quarantine", "revoke", "sim-device-1", "--server", server.url],
                                 catch_exceptions=False)
    assert revoked.exit_code == 0 and revoked.stdout.startswith("revoked sim-device-1 at ")


def test_the_unmasked_sum_must_lie_within_what_clipped_updates_add_up_to():
    within = np.array([0.3, -0.25, 0.0])
    check_secure_sum(within, 3.0, 3, 0.1, equal=True)  # each of 3 devices at most 0.1 a coordinate
    with pytest.raises(InvalidInputError, match="more than 3.000 updates clipped") as error:
        check_secure_sum(np.array([0.31, 0.0, 0.0]), 3.0, 3, 0.1, equal=True)
    assert error.value.field == "clip_range"
    with pytest.raises(InvalidInputError, match="must weigh the same"):
        check_secure_sum(within, 4.0, 3, 0.1, equal=True)  # one device claimed weight 2
    with pytest.raises(InvalidInputError, match="above 1"):
        check_secure_sum(within, 3.5, 3, 0.1, equal=False)
    check_secure_sum(within * 0.5, 1.5, 3, 0.1, equal=False)  # example weights below 1 each


def test_only_updates_pointing_away_from_the_root_count_towards_quarantine(simulation, federation, server):
    root_npz = _root_set(federation)
    root_sha = simulation.admin.publish_blob(root_npz, server.admin_token)
    simulation.start_plan(round_config(min_clients=2, target_clients=3, max_accuracy_drop=OPEN_GATE,
                                       root_trust={"root_sha256": root_sha}, direction_screening=ROOT_ALONE,
                                       quarantine={"max_exclusions": 1, "window_updates": 1}))
    devices, tasks = selected_tasks(simulation, 3)
    root = train_root_update(federation.model, federation.training_graph, federation.card,
                             TrainingConfig(**tasks[0]["training"]), root_npz, seed=1)  # what the server trains
    unit = {name: value / root.norm for name, value in root.delta.items()}
    rng = np.random.default_rng(0)
    noise = {name: rng.normal(size=value.shape).astype(np.float32) for name, value in root.delta.items()}
    along = sum(float(np.vdot(noise[name], unit[name])) for name in unit)
    orthogonal = {name: noise[name] - along * unit[name] for name in unit}
    length = np.sqrt(sum(float(np.vdot(value, value)) for value in orthogonal.values()))
    # about orthogonal (cosine -0.01: left out, not harmful) and pointing away (cosine -0.8)
    aside = {name: (0.01 * (orthogonal[name] / length - 0.01 * unit[name])).astype(np.float32) for name in unit}
    away = {name: (0.01 * (0.6 * orthogonal[name] / length - 0.8 * unit[name])).astype(np.float32) for name in unit}
    upload(devices[0], tasks[0], {name: (0.01 * value).astype(np.float32) for name, value in unit.items()})
    upload(devices[1], tasks[1], aside)
    upload(devices[2], tasks[2], away)
    cosines = {row[0]: (row[3], row[7]) for row in _rows(server, tasks[0]["round_id"])}
    assert cosines["sim-device-0"][0] == "counted" and cosines["sim-device-0"][1] == pytest.approx(1.0, abs=1e-3)
    assert cosines["sim-device-1"][0] == "rejected" and cosines["sim-device-1"][1] == pytest.approx(-0.01, abs=2e-3)
    assert cosines["sim-device-2"][0] == "rejected" and cosines["sim-device-2"][1] == pytest.approx(-0.8, abs=2e-3)
    quarantined = [entry["device_id"] for entry in _get(server, "/v1/fl/quarantine").json()["devices"]]
    assert quarantined == ["sim-device-2"]
