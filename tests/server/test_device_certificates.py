"""Device certificates over REST: the operator certifies device keys offline, the server stores and relays the
certificates, and SDK devices that pin the operator key set refuse every neighbour key the operator did not vouch
for, against a real server on loopback that lies."""

import base64
import threading
import time
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from click.testing import CliRunner

from fedzoo.cli import cli, main
from fedzoo.clients.client import FedzooClient
from fedzoo.clients.device_certification import revoke_device_keys
from fedzoo.clients.http import FedzooHTTP
from fedzoo.revocation import sign_revocation_list
from fedzoo.clients.participation import LocalData, participate_once
from fedzoo.device import CpuInfo, DeviceProfile, RuntimeInfo
from fedzoo.device_certificates import issue_certificate
from fedzoo.secagg import SecAggClient, SecAggConfig, signatures
from fedzoo.secagg.errors import ProtocolViolation
from fedzoo.server import device_certificates as server_certificates
from fedzoo.server import revocations as server_revocations
from fedzoo.server.card_keys import SERVER_KEY_FILE
from fedzoo.server.fl import secure_rounds
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN, LoopbackServer
from fedzoo.signing import CardSigningKey
from fl_helpers import device_client, digits_federation, round_config

ADMIN, VIEWER = DEFAULT_ADMIN_TOKEN, "viewer-token-for-certificate-tests-0123456789"
DEVICES = 6


LOOPBACK_SERVER_OPTIONS = {"deadline_check_s": 0.2, "viewer_token": VIEWER}  # the conftest `server`


@pytest.fixture(scope="module")
def federation():
    return digits_federation(DEVICES)


def secure_config(neighbour_count=4, target=DEVICES, deadline_s=20):
    """t is the server's default, the devices' floor for the corrupt devices the cohort must withstand."""
    privacy = {"secure_aggregation": {"neighbour_count": neighbour_count, "clip_range": 0.05, "stage_deadline_s": 3}}
    return round_config(min_clients=3, target_clients=target, deadline_s=deadline_s, poll_interval_s=0.05,
                        max_accuracy_drop=1.0, privacy=privacy)


def sdk_round(simulation, federation, config, clients=None, extra_threads=()):
    """The SDK's own participation on every device at once (and `extra_threads`, e.g. Sybils, beside them)."""
    round_id = simulation.start_plan(config)
    clients = clients or [device_client(simulation, index) for index in range(DEVICES)]
    results = [None] * DEVICES

    def device(index):
        shard = federation.shards[index]
        results[index] = participate_once(clients[index], federation.card.task,
                                          LocalData(federation.pool.x[shard], federation.pool.y[shard]), seed=index)

    threads = [threading.Thread(target=device, args=(index,), daemon=True) for index in range(DEVICES)]
    for thread in [*threads, *extra_threads]:
        thread.start()
    for thread in [*threads, *extra_threads]:
        thread.join(timeout=120)
    return [result.outcome for result in results], simulation.admin.wait_for_round(round_id, timeout_s=60)


def test_certified_sdk_devices_run_a_secure_round_that_publishes(simulation, federation):
    outcomes, view = sdk_round(simulation, federation, secure_config())
    assert outcomes == ["accepted"] * DEVICES and view["state"] == "closed", view["outcome"]


def test_devices_refuse_a_server_that_relays_keys_it_made_in_place_of_their_neighbours(
        simulation, federation, monkeypatch):
    """The attack of issue #44 (3): the server puts its own long-term keys in every neighbour's place and signs the
    relayed round keys and survivor sets with them. Devices without certificates accept every forged signature and
    reveal their shares; with the operator's key set pinned, every device refuses before it shares anything."""
    forged_keys = {}

    class SubstitutingServer(secure_rounds.SecAggServer):
        def collect_keys(self, replies):
            requests = super().collect_keys(replies)
            for client, request in requests.items():
                for entry in request["public_keys"]:
                    key = forged_keys.setdefault(entry["client"], signatures.new_signing_key())
                    payload = self.advertise_payload(entry["client"], *self.keys[entry["client"]],
                                                     self.nonces[entry["client"]])
                    entry["signing_public_key"] = base64.b64encode(signatures.public_bytes(key)).decode()
                    entry["signature"] = base64.b64encode(key.sign(payload)).decode()
            return requests

        def collect_consistency(self, replies):  # and the survivor-set signatures, under the same forged keys
            requests = super().collect_consistency(replies)
            for request in requests.values():
                for entry in request["signatures"]:
                    payload = self.consistency_payload(entry["client"], request["survivors"])
                    entry["signature"] = base64.b64encode(forged_keys[entry["client"]].sign(payload)).decode()
            return requests

    monkeypatch.setattr(secure_rounds, "SecAggServer", SubstitutingServer)
    outcomes, view = sdk_round(simulation, federation, secure_config(deadline_s=10))
    assert outcomes == ["refused: uncertified_key"] * DEVICES
    assert view["state"] == "failed" and view["result_model_id"] is None


