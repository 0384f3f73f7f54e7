"""The real fedzoo server on loopback for the Java SDK's live tests, driven over stdin/stdout.

JUnit (`LiveServer.java`) starts `$FEDZOO_PYTHON tests/clients/java_live_server.py --data-dir DIR`. This script
prepares a digits federation (the same `prepare_federation` the Python SDK's tests use), serves it with
`LoopbackServer` (the server app on a werkzeug thread, SQLite in DIR) trusting an operator key, publishes the
base model signed by that key and its evaluation set, writes each device shard and the test split as `.npz`
into DIR, then prints one JSON line:

    {"ready": true, "url", "admin_token", "enrollment_token", "model_id", "family", "task", "evaluation_sha256",
     "shards", "python_accuracy", "operator_key_id", "operator_keys"}
    (python_accuracy: the Python SDK's EdgeSession accuracy on DIR/test.npz; enrollment_token: one the admin
     created for every device of the run, Java and Python; the versions rounds publish are signed by the
     server's own key: GET /v1/keys lists both; operator_keys: the operator key set, which devices pin for their
     SecAgg+ neighbours' certificates)

After that it answers one JSON line per command line on stdin:

    {"cmd": "restart"}                                     stop and start the server (same port and data)
    {"cmd": "python_device", "device_id", "shard", "encoding"}
                                                           a Python SDK device registers and participates once
    {"cmd": "expire_token", "device_id"}                   end a device's token lifetime now (as if its TTL passed)
    {"cmd": "revoke", "device_id"}                         the admin revokes a device (POST /v1/devices/<id>/revoke)
    {"cmd": "certify"}                                     the operator certifies every device key awaiting a certificate
    {"cmd": "python_secure_devices", "device_ids", "seed", "num_examples"}
                                                           Python SDK devices register and, each in a thread, take part
                                                           in the open SecAgg+ round (take_part_securely) with a delta on
                                                           exact quantisation levels (k / 128, k in [-127, 127], for a
                                                           clip_range of 127/128 and weight 1): answers their "levels"
    {"cmd": "python_secure_results"}                       waits for those devices: {"outcomes": [...]}
    {"cmd": "check_secure_sum", "round_id", "levels"}      the largest difference between the round's published model
                                                           and its base plus the FedAvg of these devices' levels / 128
    {"cmd": "substitute_relayed_keys", "on"}            while on, the server lies in SecAgg+ rounds it starts: it relays
                                                           X25519 keys of its own making as every device's neighbours',
                                                           under the neighbours' genuine signatures
    {"cmd": "substitute_signing_keys", "on"}            while on, the server relays long-term signing keys of its own
                                                           making as every device's neighbours', and signs their round
                                                           keys and survivor sets with them (no certificate fits them)
    {"cmd": "seat_sybils", "count"}                     the server enrolls `count` devices of its own, "certifies" their
                                                           keys with its own card-signing key (written straight into its
                                                           database: the operator would never sign them), and each, in a
                                                           thread, takes a seat in the next SecAgg+ round and advertises
                                                           keys: answers their device ids
    {"cmd": "stop_sybils"}                               the Sybils stop polling
    {"cmd": "zoo_server", "shards"}                      a second server on loopback holding a tiny zoo of digits
                                                           (built now: seconds), its models timed for device class
                                                           "tier-large"; writes DIR/zoo-shard-<i>.npz (images): answers
                                                           {url, enrollment_token, task, supernet_id}
    {"cmd": "certify_zoo"}                               the operator certifies every device key the zoo server holds
    {"cmd": "zoo_round", "devices", "noise"              the zoo server opens a zoo-wide round of `devices` under
     [, "device_batch_norm"]}                              SecAgg+ and DP (`noise`: central or distributed, z = 1.5),
                                                           the devices' BatchNorm "training" (default) or "inference":
                                                           answers {round_id, noise_multiplier}
    {"cmd": "publish_privacy_terms", "version", "lines"}  the operator signs privacy terms of `lines` ({line or "*":
                                                           {"mode", "minimum_noise_multiplier"}}) and the admin uploads
                                                           them (POST /v1/privacy-terms): answers {version, lines}
    {"cmd": "quit"}
"""

from __future__ import annotations

