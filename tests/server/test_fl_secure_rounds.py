"""SecAgg+ and DP-FedAvg rounds over REST, against a real server on loopback with real devices' keys."""

import base64
import io
import json
import os
import threading
import time
from datetime import datetime, timedelta, timezone

import httpx
import numpy as np
import pytest

from fedzoo.aggregation.private import with_unclipped_bit
from fedzoo.clients.participation import LocalData, participate_once
from fedzoo.clients.secure_participation import answer_stage
from fedzoo.cloud.simulation import prepare_federation
from fedzoo.edge.onnx_initializers import read_float_initializers
from fedzoo.errors import InvalidInputError
from fedzoo.secagg import SecAggClient, SecAggConfig, dequantise_sum, flatten, quantise, signatures, unflatten
from fedzoo.secagg.crypto import MASK_DTYPES
from fedzoo.secagg.errors import RoundAborted
from fedzoo.secagg.framing import decode_unmask
from fedzoo.server.db import Database
from fedzoo.server.fl import secure_rounds
from fedzoo.server.fl.outcome import RoundOutcome, ScreeningTally, UpdateCounts
from fedzoo.server.fl.root_trust import train_root_update
from fedzoo.server.fl.schemas import RoundConfig, TrainingConfig
from fedzoo.server.fl.tables import FLRound
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN, LoopbackServer
from fl_helpers import device_client, ready_simulation, round_config
from server_helpers import fresh_postgres_database
from sqlalchemy import create_engine, text

ADMIN = DEFAULT_ADMIN_TOKEN
VIEWER = "secure-rounds-viewer-token-0123456789"
DEVICES = 8  # k = 6, t = 5: the devices' floor against 2 corrupt devices leaves room for one dropout
POLL_S = 0.05
POSTGRES_URL = os.environ.get("FEDZOO_TEST_POSTGRES_URL")


@pytest.fixture(scope="module")
def federation():
    return prepare_federation("digits", num_clients=DEVICES, alpha=None, hidden_units=8, pretrain_epochs=1, seed=0)


@pytest.fixture
def server(tmp_path):
    with LoopbackServer(tmp_path / "server", deadline_check_s=0.2, viewer_token=VIEWER) as running:
        yield running


def secure_config(**overrides):
    privacy = overrides.pop("privacy", {"secure_aggregation": {"neighbour_count": 6, "clip_range": 0.05,
                                                               "stage_deadline_s": 3}})
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
        self.answered, self.ring_input, self.error, self.number, self.config = [], None, None, None, None

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
                    protocol = SecAggClient(config, secure["client"], self.client.signing_key)
                    self.number, self.config = secure["client"], config
                    vector = flatten(self.delta)
                    if work["privacy"]["unclipped_bit"]:  # adaptive clipping: "within the bound" (the delta is small)
                        vector = with_unclipped_bit(vector, True, config.clip_range)
                    self.ring_input = quantise(vector, config, 1.0, np.random.default_rng(self.seed))
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


def run_scripted_round(simulation, federation, config, per_device=None):
    round_id = simulation.start_plan(config)
    devices = scripted_devices(simulation, federation, per_device or {})
    for device in devices:
        device.start()
    for device in devices:
        device.join(timeout=90)
    assert [device.error for device in devices] == [None] * DEVICES
    return round_id, devices, simulation.admin.wait_for_round(round_id, timeout_s=60)


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
    # min_clients 7: the 7 left are exactly the cohort's least number of survivors, and a stage closes at it
    round_id, devices, view = run_scripted_round(simulation, federation, secure_config(min_clients=DEVICES - 1),
                                                 {2: {"stop_before": "masked_input"}})
    assert view["state"] == "closed", view["outcome"]
    assert {device.config.minimum_survivors for device in devices} == {DEVICES - 1}  # the devices' floor: min_clients
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
        if stage != "unmask":
            return reply
        unmask = decode_unmask(reply)
        for share in unmask["shares"]:  # one bit off: still a field element, but not the committed share
            value = bytearray(base64.b64decode(share["value"]))
            value[-1] ^= 1
            share["value"] = base64.b64encode(bytes(value)).decode()
        return unmask  # sent as JSON: the server takes either form

    _, devices, view = run_scripted_round(simulation, federation, secure_config(), {4: {"tamper": corrupt}})
    assert view["state"] == "closed", view["outcome"]
    misbehaving = view["outcome"]["secure_aggregation"]["misbehaving"]
    assert list(misbehaving) == [str(devices[4].number)] and "commitment" in misbehaving[str(devices[4].number)]
    _, published = published_parameters(simulation, view)
    expected = expected_parameters(federation, view, devices)
    for name, value in expected.items():
        np.testing.assert_allclose(published[name], value, rtol=0, atol=1e-6)


def sdk_round(simulation, federation, config):
    """Every device runs the SDK's own participation (train, clip, quantise, the five stages), concurrently."""
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
    return round_id, results, simulation.admin.wait_for_round(round_id, timeout_s=60)


def test_sdk_devices_run_a_secure_round_that_publishes(simulation, federation):
    _, results, view = sdk_round(simulation, federation, secure_config())
    assert [result.outcome for result in results] == ["accepted"] * DEVICES
    assert view["state"] == "closed", view["outcome"]
    assert view["outcome"]["secure_aggregation"]["survivors"] == DEVICES
    # the count the unmasked sum holds, for each of the outcome's counts (no update was screened out: the server
    # sees none of them)
    outcome = view["outcome"]
    assert (outcome["accepted_updates"], outcome["aggregated_updates"], outcome["screening"]["counted"]) == (
        DEVICES, DEVICES, DEVICES)
    # nor can the record claim a screening the server never ran: it saw no update to clip or reject, and it bounds
    # none (no DP); the bytes it records are every stage's replies, as the round's view counts them
    assert outcome["screening"] == {"norm_limit": None, "counted": DEVICES, "clipped": 0, "rejected": 0}
    assert outcome["upload_bytes"] == view["upload_bytes"] > 0
    # the card's privacy claim: SecAgg+ and no DP, stated under the key a verifier reads
    card = simulation.admin.card(view["result_model_id"])
    assert card.details["federated"]["privacy"] == {"secure_aggregation": True, "dp": None}
    # what each device sent: the masked vector at 2 bytes a value, plus keys and shares
    vector_bytes = (sum(v.size for v in read_float_initializers(federation.model).values()) + 1) * 2
    assert all(vector_bytes < result.upload_bytes < vector_bytes + 3000 for result in results)
    # and the round's view counts what the server stored of this round: its 8 masked inputs, and every stage's
    # replies, the 8 masked vectors at least and no more than the devices sent
    assert view["accepted_updates"] == DEVICES
    assert DEVICES * vector_bytes < view["upload_bytes"] <= sum(result.upload_bytes for result in results)


def test_devices_refuse_a_server_that_tells_each_a_different_survivor_set(simulation, federation, monkeypatch):
    class LyingServer(secure_rounds.SecAggServer):
        """Tells each device that its ring successor dropped (so no two neighbours hold the same story) and forwards,
        as it must, only the neighbours' signatures made on the story the device heard."""

        def collect_masked_inputs(self, replies):
            requests = super().collect_masked_inputs(replies)
            survivors = sorted(requests)
            successor = {client: survivors[(position + 1) % len(survivors)] for position, client in enumerate(survivors)}
            self.stories = {client: [c for c in survivors if c != successor[client]] for client in survivors}
            return {client: dict(request, survivors=self.stories[client]) for client, request in requests.items()}

        def collect_consistency(self, replies):
            signed = {reply["client"]: reply["signature"] for reply in replies}
            requests = {client: {"stage": "unmask", "survivors": self.stories[client], "signatures": [
                {"client": peer, "signature": signed[peer]} for peer in self.graph[client]
                if peer in signed and self.stories[peer] == self.stories[client]]} for client in signed}
            self.revealers = set(requests)
            return requests

    monkeypatch.setattr(secure_rounds, "SecAggServer", LyingServer)
    _, results, view = sdk_round(simulation, federation, secure_config(deadline_s=15))
    assert [result.outcome for result in results] == ["refused: too_few_signatures"] * DEVICES
    assert view["state"] == "failed" and view["result_model_id"] is None