def _sybil(server_url, token, task, stop):
    """A device the server made: it answers stage 1 with a key pair of the server's, then waits."""
    def run():
        with FedzooClient(server_url, token=token) as client:
            client.signing_key = _sybil.keys[token]
            while not stop.is_set():
                work = client.fl_task(task)["task"]
                secure = (work or {}).get("privacy", {}).get("secure_aggregation") or {}
                if secure.get("stage") == "advertise_keys" and secure.get("request") is not None:
                    protocol = SecAggClient(SecAggConfig.from_dict(secure["config"]), secure["client"],
                                            client.signing_key)
                    reply = protocol.advertise_keys()
                    client.secure_reply(secure["reply_url"], {name: reply[name] for name in
                                                              ("cipher_public_key", "mask_public_key", "nonce",
                                                                                "signature")})
                    return
                time.sleep(0.05)
    return threading.Thread(target=run, daemon=True)


_sybil.keys = {}


def test_sybils_the_server_enrolled_and_certified_with_its_own_key_are_refused(simulation, federation, server):
    """The server enrolls three devices of its own and certifies their keys with the key it signs federated cards
    with (which devices pin for cards, in GET /v1/keys): neighbours pinning the operator key set refuse them."""
    server_key = CardSigningKey.load(server.data_dir / SERVER_KEY_FILE)
    enrollment = simulation.admin.create_enrollment_token(ADMIN, max_uses=3)["token"]
    stop, sybils = threading.Event(), []
    with FedzooHTTP(server.url, token=ADMIN) as admin:
        for index in range(3):
            profile = DeviceProfile(device_id=f"sybil-{index}", platform="linux-x86_64", device_class="simulated",
                                    cpu=CpuInfo(model="virtual", cores=1), memory_mb=2048,
                                    runtime=RuntimeInfo(onnxruntime="simulated", threads=1))
            with FedzooClient(server.url) as registering:
                token = registering.register(profile, enrollment)["token"]
                _sybil.keys[token] = registering.signing_key
            certificate = issue_certificate(f"sybil-{index}", signatures.public_bytes(_sybil.keys[token]), server_key)
            admin.request("PUT", f"/v1/devices/sybil-{index}/certificate", json={"certificate": certificate})
            sybils.append(_sybil(server.url, token, federation.card.task, stop))
    config = secure_config(neighbour_count=8, target=DEVICES + 3, deadline_s=10)  # all neighbours
    outcomes, view = sdk_round(simulation, federation, config, extra_threads=sybils)
    stop.set()
    assert outcomes == ["refused: uncertified_key"] * DEVICES
    assert view["state"] == "failed" and view["result_model_id"] is None


def test_neighbours_refuse_a_device_whose_key_the_operator_revoked(simulation, federation, server, monkeypatch):
    with FedzooHTTP(server.url, token=ADMIN) as admin:
        revocations = revoke_device_keys(admin, simulation.operator_key, {"sim-device-5"})
    assert revocations.version == 1 and len(revocations.device_key_fingerprints) == 1
    clients = [device_client(simulation, index) for index in range(DEVICES)]
    round_id = simulation.start_plan(secure_config(deadline_s=3))
    answer = clients[5].fl_task(federation.card.task)  # an honest server no longer seats it
    assert answer["task"] is None and answer["reason"].startswith("key_revoked"), answer
    simulation.admin.wait_for_round(round_id, timeout_s=60)
    monkeypatch.setattr(server_certificates, "seat_refusal", lambda *_args: None)  # a server that seats it anyway
    outcomes, _ = sdk_round(simulation, federation, secure_config(deadline_s=10), clients)
    assert outcomes.count("refused: revoked_key") == 4  # device 5's k = 4 neighbours
    assert all(client.neighbour_trust.held_revocations().version == 1 for client in clients)


