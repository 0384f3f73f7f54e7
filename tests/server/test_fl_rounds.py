"""Federated rounds against a real server on loopback: selection, refusals, deadlines, restarts, lineage."""

import hashlib
import json
import sqlite3
import threading
import time
from datetime import datetime, timezone

import httpx
import numpy as np
import pytest

from fedzoo.clients.errors import AuthenticationError, BadRequestError, ConflictError, PayloadTooLargeError, PermissionDeniedError
from fedzoo.clients.participation import run_task
from fedzoo.edge.local_training import normalise
from fedzoo.update_codec import encode_update
from fedzoo.cloud.simulation import Simulation, accuracy_of, prepare_federation
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN, LoopbackServer
from fedzoo.server.fl import rounds
from fl_helpers import device_client, honest_delta, ready_simulation, round_config, upload

ADMIN = DEFAULT_ADMIN_TOKEN


_device, _config, _upload = device_client, round_config, upload


def _honest_delta(federation, scale=0.01):
    return honest_delta(federation.model, scale)


@pytest.mark.slow
def test_two_rounds_publish_new_versions_with_lineage_and_measured_accuracy(simulation, federation):
    records = simulation.run(_config(num_rounds=2, over_selection=0.34, strategy={"name": "fedprox", "proximal_mu": 0.01}))
    assert [(r.number, r.state, r.accepted_updates) for r in records] == [(1, "closed", 3), (2, "closed", 3)]
    first, second = (simulation.admin.card(r.result_model_id) for r in records)
    assert (first.version, first.parent_id) == (2, federation.card.id)
    assert (second.version, second.parent_id) == (3, first.id)
    assert second.training_graph == federation.card.training_graph
    assert second.details["federated"]["strategy"] == "fedprox"
    assert second.metrics.split == "evaluation" and second.metrics.num_examples == len(federation.split.test)
    # the published blob is the model the card describes: its accuracy on the test split is the card's
    blob = simulation.admin.download_model(second).read_bytes()
    assert hashlib.sha256(blob).hexdigest() == second.sha256
    test_features = normalise(federation.split.test.x, federation.card.input.normalisation)
    assert accuracy_of(blob, test_features, federation.split.test.y) == pytest.approx(second.metrics.accuracy)
    # learned something: two rounds gain about 0.26 over the pre-trained model here, so 0.1 is a margin no
    # CPU's rounding closes (a round that publishes its base, or a sign-flipped delta, does not clear it)
    assert blob != federation.model and second.metrics.accuracy > federation.card.metrics.accuracy + 0.1
    # lookup can serve the new versions: they are in the registry under the task
    listed = {card["id"]: card["metrics"]["accuracy"] for card in simulation.admin.list_models(task="digits")["models"]}
    assert {federation.card.id, first.id, second.id} <= set(listed)
    chosen = _device(simulation, 0).lookup("digits", latency_budget_ms=1e6)["model"]
    assert chosen["metrics"]["accuracy"] == max(listed.values())
    round_view = simulation.admin.fl_round(records[1].round_id)
    assert round_view["upload_bytes"] > 0 and round_view["outcome"]["strategy"] == "fedprox"


def test_selection_over_selects_then_tells_the_rest_when_to_come_back(simulation):
    round_id = simulation.start_plan(_config(target_clients=2, min_clients=1, over_selection=0.5))
    answers = [_device(simulation, index).fl_task("digits") for index in range(4)]
    assert [a["task"] is not None for a in answers] == [True, True, True, False]
    assert 0 < answers[3]["retry_after_s"] <= 5.0
    view = simulation.admin.fl_round(round_id)
    assert (view["state"], view["selected_devices"]) == ("collecting", 3)
    # a selected device that asks again gets the same task back, not a second seat
    again = _device(simulation, 0).fl_task("digits")["task"]
    assert again["round_id"] == round_id and simulation.admin.fl_round(round_id)["selected_devices"] == 3
    assert answers[0]["task"]["training"]["proximal_mu"] == 0.0
    # eligibility: another task, or another family, gets no work
    assert _device(simulation, 3).fl_task("mnist")["task"] is None
    assert _device(simulation, 3).fl_task("digits", family="other-family")["task"] is None