def test_devices_refuse_parameters_below_their_own_bounds_whatever_the_server_says(simulation, federation):
    """The operator's plan asks for 2 neighbours among 8 devices: valid for the server, below every device's floor."""
    weak = {"secure_aggregation": {"neighbour_count": 2, "clip_range": 0.05, "stage_deadline_s": 3}}
    round_id, results, view = sdk_round(simulation, federation, secure_config(privacy=weak, deadline_s=10))
    assert [result.outcome for result in results] == ["refused: config_out_of_bounds"] * DEVICES
    assert view["state"] == "failed" and view["result_model_id"] is None
    # each device is on record once, as having declined: a device that refused a server's bad parameters is not
    # also charged an abandoned seat (a second exclusion towards quarantine for the server's fault)
    participants = httpx.get(f"{simulation.server_url}/v1/fl/rounds/{round_id}/participants",
                             headers={"Authorization": f"Bearer {ADMIN}"}).json()["participants"]
    assert [entry["status"] for entry in participants] == ["declined"] * DEVICES


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
               ({"secure_aggregation": {"survivor_fraction": 1.5}}, "privacy.secure_aggregation.survivor_fraction"),
               ({"secure_aggregation": {"survivor_fraction": 0}}, "privacy.secure_aggregation.survivor_fraction"),
               ({"dp": {"max_epsilon": -1, "clip_norm": 0.5}}, "privacy.dp.max_epsilon"),
               ({"dp": {"max_epsilon": 8}}, "privacy.dp.clip_norm"),
               ({"dp": {"max_epsilon": 0.01, "clip_norm": 0.5, "noise_multiplier": 0.1}}, "privacy.dp.max_epsilon"),
               ({"dp": {"max_epsilon": 1e6, "clip_norm": 0.5}}, "privacy.dp.max_epsilon"),  # needs z below 0.05
               ({"secure_aggregation": {}, "extra": 1}, "privacy.extra")]
        for privacy, field in bad:
            answer = admin.post("/v1/fl/rounds", json={**base, **secure_config(privacy=privacy)})
            assert answer.status_code == 422, (privacy, answer.text)
            assert answer.json()["error"]["field"] == field, (privacy, answer.json())
        small = admin.post("/v1/fl/rounds", json={**base, **secure_config(target_clients=2, min_clients=2)})
        assert small.status_code == 422 and small.json()["error"]["field"] == "privacy.secure_aggregation"


def test_secure_stage_endpoints_check_the_token_the_stage_and_the_body(simulation, federation):
    round_id = simulation.start_plan(secure_config())
    url = f"{simulation.server_url}/v1/fl/rounds/{round_id}/secagg"
    keys = {"cipher_public_key": "A" * 43 + "=", "mask_public_key": "A" * 43 + "=", "nonce": "A" * 43 + "=",
            "signature": "A" * 86 + "=="}
    tokens = simulation.tokens
    with httpx.Client(timeout=30) as http:
        auth = lambda index: {"Authorization": f"Bearer {tokens[index]}"}  # noqa: E731
        assert http.post(f"{url}/advertise_keys", json=keys).status_code == 401
        assert http.post(f"{url}/advertise_keys", json=keys, headers={"Authorization": "Bearer nope"}).status_code == 401
        refused = http.post(f"{url}/advertise_keys", json=keys, headers=auth(0))
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "not_selected")
        before_cohorts = http.post(f"{url}/masked_input", content=b"\0" * 10,  # read within the model's upload bound
                                   headers={**auth(0), "Content-Type": "application/octet-stream"})
        assert (before_cohorts.status_code, before_cohorts.json()["error"]["code"]) == (403, "not_selected")
        enrollment = simulation.admin.create_enrollment_token(ADMIN, max_uses=1)["token"]
        profile = {"device_id": "keyless", "platform": "linux-x86_64", "cpu": {"model": "virtual", "cores": 1},
                   "memory_mb": 2048, "runtime": {"onnxruntime": "simulated", "threads": 1}}
        keyless = http.post(f"{simulation.server_url}/v1/devices", json=profile,
                            headers={"Authorization": f"Bearer {enrollment}"}).json()["token"]
        check_in = http.get(f"{simulation.server_url}/v1/fl/task", params={"task": federation.card.task},
                            headers={"Authorization": f"Bearer {keyless}"}).json()
        assert check_in["task"] is None and check_in["reason"].startswith("signing_key_required")
        assert http.post(f"{simulation.server_url}/v1/fl/rounds/999/secagg/unmask", json={"shares": []},
                         headers=auth(0)).status_code == 404
        for index in range(DEVICES):  # selection closes: the round is at advertise_keys
            task = device_client(simulation, index).fl_task(federation.card.task)["task"]
        assert task["privacy"]["secure_aggregation"]["stage"] == "advertise_keys"
        too_early = http.post(f"{url}/unmask", json={"shares": []}, headers=auth(0))
        assert (too_early.status_code, too_early.json()["error"]["code"]) == (409, "wrong_stage")
        signature = {"signature": keys["signature"]}
        assert http.post(f"{url}/consistency_check", json=signature).status_code == 401
        too_early = http.post(f"{url}/consistency_check", json=signature, headers=auth(0))
        assert (too_early.status_code, too_early.json()["error"]["code"]) == (409, "wrong_stage")
        for body in ({"signature": "short"}, {}, {**signature, "survivors": [0]}):
            bad = http.post(f"{url}/consistency_check", json=body, headers=auth(0))
            assert bad.status_code == 422 and bad.json()["error"]["field"] in ("signature", "survivors"), bad.text
        for body, field in (({**keys, "cipher_public_key": "short"}, "cipher_public_key"),
                            ({**keys, "client": 3}, "client"), ({"mask_public_key": keys["mask_public_key"]},
                                                                 "cipher_public_key"),
                            ({**keys, "nonce": "A" * 20}, "nonce")):
            bad = http.post(f"{url}/advertise_keys", json=body, headers=auth(0))
            assert (bad.status_code, bad.json()["error"]["field"]) == (422, field), bad.text
        assert http.post(f"{url}/advertise_keys", content=b"{", headers={**auth(0), "Content-Type": "application/json"}
                         ).status_code == 400
        wrong_type = http.post(f"{url}/masked_input", content=b"\0" * 10, headers={**auth(0), "Content-Type": "text/plain"})
        assert wrong_type.status_code == 415
        unsigned = http.post(f"{url}/advertise_keys", json=keys, headers=auth(0))  # a signature, but not device 0's
        assert (unsigned.status_code, unsigned.json()["error"]["field"]) == (422, "signature"), unsigned.text
        secure = device_client(simulation, 0).fl_task(federation.card.task)["task"]["privacy"]["secure_aggregation"]
        protocol = SecAggConfig.from_dict(secure["config"])
        raw_key = base64.b64decode(keys["cipher_public_key"])
        keys["signature"] = base64.b64encode(device_client(simulation, 0).signing_key.sign(
            signatures.advertise_payload(protocol, secure["client"], raw_key, raw_key, bytes(32)))).decode()
        stored = http.post(f"{url}/advertise_keys", json=keys, headers=auth(0))  # stored: the server checks keys later
        assert stored.status_code == 201 and stored.json()["received"] == 1
        again = http.post(f"{url}/advertise_keys", json=keys, headers=auth(0))
        assert (again.status_code, again.json()["error"]["code"]) == (409, "duplicate_reply")
        upload = http.post(f"{simulation.server_url}/v1/fl/rounds/{round_id}/updates", headers=auth(1),
                           files={"delta": ("d.npz", b"x")}, data={"metadata": '{"base_version": 1, "num_examples": 1}'})
        assert (upload.status_code, upload.json()["error"]["code"]) == (409, "secure_round")