def test_a_server_withholding_the_list_still_faces_the_list_devices_hold(simulation, federation, server,
                                                                         monkeypatch):
    """Documented limitation: a server can withhold a newer list, and devices that never fetched it accept the key
    it revokes. It cannot make a device forget a list it holds: fetched once (here with `refresh_revocations`,
    the card path: one list, one state key, one version), it revokes the key in every later round."""
    clients = [device_client(simulation, index) for index in range(DEVICES)]
    with FedzooHTTP(server.url, token=ADMIN) as admin:
        revoke_device_keys(admin, simulation.operator_key, {"sim-device-5"})
    assert [client.refresh_revocations().version for client in clients] == [1] * DEVICES
    monkeypatch.setattr(server_revocations, "newest", lambda _session: None)  # GET /v1/revocations: 404 from now
    monkeypatch.setattr(server_certificates, "seat_refusal", lambda *_args: None)
    outcomes, view = sdk_round(simulation, federation, secure_config(deadline_s=10), clients)
    assert outcomes.count("refused: revoked_key") == 4 and view["state"] == "failed"  # device 5's k = 4 neighbours


def test_a_list_the_server_signed_itself_does_not_lift_a_revocation(simulation, federation, server, monkeypatch):
    """A non-operator key: the server signs "version 2" with the key it signs federated cards with (devices pin it
    for cards, in GET /v1/keys) and drops device 5 from it. This server was given no operator keys, so it stores the
    list; every device pinning the operator key set refuses it before the round, and keeps the operator's list."""
    with FedzooHTTP(server.url, token=ADMIN) as admin:
        revoke_device_keys(admin, simulation.operator_key, {"sim-device-5"})
        clients = [device_client(simulation, index) for index in range(DEVICES)]
        assert all(client.refresh_revocations().version == 1 for client in clients)
        forged = sign_revocation_list(CardSigningKey.load(server.data_dir / SERVER_KEY_FILE), 2)
        admin.request("POST", "/v1/revocations", json=forged, expected=(201,))
    monkeypatch.setattr(server_certificates, "seat_refusal", lambda *_args: None)
    outcomes, view = sdk_round(simulation, federation, secure_config(deadline_s=10), clients)
    assert outcomes == ["refused: bad_revocations"] * DEVICES and view["state"] == "failed"
    assert all(client.neighbour_trust.held_revocations().version == 1 for client in clients)


def test_a_device_keeps_the_newest_revocation_list_and_refuses_an_older_one(simulation, server):
    client = device_client(simulation, 0)
    with FedzooHTTP(server.url, token=ADMIN) as admin:
        assert client.served_revocation_list() is None
        revoke_device_keys(admin, simulation.operator_key, {"sim-device-5"})
        older = admin.get_json("/v1/revocations")
        revoke_device_keys(admin, simulation.operator_key, {"sim-device-4"})
        newer = admin.get_json("/v1/revocations")
    assert len(client.neighbour_trust.policy(newer).revoked_fingerprints) == 2
    with pytest.raises(ProtocolViolation) as refused:  # a server serving the list of before: rollback refused
        client.neighbour_trust.policy(older)
    assert refused.value.reason == "bad_revocations" and "rollback" in str(refused.value)
    assert len(client.neighbour_trust.policy(None).revoked_fingerprints) == 2  # withheld: the held list holds
    assert client.neighbour_trust.held_revocations().document == newer  # the one list the card checks use too


def test_devices_without_the_operator_key_set_decline_secure_rounds(simulation, federation, tmp_path):
    clients = [FedzooClient(simulation.server_url, token=simulation.tokens[index], cache_dir=tmp_path / f"{index}",
                            signing_key=device_client(simulation, index).signing_key) for index in range(DEVICES)]
    outcomes, view = sdk_round(simulation, federation, secure_config(deadline_s=5), clients)
    assert outcomes == ["refused: operator_keys_required"] * DEVICES
    assert view["state"] == "failed"


