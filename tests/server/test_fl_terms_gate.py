"""The server's own check of a plan against the operator's newest privacy terms (`fedzoo.server.fl.terms_gate`): a
plan every default device would refuse on a covered line is refused when it is made (422 `breaks_privacy_terms`
naming the field, the terms' version, the line and its floor; no round is created), one on a line the terms do not
cover is accepted, and a plan made before the terms arrived opens no further round. The devices' own refusals
(tests/server/test_fl_privacy_terms.py) stay the defence against a server that skips this check."""

import hashlib

import httpx
import numpy as np
import pytest

from fedzoo.cloud.simulation import prepare_federation
from fedzoo.edge.onnx_initializers import read_float_initializers
from fedzoo.edge.trainer import write_parameters
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN as ADMIN
from fl_helpers import device_client, honest_delta, round_config, selected_tasks, upload
from test_fl_distributed_dp import DEVICES, distributed_config
from test_fl_privacy_terms import FLOOR, covering, publish


@pytest.fixture(scope="module")
def federation():
    return prepare_federation("digits", num_clients=DEVICES, alpha=None, hidden_units=8, pretrain_epochs=1, seed=0)


def create_plan(simulation, config: dict, token: str | None = ADMIN) -> httpx.Response:
    body = {"model_id": simulation.federation.card.id, "evaluation_sha256": simulation.evaluation_sha256, **config}
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.post(f"{simulation.server_url}/v1/fl/rounds", json=body, headers=headers)


def assert_breaks_terms(simulation, answer: httpx.Response, field: str, reason: str, version: int = 1,
                        line: str | None = None) -> None:
    """422 `breaks_privacy_terms` naming `field`, the terms' version, the line and its floor; and no round was made:
    a device checking in finds no work."""
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["field"], error["reason"]) == ("breaks_privacy_terms", field, reason)
    assert (error["terms_version"], error["minimum_noise_multiplier"]) == (version, FLOOR)
    assert error["line"] == (line or simulation.federation.card.line_id)
    assert f"version {version}" in error["message"]
    with device_client(simulation, 0) as client:
        assert client.fl_task(simulation.federation.card.task)["task"] is None


def test_a_plan_below_the_terms_floor_is_refused_naming_the_field_and_nothing_is_created(simulation):
    """z = 0.5 below the floor 1.0; so is the z the server calibrates from max_epsilon when the plan names none (the
    devices would be asked for that); without the admin token the plan is refused first (401), as before."""
    publish(simulation, covering(simulation))
    assert_breaks_terms(simulation, create_plan(simulation, distributed_config(noise_multiplier=0.5)),
                        "privacy.dp.noise_multiplier", "noise_below_floor")
    calibrated = distributed_config(noise_multiplier=None)
    calibrated["privacy"]["dp"]["max_epsilon"] = 20  # z about 0.31 for one round
    assert_breaks_terms(simulation, create_plan(simulation, calibrated), "privacy.dp.noise_multiplier",
                        "noise_below_floor")
    assert create_plan(simulation, distributed_config(noise_multiplier=0.5), token=None).status_code == 401


def test_a_plan_without_distributed_dp_on_a_covered_line_is_refused_naming_what_is_missing(simulation):
    """Terms for every line ("*", version 2 after a version naming another line): no DP, central noise under
    SecAgg+ (the server would see the noiseless sum), DP without SecAgg+: each 422 naming the field to change."""
    publish(simulation, covering(simulation, line="another-line"))
    publish(simulation, covering(simulation, version=2, line="*"))
    no_dp = distributed_config()
    del no_dp["privacy"]["dp"]
    no_secure_aggregation = distributed_config(noise="central", secure=False)
    for config, field in ((no_dp, "privacy.dp"), (distributed_config(noise="central"), "privacy.dp.noise"),
                          (no_secure_aggregation, "privacy.secure_aggregation"), (round_config(), "privacy.dp")):
        assert_breaks_terms(simulation, create_plan(simulation, config), field, "noise_not_distributed", version=2)


