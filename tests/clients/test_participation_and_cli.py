"""The device side of FL and the `fedzoo client` commands, against a real server on loopback."""

import json
import threading

import numpy as np
import pytest
from click.testing import CliRunner

from fedzoo.clients.cli import client as client_cli
from fedzoo.clients.client import FedzooClient
from fedzoo.clients.participation import participation_loop, run_task, train_locally
from fedzoo.cloud.simulation import Simulation, prepare_federation
from fedzoo.server.testing import LoopbackServer

TRAINING = {"local_epochs": 2, "batch_size": 16, "learning_rate": 0.1, "optimizer": "sgd", "momentum": 0.0}


@pytest.fixture(scope="module")
def federation():
    return prepare_federation("digits", num_clients=3, alpha=1.0, hidden_units=16, pretrain_epochs=1, seed=1)


def test_local_training_lowers_the_loss_and_returns_a_delta_per_parameter(federation):
    data = federation.client_data(0)
    delta, metrics = train_locally(federation.training_graph, federation.model, federation.card, TRAINING, data)
    assert sorted(delta) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    assert all(np.any(value != 0) for value in delta.values())
    again, later = train_locally(federation.training_graph, federation.model, federation.card,
                                 {**TRAINING, "local_epochs": 6}, data)
    assert later["loss"] < metrics["loss"] and 0 <= later["accuracy"] <= 1


def test_fedprox_proximal_term_keeps_the_local_model_near_the_global_one(federation):
    data = federation.client_data(0)
    plain, _ = train_locally(federation.training_graph, federation.model, federation.card, TRAINING, data)
    proximal, _ = train_locally(federation.training_graph, federation.model, federation.card,
                                {**TRAINING, "proximal_mu": 5.0}, data)
    norm = lambda delta: np.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in delta.values()))  # noqa: E731
    assert norm(proximal) < 0.8 * norm(plain)


def test_unknown_optimizer_is_refused(federation):
    with pytest.raises(ValueError, match="unknown optimizer 'lbfgs'"):
        train_locally(federation.training_graph, federation.model, federation.card, {**TRAINING, "optimizer": "lbfgs"},
                      federation.client_data(0))


@pytest.fixture
def running(federation, tmp_path):
    with LoopbackServer(tmp_path / "server") as server:
        with Simulation(federation, server.url, cache_root=tmp_path / "devices") as sim:
            sim.publish_base_model()
            yield server, sim


def test_participation_loop_waits_as_told_then_trains_and_uploads(running, federation, tmp_path):
    server, sim = running
    sim.register_devices()
    device = FedzooClient(server.url, token=sim.tokens[0], cache_dir=tmp_path / "cache")
    sleeps = []
    started = threading.Event()

    def sleep(seconds):  # the first time the device is told to wait, the admin starts a round
        sleeps.append(seconds)
        if not started.is_set():
            started.set()
            sim.start_plan({"min_clients": 1, "target_clients": 1, "deadline_s": 60, "batch_size": 16})

    results = participation_loop(device, "digits", federation.client_data(0), max_participations=1, max_idle_s=30,
                                 encoding="int8", sleep=sleep)
    assert len(sleeps) == 1 and 30 * 0.8 <= sleeps[0] <= 30 * 1.2  # the server's idle retry_after, jittered
    assert [r.outcome for r in results] == ["accepted"]
    view = sim.admin.fl_round(results[0].round_id)
    assert view["state"] == "closed" and view["upload_bytes"] == results[0].upload_bytes
    assert device.uploaded_bytes == results[0].upload_bytes and device.downloaded_bytes > 0