def test_bad_updates_are_refused_naming_the_problem_and_never_counted(simulation, federation):
    round_id = simulation.start_plan(_config())
    device = _device(simulation, 0)
    task = device.fl_task("digits")["task"]
    good = _honest_delta(federation)
    name = sorted(good)[0]
    cases = [
        ({**good, name: np.zeros((2, 2), np.float32)}, BadRequestError, name, "shape"),
        ({**good, name: np.full(good[name].shape, np.nan, np.float32)}, BadRequestError, name, "NaN"),
        ({k: v for k, v in good.items() if k != name}, BadRequestError, name, "missing"),
    ]
    for delta, kind, field, words in cases:
        with pytest.raises(kind, match=words) as error:
            _upload(device, task, delta)
        assert error.value.field == field
    with pytest.raises(ConflictError) as stale:
        _upload(device, task, good, base_version=task["base_version"] + 1)
    assert stale.value.code == "stale_update" and stale.value.status == 409
    total = sum(value.size for value in good.values())
    too_large = {**good, name: np.zeros(2 * total + 20_000, np.float32)}  # past the model's size + 64 KiB
    with pytest.raises(PayloadTooLargeError):
        _upload(device, task, too_large)
    assert simulation.admin.fl_round(round_id)["accepted_updates"] == 0
    # a device that was not selected may not upload; one that was is accepted once, then refused as duplicate
    with pytest.raises(PermissionDeniedError) as unselected:
        _upload(_device(simulation, 3), task, good)
    assert unselected.value.code == "not_selected"
    receipt = _upload(device, task, good, encoding="int8")
    assert receipt["accepted_updates"] == 1 and receipt["encoding"] == "int8"
    with pytest.raises(ConflictError) as duplicate:
        _upload(device, task, good)
    assert duplicate.value.code == "duplicate_update"
    assert simulation.admin.fl_round(round_id)["accepted_updates"] == 1


def test_admin_only_and_bad_round_configs_are_refused(simulation, federation):
    plan = {"model_id": federation.card.id, "evaluation_sha256": simulation.evaluation_sha256}
    with pytest.raises(AuthenticationError):
        simulation.admin.create_rounds({**plan, **_config()}, "wrong-token")
    with pytest.raises(BadRequestError, match="unknown strategy") as strategy:
        simulation.admin.create_rounds({**plan, **_config(strategy={"name": "krum"})}, ADMIN)
    assert strategy.value.field == "strategy.name"
    with pytest.raises(BadRequestError, match="target_clients"):
        simulation.admin.create_rounds({**plan, **_config(min_clients=5)}, ADMIN)
    # the server publishes only what it measured itself: a round without an evaluation set is refused
    with pytest.raises(BadRequestError, match="Field required") as no_evaluation:
        simulation.admin.create_rounds({"model_id": federation.card.id, **_config()}, ADMIN)
    assert no_evaluation.value.field == "evaluation_sha256"
    with pytest.raises(BadRequestError) as bad_bound:
        simulation.admin.create_rounds({**plan, **_config(norm_bound={"median_multiple": 0.5})}, ADMIN)
    assert bad_bound.value.field == "norm_bound.median_multiple"


def test_the_learning_rate_decays_by_the_plans_factor_each_round(simulation, federation):
    round_id = simulation.start_plan(_config(min_clients=1, target_clients=1, num_rounds=2, learning_rate_decay=0.5))
    first = _device(simulation, 0).fl_task("digits")["task"]
    _upload(_device(simulation, 0), first, _honest_delta(federation))
    give_up = time.monotonic() + 10
    while simulation.admin.fl_round(round_id)["next_round_id"] is None and time.monotonic() < give_up:
        time.sleep(0.05)  # the target is in: the server aggregates and opens round 2
    second = _device(simulation, 1).fl_task("digits")["task"]
    assert (first["round_number"], second["round_number"]) == (1, 2)
    assert (first["training"]["learning_rate"], second["training"]["learning_rate"]) == (0.05, 0.025)


@pytest.mark.slow
def test_a_round_short_of_its_minimum_fails_at_the_deadline_and_the_next_starts(simulation, federation):
    round_id = simulation.start_plan(_config(min_clients=2, target_clients=2, deadline_s=3, num_rounds=2))
    fast, straggler = _device(simulation, 0), _device(simulation, 1)
    task = fast.fl_task("digits")["task"]
    late_task = straggler.fl_task("digits")["task"]
    _upload(fast, task, _honest_delta(federation))
    deadline = datetime.fromisoformat(task["deadline_at"])
    time.sleep(max(0.0, (deadline - datetime.now(timezone.utc)).total_seconds()) + 0.2)
    view = simulation.admin.fl_round(round_id)
    assert view["state"] == "failed" and "only 1 of the minimum 2" in view["outcome"]["failure"]
    with pytest.raises(ConflictError) as late:
        _upload(straggler, late_task, _honest_delta(federation))
    assert late.value.code == "round_not_accepting"
    following = simulation.admin.fl_round(view["next_round_id"])
    assert (following["state"], following["number"], following["base_model_id"]) == ("open", 2, federation.card.id)