import argparse
import io
import json
import sqlite3
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from fedzoo.admin.operator_client import OperatorClient
from fedzoo.cards import Latency, is_supernet
from fedzoo.clients.client import FedzooClient
from fedzoo.clients.device_certification import certify_devices
from fedzoo.clients.http import FedzooHTTP
from fedzoo.clients.participation import participate_once
from fedzoo.clients.secure_participation import take_part_securely
from fedzoo.edge.onnx_initializers import read_float_initializers
from fedzoo.device_certificates import issue_certificate
from fedzoo.privacy_terms import sign_privacy_terms
from fedzoo.secagg import SecAggClient, SecAggConfig, crypto, flatten, signatures, unflatten
from fedzoo.secagg.messages import to_base64
from fedzoo.server.card_keys import SERVER_KEY_FILE
from fedzoo.server.fl import secure_rounds
from fedzoo.cloud.simulation import Simulation, prepare_federation
from fedzoo.datasets import dirichlet_partition, load_dataset, split_dataset
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN, LoopbackServer
from fedzoo.device import CpuInfo, DeviceProfile, RuntimeInfo
from fedzoo.edge.runtime import EdgeSession
from fedzoo.signing import CardSigningKey, TrustedKeys
from fedzoo.zoo import Zoo

NUM_SHARDS = 4


def _reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _python_device(server: LoopbackServer, federation, data_dir: Path, enrollment_token: str, command: dict) -> dict:
    with FedzooClient(server.url, cache_dir=data_dir / "python-devices" / command["device_id"]) as client:
        client.register(_profile(command["device_id"]), enrollment_token)
        result = participate_once(client, federation.card.task, federation.client_data(command["shard"]),
                                  command.get("encoding", "fp32"))
    return {"round_id": result.round_id, "outcome": result.outcome, "upload_bytes": result.upload_bytes}


def _expire_token(server: LoopbackServer, device_id: str) -> dict:
    # the token's lifetime ends in the database, where the server reads it on every request
    with sqlite3.connect(server.data_dir / "registry.db") as database:
        changed = database.execute("UPDATE devices SET token_expires_at = '2000-01-01 00:00:00.000000' WHERE id = ?",
                                   (device_id,)).rowcount
    return {"ok": changed == 1}


def _revoke(server: LoopbackServer, device_id: str) -> dict:
    with FedzooClient(server.url) as admin:
        answer = admin.http.request("POST", f"/v1/devices/{device_id}/revoke",
                                    headers={"Authorization": f"Bearer {DEFAULT_ADMIN_TOKEN}"})
    return {"ok": answer.status_code == 200}


def _certify(server: LoopbackServer, operator: CardSigningKey) -> dict:
    with FedzooHTTP(server.url, token=DEFAULT_ADMIN_TOKEN) as admin:
        return {"certified": len(certify_devices(admin, operator))}


def _publish_privacy_terms(server: LoopbackServer, operator: CardSigningKey, command: dict) -> dict:
    """The operator signs privacy terms (`fedzoo.privacy_terms`) and the admin uploads them."""
    with FedzooHTTP(server.url, token=DEFAULT_ADMIN_TOKEN) as admin:
        return admin.post_json("/v1/privacy-terms", sign_privacy_terms(operator, command["version"], command["lines"]),
                               expected=(201,))


LEVEL_SCALE = 128  # a delta of k / 128 quantises exactly to k when clip_range = 127 / 128 and the weight is 1


