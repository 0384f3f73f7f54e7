"""The server never takes a device's word for weight or quality: strict and capped example counts, a norm
bound recorded per update, publication only after the server's own evaluation, and the devices' metrics
kept apart as client_reported_metrics. Real server on loopback, real SQLite, real onnxruntime."""

import json
import sqlite3

import httpx
import numpy as np
import pytest
from fl_helpers import device_client, honest_delta, round_config, selected_tasks, upload

from fedzoo.clients.errors import ConflictError
from fedzoo.update_codec import encode_update
from fedzoo.edge.onnx_initializers import read_float_initializers


def _published_parameters(simulation, round_id):
    view = simulation.admin.fl_round(round_id)
    card = simulation.admin.card(view["result_model_id"])
    return view, card, read_float_initializers(simulation.admin.download_model(card).read_bytes())


def _update_rows(server, round_id):
    with sqlite3.connect(server.data_dir / "registry.db") as connection:
        return connection.execute(
            "SELECT device_id, num_examples, counted_examples, delta_norm, screening, screening_reason, counted_norm "
            "FROM fl_updates WHERE round_id = ? ORDER BY id", (round_id,)).fetchall()


def test_num_examples_must_be_a_json_integer(simulation, federation):
    round_id = simulation.start_plan(round_config())
    task = device_client(simulation, 0).fl_task("digits")["task"]
    delta = encode_update(honest_delta(federation.model), "fp32")
    url = f"{simulation.server_url}{task['upload']['url']}"
    headers = {"Authorization": f"Bearer {simulation.tokens[0]}"}
    for bad in ("100", 1.5, True, None):
        metadata = json.dumps({"base_version": task["base_version"], "num_examples": bad})
        answer = httpx.post(url, files={"metadata": (None, metadata), "delta": ("delta.npz", delta)}, headers=headers)
        assert answer.status_code == 422, (bad, answer.text)
        assert answer.json()["error"]["field"] == "num_examples"
    nested = "[" * 1100 + "]" * 1100
    answer = httpx.post(url, files={"metadata": (None, nested), "delta": ("delta.npz", delta)}, headers=headers)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "malformed_json"
    assert simulation.admin.fl_round(round_id)["accepted_updates"] == 0


def test_an_inflated_example_count_is_capped_to_the_rounds_limit(simulation, federation, server):
    round_id = simulation.start_plan(round_config(min_clients=2, target_clients=2, max_examples_per_update=50))
    devices, tasks = selected_tasks(simulation, 2)
    small, large = honest_delta(federation.model, 0.001), honest_delta(federation.model, 0.003)
    receipt = upload(devices[0], tasks[0], small, num_examples=1_000_000_000)
    assert receipt["counted_examples"] == 50
    assert upload(devices[1], tasks[1], large, num_examples=50)["counted_examples"] == 50
    view, card, parameters = _published_parameters(simulation, round_id)
    base = read_float_initializers(federation.model)
    for name, value in parameters.items():  # equal weights: the plain mean of the two deltas, 0.002
        np.testing.assert_allclose(value, base[name] + 0.002, atol=1e-6)
    assert view["config"]["max_examples_per_update"] == 50 and view["outcome"]["num_examples"] == 100
    assert [row[1:3] for row in _update_rows(server, round_id)] == [(1_000_000_000, 50), (50, 50)]


def test_the_default_cap_is_the_servers_setting_recorded_in_the_round(simulation):
    round_id = simulation.start_plan(round_config())
    assert simulation.admin.fl_round(round_id)["config"]["max_examples_per_update"] == 10_000


