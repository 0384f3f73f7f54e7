"""Capability-aware selection: a device declares at check-in what it can do, a private plan selects only devices
that declared what it needs, and a device handed a task it cannot do declines it, which the round records."""

import httpx
import pytest

from fedzoo.capabilities import PYTHON_SDK, SECURE_AGGREGATION_VERSION, Capabilities
from fedzoo.clients import secure_participation
from fedzoo.clients.errors import BadRequestError, PermissionDeniedError
from fedzoo.clients.participation import participate_once
from fedzoo.cloud.simulation import prepare_federation
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN, LoopbackServer
from fl_helpers import device_client, ready_simulation, round_config

DEVICES = 4
NOTHING_DECLARED = Capabilities()
SECURE = {"secure_aggregation": {"neighbour_count": 2, "threshold": 2, "clip_range": 0.05, "stage_deadline_s": 2}}
DP = {"dp": {"max_epsilon": 1000.0, "clip_norm": 1.0, "noise_multiplier": 1.0}}
ADAPTIVE_SECURE = {**SECURE, "dp": {**DP["dp"], "adaptive": {}}}


@pytest.fixture(scope="module")
def federation():
    return prepare_federation("digits", num_clients=DEVICES, alpha=None, hidden_units=8, pretrain_epochs=1, seed=0)


@pytest.fixture
def simulation(federation, tmp_path):
    """A server on loopback with the base model published and the devices registered."""
    with (LoopbackServer(tmp_path / "server", deadline_check_s=0.2) as server,
          ready_simulation(federation, server.url, tmp_path / "devices") as ready):
        yield ready


def private_round(simulation, privacy, target_clients=3):
    return simulation.start_plan(round_config(min_clients=target_clients, target_clients=target_clients,
                                              max_accuracy_drop=1.0, poll_interval_s=0.05, privacy=privacy))


@pytest.mark.parametrize("privacy, needed", [(SECURE, f"secure aggregation version {SECURE_AGGREGATION_VERSION}"),
                                             (DP, "DP clipping"),
                                             (ADAPTIVE_SECURE, "the unclipped bit in the masked vector")])
def test_a_private_plan_selects_only_devices_that_declared_what_it_needs(simulation, federation, privacy, needed):
    round_id = private_round(simulation, privacy)
    task = federation.card.task
    plain = device_client(simulation, 0).fl_task(task, capabilities=NOTHING_DECLARED)
    assert plain["task"] is None and needed in plain["reason"] and f"round {round_id}" in plain["reason"]
    assert plain["retry_after_s"] > 0
    half = Capabilities(secure_aggregation=SECURE_AGGREGATION_VERSION if "dp" in privacy else None,
                        dp_clipping="secure_aggregation" in privacy)
    assert device_client(simulation, 1).fl_task(task, capabilities=half)["task"] is None
    capable = device_client(simulation, 2).fl_task(task, capabilities=PYTHON_SDK)["task"]
    assert capable is not None and capable["round_id"] == round_id
    # the operator's participant list (a DP round's read withholds its counts: docs/privacy.md)
    assert len(simulation.admin.http.get_json(f"/v1/fl/rounds/{round_id}/participants")["participants"]) == 1


def test_a_plain_round_selects_devices_that_declare_nothing_but_not_one_without_a_shared_encoding(simulation, federation):
    round_id = simulation.start_plan(round_config())
    task = federation.card.task
    assert device_client(simulation, 0).fl_task(task, capabilities=NOTHING_DECLARED)["task"]["round_id"] == round_id
    future = device_client(simulation, 1).fl_task(task, capabilities=Capabilities(encodings=("fp16",)))
    assert future["task"] is None and "an update encoding of ['fp32', 'int8']" in future["reason"]
    int8_only = Capabilities(encodings=("int8",))
    assert device_client(simulation, 2).fl_task(task, capabilities=int8_only)["task"]["round_id"] == round_id


@pytest.mark.parametrize("query, field", [({"encodings": "fp32,,int8"}, "encodings"),
                                          ({"encodings": "FP32"}, "encodings"),
                                          ({"secure_aggregation": "one"}, "secure_aggregation"),
                                          ({"dp_clipping": "perhaps"}, "dp_clipping"),
                                          ({"unclipped_bit": "perhaps"}, "unclipped_bit")])
def test_a_malformed_capability_is_refused_naming_its_field(simulation, federation, query, field):
    answer = httpx.get(f"{simulation.server_url}/v1/fl/task", params={"task": federation.card.task, **query},
                       headers={"Authorization": f"Bearer {simulation.tokens[0]}"})
    assert answer.status_code == 422
    assert answer.json()["error"]["field"].endswith(field)


def test_a_selected_device_declines_with_a_reason_the_round_records_and_is_not_offered_the_task_again(
        simulation, federation):
    round_id = simulation.start_plan(round_config(target_clients=3, min_clients=2))
    task = federation.card.task
    device = device_client(simulation, 0)
    assert device.fl_task(task)["task"]["round_id"] == round_id
    url = f"{simulation.server_url}/v1/fl/rounds/{round_id}/decline"
    assert httpx.post(url, json={"reason": "unsupported_dp_clipping"}).status_code == 401
    assert httpx.post(url, json={"reason": "x"}, headers={"Authorization": "Bearer not-a-token"}).status_code == 401
    with pytest.raises(BadRequestError) as malformed:
        device.decline_task(round_id, "Not A Reason!")
    assert malformed.value.field == "reason"
    with pytest.raises(PermissionDeniedError) as stranger:
        device_client(simulation, 1).decline_task(round_id, "unsupported_dp_clipping")
    assert stranger.value.code == "not_selected"

    receipt = device.decline_task(round_id, "unsupported_dp_clipping", "this app build does not clip")
    assert receipt == {"round_id": round_id, "reason": "unsupported_dp_clipping"}
    device.decline_task(round_id, "unsupported_dp_clipping")  # a repeat is recorded once
    assert simulation.admin.fl_round(round_id)["declined_devices"] == 1
    assert device.fl_task(task)["task"] is None
    participants = httpx.get(f"{simulation.server_url}/v1/fl/rounds/{round_id}/participants",
                             headers={"Authorization": f"Bearer {DEFAULT_ADMIN_TOKEN}"}).json()["participants"]
    declined = [entry for entry in participants if entry["status"] == "declined"]
    assert len(declined) == 1 and declined[0]["reason"] == "unsupported_dp_clipping: this app build does not clip"


def test_a_device_handed_a_secure_round_of_another_protocol_version_declines_it(simulation, federation, monkeypatch):
    round_id = private_round(simulation, SECURE)
    # this device's SDK speaks a newer protocol than it declared: it was selected by mistake
    monkeypatch.setattr(secure_participation, "SECURE_AGGREGATION_VERSION", SECURE_AGGREGATION_VERSION + 1)
    result = participate_once(device_client(simulation, 0), federation.card.task, federation.client_data(0))
    assert result.round_id == round_id and result.outcome == "refused: unsupported_secure_aggregation"
    assert simulation.admin.fl_round(round_id)["declined_devices"] == 1