def test_a_device_without_a_valid_certificate_is_not_seated_in_a_secure_round(simulation, federation, server):
    enrollment = simulation.admin.create_enrollment_token(ADMIN, max_uses=1)["token"]
    profile = DeviceProfile(device_id="fresh", platform="linux-x86_64", cpu=CpuInfo(model="virtual", cores=1),
                            memory_mb=2048, runtime=RuntimeInfo(onnxruntime="simulated", threads=1))
    with FedzooClient(server.url) as fresh, FedzooHTTP(server.url, token=ADMIN) as admin:
        fresh.register(profile, enrollment)
        simulation.start_plan(secure_config())
        answer = fresh.fl_task(federation.card.task)
        assert answer["task"] is None and answer["reason"].startswith("certificate_required")
        expired = issue_certificate("fresh", signatures.public_bytes(fresh.signing_key), simulation.operator_key,
                                    now=datetime.now(timezone.utc) - timedelta(days=400))
        admin.request("PUT", "/v1/devices/fresh/certificate", json={"certificate": expired})
        answer = fresh.fl_task(federation.card.task)
        assert answer["task"] is None and answer["reason"].startswith("certificate_expired")


def test_certificate_endpoints_need_the_admin_token_and_name_bad_input(simulation, server):
    key = simulation.operator_key
    device_key = base64.b64decode(simulation.admin.http.get_json(
        "/v1/devices/signing-keys", headers={"Authorization": f"Bearer {ADMIN}"})["devices"][0]["signing_public_key"])
    certificate = {"certificate": issue_certificate("sim-device-0", device_key, key)}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for token in (None, "nope", VIEWER, simulation.tokens[0]):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            assert http.get("/v1/devices/signing-keys", headers=headers).status_code in (401, 403)
            assert http.put("/v1/devices/sim-device-0/certificate", json=certificate,
                            headers=headers).status_code in (401, 403)
        admin = {"Authorization": f"Bearer {ADMIN}"}
        listed = http.get("/v1/devices/signing-keys", params={"uncertified": "true"}, headers=admin).json()
        assert listed["devices"] == [] and listed["total"] == 0  # the simulation certified every device
        every = http.get("/v1/devices/signing-keys", params={"limit": 2}, headers=admin).json()
        assert every["total"] == DEVICES and every["next_offset"] == 2 and every["devices"][0]["certificate_key_id"]
        assert http.put("/v1/devices/sim-device-0/certificate", json=certificate, headers=admin).status_code == 200
        for body, field in (({"certificate": {"key_id": "x"}}, "certificate.key_id"), ({}, "certificate"),
                            ({"certificate": {**certificate["certificate"], "payload": "bm90IGpzb24="}},
                             "certificate")):
            bad = http.put("/v1/devices/sim-device-0/certificate", json=body, headers=admin)
            assert (bad.status_code, bad.json()["error"]["field"]) == (422, field), bad.text
        other = http.put("/v1/devices/sim-device-1/certificate", json=certificate, headers=admin)  # device 0's
        assert (other.status_code, other.json()["error"]["code"]) == (422, "certificate_not_trusted")
        assert http.put("/v1/devices/nobody/certificate", json=certificate, headers=admin).status_code == 404
        assert http.get("/v1/devices/signing-keys", params={"limit": 0}, headers=admin).status_code == 422
        as_list = http.post("/v1/revocations", json=certificate["certificate"], headers=admin)  # not a list
        assert (as_list.status_code, as_list.json()["error"]["field"]) == (422, "signature"), as_list.text
        assert http.get("/v1/revocations").status_code == 404


