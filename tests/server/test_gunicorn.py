"""`fedzoo serve` itself: imports a zoo directory, serves with gunicorn workers, and shuts down
gracefully — a download in flight when SIGTERM arrives still completes."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess

import httpx
import pytest
from server_helpers import (
    ADMIN_TOKEN, device_profile, fedzoo_command, make_card, start_gunicorn, stop_gunicorn, tiny_onnx_model,
)

from fedzoo.zoo import Zoo

pytestmark = pytest.mark.slow
ARTIFACT_BYTES = 24 * 1024 * 1024  # larger than the socket buffers, so the download is really in flight


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    zoo = Zoo.create(root)
    artifact = zoo.add_blob_bytes(os.urandom(ARTIFACT_BYTES))
    # latencies measured on the "edge-box" class, so the choice does not depend on which predictor is installed
    for index, (accuracy, latency_ms) in enumerate([(0.8, 1.0), (0.9, 5.0), (0.97, 60.0)]):
        blob = tiny_onnx_model(seed=100 + index)
        zoo.add_blob_bytes(blob)
        zoo.add_card(make_card(blob, f"zoo-{index}", accuracy, 1000, artifacts={"torch_state": artifact},
                               latency_ms={"edge-box": {"median_ms": latency_ms, "source": "measured"}}))
    return root


def run_import(data_dir, zoo_dir) -> str:
    env = {**os.environ, "FEDZOO_DATA_DIR": str(data_dir)}
    env.pop("FEDZOO_DATABASE_URL", None)
    completed = subprocess.run([*fedzoo_command(), "serve", "--zoo", str(zoo_dir), "--import-only"], env=env,
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


def test_import_only_publishes_the_zoo_once(tmp_path, zoo_dir):
    assert "3 models (3 new)" in run_import(tmp_path / "data", zoo_dir)
    assert "3 models (0 new)" in run_import(tmp_path / "data", zoo_dir)


def test_gunicorn_serves_lookups_and_finishes_a_download_on_sigterm(tmp_path, zoo_dir):
    server = start_gunicorn(tmp_path / "data", "--zoo", str(zoo_dir), workers=2)
    try:
        with httpx.Client(base_url=server.base_url, timeout=30) as client:
            registration = client.post("/v1/devices", json=device_profile("edge-1", device_class="edge-box"))
            assert registration.status_code == 201
            token = registration.json()["token"]
            for _ in range(20):  # whichever worker answers, it reads the same registry
                answer = client.post("/v1/lookup", json={"task": "digits", "latency_budget_ms": 10},
                                     headers={"Authorization": f"Bearer {token}"})
                assert answer.status_code == 200 and answer.json()["model"]["id"] == "zoo-1"
                assert answer.json()["latency_basis"] == "card_device_class"
            # an early 401 leaves 200 KB of body unread (gunicorn drains 64 KiB at most): the answer must say
            # Connection: close, so this client's next request goes out on a fresh connection and works
            refused = client.post("/v1/lookup", content=b"{" + b" " * 200_000 + b"}",
                                  headers={"Content-Type": "application/json"})
            assert refused.status_code == 401 and refused.headers["Connection"] == "close"
            assert client.get("/v1/health").status_code == 200
            too_long = client.get("/v1/models", params={"task": "x" * 5000})  # as the OpenAPI document says
            assert too_long.status_code == 414 and too_long.headers["Content-Type"].startswith("text/html")
            card = client.get("/v1/models/zoo-1").json()
            artifact = card["artifacts"]["torch_state"]
            with client.stream("GET", f"/v1/blobs/{artifact}") as download:
                digest = hashlib.sha256()
                chunks = download.iter_bytes()
                digest.update(next(chunks))
                server.process.send_signal(signal.SIGTERM)
                for chunk in chunks:
                    digest.update(chunk)
            assert download.status_code == 200 and digest.hexdigest() == artifact
        assert server.process.wait(timeout=30) == 0
        log = server.process.stdout.read()
        assert "Handling signal: term" in log and "Shutting down: Master" in log
        assert "terminate called" not in log and "SIGABRT" not in log
    finally:
        stop_gunicorn(server)
    assert ADMIN_TOKEN not in log