class SecureDevices:
    """Python SDK devices taking part in a SecAgg+ round in threads, each with a delta on exact levels."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.outcomes: dict[str, str] = {}

    def start(self, server: LoopbackServer, federation, data_dir: Path, enrollment_token: str, operator: CardSigningKey,
              command: dict) -> dict:
        shapes = {name: value.shape for name, value in read_float_initializers(federation.model).items()}
        rng = np.random.default_rng(command["seed"])
        levels = {}
        for device_id in command["device_ids"]:
            delta = {name: (rng.integers(-127, 128, shape) / LEVEL_SCALE).astype(np.float32)
                     for name, shape in shapes.items()}
            levels[device_id] = [int(round(value * LEVEL_SCALE)) for value in flatten(delta)]
            folder = data_dir / "python-devices" / device_id
            client = FedzooClient(server.url, cache_dir=folder, state_file=folder / "state.json",
                                  operator_keys=TrustedKeys([operator.public_key_raw]))
            client.register(_profile(device_id), enrollment_token)
            _certify(server, operator)
            work = client.fl_task(federation.card.task)["task"]  # selected now, so seated before the stages open
            thread = threading.Thread(target=self._take_part, args=(client, federation.card.task, work, delta,
                                                                     command["num_examples"]), daemon=True)
            thread.start()
            self.threads.append(thread)
        return {"levels": levels}

    def _take_part(self, client: FedzooClient, task: str, work: dict, delta: dict, num_examples: int) -> None:
        try:
            outcome, _sent = take_part_securely(client, work, delta, num_examples, lambda: client.fl_task(task),
                                                sleep=lambda seconds: time.sleep(min(seconds, 0.2)))
        except Exception as error:  # reported to the Java test
            outcome = f"error: {error!r}"
        self.outcomes[client.device_id] = outcome

    def results(self) -> dict:
        for thread in self.threads:
            thread.join(timeout=120)
        self.threads = []
        return {"outcomes": self.outcomes}


def _check_secure_sum(simulation: Simulation, command: dict) -> dict:
    view = simulation.admin.fl_round(command["round_id"])
    base = read_float_initializers(simulation.admin.download_model(simulation.admin.card(view["base_model_id"]))
                                   .read_bytes())
    published = read_float_initializers(simulation.admin.download_model(simulation.admin.card(view["result_model_id"]))
                                        .read_bytes())
    levels = np.asarray(command["levels"], dtype=np.float64)
    mean = unflatten(levels.sum(axis=0) / LEVEL_SCALE / len(levels), {name: value.shape for name, value in base.items()})
    return {"max_abs_diff": max(float(np.max(np.abs(published[name] - (base[name] + mean[name])))) for name in base)}


class KeySubstitutingServer(secure_rounds.SecAggServer):
    """A lying server (docs/privacy.md, "Threat model"): the keys it relays are its own, so that it could decrypt the
    shares and remove the masks; the signatures are the neighbours' own, over the keys they advertised."""

    def collect_keys(self, replies: list[dict]) -> dict[int, dict]:
        requests = super().collect_keys(replies)
        return {client: dict(request, public_keys=[dict(entry, cipher_public_key=to_base64(crypto.new_key_pair()[1]))
                                                   for entry in request["public_keys"]])
                for client, request in requests.items()}


class SigningKeySubstitutingServer(secure_rounds.SecAggServer):
    """A lying server that puts long-term signing keys of its own in every neighbour's place and signs what it
    relays with them: a device that trusted the server's word for its neighbours' keys would accept every signature."""

    forged_keys: dict[int, object] = {}

    def collect_keys(self, replies: list[dict]) -> dict[int, dict]:
        requests = super().collect_keys(replies)
        for request in requests.values():
            for entry in request["public_keys"]:
                key = self.forged_keys.setdefault(entry["client"], signatures.new_signing_key())
                payload = self.advertise_payload(entry["client"], *self.keys[entry["client"]],
                                                 self.nonces[entry["client"]])
                entry["signing_public_key"] = to_base64(signatures.public_bytes(key))
                entry["signature"] = to_base64(key.sign(payload))
        return requests

    def collect_consistency(self, replies: list[dict]) -> dict[int, dict]:
        requests = super().collect_consistency(replies)
        for request in requests.values():
            for entry in request["signatures"]:
                payload = self.consistency_payload(entry["client"], request["survivors"])
                entry["signature"] = to_base64(self.forged_keys[entry["client"]].sign(payload))
        return requests


HONEST_SERVER = secure_rounds.SecAggServer


def _substitute(command: dict, lying_server: type) -> dict:
    secure_rounds.SecAggServer = lying_server if command["on"] else HONEST_SERVER
    return {"ok": True}


class Sybils:
    """Devices the server made: enrolled, their keys "certified" with the server's own key, each answering the
    first SecAgg+ stage of the round it is seated in with key pairs of the server's making."""

    def __init__(self) -> None:
        self.stop = threading.Event()

    def seat(self, server: LoopbackServer, federation, enrollment_token: str, count: int) -> dict:
        own_key = CardSigningKey.load(server.data_dir / SERVER_KEY_FILE)
        device_ids = [f"sybil-{index}" for index in range(count)]
        for device_id in device_ids:
            client = FedzooClient(server.url)
            client.register(_profile(device_id), enrollment_token)
            certificate = issue_certificate(device_id, signatures.public_bytes(client.signing_key), own_key)
            with sqlite3.connect(server.data_dir / "registry.db") as database:  # no upload: it would be refused
                database.execute("INSERT INTO device_certificates (device_id, certificate_json, key_id, expires_at, "
                                 "uploaded_at) VALUES (?, ?, ?, '2100-01-01 00:00:00.000000', "
                                 "'2026-01-01 00:00:00.000000')", (device_id, json.dumps(certificate), own_key.key_id))
            threading.Thread(target=self._advertise, args=(client, federation.card.task), daemon=True).start()
        return {"device_ids": device_ids}

    def _advertise(self, client: FedzooClient, task: str) -> None:
        with client:
            while not self.stop.is_set():
                secure = ((client.fl_task(task)["task"] or {}).get("privacy") or {}).get("secure_aggregation") or {}
                if secure.get("stage") == "advertise_keys" and secure.get("request") is not None:
                    reply = SecAggClient(SecAggConfig.from_dict(secure["config"]), secure["client"],
                                         client.signing_key).advertise_keys()
                    client.secure_reply(secure["reply_url"], {name: reply[name] for name in (
                        "cipher_public_key", "mask_public_key", "nonce", "signature")})
                    return
                time.sleep(0.05)