@pytest.mark.parametrize("action", ["reject", "clip"])
def test_an_update_far_outside_the_norm_bound_is_rejected_or_clipped_and_recorded(simulation, federation, server,
                                                                                   action):
    round_id = simulation.start_plan(round_config(min_clients=2, target_clients=3,
                                                  norm_bound={"median_multiple": 3.0, "action": action}))
    devices, tasks = selected_tasks(simulation, 3)
    upload(devices[0], tasks[0], honest_delta(federation.model, 0.001))
    upload(devices[1], tasks[1], honest_delta(federation.model, 0.002))
    upload(devices[2], tasks[2], honest_delta(federation.model, 3e29))  # the probe's attack, inside float32
    view, card, parameters = _published_parameters(simulation, round_id)
    rows = _update_rows(server, round_id)
    norms = [row[3] for row in rows]
    limit = 3.0 * float(np.median(norms))
    assert view["outcome"]["screening"]["norm_limit"] == pytest.approx(limit)
    assert [row[4] for row in rows] == ["counted", "counted", "rejected" if action == "reject" else "clipped"]
    assert "exceeds the round's bound" in rows[2][5] and rows[2][3] == pytest.approx(norms[2])
    base = read_float_initializers(federation.model)
    if action == "reject":
        expected_shift = lambda name: 0.0015  # noqa: E731  the mean of the two honest deltas
        assert rows[2][6] is None and view["outcome"]["aggregated_updates"] == 2
    else:
        clipped_scale = 3e29 * limit / norms[2]  # the attacker's delta scaled down to the bound
        expected_shift = lambda name: (0.001 + 0.002 + clipped_scale) / 3  # noqa: E731
        assert rows[2][6] == pytest.approx(limit) and view["outcome"]["aggregated_updates"] == 3
    for name, value in parameters.items():
        np.testing.assert_allclose(value, base[name] + expected_shift(name), rtol=1e-4, atol=1e-6)
    assert card.details["federated"]["screening"][action + "ed" if action == "reject" else "clipped"] == 1


def test_a_worse_aggregate_is_not_published_and_lookup_keeps_the_parent(simulation, federation, server):
    round_id = simulation.start_plan(round_config(min_clients=2, target_clients=2, num_rounds=2, max_accuracy_drop=0.02))
    devices, tasks = selected_tasks(simulation, 2)
    for device, task in zip(devices, tasks):  # equal, huge deltas: no norm outlier, but a wrecked model
        upload(device, task, honest_delta(federation.model, 5.0), metrics={"accuracy": 1.0, "loss": 0.0})
    view = simulation.admin.fl_round(round_id)
    assert view["state"] == "failed" and view["result_model_id"] is None
    outcome = view["outcome"]
    assert outcome["publication"]["published"] is False and "not published" in outcome["failure"]
    assert outcome["evaluation"]["accuracy"] < outcome["parent_evaluation"]["accuracy"] - 0.02
    assert outcome["client_reported_metrics"]["accuracy"] == 1.0  # recorded, and beside the point
    assert len(outcome["refused_model_sha256"]) == 64
    listed = [card["id"] for card in simulation.admin.list_models(task="digits")["models"]]
    assert listed == [federation.card.id]
    assert device_client(simulation, 2).lookup("digits", latency_budget_ms=1e6)["model"]["id"] == federation.card.id
    following = simulation.admin.fl_round(view["next_round_id"])
    assert (following["state"], following["base_model_id"]) == ("open", federation.card.id)
    with pytest.raises(ConflictError):  # the refused round takes nothing more
        upload(devices[0], tasks[0], honest_delta(federation.model))


def test_published_accuracy_is_the_servers_measurement_not_the_devices_claim(simulation, federation):
    round_id = simulation.start_plan(round_config(min_clients=2, target_clients=2))
    devices, tasks = selected_tasks(simulation, 2)
    upload(devices[0], tasks[0], honest_delta(federation.model, 0.0005), num_examples=10,
           metrics={"accuracy": 1.0, "loss": 1e308})
    upload(devices[1], tasks[1], honest_delta(federation.model, 0.0005), num_examples=30,
           metrics={"accuracy": 1.0, "loss": 1e308})
    view, card, _ = _published_parameters(simulation, round_id)
    assert card.metrics.split == "evaluation" and card.metrics.num_examples == len(federation.split.test)
    assert card.metrics.accuracy == view["outcome"]["evaluation"]["accuracy"] < 1.0
    reported = card.details["federated"]["client_reported_metrics"]
    assert reported == {"accuracy": 1.0, "loss": 1e308}  # no overflow into null
    assert view["outcome"]["client_reported_metrics"] == reported