def test_a_masked_vector_of_the_wrong_length_is_refused_naming_it(simulation, federation, server):
    round_id = simulation.start_plan(secure_config())
    devices = scripted_devices(simulation, federation, {index: {"stop_before": "masked_input"}
                                                        for index in range(DEVICES)})
    for device in devices:
        device.start()
    for device in devices:
        device.join(timeout=60)
    task = device_client(simulation, 0).fl_task(federation.card.task)["task"]
    assert task["privacy"]["secure_aggregation"]["stage"] == "masked_input"
    # the pacing's floor, 0.05 s (here the plan's poll interval too), holds however near the stage's deadline: no
    # answer tells a device to ask again at once (an integer rounding would say 0) or later than it must
    assert task["privacy"]["secure_aggregation"]["retry_after_s"] == POLL_S
    vector_length = task["privacy"]["secure_aggregation"]["config"]["vector_length"]
    # every signature binds this id: another round's replies (a replay) are signed for another one
    assert task["privacy"]["secure_aggregation"]["config"]["round_id"] == f"fl-round-{round_id}"
    with httpx.Client(timeout=30) as http:
        post = lambda body: http.post(  # noqa: E731
            f"{simulation.server_url}/v1/fl/rounds/{round_id}/secagg/masked_input", content=body,
            headers={"Authorization": f"Bearer {simulation.tokens[0]}", "Content-Type": "application/octet-stream"})
        answer = post(b"\0" * 10)
        # the server reads at most 4 bytes a value of the cohort's masked vector, far less than a whole update
        too_long = post(b"\0" * (4 * (vector_length + 1) + 1))
    assert (answer.status_code, answer.json()["error"]["field"]) == (422, "masked_vector")
    assert (too_long.status_code, too_long.json()["error"]["code"]) == (413, "payload_too_large"), too_long.text
    # another worker closing a stage it saw overdue a moment ago: the round has moved on, so its close claims nothing
    # (a stage closes once; a late close must not move the round back and drop the devices that replied since)
    late_worker = secure_rounds.PrivateRounds(Database(f"sqlite:///{server.data_dir / 'registry.db'}"),
                                              lambda: datetime.now(timezone.utc))
    assert [late_worker.close_stage(round_id, stage) for stage in ("advertise_keys", "share_keys")] == [None, None]
    with late_worker.database.session() as session:  # nor does forming the cohorts again, once they are fixed
        round_row = session.get(FLRound, round_id)
        late_worker.start_stages(session, round_row, RoundConfig.model_validate_json(round_row.config_json),
                                 lambda _device: secure_rounds.SeatGroup("", vector_length))
    # no masked vector came: at the stage's deadline the round is aborted
    view = simulation.admin.wait_for_round(round_id, timeout_s=60)
    assert (view["state"], view["outcome"]["failure"]) == (
        "failed", "secure aggregation aborted after 'masked_input': only 0 masked inputs arrived; the round needs 5")


def test_closing_a_stage_moves_only_its_round_gives_the_next_stage_its_own_deadline_and_a_cohort_of_three_sums(
        simulation, federation, server):
    """Two SecAgg+ rounds at one stage on one server, each a cohort of exactly SecAgg+'s least (3 devices): a
    worker closing the first round's stage moves that round alone, and the stage it opens has its own
    `stage_deadline_s` from the moment it opened; the second round's cohort of three still sums exactly."""
    config = secure_config(min_clients=3, target_clients=3, poll_interval_s=60, privacy={"secure_aggregation": {
        "neighbour_count": 2, "clip_range": 0.05, "stage_deadline_s": 20}})
    first, second = simulation.start_plan(config), simulation.start_plan(config)
    for index in range(6):  # each round seats three: selection closes and its cohorts form
        device_client(simulation, index).fl_task(federation.card.task)
    views = [device_client(simulation, index).fl_task(federation.card.task)["task"] for index in range(6)]
    assert [view["round_id"] for view in views] == [first] * 3 + [second] * 3
    secure = [view["privacy"]["secure_aggregation"] for view in views]
    assert [(view["stage"], view["client"], view["config"]["num_clients"]) for view in secure] == [
        ("advertise_keys", client, 3) for client in (0, 1, 2)] * 2  # a group of exactly 3 forms a cohort
    # each seated device is told to ask again by the stage's deadline (20 s), not after the plan's poll interval
    # (60 s): paced past the close, a device not yet asked would miss the next stage and be charged the seat
    assert all(0 < view["retry_after_s"] <= 20 for view in secure)
    # a worker closes the first round's stage 7 s on (as at its deadline, none of its devices having replied)
    opened_at = datetime.now(timezone.utc) + timedelta(seconds=7)
    worker = secure_rounds.PrivateRounds(Database(f"sqlite:///{server.data_dir / 'registry.db'}"), lambda: opened_at)
    with pytest.raises(RoundAborted) as aborted:
        worker.close_stage(first, "advertise_keys")
    assert (str(aborted.value), aborted.value.clients) == (
        "only 0 devices completed 'advertise_keys'; the cohort needs 3", [])
    moved = device_client(simulation, 0).fl_task(federation.card.task)["task"]["privacy"]["secure_aggregation"]
    assert moved["stage"] == "share_keys"
    assert abs(datetime.fromisoformat(moved["stage_deadline_at"]) - (opened_at + timedelta(seconds=20))
               ) < timedelta(milliseconds=1)
    still = device_client(simulation, 3).fl_task(federation.card.task)["task"]["privacy"]["secure_aggregation"]
    assert still["stage"] == "advertise_keys"  # the other round's devices have not replied yet: its stage stays
    # the first round runs on (to its new stage's deadline): after the timeout the wait hands back its view as it is
    assert simulation.admin.wait_for_round(first, timeout_s=0.3)["state"] == "collecting"
    parameters = read_float_initializers(federation.model)
    rng = np.random.default_rng(3)
    devices = [ScriptedDevice(device_client(simulation, index), federation.card.task,
                              {name: rng.normal(0, 0.01, value.shape).astype(np.float32)
                               for name, value in parameters.items()}, seed=index) for index in (3, 4, 5)]
    for device in devices:
        device.start()
    for device in devices:
        device.join(timeout=60)
    assert [device.error for device in devices] == [None] * 3
    view = simulation.admin.wait_for_round(second, timeout_s=60)
    assert view["state"] == "closed", view["outcome"]
    assert view["outcome"]["secure_aggregation"]["survivors"] == 3
    participants = simulation.admin.http.get_json(f"/v1/fl/rounds/{second}/participants")["participants"]
    assert [entry["status"] for entry in participants if entry["status"] == "sat_out"] == []  # all 3 had a cohort
    _, published = published_parameters(simulation, view)
    for name, value in expected_parameters(federation, view, devices).items():
        np.testing.assert_allclose(published[name], value, rtol=0, atol=1e-6)


def test_a_server_restart_between_stages_loses_nothing_and_the_sum_is_exact(simulation, federation, server):
    resume = threading.Event()

    class PausingDevice(ScriptedDevice):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.paused = threading.Event()

        def _run(self):
            original = self.tamper

            def pause_then(stage, reply):
                if stage == "masked_input":  # computed; the server restarts before it is sent
                    self.paused.set()
                    resume.wait(30)
                return original(stage, reply) if original else reply

            self.tamper = pause_then
            super()._run()

    round_id = simulation.start_plan(secure_config(privacy={"secure_aggregation": {
        "neighbour_count": 6, "stage_deadline_s": 20}}))
    parameters = read_float_initializers(federation.model)
    rng = np.random.default_rng(3)
    devices = [PausingDevice(device_client(simulation, index), federation.card.task,
                             {name: rng.normal(0, 0.01, value.shape).astype(np.float32)
                              for name, value in parameters.items()}, seed=index) for index in range(DEVICES)]
    for device in devices:
        device.start()
    assert all(device.paused.wait(30) for device in devices)
    server.restart()
    resume.set()
    for device in devices:
        device.join(timeout=60)
    assert [device.error for device in devices] == [None] * DEVICES
    view = simulation.admin.wait_for_round(round_id, timeout_s=60)
    assert view["state"] == "closed", view["outcome"]
    _, published = published_parameters(simulation, view)
    for name, value in expected_parameters(federation, view, devices).items():
        np.testing.assert_allclose(published[name], value, rtol=0, atol=1e-6)