ZOO_TIER = "tier-large"


class ZooServer:
    """A second server on loopback with a tiny zoo (built on first use, so only the zoo test pays for it): zoo-wide
    rounds re-publish every zoo model, and a zoo of the federation's task beside its MLP would mix their inputs."""

    def __init__(self, stack: ExitStack, data_dir: Path, operator: CardSigningKey) -> None:
        self.stack, self.data_dir, self.operator = stack, data_dir, operator
        self.server: LoopbackServer | None = None
        self.plan: dict = {}

    def start(self, command: dict) -> dict:
        from fedzoo.cloud.pipeline import BuildConfig, build_zoo

        out = self.data_dir / "zoo"
        # the tiny preset cut to one supernet epoch, no fine-tune and a 4-candidate search: the test is about the
        # zoo-wide round's protocol and privacy, not the zoo's accuracy (the round's accuracy gate is open)
        build_zoo(BuildConfig(dataset="digits", out=out, preset="tiny", latency_source="macs", compress=False,
                              executor="in-process", zoo_min_size=2, zoo_max_size=3, epochs=1, finetune_epochs=0,
                              evaluations=4, population_size=4))
        zoo = Zoo(out)
        for card in zoo.cards():  # timed on the tier the Java devices say they are, so lookup can choose for them
            zoo.add_card(card.model_copy(update={"latency_ms": {
                **card.latency_ms, ZOO_TIER: Latency(median_ms=card.macs / 1e4, source="measured")}}))
        split = split_dataset(load_dataset("digits"), seed=0)
        for index, shard in enumerate(dirichlet_partition(split.train.y, num_clients=command["shards"], alpha=0.5,
                                                          seed=0)):
            np.savez(self.data_dir / f"zoo-shard-{index}.npz", x=split.train.x[shard].astype(np.float32),
                     y=split.train.y[shard].astype(np.int64))
        self.server = self.stack.enter_context(LoopbackServer(self.data_dir / "zoo-server",
                                                              admin_token=DEFAULT_ADMIN_TOKEN, deadline_check_s=0.2))
        with OperatorClient(self.server.url, token=DEFAULT_ADMIN_TOKEN, cache_dir=self.data_dir / "zoo-admin") as admin:
            for card in zoo.cards():
                digests = [card.sha256, *card.artifacts.values(), *([card.training_graph] if card.training_graph
                                                                     else [])]
                admin.publish_model(card, {digest: zoo.blob_path(digest).read_bytes() for digest in digests},
                                    DEFAULT_ADMIN_TOKEN)
            supernet = next(card for card in zoo.cards() if is_supernet(card))
            self.plan = {"model_id": supernet.id, "evaluation_sha256": admin.publish_blob(
                _npz_bytes(x=split.test.x, y=split.test.y), DEFAULT_ADMIN_TOKEN),
                "zoo": {"latency_budget_ms": 1e5, "calibration_sha256": admin.publish_blob(
                    _npz_bytes(x=split.validation.x), DEFAULT_ADMIN_TOKEN)}}
            enrollment = admin.create_enrollment_token(DEFAULT_ADMIN_TOKEN, max_uses=100)["token"]
        return {"url": self.server.url, "enrollment_token": enrollment, "task": supernet.details["supernet"]["task"],
                "supernet_id": supernet.id}

    def certify(self) -> dict:
        return _certify(self.server, self.operator)

    def open_round(self, command: dict) -> dict:
        noise_multiplier = 1.5
        zoo = {**self.plan["zoo"], "device_batch_norm": command.get("device_batch_norm", "training")}
        plan = {**self.plan, "zoo": zoo, "min_clients": command["devices"], "target_clients": command["devices"],
                "over_selection": 0.0, "deadline_s": 240, "local_epochs": 1, "batch_size": 16, "learning_rate": 0.05,
                "max_accuracy_drop": 1.0, "poll_interval_s": 0.1,
                "privacy": {"secure_aggregation": {"neighbour_count": 2, "levels": 32767, "stage_deadline_s": 60},
                            "dp": {"max_epsilon": 50.0, "clip_norm": 0.5, "noise_multiplier": noise_multiplier,
                                   "noise": command["noise"]}}}
        with OperatorClient(self.server.url, token=DEFAULT_ADMIN_TOKEN, cache_dir=self.data_dir / "zoo-admin") as admin:
            return {"round_id": admin.create_zoo_rounds(plan, DEFAULT_ADMIN_TOKEN)["id"],
                    "noise_multiplier": noise_multiplier}