def test_a_plan_on_a_line_the_terms_do_not_cover_or_meeting_them_is_accepted(simulation):
    """Terms naming another line leave this one free (a plain plan opens); terms on this line take a plan at z = 1.5
    under SecAgg+ with distributed DP (above the floor 1.0)."""
    publish(simulation, covering(simulation, line="another-line"))
    plain = create_plan(simulation, round_config(num_rounds=1))
    assert plain.status_code == 201, plain.text
    with device_client(simulation, 0) as client:
        assert client.fl_task(simulation.federation.card.task)["task"]["round_id"] == plain.json()["id"]
    publish(simulation, covering(simulation, version=2))
    meeting = create_plan(simulation, distributed_config())
    assert meeting.status_code == 201, meeting.text


def test_terms_uploaded_after_the_plan_was_made_stop_it_before_its_next_round(simulation):
    """A plain plan of 2 rounds made before any terms; the operator's terms then cover its line. Round 1 runs and
    publishes (nothing it stored is lost); round 2 does not open, and round 1 records why: the terms' version and
    the field."""
    answer = create_plan(simulation, round_config(num_rounds=2))
    assert answer.status_code == 201, answer.text
    publish(simulation, covering(simulation))
    clients, tasks = selected_tasks(simulation, 3, simulation.federation.card.task)
    for client, task in zip(clients, tasks):
        model = client.download(task["model_url"], task["model_sha256"]).read_bytes()
        upload(client, task, honest_delta(model))
        client.close()
    view = simulation.admin.wait_for_round(answer.json()["id"], timeout_s=60)
    assert view["state"] == "closed", view["outcome"]
    assert simulation.admin.card(view["result_model_id"]).version == 2
    assert view["next_round_id"] is None
    stopped = view["outcome"]["plan_stopped"]
    assert "privacy terms (version 1)" in stopped and "noise_not_distributed" in stopped, stopped
    with device_client(simulation, 0) as client:
        assert client.fl_task(simulation.federation.card.task)["task"] is None



def test_a_plan_on_weights_of_a_covered_dp_line_is_checked_against_that_lines_terms(simulation):
    """A DP round on the base line publishes weights; a child card of its own line (as a pruned or fine-tuned child
    is) continues that line's ledger. Terms naming only the base line: a central-noise plan on the child, which its
    devices (checking the child's own line) would take, is refused naming the ledger line it charges."""
    central = {"max_epsilon": 50, "delta": 1e-5, "clip_norm": 0.5, "noise_multiplier": 1.5}
    answer = create_plan(simulation, round_config(min_clients=3, target_clients=3, privacy={"dp": central}))
    assert answer.status_code == 201, answer.text
    clients, tasks = selected_tasks(simulation, 3, simulation.federation.card.task)
    for client, task in zip(clients, tasks):
        upload(client, task, honest_delta(client.download(task["model_url"], task["model_sha256"]).read_bytes()))
        client.close()
    view = simulation.admin.wait_for_round(answer.json()["id"], timeout_s=60)
    assert view["state"] == "closed", view["outcome"]
    first = simulation.admin.card(view["result_model_id"])
    onnx_bytes = simulation.admin.download(f"/v1/models/{first.id}/blob", first.sha256).read_bytes()
    child_bytes = write_parameters(onnx_bytes, {name: value * np.float32(0.99)
                                                for name, value in read_float_initializers(onnx_bytes).items()})
    child = first.model_copy(update={"id": "child-weights", "version": 1, "parent_id": first.id, "line": None,
                                     "details": {}, "signature": None, "size_bytes": len(child_bytes),
                                     "sha256": hashlib.sha256(child_bytes).hexdigest()})
    simulation.admin.publish_model(child, {child.sha256: child_bytes}, ADMIN)
    publish(simulation, covering(simulation))
    refused = create_plan(simulation, round_config(model_id=child.id, min_clients=3, target_clients=3,
                                                   privacy={"dp": central}))
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["field"], error["line"]) == ("breaks_privacy_terms", "privacy.secure_aggregation",
                                                              simulation.federation.card.line_id)
