"""The real fedzoo server on loopback for the Java SDK's live tests, driven over stdin/stdout.

JUnit (`LiveServer.java`) starts `$FEDZOO_PYTHON tests/clients/java_live_server.py --data-dir DIR`. This script
prepares a digits federation (the same `prepare_federation` the Python SDK's tests use), serves it with
`LoopbackServer` (the server app on a werkzeug thread, SQLite in DIR) trusting an operator key, publishes the
base model signed by that key and its evaluation set, writes each device shard and the test split as `.npz`
into DIR, then prints one JSON line:

    {"ready": true, "url", "admin_token", "enrollment_token", "model_id", "family", "task", "evaluation_sha256",
     "shards", "python_accuracy", "operator_key_id"}
    (python_accuracy: the Python SDK's EdgeSession accuracy on DIR/test.npz; enrollment_token: one the admin
     created for every device of the run, Java and Python; the versions rounds publish are signed by the
     server's own key: GET /v1/keys lists both)

After that it answers one JSON line per command line on stdin:

    {"cmd": "restart"}                                     stop and start the server (same port and data)
    {"cmd": "python_device", "device_id", "shard", "encoding"}
                                                           a Python SDK device registers and participates once
    {"cmd": "expire_token", "device_id"}                   end a device's token lifetime now (as if its TTL passed)
    {"cmd": "revoke", "device_id"}                         the admin revokes a device (POST /v1/devices/<id>/revoke)
    {"cmd": "quit"}
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path

import numpy as np

from fedzoo.clients.client import FedzooClient
from fedzoo.clients.participation import participate_once
from fedzoo.cloud.simulation import DEFAULT_ADMIN_TOKEN, LoopbackServer, Simulation, prepare_federation
from fedzoo.device import CpuInfo, DeviceProfile, RuntimeInfo
from fedzoo.edge.runtime import EdgeSession
from fedzoo.signing import CardSigningKey, TrustedKeys

NUM_SHARDS = 4


def _reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _python_device(server: LoopbackServer, federation, data_dir: Path, enrollment_token: str, command: dict) -> dict:
    profile = DeviceProfile(device_id=command["device_id"], platform="linux-x86_64", cpu=CpuInfo(model="python", cores=1),
                            memory_mb=1024, runtime=RuntimeInfo(onnxruntime="python", threads=1))
    with FedzooClient(server.url, cache_dir=data_dir / "python-devices" / command["device_id"]) as client:
        client.register(profile, enrollment_token)
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

    with LoopbackServer(data_dir / "server", admin_token=DEFAULT_ADMIN_TOKEN, trusted_keys=operator_keys) as server:
        with Simulation(federation, server.url, cache_root=data_dir / "admin") as simulation:
            simulation.publish_base_model(signing_key=operator)
            enrollment_token = simulation.admin.create_enrollment_token(DEFAULT_ADMIN_TOKEN, max_uses=1000,
                                                                        label="java live tests")["token"]
            _reply({"ready": True, "url": server.url, "admin_token": DEFAULT_ADMIN_TOKEN,
                    "enrollment_token": enrollment_token, "model_id": federation.card.id,
                    "family": federation.card.family, "task": federation.card.task,
                    "evaluation_sha256": simulation.evaluation_sha256, "shards": NUM_SHARDS,
                    "python_accuracy": python_accuracy, "operator_key_id": operator.key_id})
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
                elif command["cmd"] == "python_device":
                    _reply(_python_device(server, federation, data_dir, enrollment_token, command))
                else:
                    _reply({"error": f"unknown command {command['cmd']!r}"})


if __name__ == "__main__":
    main()