def _npz_bytes(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _profile(device_id: str) -> DeviceProfile:
    return DeviceProfile(device_id=device_id, platform="linux-x86_64", cpu=CpuInfo(model="python", cores=1),
                         memory_mb=1024, runtime=RuntimeInfo(onnxruntime="python", threads=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    data_dir = parser.parse_args().data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    federation = prepare_federation("digits", num_clients=NUM_SHARDS, alpha=1.0, hidden_units=16, pretrain_epochs=1,
                                    seed=1)
    for index in range(NUM_SHARDS):
        shard = federation.client_data(index)
        np.savez(data_dir / f"shard-{index}.npz", x=shard.x, y=shard.y)
    test = federation.split.test
    np.savez(data_dir / "test.npz", x=test.x, y=test.y)
    python_accuracy = float((EdgeSession(federation.model, federation.card).predict(test.x) == test.y).mean())

    operator = CardSigningKey.generate()
    operator_keys = data_dir / "operator-keys.json"
    operator_keys.write_text(json.dumps(TrustedKeys([operator.public_key_raw]).to_json()))

    # deadlines checked every 0.2 s, not every second: a round the tests let run out ends 0.2 s after its deadline
    with LoopbackServer(data_dir / "server", admin_token=DEFAULT_ADMIN_TOKEN, trusted_keys=operator_keys,
                        deadline_check_s=0.2) as server, \
            ExitStack() as stack:
        with Simulation(federation, server.url, cache_root=data_dir / "admin") as simulation:
            simulation.publish_base_model(signing_key=operator)
            enrollment_token = simulation.admin.create_enrollment_token(DEFAULT_ADMIN_TOKEN, max_uses=1000,
                                                                        label="java live tests")["token"]
            _reply({"ready": True, "url": server.url, "admin_token": DEFAULT_ADMIN_TOKEN,
                    "enrollment_token": enrollment_token, "model_id": federation.card.id,
                    "family": federation.card.family, "task": federation.card.task,
                    "evaluation_sha256": simulation.evaluation_sha256, "shards": NUM_SHARDS,
                    "python_accuracy": python_accuracy, "operator_key_id": operator.key_id,
                    "operator_keys": TrustedKeys([operator.public_key_raw]).to_json()})
            secure_devices, sybils, zoo = SecureDevices(), Sybils(), ZooServer(stack, data_dir, operator)
            for line in sys.stdin:
                command = json.loads(line)
                if command["cmd"] == "quit":
                    break
                if command["cmd"] == "restart":
                    server.restart()
                    _reply({"ok": True, "url": server.url})
                elif command["cmd"] == "expire_token":
                    _reply(_expire_token(server, command["device_id"]))
                elif command["cmd"] == "revoke":
                    _reply(_revoke(server, command["device_id"]))
                elif command["cmd"] == "python_secure_devices":
                    _reply(secure_devices.start(server, federation, data_dir, enrollment_token, operator, command))
                elif command["cmd"] == "certify":
                    _reply(_certify(server, operator))
                elif command["cmd"] == "publish_privacy_terms":
                    _reply(_publish_privacy_terms(server, operator, command))
                elif command["cmd"] == "python_secure_results":
                    _reply(secure_devices.results())
                elif command["cmd"] == "check_secure_sum":
                    _reply(_check_secure_sum(simulation, command))
                elif command["cmd"] == "substitute_relayed_keys":
                    _reply(_substitute(command, KeySubstitutingServer))
                elif command["cmd"] == "substitute_signing_keys":
                    _reply(_substitute(command, SigningKeySubstitutingServer))
                elif command["cmd"] == "seat_sybils":
                    _reply(sybils.seat(server, federation, enrollment_token, command["count"]))
                elif command["cmd"] == "stop_sybils":
                    sybils.stop.set()
                    _reply({"ok": True})
                elif command["cmd"] == "zoo_server":
                    _reply(zoo.start(command))
                elif command["cmd"] == "certify_zoo":
                    _reply(zoo.certify())
                elif command["cmd"] == "zoo_round":
                    _reply(zoo.open_round(command))
                elif command["cmd"] == "python_device":
                    _reply(_python_device(server, federation, data_dir, enrollment_token, command))
                else:
                    _reply({"error": f"unknown command {command['cmd']!r}"})


if __name__ == "__main__":
    main()