def test_dp_with_secure_aggregation_records_epsilon_on_the_card(simulation, federation):
    from fedzoo.dp.accountant import epsilon_after

    privacy = {"secure_aggregation": {"neighbour_count": 6, "stage_deadline_s": 5},
               "dp": {"max_epsilon": 50, "delta": 1e-5, "clip_norm": 0.5, "noise_multiplier": 1.5}}
    _, results, view = sdk_round(simulation, federation, secure_config(privacy=privacy))
    assert [result.outcome for result in results] == ["accepted"] * DEVICES
    assert view["state"] == "closed", view["outcome"]
    card = simulation.admin.card(view["result_model_id"])
    dp = card.details["federated"]["privacy"]["dp"]
    assert card.details["federated"]["privacy"]["secure_aggregation"] is True
    assert (dp["rounds"], dp["delta"], dp["accountant"], dp["noise_multiplier"]) == (1, 1e-5, "rdp", 1.5)
    assert dp["epsilon"] == pytest.approx(epsilon_after(1, 1.5, 1.0, 1e-5, "rdp"))
    assert dp["sensitivity"] > dp["clip_norm"]  # quantisation can lengthen a clipped delta: more noise
    # the bound each update was held to, the one figure of the screening a DP round's outcome keeps
    assert view["outcome"]["screening"]["norm_limit"] == 0.5


def test_a_dp_plan_stops_before_its_budget_and_its_ledger_survives_a_restart(simulation, federation, server):
    from fedzoo.dp.accountant import epsilon_after
    from fl_helpers import honest_delta, upload

    budget = (epsilon_after(2, 1.0, 1.0, 1e-5) + epsilon_after(3, 1.0, 1.0, 1e-5)) / 2
    config = round_config(min_clients=3, target_clients=3, num_rounds=5, max_accuracy_drop=1.0,
                          privacy={"dp": {"max_epsilon": budget, "clip_norm": 0.1, "noise_multiplier": 1.0}})
    round_id = simulation.start_plan(config)
    cards = []
    for number in (1, 2):
        for index in range(3):
            client = device_client(simulation, index)
            task = client.fl_task(federation.card.task)["task"]
            assert task["privacy"]["clip_norm"] == 0.1 and task["privacy"]["equal_weights"] is True
            upload(client, task, honest_delta(task_model(client, task), 0.05))  # norm > 0.1: the server clips
        view = simulation.admin.wait_for_round(round_id, timeout_s=60)
        assert view["state"] == "closed", view["outcome"]
        cards.append(simulation.admin.card(view["result_model_id"]))
        if number == 1:
            server.restart()  # the ledger is in the database, not in the service
            round_id = view["next_round_id"]
    assert [card.details["federated"]["privacy"]["dp"]["rounds"] for card in cards] == [1, 2]
    assert cards[1].details["federated"]["privacy"]["dp"]["epsilon"] == pytest.approx(epsilon_after(2, 1.0, 1.0, 1e-5))
    assert view["next_round_id"] is None and "max_epsilon" in view["outcome"]["plan_stopped"]


def task_model(client, task):
    return client.download(task["model_url"], task["model_sha256"]).read_bytes()


@pytest.mark.slow
def test_two_gunicorn_workers_run_a_secure_round_with_a_dropout_to_the_exact_sum(federation, tmp_path):
    from server_helpers import ADMIN_TOKEN, start_gunicorn, stop_gunicorn

    server = start_gunicorn(tmp_path / "data", workers=2)
    try:
        with ready_simulation(federation, server.base_url, tmp_path / "devices", ADMIN_TOKEN) as simulation:
            _, devices, view = run_scripted_round(simulation, federation, secure_config(),
                                                  {5: {"stop_before": "masked_input"}})
            assert view["state"] == "closed", view["outcome"]
            assert view["outcome"]["secure_aggregation"]["survivors"] == DEVICES - 1
            _, published = published_parameters(simulation, view)
            for name, value in expected_parameters(federation, view, devices[:5] + devices[6:]).items():
                np.testing.assert_allclose(published[name], value, rtol=0, atol=1e-6)
    except Exception as error:  # the server's side of a failure (e.g. a master that went away) is in its log
        raise AssertionError(f"{error}\n--- fedzoo serve log (tail) ---\n{server.log()[-6000:]}") from error
    finally:
        stop_gunicorn(server)


def _run_dp_round(simulation, federation, round_id):
    from fl_helpers import honest_delta, upload

    for index in range(3):
        client = device_client(simulation, index)
        task = client.fl_task(federation.card.task)["task"]
        upload(client, task, honest_delta(task_model(client, task), 0.05))
    view = simulation.admin.wait_for_round(round_id, timeout_s=60)
    assert view["state"] == "closed", view["outcome"]
    return simulation.admin.card(view["result_model_id"])


def test_plans_on_one_model_line_compose_into_one_ledger_and_the_card_states_the_total(simulation, federation):
    """Two chained one-round plans at z=1.5: the second card says epsilon of both rounds, not of its own."""
    from fedzoo.dp.accountant import epsilon_after

    dp = {"max_epsilon": 8, "delta": 1e-5, "clip_norm": 0.1, "noise_multiplier": 1.5}
    plan = round_config(min_clients=3, target_clients=3, num_rounds=1, max_accuracy_drop=1.0, privacy={"dp": dp})
    first = _run_dp_round(simulation, federation, simulation.start_plan(plan))
    second_plan = {**plan, "model_id": first.id}
    second = _run_dp_round(simulation, federation, simulation.start_plan(second_plan))
    claims = [card.details["federated"]["privacy"]["dp"] for card in (first, second)]
    assert [claim["line"] for claim in claims] == [federation.card.id] * 2 == [first.line_id, second.line_id]
    assert claims[0]["epsilon"] == pytest.approx(epsilon_after(1, 1.5, 1.0, 1e-5))
    assert claims[1]["epsilon"] == pytest.approx(epsilon_after(2, 1.5, 1.0, 1e-5))
    assert claims[1]["epsilon"] > claims[1]["plan_epsilon"]
    assert claims[1]["plan_epsilon"] == pytest.approx(claims[0]["epsilon"]) and claims[1]["rounds"] == 1
    assert claims[1]["line_events"] == [[1.5, 1.0, 1], [1.5, 1.0, 1]]
    # the whole claim, each figure read from where it comes from: a card that drops or misstates one (the delta,
    # the mechanism, the budgets, the bound the noise was sized for) states a privacy it does not have
    assert claims[1] == {
        "epsilon": pytest.approx(epsilon_after(2, 1.5, 1.0, 1e-5)), "delta": 1e-5, "accountant": "rdp", "rounds": 1,
        "max_epsilon": 8, "plan_epsilon": pytest.approx(epsilon_after(1, 1.5, 1.0, 1e-5)),
        "line": federation.card.id, "line_events": [[1.5, 1.0, 1], [1.5, 1.0, 1]], "line_max_epsilon": 10.0,
        "noise_multiplier": 1.5, "clip_norm": 0.1, "sampling_probability": 1.0,
        "sensitivity": pytest.approx(0.1 * 1.001),  # the clip bound and the noise grid's rounding (clip_norm / 1000)
        "mechanism": "central-discrete-gaussian", "noise": "discrete Gaussian from os.urandom"}
    federated = second.details["federated"]  # a DP card states no contributor count at all
    assert (federated["accepted_updates"], federated["aggregated_updates"], federated["num_examples"]) == (None,) * 3
    assert federated["screening"] == {"norm_limit": 0.1} and "counts_withheld" in federated


def _outcome(contributors, clipped=2, privacy=None):
    return RoundOutcome(counts=UpdateCounts(contributors, contributors, None),
                        screening=ScreeningTally(contributors, clipped, 0, norm_limit=0.1), privacy=privacy)


def test_membership_attack_a_dp_card_reads_the_same_with_and_without_the_target():
    """Add/remove adjacency: whoever knows the other contributors compares the card's counts with the target and
    without. Rounded counts told them apart for 6 of 60 cohort sizes (14 others: 10 vs 20); a DP card states none."""
    private = {"dp": {"epsilon": 1.0}}
    leaks = [others for others in range(1, 61)
             if secure_rounds.published_counts(_outcome(others, privacy=private))
             != secure_rounds.published_counts(_outcome(others + 1, clipped=3, privacy=private))]
    assert leaks == []
    plain = _outcome(17)
    assert secure_rounds.published_counts(plain) == {  # without DP the counts are exact
        "accepted_updates": 17, "aggregated_updates": 17, "num_examples": None,
        "screening": {"norm_limit": 0.1, "counted": 17, "clipped": 2, "rejected": 0}}
    assert secure_rounds.published_counts(_outcome(17, privacy=private)) == {  # under DP: none, and says why
        "accepted_updates": None, "aggregated_updates": None, "num_examples": None,
        "screening": {"norm_limit": 0.1}, "counts_withheld": secure_rounds.DP_COUNTS_WITHHELD}


