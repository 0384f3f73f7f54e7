"""SecAgg+ and DP-FedAvg rounds over REST, against a real server on loopback with real devices' keys."""

import threading
import time

import httpx
import numpy as np
import pytest

from fedzoo.clients.participation import LocalData, participate_once
from fedzoo.clients.secure_participation import answer_stage
from fedzoo.cloud.simulation import DEFAULT_ADMIN_TOKEN, LoopbackServer, Simulation, prepare_federation
from fedzoo.edge.onnx_initializers import read_float_initializers
from fedzoo.secagg import SecAggClient, SecAggConfig, dequantise_sum, flatten, quantise, unflatten
from fedzoo.secagg.crypto import MASK_DTYPES
from fedzoo.server.fl import secure_rounds
from fl_helpers import device_client, round_config

ADMIN = DEFAULT_ADMIN_TOKEN
DEVICES = 6
POLL_S = 0.05


@pytest.fixture(scope="module")
def federation():
    return prepare_federation("digits", num_clients=DEVICES, alpha=None, hidden_units=8, pretrain_epochs=1, seed=0)


@pytest.fixture
def server(tmp_path):
    with LoopbackServer(tmp_path / "server", deadline_check_s=0.2) as running:
        yield running


@pytest.fixture
def simulation(federation, server, tmp_path):
    with Simulation(federation, server.url, cache_root=tmp_path / "devices") as sim:
        sim.publish_base_model()
        sim.register_devices()
        yield sim


def secure_config(**overrides):
    privacy = overrides.pop("privacy", {"secure_aggregation": {"neighbour_count": 4, "threshold": 3,
                                                               "clip_range": 0.05, "stage_deadline_s": 3}})
    settings = {"min_clients": 3, "target_clients": DEVICES, "deadline_s": 60, "poll_interval_s": POLL_S,
                "max_accuracy_drop": 1.0, "privacy": privacy}
    return round_config(**{**settings, **overrides})


class ScriptedDevice(threading.Thread):
    """A device that answers the SecAgg+ stages with a known delta (so the test knows its exact ring input),
    and can stop before a stage (a dropout) or alter a reply (a misbehaving device)."""

    def __init__(self, client, task, delta, seed, stop_before=None, tamper=None):
        super().__init__(daemon=True)
        self.client, self.task, self.delta, self.seed = client, task, delta, seed
        self.stop_before, self.tamper = stop_before, tamper
        self.answered, self.ring_input, self.error, self.number = [], None, None, None

    def run(self):
        try:
            self._run()
        except Exception as error:  # reported by the test
            self.error = error

    def _run(self):
        protocol = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            work = self.client.fl_task(self.task)["task"]
            if work is None:
                return
            secure = work["privacy"]["secure_aggregation"]
            if secure["request"] is not None:
                stage = secure["stage"]
                if stage == self.stop_before:
                    return
                if protocol is None:
                    config = SecAggConfig.from_dict(secure["config"])
                    protocol, self.number = SecAggClient(config, secure["client"]), secure["client"]
                    self.ring_input = quantise(flatten(self.delta), config, 1.0, np.random.default_rng(self.seed))
                reply = answer_stage(protocol, stage, secure["request"], self.ring_input)
                if self.tamper is not None:
                    reply = self.tamper(stage, reply)
                self.client.secure_reply(secure["reply_url"], reply)
                self.answered.append(stage)
                if stage == "unmask":
                    return
            time.sleep(POLL_S)


def scripted_devices(simulation, federation, per_device):
    parameters = read_float_initializers(federation.model)
    rng = np.random.default_rng(7)
    devices = []
    for index in range(DEVICES):
        delta = {name: rng.normal(0, 0.01, value.shape).astype(np.float32) for name, value in parameters.items()}
        devices.append(ScriptedDevice(device_client(simulation, index), federation.card.task, delta, seed=index,
                                      **per_device.get(index, {})))
    return devices


