"""`fedzoo serve` itself: imports a zoo directory, serves with gunicorn workers, and shuts down
gracefully — a download in flight when SIGTERM arrives still completes."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_helpers import (
    ADMIN_TOKEN, create_enrollment_token, device_profile, fedzoo_command, make_card, start_gunicorn, stop_gunicorn, tiny_onnx_model,
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


def test_the_serving_process_loads_no_onnxruntime_before_forking_workers():
    # onnxruntime >= 1.30 starts a thread when imported: a worker forked from a master holding it aborts on exit
    probe = ("import sys, fedzoo.server.cli; "
             "print(sorted(name for name in ('onnxruntime', 'torch', 'fedzoo.server.app') if name in sys.modules))")
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"


def test_gunicorn_serves_lookups_and_finishes_a_download_on_sigterm(tmp_path, zoo_dir):
    server = start_gunicorn(tmp_path / "data", "--zoo", str(zoo_dir), workers=2)
    try:
        with httpx.Client(base_url=server.base_url, timeout=30) as client:
            registration = client.post("/v1/devices", json=device_profile("edge-1", device_class="edge-box"),
                                       headers={"Authorization": f"Bearer {create_enrollment_token(server.base_url)}"})
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
        log = server.log()
        assert "Handling signal: term" in log and "Shutting down: Master" in log
        assert "terminate called" not in log and "SIGABRT" not in log
    finally:
        stop_gunicorn(server)
    assert ADMIN_TOKEN not in log


def _post(url: str, **kwargs) -> httpx.Response:
    """A request on a fresh connection, so the master hands each one to whichever worker accepts first."""
    return httpx.post(url, timeout=30, **kwargs)


def test_enrollment_uses_rate_limits_and_revocation_hold_across_workers(tmp_path, zoo_dir):
    server = start_gunicorn(tmp_path / "data", "--zoo", str(zoo_dir), workers=2,
                            env={"FEDZOO_RATE_LIMIT_LOOKUP_PER_DEVICE": "10/minute"})
    try:
        enrollment = {"Authorization": f"Bearer {create_enrollment_token(server.base_url, max_uses=5)}"}
        with ThreadPoolExecutor(max_workers=8) as pool:  # 12 devices race for 5 uses
            registrations = list(pool.map(lambda index: _post(
                f"{server.base_url}/v1/devices", json=device_profile(f"edge-{index}", device_class="edge-box"),
                headers=enrollment), range(12)))
        enrolled = [answer.json()["token"] for answer in registrations if answer.status_code == 201]
        refused = [answer.json()["error"]["code"] for answer in registrations if answer.status_code != 201]
        assert len(enrolled) == 5 and refused == ["enrollment_token_used_up"] * 7

        lookup = {"task": "digits", "latency_budget_ms": 10}
        device = {"Authorization": f"Bearer {enrolled[0]}"}
        with ThreadPoolExecutor(max_workers=6) as pool:  # one counter for both workers: 10 answered, not 20
            statuses = list(pool.map(lambda _: _post(f"{server.base_url}/v1/lookup", json=lookup,
                                                     headers=device).status_code, range(30)))
        assert statuses.count(200) == 10 and statuses.count(429) == 20

        other = {"Authorization": f"Bearer {enrolled[1]}"}
        assert _post(f"{server.base_url}/v1/lookup", json=lookup, headers=other).status_code == 200
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        revoked_id = next(answer.json()["device_id"] for answer in registrations
                          if answer.status_code == 201 and answer.json()["token"] == enrolled[1])
        assert _post(f"{server.base_url}/v1/devices/{revoked_id}/revoke", headers=admin).status_code == 200
        with ThreadPoolExecutor(max_workers=4) as pool:  # refused from the next request on, by every worker
            codes = list(pool.map(lambda _: _post(f"{server.base_url}/v1/lookup", json=lookup,
                                                  headers=other).json()["error"]["code"], range(8)))
        assert codes == ["device_revoked"] * 8
    finally:
        stop_gunicorn(server)


def test_open_enrollment_is_announced_by_every_worker_and_in_health(tmp_path):
    server = start_gunicorn(tmp_path / "data", workers=2, env={"FEDZOO_OPEN_ENROLLMENT": "1"})
    try:
        assert httpx.get(f"{server.base_url}/v1/health").json() == {"status": "ok", "open_enrollment": True}
        assert _post(f"{server.base_url}/v1/devices", json=device_profile("walk-in")).status_code == 201
    finally:
        stop_gunicorn(server)
    assert server.log().count("OPEN ENROLLMENT") == 2