def test_a_dp_rounds_view_keeps_no_figure_that_counts_devices():
    """Every membership-dependent figure a round's view can hold, as the server writes them: none survives
    `without_dp_counts`, and what does not count devices (the SecAgg+ parameters, the zoo's models) is kept."""
    view = {"state": "failed", "selected_devices": 9, "accepted_updates": 8, "upload_bytes": 1000,
            "declined_devices": 1, "sat_out_devices": {"subnet-a": 2},
            "outcome": {"version": 2, "accepted_updates": 8, "aggregated_updates": 8, "num_examples": 80,
                        "upload_bytes": 1000, "declined": 1, "screening": {"norm_limit": 2.0, "rejected": 1},
                        "secure_aggregation": {"neighbour_count": 6, "threshold": 5, "levels": 127, "clip_range": 0.1,
                                               "survivors": 8, "dropped": 1},
                        "zoo": {"models": 3, "devices_per_zoo_model": {"a": 3}, "devices_per_subnet": {"a": [3]},
                                "coverage": 0.5, "bytes": 10},
                        "failure": "only 1 of the 2 devices needed replied"}}
    assert secure_rounds.without_dp_counts(view) == {
        "state": "failed", "selected_devices": None, "accepted_updates": None, "upload_bytes": None,
        "declined_devices": None, "sat_out_devices": None, "counts_withheld": secure_rounds.DP_COUNTS_WITHHELD,
        "outcome": {"version": 2, "screening": {"norm_limit": 2.0},
                    "secure_aggregation": {"neighbour_count": 6, "threshold": 5, "levels": 127, "clip_range": 0.1},
                    "zoo": {"models": 3},
                    "failure": "the round failed (its reason is withheld under DP: it counts devices)"}}
    assert secure_rounds.without_dp_counts({**view, "outcome": None})["outcome"] is None
    assert secure_rounds.without_dp_counts({**view, "outcome": {"version": 2}})["outcome"] == {"version": 2}


def test_membership_attack_a_dp_rounds_read_states_no_counts_and_needs_an_operator_token(simulation, federation):
    """The round read (GET /v1/fl/rounds/<id>) showed the exact counts of a DP round to anyone: it now needs the
    viewer or admin token (401 without, 401 with a device's), and even then a DP round's counts are withheld."""
    dp = {"max_epsilon": 8, "delta": 1e-5, "clip_norm": 0.1, "noise_multiplier": 1.5}
    plan = round_config(min_clients=3, target_clients=3, num_rounds=1, max_accuracy_drop=1.0, privacy={"dp": dp})
    round_id = simulation.start_plan(plan)
    _run_dp_round(simulation, federation, round_id)
    with httpx.Client(base_url=simulation.admin.http.base_url) as http:
        anonymous = http.get(f"/v1/fl/rounds/{round_id}")
        device = http.get(f"/v1/fl/rounds/{round_id}", headers={"Authorization": f"Bearer {simulation.tokens[0]}"})
        participants = http.get(f"/v1/fl/rounds/{round_id}/participants")
        admin = http.get(f"/v1/fl/rounds/{round_id}", headers={"Authorization": f"Bearer {ADMIN}"})
        viewer = http.get(f"/v1/fl/rounds/{round_id}", headers={"Authorization": f"Bearer {VIEWER}"})
    assert anonymous.status_code == 401 and anonymous.json()["error"]["field"] == "Authorization"
    assert device.status_code == 401 and participants.status_code == 401
    view = admin.json()
    assert admin.status_code == 200 and view["state"] == "closed" and viewer.json() == view
    assert (view["selected_devices"], view["accepted_updates"], view["upload_bytes"]) == (None, None, None)
    assert "accepted_updates" not in view["outcome"] and view["outcome"]["screening"] == {"norm_limit": 0.1}