def wait_for_end(simulation, round_id, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    view = simulation.admin.fl_round(round_id)
    while view["state"] in ("open", "collecting", "aggregating") and time.monotonic() < deadline:
        time.sleep(0.1)
        view = simulation.admin.fl_round(round_id)
    return view


def run_scripted_round(simulation, federation, config, per_device=None):
    round_id = simulation.start_plan(config)
    devices = scripted_devices(simulation, federation, per_device or {})
    for device in devices:
        device.start()
    for device in devices:
        device.join(timeout=90)
    assert [device.error for device in devices] == [None] * DEVICES
    return round_id, devices, wait_for_end(simulation, round_id)


def expected_parameters(federation, view, survivors):
    """The FedAvg result computed here from the survivors' exact ring inputs (what the server must publish)."""
    secure = view["outcome"]["secure_aggregation"]
    parameters = read_float_initializers(federation.model)
    config = SecAggConfig("check", secure["num_clients"], secure["neighbour_count"], secure["threshold"],
                          sum(value.size for value in parameters.values()), secure["clip_range"], secure["levels"])
    ring_sum = sum((device.ring_input.astype(np.int64) for device in survivors), np.zeros(config.vector_length + 1,
                                                                                          dtype=np.int64))
    total, weight = dequantise_sum((ring_sum % 2**config.modulus_bits).astype(MASK_DTYPES[config.modulus_bits]),
                                   config)
    mean = unflatten(total / weight, {name: value.shape for name, value in parameters.items()})
    return {name: parameters[name] + mean[name] for name in parameters}


def published_parameters(simulation, view):
    card = simulation.admin.card(view["result_model_id"])
    return card, read_float_initializers(simulation.admin.download_model(card).read_bytes())


def test_a_device_dropping_after_key_sharing_leaves_the_exact_sum_of_the_others(simulation, federation):
    round_id, devices, view = run_scripted_round(simulation, federation, secure_config(),
                                                 {2: {"stop_before": "masked_input"}})
    assert view["state"] == "closed", view["outcome"]
    secure = view["outcome"]["secure_aggregation"]
    assert (secure["survivors"], secure["dropped"], secure["misbehaving"]) == (DEVICES - 1, 1, {})
    assert devices[2].answered == ["advertise_keys", "share_keys"]
    survivors = [device for index, device in enumerate(devices) if index != 2]
    assert all(device.answered[-1] == "unmask" for device in survivors)
    card, published = published_parameters(simulation, view)
    expected = expected_parameters(federation, view, survivors)
    for name, value in expected.items():
        np.testing.assert_allclose(published[name], value, rtol=0, atol=1e-6)
    # and it is not the sum with the dropped device in it
    with_dropped = expected_parameters(federation, view, devices)
    assert any(not np.allclose(published[name], with_dropped[name], atol=1e-6) for name in published)
    assert card.details["federated"]["privacy"] == {"secure_aggregation": True, "dp": None}


def test_a_device_returning_bad_shares_is_named_and_the_sum_is_still_exact(simulation, federation):
    def corrupt(stage, reply):
        if stage == "unmask":
            for share in reply["shares"]:
                share["value"] = share["value"][:-4] + ("AAA=" if share["value"][-4:] != "AAA=" else "AQA=")
        return reply

    _, devices, view = run_scripted_round(simulation, federation, secure_config(), {4: {"tamper": corrupt}})
    assert view["state"] == "closed", view["outcome"]
    misbehaving = view["outcome"]["secure_aggregation"]["misbehaving"]
    assert list(misbehaving) == [str(devices[4].number)] and "commitment" in misbehaving[str(devices[4].number)]
    _, published = published_parameters(simulation, view)
    expected = expected_parameters(federation, view, devices)
    for name, value in expected.items():
        np.testing.assert_allclose(published[name], value, rtol=0, atol=1e-6)


def sdk_round(simulation, federation, config):
    """Every device runs the SDK's own participation (train, clip, quantise, the four stages), concurrently."""
    round_id = simulation.start_plan(config)
    results = [None] * DEVICES

    def device(index):
        shard = federation.shards[index]
        data = LocalData(federation.pool.x[shard], federation.pool.y[shard])
        results[index] = participate_once(device_client(simulation, index), federation.card.task, data, seed=index)

    threads = [threading.Thread(target=device, args=(index,), daemon=True) for index in range(DEVICES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return round_id, results, wait_for_end(simulation, round_id)


def test_sdk_devices_run_a_secure_round_that_publishes(simulation, federation):
    _, results, view = sdk_round(simulation, federation, secure_config())
    assert [result.outcome for result in results] == ["accepted"] * DEVICES
    assert view["state"] == "closed", view["outcome"]
    assert view["outcome"]["secure_aggregation"]["survivors"] == DEVICES
    # what each device sent: the masked vector at 2 bytes a value, plus keys and shares
    vector_bytes = (sum(v.size for v in read_float_initializers(federation.model).values()) + 1) * 2
    assert all(vector_bytes < result.upload_bytes < vector_bytes + 3000 for result in results)


def test_devices_refuse_a_server_that_lists_a_client_as_both_survived_and_dropped(simulation, federation,
                                                                                   monkeypatch):
    class LyingServer(secure_rounds.SecAggServer):
        def collect_masked_inputs(self, replies):
            requests = super().collect_masked_inputs(replies)
            for request in requests.values():  # claim the first survivor dropped too: both its secrets
                request["dropped"] = sorted({*request["dropped"], request["survivors"][0]})
            return requests

    monkeypatch.setattr(secure_rounds, "SecAggServer", LyingServer)
    _, results, view = sdk_round(simulation, federation, secure_config(deadline_s=15))
    assert [result.outcome for result in results] == ["refused: overlapping_lists"] * DEVICES
    assert view["state"] == "failed" and "cannot be recovered" in view["outcome"]["failure"]
    assert view["result_model_id"] is None


def test_plans_with_rules_that_need_every_update_are_refused_under_privacy(simulation):
    with httpx.Client(base_url=simulation.server_url, headers={"Authorization": f"Bearer {ADMIN}"}) as admin:
        base = {"model_id": simulation.federation.card.id, "evaluation_sha256": simulation.evaluation_sha256}
        for strategy in ({"name": "median"}, {"name": "trimmed_mean", "trim_fraction": 0.2}, {"name": "krum"}):
            for privacy in ({"secure_aggregation": {}}, {"dp": {"max_epsilon": 8, "clip_norm": 0.5}}):
                answer = admin.post("/v1/fl/rounds", json={**base, **secure_config(strategy=strategy, privacy=privacy)})
                assert answer.status_code == 422, answer.text
                assert answer.json()["error"]["field"] == "strategy.name"
        bad = [({"secure_aggregation": {"neighbour_count": 5}}, "privacy.secure_aggregation"),
               ({"secure_aggregation": {"neighbour_count": 4, "threshold": 2}}, "privacy.secure_aggregation"),
               ({"secure_aggregation": {"levels": 0}}, "privacy.secure_aggregation.levels"),
               ({"dp": {"max_epsilon": -1, "clip_norm": 0.5}}, "privacy.dp.max_epsilon"),
               ({"dp": {"max_epsilon": 8}}, "privacy.dp.clip_norm"),
               ({"dp": {"max_epsilon": 0.01, "clip_norm": 0.5, "noise_multiplier": 0.1}}, "privacy.dp.max_epsilon"),
               ({"secure_aggregation": {}, "extra": 1}, "privacy.extra")]
        for privacy, field in bad:
            answer = admin.post("/v1/fl/rounds", json={**base, **secure_config(privacy=privacy)})
            assert answer.status_code == 422, (privacy, answer.text)
            assert answer.json()["error"]["field"] == field, (privacy, answer.json())
        small = admin.post("/v1/fl/rounds", json={**base, **secure_config(target_clients=2, min_clients=2)})
        assert small.status_code == 422 and small.json()["error"]["field"] == "privacy.secure_aggregation"