def test_a_device_whose_model_diverged_sends_nothing(running, federation, tmp_path):
    server, sim = running
    sim.register_devices()
    device = FedzooClient(server.url, token=sim.tokens[0], cache_dir=tmp_path / "cache")
    round_id = sim.start_plan({"min_clients": 1, "target_clients": 1, "deadline_s": 60, "batch_size": 16})
    task = device.fl_task("digits")["task"]
    diverged = lambda delta: {name: value * np.float32("nan") for name, value in delta.items()}  # noqa: E731
    result = run_task(device, task, federation.client_data(0), transform=diverged)
    assert (result.outcome, result.upload_bytes, device.uploaded_bytes) == ("diverged", 0, 0)
    assert sim.admin.fl_round(round_id)["accepted_updates"] == 0


def test_an_update_upload_reports_its_bytes_as_they_are_sent(running, federation, tmp_path):
    server, sim = running
    sim.register_devices()
    heard = []
    device = FedzooClient(server.url, token=sim.tokens[0], cache_dir=tmp_path / "cache",
                          progress=lambda *event: heard.append(event))
    round_id = sim.start_plan({"min_clients": 1, "target_clients": 1, "deadline_s": 60, "batch_size": 16})
    result = run_task(device, device.fl_task("digits")["task"], federation.client_data(0))
    uploads = [event for event in heard if event[0] == "upload update"]
    assert result.outcome == "accepted" and uploads[-1][1:] == (result.upload_bytes, result.upload_bytes)
    assert sim.admin.fl_round(round_id)["upload_bytes"] == result.upload_bytes


def test_cli_registers_downloads_runs_and_participates(running, federation, tmp_path):
    server, sim = running
    runner = CliRunner()
    state = tmp_path / "state.json"
    base = ["--server", server.url, "--state", str(state), "--cache-dir", str(tmp_path / "cache")]
    result = runner.invoke(client_cli, [*base, "register", "--device-id", "cli-device", "--no-calibrate"])
    assert "needs an enrollment token" in str(result.exception)  # the server does not enroll openly
    enrollment_token = sim.admin.create_enrollment_token(sim.admin_token)["token"]
    result = runner.invoke(client_cli, [*base, "register", "--device-id", "cli-device", "--no-calibrate",
                                        "--enrollment-token", enrollment_token])
    assert result.exit_code == 0, result.output
    saved = json.loads(state.read_text())
    assert saved["device_id"] == "cli-device" and saved["token_expires_at_s"] > saved["token_refresh_at_s"]
    result = runner.invoke(client_cli, [*base, "lookup", "--task", "digits", "--latency-budget-ms", "100000"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(federation.card.id) and "why:" in result.output
    result = runner.invoke(client_cli, [*base, "lookup", "--task", "digits", "--latency-budget-ms", "100000",
                                        "--format", "json"])
    answer = json.loads(result.stdout)
    assert answer["model"]["id"] == federation.card.id and answer["latency_source"] in ("measured", "predicted")
    result = runner.invoke(client_cli, ["--state", str(state), "--cache-dir", str(tmp_path / "cache"), "download",
                                        federation.card.id])
    assert result.exit_code == 0 and federation.card.sha256 in result.output
    images = tmp_path / "images.npz"
    np.savez(images, x=federation.split.test.x[:50], y=federation.split.test.y[:50])
    result = runner.invoke(client_cli, [*base, "run", federation.card.id, str(images), "--report-latency"])
    assert result.exit_code == 0, result.output
    assert "accuracy" in result.output and "reported" in result.output
    shard = tmp_path / "shard.npz"
    data = federation.client_data(1)
    np.savez(shard, x=data.x, y=data.y)
    sim.start_plan({"min_clients": 1, "target_clients": 1, "deadline_s": 60})
    result = runner.invoke(client_cli, [*base, "participate", "--task", "digits", "--data", str(shard),
                                        "--max-idle-s", "20"])
    assert result.exit_code == 0, result.output
    assert "accepted" in result.output
    bad = tmp_path / "bad.npz"
    np.savez(bad, images=np.zeros(3))
    result = runner.invoke(client_cli, [*base, "participate", "--task", "digits", "--data", str(bad)])
    assert result.exit_code != 0 and "must hold 'x' and 'y'" in str(result.exception)