def _round_rows(server):
    """The rounds as the database holds them, read without a request (a request would advance them itself)."""
    with sqlite3.connect(server.data_dir / "registry.db") as connection:
        return connection.execute(
            "SELECT number, state, result_model_id, deadline_at, finished_at FROM fl_rounds ORDER BY id").fetchall()


def test_a_round_past_its_deadline_seats_no_device_before_the_deadline_check_moves_it_on(federation, tmp_path,
                                                                                           monkeypatch):
    # device requests move overdue rounds on at most once per interval: the seat's own write checks the deadline
    monkeypatch.setattr(rounds, "DEVICE_ADVANCE_INTERVAL_S", 3600.0)
    with LoopbackServer(tmp_path / "server", deadline_check_s=3600) as server, \
            ready_simulation(federation, server.url, tmp_path / "devices") as simulation:
        round_id = simulation.start_plan(_config(min_clients=2, target_clients=3, deadline_s=1.5))
        seated = _device(simulation, 0).fl_task("digits")["task"]
        assert seated["round_id"] == round_id
        deadline = datetime.fromisoformat(seated["deadline_at"])
        time.sleep(max(0.0, (deadline - datetime.now(timezone.utc)).total_seconds()) + 0.2)
        late = _device(simulation, 1).fl_task("digits")
        assert late["task"] is None
        assert _round_rows(server)[0][1] == "open"  # no deadline check ran: the seat's write refused the device
        view = simulation.admin.fl_round(round_id)  # an operator's read moves the round on at once
        assert view["state"] == "failed" and "only 0 of the minimum 2" in view["outcome"]["failure"]


@pytest.mark.slow
def test_the_background_check_finishes_overdue_rounds_with_no_traffic(simulation, federation, server):
    # a deadline long enough for two uploads on a loaded machine (the test waits for it, twice)
    simulation.start_plan(_config(min_clients=2, target_clients=3, deadline_s=5, num_rounds=2))
    devices = [_device(simulation, index) for index in range(2)]
    tasks = [device.fl_task("digits")["task"] for device in devices]
    for device, task in zip(devices, tasks):
        _upload(device, task, _honest_delta(federation))
    # no request from here on: round 1 (2 of 3 seats, the minimum) must close at its deadline, round 2 open
    # at once and, with no updates, fail at its own deadline
    waited = time.monotonic()
    while [row[1] for row in _round_rows(server)] != ["closed", "failed"] and time.monotonic() - waited < 30:
        time.sleep(0.2)
    (first, second) = _round_rows(server)
    assert first[:2] == (1, "closed") and first[2] is not None
    assert second[:3] == (2, "failed", None)
    # each closed because its deadline passed (round 1 never reached its target of 3), not before it
    assert all(finished >= deadline for *_, deadline, finished in (first, second))


@pytest.mark.slow
def test_a_restart_mid_round_keeps_every_accepted_update(simulation, federation, server):
    round_id = simulation.start_plan(_config(min_clients=3, target_clients=3))
    devices = [_device(simulation, index) for index in range(3)]
    tasks = [device.fl_task("digits")["task"] for device in devices]
    data = [federation.client_data(index) for index in range(3)]
    for index in range(2):
        assert run_task(devices[index], tasks[index], data[index]).outcome == "accepted"
    server.restart()
    view = simulation.admin.fl_round(round_id)
    assert (view["state"], view["accepted_updates"], view["selected_devices"]) == ("collecting", 2, 3)
    with pytest.raises(ConflictError) as duplicate:
        _upload(devices[0], tasks[0], _honest_delta(federation))
    assert duplicate.value.code == "duplicate_update"
    assert run_task(devices[2], tasks[2], data[2]).outcome == "accepted"
    view = simulation.admin.fl_round(round_id)
    assert view["state"] == "closed" and view["outcome"]["accepted_updates"] == 3
    assert simulation.admin.card(view["result_model_id"]).version == 2


