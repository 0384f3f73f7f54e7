"""Helpers for the server tests: tiny real ONNX models and cards, device profiles, a real HTTP server
on loopback (werkzeug in a thread for speed; `start_gunicorn` runs `fedzoo serve` itself), and a
snapshot of everything stored so a test can assert that a refused request changed nothing.
The fixtures themselves are in conftest.py; import helpers with `from server_helpers import ...`."""

from __future__ import annotations

import hashlib
import re
import os
import uuid
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError
from werkzeug.serving import make_server

from fedzoo.cards import ModelCard
from fedzoo.server.app import create_app
from fedzoo.server.config import ServerConfig
from fedzoo.server.latency import CalibrationScalingEstimator

ADMIN_TOKEN = "test-admin-token-0123456789abcdefghijklmnop"
VIEWER_TOKEN = "test-viewer-token-9876543210zyxwvutsrqpo"
# The reference device's timings of two calibration models; a device twice as slow reports 2x these.
REFERENCE_CALIBRATION_MS = {"cal-dense-fp32": 2.0, "cal-tiny-fp32": 0.5}
# a device's last-seen time moves with any authenticated request, refused or not: not data a request stores
NOT_STORED_DATA = ("last_seen_at",)
REGISTRY_TABLES = ("models", "model_class_latency", "devices", "latency_reports", "measured_latency",
                   "enrollment_tokens")


def tiny_onnx_model(seed: int, hidden: int = 8) -> bytes:
    """A real ONNX classifier (Flatten -> Gemm -> Relu -> Gemm) on a 1x4x4 input; bytes differ per seed."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weights = [
        numpy_helper.from_array(rng.normal(size=(16, hidden)).astype(np.float32), "w1"),
        numpy_helper.from_array(np.zeros(hidden, np.float32), "b1"),
        numpy_helper.from_array(rng.normal(size=(hidden, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(np.zeros(3, np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("Flatten", ["input"], ["flat"]),
        helper.make_node("Gemm", ["flat", "w1", "b1"], ["hidden"]),
        helper.make_node("Relu", ["hidden"], ["activated"]),
        helper.make_node("Gemm", ["activated", "w2", "b2"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 4, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        initializer=weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def make_card(model_bytes: bytes, model_id: str, accuracy: float, macs: int, task: str = "digits",
              precision: str = "fp32", **fields: Any) -> ModelCard:
    """A valid card for `model_bytes`."""
    return ModelCard.from_dict({
        "id": model_id, "family": "tiny", "task": task, "precision": precision,
        "input": {"name": "input", "shape": ["batch", 1, 4, 4]},
        "labels": ["a", "b", "c"],
        "metrics": {"accuracy": accuracy, "num_examples": 100},
        "macs": macs, "params": 200, "size_bytes": len(model_bytes),
        "sha256": hashlib.sha256(model_bytes).hexdigest(),
        **fields,
    })


def log_in(client: httpx.Client, token: str) -> httpx.Response:
    """Log in to the dashboard with the login form (its CSRF field included), as a browser does."""
    form = client.get("/ui/login")
    form_token = re.search(r'name="form_token" value="([^"]+)"', form.text).group(1)
    return client.post("/ui/login", data={"form_token": form_token, "token": token, "next": "/ui/fleet"})


def device_profile(device_id: str, slowdown: float = 1.0, device_class: str | None = None,
                   memory_mb: int = 2048) -> dict[str, Any]:
    """A device profile whose calibration benchmarks are `slowdown` x the reference's."""
    profile: dict[str, Any] = {
        "device_id": device_id, "platform": "linux-x86_64",
        "cpu": {"model": "test cpu", "cores": 2}, "memory_mb": memory_mb,
        "runtime": {"onnxruntime": "1.32.0", "threads": 1},
        "benchmarks": [{"model": name, "median_ms": ms * slowdown} for name, ms in REFERENCE_CALIBRATION_MS.items()],
    }
    if device_class is not None:
        profile["device_class"] = device_class
    return profile


def create_enrollment_token(base_url: str, max_uses: int = 1000, **fields: Any) -> str:
    """A fresh enrollment token created with the test admin token (the way an operator does)."""
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30) as admin:
        response = admin.post("/v1/enrollment-tokens", json={"max_uses": max_uses, **fields})
    assert response.status_code == 201, response.text
    return response.json()["token"]