def test_an_archive_whose_header_declares_1e12_values_is_refused_before_reading(simulation):
    import io
    import zipfile

    round_id = simulation.start_plan(round_config())
    task = device_client(simulation, 0).fl_task("digits")["task"]
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, {"descr": "<f4", "fortran_order": False, "shape": (10**12,)})
    member.write(b"\0" * 64)
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as writer:
        writer.writestr("w1.npy", member.getvalue())
    metadata = json.dumps({"base_version": task["base_version"], "num_examples": 10})
    answer = httpx.post(f"{simulation.server_url}{task['upload']['url']}",
                        files={"metadata": (None, metadata), "delta": ("delta.npz", archive.getvalue())},
                        headers={"Authorization": f"Bearer {simulation.tokens[0]}"})
    assert answer.status_code == 422 and "declares" in answer.json()["error"]["message"]
    assert answer.json()["error"]["field"] == "delta"
    assert simulation.admin.fl_round(round_id)["accepted_updates"] == 0


def test_client_reported_means_stay_finite_at_the_top_of_the_float_range():
    import sys

    from fedzoo.server.fl.evaluation import client_reported_metrics
    from fedzoo.aggregation.strategies import ClientUpdate

    top = sys.float_info.max
    updates = [ClientUpdate("a", 3, dict, 0.0, {"loss": top}),
               ClientUpdate("b", 7, dict, 0.0, {"loss": top, "accuracy": 0.5}),
               ClientUpdate("c", 10, dict, 0.0, {"loss": -top})]
    means = client_reported_metrics(updates)
    assert means["accuracy"] == 0.5 and means["loss"] == pytest.approx(0.0, abs=1e300)
    assert client_reported_metrics(updates[:2]) == {"accuracy": 0.5, "loss": top}


def test_the_norm_limit_is_the_smaller_of_the_median_multiple_and_the_absolute_bound():
    from fedzoo.server.fl.schemas import NormBound
    from fedzoo.aggregation.screening import norm_limit

    assert norm_limit([1.0, 2.0, 100.0], NormBound(median_multiple=3.0)) == 6.0
    assert norm_limit([1.0, 2.0, 100.0], NormBound(median_multiple=3.0, max_norm=4.0)) == 4.0


def test_a_revoked_devices_pending_update_is_not_aggregated(simulation, federation, server):
    round_id = simulation.start_plan(round_config(min_clients=2, target_clients=3))
    devices, tasks = selected_tasks(simulation, 3)
    upload(devices[0], tasks[0], honest_delta(federation.model, 0.5))  # stored, then its device is revoked
    revoked = httpx.post(f"{simulation.server_url}/v1/devices/sim-device-0/revoke",
                         headers={"Authorization": f"Bearer {simulation.admin_token}"})
    assert revoked.status_code == 200
    upload(devices[1], tasks[1], honest_delta(federation.model, 0.001))
    upload(devices[2], tasks[2], honest_delta(federation.model, 0.003))
    view, card, parameters = _published_parameters(simulation, round_id)
    base = read_float_initializers(federation.model)
    for name, value in parameters.items():  # the mean of the two remaining deltas only
        np.testing.assert_allclose(value, base[name] + 0.002, atol=1e-6)
    assert view["outcome"]["aggregated_updates"] == 2 and view["outcome"]["screening"]["rejected"] == 1
    assert [row[4:6] for row in _update_rows(server, round_id)][0] == ("rejected",
                                                                        "the device was revoked by the operator")