def test_a_server_given_the_operator_keys_refuses_certificates_they_did_not_sign(federation, tmp_path):
    operator, stranger = CardSigningKey.generate(), CardSigningKey.generate()
    keys_file = tmp_path / "operator-keys.json"
    import json
    from fedzoo.signing import TrustedKeys
    keys_file.write_text(json.dumps(TrustedKeys([operator.public_key_raw]).to_json()))
    with LoopbackServer(tmp_path / "server", trusted_keys=keys_file) as running, \
            FedzooClient(running.url, cache_dir=tmp_path / "device") as device, \
            httpx.Client(base_url=running.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30) as http:
        enrollment = http.post("/v1/enrollment-tokens", json={"max_uses": 1}).json()["token"]
        device.register(DeviceProfile(device_id="phone", platform="linux-x86_64", cpu=CpuInfo(model="v", cores=1),
                                      memory_mb=2048, runtime=RuntimeInfo(onnxruntime="simulated", threads=1)),
                        enrollment)
        raw = signatures.public_bytes(device.signing_key)
        foreign = http.put("/v1/devices/phone/certificate",
                           json={"certificate": issue_certificate("phone", raw, stranger)})
        assert (foreign.status_code, foreign.json()["error"]["reason"]) == (422, "unknown_key")
        good = http.put("/v1/devices/phone/certificate", json={"certificate": issue_certificate("phone", raw, operator)})
        assert good.status_code == 200 and good.json()["key_id"] == operator.key_id


def test_the_cli_certifies_what_awaits_a_certificate_and_publishes_revocations(simulation, server, tmp_path,
                                                                                        monkeypatch, capsys):
    enrollment = simulation.admin.create_enrollment_token(ADMIN, max_uses=1)["token"]
    with FedzooClient(server.url) as fresh:
        fresh.register(DeviceProfile(device_id="fresh", platform="linux-x86_64", cpu=CpuInfo(model="v", cores=1),
                                     memory_mb=2048, runtime=RuntimeInfo(onnxruntime="simulated", threads=1)),
                       enrollment)
    key_file = tmp_path / "operator.pem"
    simulation.operator_key.save(key_file)
    env = {"FEDZOO_ADMIN_TOKEN": ADMIN, "FEDZOO_SERVER": server.url}
    certified = CliRunner().invoke(cli, ["devices", "certify", "--signing-key", str(key_file)], env=env,
                                   catch_exceptions=False)
    assert certified.exit_code == 0 and certified.stdout.startswith("certified fresh with key ")
    assert "1 devices certified" in certified.stdout
    again = CliRunner().invoke(cli, ["devices", "certify", "--signing-key", str(key_file)], env=env)
    assert again.exit_code == 0 and "0 devices certified" in again.stdout
    revoked = CliRunner().invoke(cli, ["devices", "revoke-keys", "fresh", "--signing-key", str(key_file)], env=env)
    assert revoked.exit_code == 0 and "version 1: 1 device keys, 0 card ids" in revoked.stdout, revoked.output
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for arguments, named in ((["revoke-keys", "nobody", "--signing-key", str(key_file)], "nobody"),
                             (["certify", "--signing-key", str(tmp_path / "none.pem")], "none.pem")):
        with pytest.raises(SystemExit) as exit_:  # a message naming what is wrong, not a traceback
            main(["devices", *arguments])
        captured = capsys.readouterr()
        assert exit_.value.code == 1 and named in captured.err and "Traceback" not in captured.err


def test_the_device_cli_pins_the_operator_key_set_in_its_state_file(simulation, server, tmp_path):
    import json

    import click

    from fedzoo.clients.cli import _client
    from fedzoo.clients.device_state import load_state

    keys_file, state = tmp_path / "operator-keys.json", tmp_path / "client.json"
    keys_file.write_text(json.dumps(simulation.operator_keys.to_json()))
    enrollment = simulation.admin.create_enrollment_token(ADMIN, max_uses=1)["token"]
    registered = CliRunner().invoke(cli, ["client", "--server", server.url, "--state", str(state), "--operator-keys",
                                          str(keys_file), "register", "--device-id", "cli-phone", "--no-calibrate",
                                          "--enrollment-token", enrollment], catch_exceptions=False)
    assert registered.exit_code == 0, registered.output
    assert load_state(state)["operator_keys"] == simulation.operator_keys.to_json()
    options = {"server": None, "token": None, "state": state, "cache_dir": tmp_path / "cache", "trusted_keys": None,
               "operator_keys": None}  # a later command: the pinned set comes from the state file
    with _client(click.Context(click.Command("x"), obj=options)) as device:
        assert device.neighbour_trust.operator_keys.key_ids == simulation.operator_keys.key_ids