def test_concurrent_uploads_every_accepted_update_is_aggregated(simulation, federation):
    round_id = simulation.start_plan(_config(min_clients=2, target_clients=2, over_selection=1.0))
    devices = [_device(simulation, index) for index in range(4)]
    tasks = [device.fl_task("digits")["task"] for device in devices]
    outcomes = [None] * 4

    def upload(index):
        try:
            outcomes[index] = _upload(devices[index], tasks[index], _honest_delta(federation))["device_id"]
        except ConflictError as error:
            outcomes[index] = error.code

    threads = [threading.Thread(target=upload, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    accepted = [outcome for outcome in outcomes if outcome != "round_not_accepting"]
    assert len(accepted) >= 2 and set(outcomes) <= {*accepted, "round_not_accepting"}
    view = simulation.admin.fl_round(round_id)
    assert view["state"] == "closed" and view["outcome"]["accepted_updates"] == view["accepted_updates"] == len(accepted)


def test_openapi_documents_the_federated_routes(simulation):
    paths = simulation.admin.http.get_json("/v1/openapi.json")["paths"]
    assert {"/v1/fl/task", "/v1/fl/rounds", "/v1/fl/rounds/{round_id}", "/v1/fl/rounds/{round_id}/updates"} <= set(paths)
    upload = paths["/v1/fl/rounds/{round_id}/updates"]["post"]
    multipart = upload["requestBody"]["content"]["multipart/form-data"]
    assert multipart["encoding"]["metadata"] == {"contentType": "application/json"}
    assert multipart["schema"]["$ref"].endswith("/UpdateUpload")
    assert {"409", "413", "422"} <= set(upload["responses"])


def test_the_metadata_part_may_come_as_an_application_json_file_part(simulation, federation):
    simulation.start_plan(_config())
    device = _device(simulation, 0)
    task = device.fl_task("digits")["task"]
    metadata = json.dumps({"base_version": task["base_version"], "num_examples": 10, "metrics": {}})
    delta = encode_update(_honest_delta(federation), "fp32")
    url = f"{simulation.server_url}{task['upload']['url']}"
    headers = {"Authorization": f"Bearer {simulation.tokens[0]}"}
    files = {"metadata": ("metadata.json", metadata, "application/json"), "delta": ("delta.npz", delta)}
    answer = httpx.post(url, files=files, headers=headers)
    assert answer.status_code == 201 and answer.json()["accepted_updates"] == 1
    refused = httpx.post(url, files={"delta": ("delta.npz", delta)}, headers=headers)
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "delta"


def test_an_evaluation_set_that_does_not_fit_the_model_is_refused(simulation, federation):
    import io

    buffer = io.BytesIO()
    np.savez(buffer, x=np.zeros((4, 1, 5, 5), np.float32), y=np.zeros(4, np.int64))
    digest = simulation.admin.publish_blob(buffer.getvalue(), ADMIN)
    with pytest.raises(BadRequestError, match="the model needs x") as error:
        simulation.admin.create_rounds({"model_id": federation.card.id, "evaluation_sha256": digest, **_config()}, ADMIN)
    assert error.value.field == "evaluation_sha256"
    not_npz = simulation.admin.publish_blob(b"plain bytes", ADMIN)
    with pytest.raises(BadRequestError, match="not an .npz"):
        simulation.admin.create_rounds({"model_id": federation.card.id, "evaluation_sha256": not_npz, **_config()}, ADMIN)


def test_concurrent_check_ins_seat_exactly_the_selection_goal(server, tmp_path):
    """Check-ins racing for the last seats: the round seats target x (1 + over_selection) devices, not one more
    (an extra seat would train and upload only to be refused)."""
    crowd = prepare_federation("digits", num_clients=12, alpha=None, hidden_units=8, pretrain_epochs=1, seed=1)
    with Simulation(crowd, server.url, cache_root=tmp_path / "crowd", http_threads=4) as simulation:
        simulation.publish_base_model()
        simulation.register_devices()
        for attempt in range(3):  # a plan per attempt: each round is raced for afresh
            round_id = simulation.start_plan(_config(target_clients=3, min_clients=1, over_selection=0.0,
                                                     deadline_s=60))
            devices = [_device(simulation, index) for index in range(12)]
            start = threading.Barrier(len(devices))
            tasks = [None] * len(devices)

            def check_in(index):
                start.wait()
                tasks[index] = devices[index].fl_task("digits")["task"]

            threads = [threading.Thread(target=check_in, args=(index,)) for index in range(len(devices))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            seated = [task for task in tasks if task is not None and task["round_id"] == round_id]
            view = simulation.admin.fl_round(round_id)
            assert (len(seated), view["selected_devices"], view["state"]) == (3, 3, "collecting"), attempt
            for device in devices:
                device.close()