@dataclass
class LiveServer:
    base_url: str
    config: ServerConfig
    app: Any

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=30)

    def admin(self) -> httpx.Client:
        return self.client(ADMIN_TOKEN)

    def publish(self, card: ModelCard, model_bytes: bytes) -> httpx.Response:
        """Upload the blob, then the card (the two-step publish)."""
        with self.admin() as admin:
            upload = admin.put(f"/v1/blobs/{card.sha256}", content=model_bytes,
                               headers={"Content-Type": "application/octet-stream"})
            assert upload.status_code in (200, 201), upload.text
            return admin.post("/v1/models", content=card.to_json(), headers={"Content-Type": "application/json"})

    def enrollment_token(self, max_uses: int = 1000, **fields: Any) -> str:
        return create_enrollment_token(self.base_url, max_uses, **fields)

    def enroller(self) -> httpx.Client:
        """A client that registers devices with this server's shared test enrollment token."""
        if not hasattr(self, "_enrollment_token"):
            self._enrollment_token = self.enrollment_token()
        return self.client(self._enrollment_token)

    def register(self, profile: dict[str, Any]) -> str:
        with self.enroller() as client:
            response = client.post("/v1/devices", json=profile)
        assert response.status_code == 201, response.text
        return response.json()["token"]

    def snapshot(self) -> dict[str, Any]:
        """Every stored row and blob, to compare before and after a refused request."""
        context = self.app.extensions["fedzoo"]
        with context.db.engine.connect() as connection:
            rows = {table: sorted((tuple(value for key, value in row._mapping.items() if key not in NOT_STORED_DATA)
                                   for row in connection.execute(text(f"SELECT * FROM {table}"))), key=repr)
                    for table in REGISTRY_TABLES}
        rows["blobs"] = sorted(str(path.relative_to(self.config.blob_dir))
                               for path in self.config.blob_dir.rglob("*") if path.is_file())
        return rows


def config_for_tests(data_parent: Path) -> ServerConfig:
    """Settings for a test server: a fresh SQLite file and blob folder, small limits, the test admin and
    viewer tokens."""
    return ServerConfig.from_env({}, data_dir=data_parent / "data", admin_token=ADMIN_TOKEN, viewer_token=VIEWER_TOKEN,
                                 max_request_bytes=4 * 1024 * 1024, max_json_bytes=64 * 1024)


@contextmanager
def running_live_server(config: ServerConfig) -> Iterator[LiveServer]:
    """The app behind a real threaded HTTP server on a free loopback port, for the duration of the block."""
    app = create_app(config, estimator=CalibrationScalingEstimator(REFERENCE_CALIBRATION_MS))
    http_server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=http_server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield LiveServer(f"http://127.0.0.1:{http_server.server_port}", config, app)
    finally:
        http_server.shutdown()
        thread.join(timeout=10)
        app.extensions["fedzoo"].db.dispose()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class GunicornServer:
    base_url: str
    process: subprocess.Popen
    data_dir: Path
    log_path: Path  # master's and workers' output: a file, so a chatty server never blocks on a full pipe

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def fedzoo_command() -> list[str]:
    return [str(Path(sys.executable).with_name("fedzoo"))]


def wait_until_healthy(base_url: str, process: subprocess.Popen, timeout_s: float = 60.0,
                       log_path: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = log_path.read_text(errors="replace") if log_path else process.stdout.read()
            raise RuntimeError(f"fedzoo serve exited with {process.returncode}: {output}")
        try:
            if httpx.get(f"{base_url}/v1/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"fedzoo serve did not answer at {base_url} within {timeout_s} s")


def start_gunicorn(data_dir: Path, *extra_args: str, workers: int = 2, env: dict[str, str] | None = None,
                   port: int | None = None) -> GunicornServer:
    """`fedzoo serve` in its own session (so `kill_gunicorn` can kill master and workers at once); `env`
    adds variables (e.g. FEDZOO_DATABASE_URL, else the data dir's SQLite file)."""
    port = port or free_port()
    environment = {**os.environ, "FEDZOO_ADMIN_TOKEN": ADMIN_TOKEN, "FEDZOO_DATA_DIR": str(data_dir)}
    environment.pop("FEDZOO_DATABASE_URL", None)
    environment.update(env or {})
    log_path = data_dir.parent / f"gunicorn-{port}.log"
    with log_path.open("a") as log:
        process = subprocess.Popen(
            [*fedzoo_command(), "serve", "--port", str(port), "--workers", str(workers), *extra_args],
            env=environment, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
    server = GunicornServer(f"http://127.0.0.1:{port}", process, data_dir, log_path)
    try:
        wait_until_healthy(server.base_url, process, log_path=log_path)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return server


def stop_gunicorn(server: GunicornServer, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
    if server.process.poll() is None:
        server.process.send_signal(sig)
        try:
            server.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
    return server.process.returncode


def kill_gunicorn(server: GunicornServer) -> None:
    """SIGKILL the master and every worker at once, as a machine losing power would."""
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait(timeout=30)


def drop_test_database(admin, name: str, attempts: int = 20) -> None:
    """DROP ... WITH (FORCE) ends our own sessions, but not an autovacuum worker (the superuser's) that happens to
    be in the database: that refusal passes once the worker is done, so it is retried for a few seconds."""
    for attempt in range(attempts):
        try:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            return
        except ProgrammingError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.25)


@contextmanager
def fresh_postgres_database(server_url: str, prefix: str) -> Iterator[str]:
    """A new, empty PostgreSQL database on the server `server_url` names, dropped afterwards; yields its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        drop_test_database(admin, name)
        admin.dispose()