def test_a_plan_that_would_pass_the_lines_lifetime_budget_is_refused_before_it_opens(simulation, federation):
    from fedzoo.dp.accountant import epsilon_after

    dp = {"max_epsilon": 8, "delta": 1e-5, "clip_norm": 0.1, "noise_multiplier": 1.5}
    plan = round_config(min_clients=3, target_clients=3, num_rounds=1, max_accuracy_drop=1.0, privacy={"dp": dp})
    first = _run_dp_round(simulation, federation, simulation.start_plan(plan))
    # three rounds at z=0.95 fit their plan's own budget, but not the line's default lifetime budget of 10
    more = {"max_epsilon": 9.9, "delta": 1e-5, "clip_norm": 0.1, "noise_multiplier": 0.95}
    assert epsilon_after(3, 0.95, 1.0, 1e-5) < 9.9 and epsilon_after(1, 1.5, 1.0, 1e-5) < 10.0
    with httpx.Client(base_url=simulation.admin.http.base_url, headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        refused = http.post("/v1/fl/rounds", json={**plan, "model_id": first.id, "num_rounds": 3,
                                                    "evaluation_sha256": simulation.evaluation_sha256,
                                                    "privacy": {"dp": more}})
        other_delta = http.post("/v1/fl/rounds", json={**plan, "model_id": first.id,
                                                        "evaluation_sha256": simulation.evaluation_sha256,
                                                        "privacy": {"dp": {**dp, "delta": 1e-6}}})
        rounds = http.get("/v1/fl/rounds").json()
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "privacy.dp.max_epsilon"
    assert "lifetime budget" in refused.json()["error"]["message"] and federation.card.id in refused.json()["error"][
        "message"]
    assert other_delta.status_code == 422 and other_delta.json()["error"]["field"] == "privacy.dp.delta"
    assert len(rounds["rounds"]) == 1  # nothing opened


def test_a_second_dp_plan_on_a_line_waits_for_the_running_one(simulation, federation, server):
    dp = {"max_epsilon": 8, "delta": 1e-5, "clip_norm": 0.1, "noise_multiplier": 1.5}
    plan = round_config(min_clients=3, target_clients=3, num_rounds=1, max_accuracy_drop=1.0, privacy={"dp": dp})
    running = simulation.start_plan(plan)
    with httpx.Client(base_url=simulation.admin.http.base_url, headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        post = lambda: http.post("/v1/fl/rounds", json={  # noqa: E731
            **plan, "model_id": federation.card.id, "evaluation_sha256": simulation.evaluation_sha256})
        busy = post()
        # while a worker makes the round's release (aggregating: its ledger not yet recorded) the line stays busy
        database = Database(f"sqlite:///{server.data_dir / 'registry.db'}")
        with database.session() as session:
            session.get(FLRound, running).state = "aggregating"
        while_aggregating = post()
    assert busy.status_code == 409
    assert (busy.json()["error"]["code"], busy.json()["error"]["field"]) == ("line_busy", "model_id")
    # the message names the line and the round holding it: what the operator waits for
    assert f"model line {federation.card.line_id!r}" in busy.json()["error"]["message"]
    assert f"(round {running})" in busy.json()["error"]["message"]
    assert (while_aggregating.status_code, while_aggregating.json().get("error", {}).get("code")) == (409, "line_busy")


@pytest.mark.slow
@pytest.mark.skipif(not POSTGRES_URL, reason="set FEDZOO_TEST_POSTGRES_URL to run against PostgreSQL")
def test_two_dp_plans_opening_at_once_on_one_line_on_postgres_open_one_and_the_other_is_told_line_busy(federation,
                                                                                                       tmp_path):
    """Two operators open a DP plan on one line in the same instant: one opens, the other is told `line_busy`, and
    the plan that opened holds the line's ledger. On a new line both insert its row and the primary key refuses the
    second. On a line that exists each reads it free before the other commits; on PostgreSQL only the row lock of
    `_start_on_line`'s `revision` raise makes the second wait for the first and then see its plan (SQLite's one
    write lock serialises them anyway). Two plans on one line would each check the line's lifetime budget against
    the line without the other's rounds. Each opened plan fails at its 1 s deadline, freeing the line for the next
    race; without the row lock two plans opened in about two races of three."""
    dp = {"max_epsilon": 8, "delta": 1e-5, "clip_norm": 0.1, "noise_multiplier": 1.5}
    plan = round_config(min_clients=3, target_clients=3, num_rounds=1, privacy={"dp": dp})
    with (fresh_postgres_database(POSTGRES_URL, "fedzoo_lines") as url,
          LoopbackServer(tmp_path / "server", deadline_check_s=0.1, environ={"FEDZOO_DATABASE_URL": url}) as server,
          ready_simulation(federation, server.url, tmp_path / "devices") as simulation):
        body = {**plan, "deadline_s": 1, "model_id": federation.card.id,
                "evaluation_sha256": simulation.evaluation_sha256}
        database = create_engine(url)
        try:
            _race_for_the_line(simulation, database, body, line_events=[])  # the line is new
            _run_dp_round(simulation, federation, simulation.start_plan(plan))  # the line: one round released
            for _ in range(3):
                _race_for_the_line(simulation, database, body, line_events=[[1.5, 1.0, 1]])
        finally:
            database.dispose()


def _race_for_the_line(simulation, database, body, line_events):
    """Two admins post the DP plan `body` in the same instant (a thread each): exactly one opens, and the other is
    refused `line_busy`; the one that opened holds the line's ledger, as the line stands. Returns when that plan
    failed at its deadline (no device checks in) and the line is free."""
    together, answers = threading.Barrier(2), []

    def open_plan():
        with httpx.Client(base_url=simulation.server_url, headers={"Authorization": f"Bearer {ADMIN}"},
                          timeout=30) as http:
            together.wait()
            answers.append(http.post("/v1/fl/rounds", json=body))

    operators = [threading.Thread(target=open_plan) for _ in range(2)]
    for operator in operators:
        operator.start()
    for operator in operators:
        operator.join(timeout=60)
    assert sorted(answer.status_code for answer in answers) == [201, 409], [answer.text for answer in answers]
    [opened] = [answer.json()["id"] for answer in answers if answer.status_code == 201]
    [refused] = [answer.json()["error"] for answer in answers if answer.status_code == 409]
    assert (refused["code"], refused["field"]) == ("line_busy", "model_id")
    with database.connect() as connection:
        holders = connection.execute(text(
            "SELECT r.id, p.line_id, p.ledger_json FROM fl_rounds r JOIN fl_private_rounds p ON p.round_id = r.id "
            "WHERE r.state NOT IN ('closed', 'failed')")).all()
        [(line_id, events_json)] = connection.execute(text("SELECT line_id, events_json FROM privacy_lines"))
    [(holder, holder_line, ledger_json)] = holders  # one plan holds the line's ledger: the one that opened
    assert (holder, holder_line) == (opened, line_id) and repr(line_id) in refused["message"]
    assert json.loads(ledger_json)["line_events"] == json.loads(events_json) == line_events
    assert simulation.admin.wait_for_round(opened, timeout_s=60)["state"] == "failed"


def test_a_secure_stage_reply_to_a_round_without_secure_aggregation_is_refused_naming_the_round(simulation,
                                                                                                 federation):
    """A DP round without SecAgg+ keeps a private-round row with no stage: a device posting a stage reply to it (to
    slip a masked vector past the clear path's clipping) is refused naming the round."""
    dp = {"max_epsilon": 8, "delta": 1e-5, "clip_norm": 0.1, "noise_multiplier": 1.5}
    round_id = simulation.start_plan(round_config(min_clients=3, target_clients=3, num_rounds=1,
                                                  max_accuracy_drop=1.0, privacy={"dp": dp}))
    with httpx.Client(timeout=30) as http:
        refused = http.post(f"{simulation.server_url}/v1/fl/rounds/{round_id}/secagg/masked_input", content=b"\0" * 10,
                            headers={"Authorization": f"Bearer {simulation.tokens[0]}",
                                     "Content-Type": "application/octet-stream"})
    assert refused.status_code == 409, refused.text
    assert (refused.json()["error"]["code"], refused.json()["error"]["field"]) == ("not_a_secure_round", "round_id")


def test_a_secure_round_nobody_joins_fails_at_its_deadline_naming_the_selection_stage(simulation, federation):
    """No cohort formed, so no seat was abandoned: failing the round records no seat failure and the plan is free
    (a failure that raised there would leave the round open past its deadline, holding the task)."""
    round_id = simulation.start_plan(secure_config(deadline_s=1))
    view = simulation.admin.wait_for_round(round_id, timeout_s=30)
    assert view["state"] == "failed", view
    assert "at stage 'selection'" in view["outcome"]["failure"]


def test_a_new_line_from_a_dp_model_starts_from_the_ledger_its_signed_card_carries(federation):
    claim = {"line_events": [[1.5, 1.0, 2]], "delta": 1e-6, "accountant": "pld"}
    assert secure_rounds.inherited_ledger(claim, 1e-5, "rdp") == ([[1.5, 1.0, 2]], 1e-6, "pld")
    assert secure_rounds.inherited_ledger({}, 1e-5, "rdp") == ([], 1e-5, "rdp")
    assert secure_rounds.inherited_ledger({"line_events": [[1.5, 1.0, 2]]}, 1e-5, "rdp") == ([[1.5, 1.0, 2]], 1e-5, "rdp")
    assert secure_rounds.inherited_ledger({"line_events": "[[1.5, 1.0, 2]]"}, 1e-5, "rdp") == ([], 1e-5, "rdp")


def test_an_insider_that_takes_secure_seats_and_drops_out_every_round_is_quarantined(simulation, federation):
    """Issue #44: the device claims SecAgg+, takes its seat and vanishes after key sharing, round after round. Each
    seat it abandons counts like an update left out; its history shows in the participants view. Once seated it
    also posts a plain update, refused (409 `secure_round`) and recorded as `rejected`: a refusal on record must
    not stand in for the abandoned seat, which is recorded `aborted` all the same."""
    policy = {"quarantine": {"max_exclusions": 2, "window_updates": 3}}
    headers = {"Authorization": f"Bearer {ADMIN}"}

    def plain_update_first(stage, reply):
        if stage == "advertise_keys":
            round_id = device_client(simulation, 2).fl_task(federation.card.task)["task"]["round_id"]
            refused = httpx.post(f"{simulation.server_url}/v1/fl/rounds/{round_id}/updates",
                                 headers={"Authorization": f"Bearer {simulation.tokens[2]}"},
                                 files={"delta": ("d.npz", b"x")},
                                 data={"metadata": '{"base_version": 1, "num_examples": 1}'})
            assert (refused.status_code, refused.json()["error"]["code"]) == (409, "secure_round")
        return reply

    rounds = []
    for _ in range(2):
        round_id, devices, view = run_scripted_round(
            simulation, federation, secure_config(**policy),
            {2: {"stop_before": "masked_input", "tamper": plain_update_first}})
        assert view["state"] == "closed", view["outcome"]
        rounds.append(round_id)
    insiders = set()
    for round_id in rounds:
        participants = {entry["device_id"]: entry for entry in httpx.get(
            f"{simulation.server_url}/v1/fl/rounds/{round_id}/participants", headers=headers).json()["participants"]}
        insiders |= {device for device, entry in participants.items() if entry["status"] == "aborted"}
        (insider,) = insiders  # the same one device, the one that dropped out, in both rounds
        assert participants[insider]["reason"] == "took a SecAgg+ seat and did not answer stage 'masked_input'"
        assert {entry["status"] for device, entry in participants.items() if device != insider} == {"no_update"}
    quarantined = httpx.get(f"{simulation.server_url}/v1/fl/quarantine", headers=headers).json()
    assert [entry["device_id"] for entry in quarantined["devices"]] == [insider]
    assert "SecAgg+ seats" in quarantined["devices"][0]["reason"]
    assert participants[insider]["quarantined"] is True


def test_sybils_that_abandon_their_seats_to_abort_a_round_are_charged_and_the_honest_devices_are_not(simulation,
                                                                                                  federation):
    """Four enrolled Sybils take SecAgg+ seats and vanish before the masked input: 4 masked inputs for the 5 the
    cohort needs, so the round aborts as the consistency check opens. Only a stage that closed can have been
    missed: the Sybils are charged their abandoned seats (towards quarantine), and the four devices that answered
    every stage they were asked are charged nothing, so aborting rounds together cannot frame honest devices."""
    sybils = range(4, DEVICES)
    round_id = simulation.start_plan(secure_config())
    devices = scripted_devices(simulation, federation, {index: {"stop_before": "masked_input"} for index in sybils})
    for device in devices:
        device.start()
    for device in devices:
        device.join(timeout=90)
    # the honest devices answered every stage they were asked; one that polled as the round ended was told why
    assert [device.answered for device in devices] == [["advertise_keys", "share_keys", "masked_input"]] * 4 + [
        ["advertise_keys", "share_keys"]] * 4
    assert {str(device.error) for device in devices} <= {
        "None", "only 4 masked inputs arrived; the round needs 5 (HTTP 400 bad_request)"}
    view = simulation.admin.wait_for_round(round_id, timeout_s=60)
    assert (view["state"], view["outcome"]["failure"]) == (
        "failed", "secure aggregation aborted after 'masked_input': only 4 masked inputs arrived; the round needs 5")
    participants = simulation.admin.http.get_json(f"/v1/fl/rounds/{round_id}/participants")["participants"]
    # (an abandoned seat is on record with the 0 bytes of update it sent: the operator's view of the round's traffic)
    assert {entry["device_id"]: (entry["status"], entry["upload_bytes"]) for entry in participants} == {
        f"sim-device-{index}": ("aborted", 0) if index in sybils else ("no_update", None) for index in range(DEVICES)}


def test_a_device_whose_ring_input_lies_outside_the_clip_range_gets_the_round_refused(simulation, federation):
    """The masks hide each input: only the unmasked sum shows that a device sent what its SDK would have clipped.
    Device 2 adds 40 x levels to one coordinate of its ring input (on the wire, the masked vector), more than
    all 8 clipped updates can add up to: nothing is published."""
    vector_length = sum(value.size for value in read_float_initializers(federation.model).values())

    def outside_the_clip_range(stage, reply):
        if stage != "masked_input":
            return reply
        dtype = {2: np.uint16, 4: np.uint32}[len(reply) // (vector_length + 1)]
        masked = np.frombuffer(reply, dtype=dtype).copy()
        masked[0] += 40 * 127  # wraps modulo 2^bits, as the masks do
        return masked.tobytes()

    _, devices, view = run_scripted_round(simulation, federation, secure_config(),
                                          {2: {"tamper": outside_the_clip_range}})
    assert all("unmask" in device.answered for device in devices)  # every device took part to the end
    assert view["state"] == "failed" and view["result_model_id"] is None
    assert "clipping range" in json.dumps(view["outcome"]), view["outcome"]


def test_a_private_round_whose_aggregate_points_away_from_the_root_update_is_refused(simulation, federation, server):
    """Under SecAgg+ the server sees only the mean, so it checks the mean against its own update on its root set:
    every device sending the server's own update negated (clipped) gives a sum pointing away from it."""
    root_npz = io.BytesIO()
    np.savez(root_npz, x=federation.split.validation.x[:150], y=federation.split.validation.y[:150])
    root_sha = simulation.admin.publish_blob(root_npz.getvalue(), server.admin_token)
    round_id = simulation.start_plan(secure_config(root_trust={"root_sha256": root_sha}))
    work = device_client(simulation, 0).fl_task(federation.card.task)["task"]
    root = train_root_update(federation.model, federation.training_graph, federation.card,
                             TrainingConfig(**work["training"]), root_npz.getvalue(), seed=1)  # what the server trains
    away = {name: -value for name, value in root.delta.items()}
    devices = [ScriptedDevice(device_client(simulation, index), federation.card.task, away, seed=index)
               for index in range(DEVICES)]
    for device in devices:
        device.start()
    for device in devices:
        device.join(timeout=90)
    assert [device.error for device in devices] == [None] * DEVICES
    view = simulation.admin.wait_for_round(round_id, timeout_s=60)
    assert view["state"] == "failed" and view["result_model_id"] is None
    assert "root set" in json.dumps(view["outcome"]), view["outcome"]


def test_the_servers_default_parameters_are_within_every_default_devices_bounds():
    """Rounds run: whatever the cohort, the server's default t (and k capped below the cohort) pass the devices'
    floors for the corrupt devices they withstand (`fedzoo.secagg.bounds`)."""
    from fedzoo.secagg.bounds import SecAggBounds
    from fedzoo.server.fl.schemas import SecureAggregationSettings

    for cohort in range(3, 300):
        SecAggBounds().check(secure_rounds.secagg_config(SecureAggregationSettings(), 1, cohort, 10, 0.05, 3))
    assert secure_rounds.secagg_config(SecureAggregationSettings(), 1, 100, 10, 0.05, 3).threshold == 33


@pytest.fixture
def roomy_server(tmp_path):
    """A server whose model lines may spend epsilon 1,000: the adaptive tests' count noise is tiny, epsilon large."""
    with LoopbackServer(tmp_path / "roomy", deadline_check_s=0.2,
                        environ={"FEDZOO_DP_LINE_MAX_EPSILON": "1000"}) as running:
        yield running


@pytest.fixture
def roomy_simulation(federation, roomy_server, tmp_path):
    with ready_simulation(federation, roomy_server.url, tmp_path / "roomy-devices") as sim:
        yield sim


def test_a_dp_round_under_secure_aggregation_publishes_the_noised_mean_of_the_unmasked_sum(roomy_simulation, federation):
    """Central DP over SecAgg+ noises the sum the devices' masks add up to, not the clear path's (empty) sum of
    uploaded deltas. At z = 0.05 the noise on the mean (0.05 x 0.5 / 8 per coordinate, norm about 0.08) is below
    the mean of the devices' deltas (norm about 0.09): the published step points along that mean (on a server
    whose lines may spend epsilon 1,000: one round at z = 0.05 spends 295)."""
    privacy = {"secure_aggregation": {"neighbour_count": 6, "stage_deadline_s": 5},
               "dp": {"max_epsilon": 500, "delta": 1e-5, "clip_norm": 0.5, "noise_multiplier": 0.05}}
    _, devices, view = run_scripted_round(roomy_simulation, federation, secure_config(privacy=privacy))
    assert view["state"] == "closed", view["outcome"]
    config = devices[0].config
    ring_sum = sum((device.ring_input.astype(np.int64) for device in devices), np.zeros(config.vector_length + 1,
                                                                                          dtype=np.int64))
    total, _ = dequantise_sum((ring_sum % 2**config.modulus_bits).astype(MASK_DTYPES[config.modulus_bits]), config)
    base = read_float_initializers(federation.model)
    _, published = published_parameters(roomy_simulation, view)
    step = flatten({name: published[name] - base[name] for name in base})  # the order the ring vector takes
    mean = total / DEVICES  # the fixed denominator: the plan's target_clients
    cosine = float(step @ mean / (np.linalg.norm(step) * np.linalg.norm(mean)))
    assert cosine > 0.5, cosine  # about 0.75 here; a step of noise alone is about 0 (+- 0.04)


def _adaptive_privacy(clip_norm, secure):
    """Adaptive clipping with a count noise too small to move a whole number (sigma 0.06: z = 0.1 needs more than
    z / 2), so two rounds over the same deltas must state the same noised count."""
    privacy = {"dp": {"max_epsilon": 500, "delta": 1e-5, "clip_norm": clip_norm, "noise_multiplier": 0.1,
                      "adaptive": {"target_unclipped_quantile": 0.5, "clip_learning_rate": 0.5,
                                   "clipped_count_stddev": 0.06}}}
    if secure:
        privacy["secure_aggregation"] = {"neighbour_count": 6, "stage_deadline_s": 5}
    return privacy


def test_adaptive_clipping_under_secure_aggregation_moves_the_norm_as_the_clear_path_does(roomy_simulation,
                                                                                          federation):
    """The SDK devices' deltas (what `fit_device`, the SDK's training, gives for seed = index) with the clip norm
    between the third and fourth shortest: three of eight are within. The server learns that count from the
    unmasked sum's last coordinate under SecAgg+ and from the clear deltas without it (where the devices' clipped
    deltas arrive at the bound, up to float32 rounding, and count as clipped), and moves the norm alike."""
    from fedzoo.aggregation.strategies import make_strategy
    from fedzoo.cloud.inprocess import DeviceContext, FitInstructions, fit_device
    from fedzoo.dp.clipping import l2_norm
    from fedzoo.server.fl.schemas import RoundConfig, round_training
    from fedzoo.update_codec import split_statistics

    plan = secure_config(privacy=_adaptive_privacy(1.0, secure=False))
    config = RoundConfig.model_validate({"model_id": federation.card.id, "evaluation_sha256": "0" * 64, **plan})
    training = round_training(config, 1, make_strategy(config.strategy).configure_fit(1)).model_dump(mode="json")
    context = DeviceContext.of(federation)
    norms = sorted(l2_norm(split_statistics(fit_device(context, FitInstructions(index, index, federation.model,
                                                                                  training)).delta)[0])
                   for index in range(DEVICES))
    clip_norm = (norms[2] + norms[3]) / 2
    claims = {}
    for secure in (False, True):  # the secure plan has a second round (last: one DP plan at a time on a line)
        _, results, view = sdk_round(roomy_simulation, federation, secure_config(
            privacy=_adaptive_privacy(clip_norm, secure), num_rounds=1 + secure))
        assert [result.outcome for result in results] == ["accepted"] * DEVICES
        assert view["state"] == "closed", view["outcome"]
        claims[secure] = view["outcome"]["privacy"]["dp"]
    vector_bytes = (sum(v.size for v in read_float_initializers(federation.model).values()) + 2) * 2
    assert all(vector_bytes < result.upload_bytes < vector_bytes + 3000 for result in results)  # the bit went too
    for claim in claims.values():
        # the centred count 3 - 8/2, doubled: -2 over 2 x 8 devices, plus 0.5
        assert claim["noised_unclipped_fraction"] == pytest.approx(0.5 - 2 / 16, abs=1e-9)
        assert claim["next_clip_norm"] == pytest.approx(clip_norm * np.exp(-0.5 * (0.375 - 0.5)), rel=1e-9)
        assert claim["delta_noise_multiplier"] == pytest.approx((0.1**-2 - 0.12**-2) ** -0.5)
    assert claims[True]["sensitivity"] > claims[False]["sensitivity"]  # quantised to 127 levels: more noise
    following = roomy_simulation.admin.fl_round(view["next_round_id"])  # the next round clips at the moved norm
    assert following["config"]["privacy"]["dp"]["clip_norm"] == pytest.approx(claims[True]["next_clip_norm"])
    task = device_client(roomy_simulation, 0).fl_task(federation.card.task)["task"]
    assert task["privacy"]["clip_norm"] == pytest.approx(claims[True]["next_clip_norm"])
    assert task["privacy"]["unclipped_bit"] is True


@pytest.mark.parametrize("bits", [40, -9, 0.5], ids=["above-one", "below-zero", "not-whole"])
def test_a_device_lying_with_its_unclipped_bit_gets_the_round_refused(roomy_simulation, roomy_server, federation,
                                                                       bits):
    """Device 2 adds `bits` x levels to the bit coordinate of its masked vector: the masks hide it, but the unmasked
    count leaves [0, survivors] or is not whole, and nothing is published (nor the clip norm moved)."""
    import sqlite3

    vector_length = sum(value.size for value in read_float_initializers(federation.model).values())

    def lying_bit(stage, reply):
        if stage != "masked_input":
            return reply
        dtype = {2: np.uint16, 4: np.uint32}[len(reply) // (vector_length + 2)]
        masked = np.frombuffer(reply, dtype=dtype).copy()
        masked[vector_length:vector_length + 1] += dtype(int(bits * 127) % 2 ** (8 * masked.itemsize))  # wraps
        return masked.tobytes()

    round_id, devices, view = run_scripted_round(roomy_simulation, federation, secure_config(
        privacy=_adaptive_privacy(0.5, secure=True)), {2: {"tamper": lying_bit}})
    assert all("unmask" in device.answered for device in devices)  # every device took part to the end
    assert view["state"] == "failed" and view["result_model_id"] is None
    with sqlite3.connect(roomy_server.data_dir / "registry.db") as database:  # a DP round's read withholds the reason
        (outcome,) = database.execute("SELECT outcome_json FROM fl_rounds WHERE id = ?", (round_id,)).fetchone()
    assert "unclipped bits" in outcome and "some device sent a bit other than 0 or 1" in outcome, outcome


PLAN_MODEL = {"model_id": "digits-v1", "evaluation_sha256": "0" * 64}  # a config unit-tested without a server


def test_a_plan_without_a_noise_multiplier_gets_the_smallest_that_spends_its_budget():
    """What a DP plan's rounds are noised with: calibrated from the plan's own budget, delta, rounds and accountant
    (no sampling amplification), the operator's own z kept, and a count noise that leaves the deltas none refused
    under the plan's field name."""
    from fedzoo.dp.accountant import noise_multiplier_for
    from fedzoo.server.fl.schemas import RoundConfig

    def plan(**dp):
        settings = {"max_epsilon": 8.0, "delta": 1e-5, "clip_norm": 1.0, **dp}
        return RoundConfig(**round_config(num_rounds=5, privacy={"dp": settings}, **PLAN_MODEL))

    calibrated = secure_rounds.with_calibrated_noise(plan()).privacy.dp.noise_multiplier
    assert calibrated == pytest.approx(noise_multiplier_for(8.0, 1e-5, 5, 1.0, "rdp"))
    assert secure_rounds.with_calibrated_noise(plan(noise_multiplier=2.5)).privacy.dp.noise_multiplier == 2.5
    plain = RoundConfig(**round_config(**PLAN_MODEL))
    assert secure_rounds.with_calibrated_noise(plain) == plain
    adaptive = plan(noise_multiplier=2.0, adaptive={"clipped_count_stddev": 3.0})  # target 3 clients: m / 20 < z
    assert secure_rounds.with_calibrated_noise(adaptive).privacy.dp.noise_multiplier == 2.0
    with pytest.raises(InvalidInputError, match="^clipped_count_stddev=1.0 is too small for noise multiplier 2.0") \
            as refused:
        secure_rounds.with_calibrated_noise(plan(noise_multiplier=2.0, adaptive={"clipped_count_stddev": 1.0}))
    assert refused.value.field == "privacy.dp.adaptive.clipped_count_stddev"


def test_a_cohorts_parameters_carry_the_operators_threshold_the_plans_minimum_and_the_subnet_in_the_id():
    from fedzoo.server.fl.schemas import SecureAggregationSettings

    chosen = secure_rounds.secagg_config(SecureAggregationSettings(threshold=40), 7, 100, 10, 0.05, 60, subnet=2)
    assert chosen.threshold == 40 and chosen.minimum_survivors >= 60
    assert chosen.round_id == "fl-round-7/subnet-2"
    assert secure_rounds.secagg_config(SecureAggregationSettings(), 7, 100, 10, 0.05, 3).round_id == "fl-round-7"


def test_secure_rounds_weigh_devices_equally_unless_the_plan_keeps_example_weights_and_never_under_dp():
    """The server sees only the sum, so under SecAgg+ it bounds each device's weight by making them equal, unless
    the operator keeps FedAvg's example weights; DP always weighs equally (its sensitivity assumes it). The
    unclipped bit rides along only where adaptive clipping meets SecAgg+."""
    from fedzoo.server.fl.schemas import RoundConfig

    dp = {"max_epsilon": 8.0, "delta": 1e-5, "clip_norm": 1.0}
    adaptive_dp = {**dp, "adaptive": {}}

    def plan(privacy, rule="median_multiple"):
        return RoundConfig(**round_config(privacy=privacy, weight_bound={"rule": rule}, **PLAN_MODEL))

    assert secure_rounds.equal_weights(plan({"secure_aggregation": {}}))
    assert not secure_rounds.equal_weights(plan({"secure_aggregation": {}}, rule="examples"))
    assert secure_rounds.equal_weights(plan({"secure_aggregation": {}, "dp": dp}, rule="examples"))
    assert secure_rounds.equal_weights(plan({"dp": dp}, rule="examples"))
    assert secure_rounds.carries_unclipped_bit(plan({"secure_aggregation": {}, "dp": adaptive_dp}))
    assert not secure_rounds.carries_unclipped_bit(plan({"secure_aggregation": {}, "dp": dp}))
    assert not secure_rounds.carries_unclipped_bit(plan({"dp": adaptive_dp}))
    assert not secure_rounds.carries_unclipped_bit(plan({"secure_aggregation": {}}))
