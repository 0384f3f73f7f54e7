"""Fault injection: real `fedzoo serve` processes on loopback are killed at each step of a round, on SQLite
(and on PostgreSQL when FEDZOO_TEST_POSTGRES_URL is set). After every fault the round must aggregate
exactly once (one published version whose weights are base + the mean of the stored deltas, counted
once each) and nothing stored may be lost. Crash points: `fedzoo.server.fl.faults`."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from fl_helpers import device_client, honest_delta, round_config
from server_helpers import ADMIN_TOKEN, drop_test_database, kill_gunicorn, start_gunicorn, stop_gunicorn
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from fedzoo.clients.client import FedzooClient
from fedzoo.clients.http import RetryPolicy
from fedzoo.clients.participation import deliver_update
from fedzoo.update_codec import encode_update
from fedzoo.cloud.simulation import Simulation
from fedzoo.edge.onnx_initializers import read_float_initializers

pytestmark = pytest.mark.slow
POSTGRES_URL = os.environ.get("FEDZOO_TEST_POSTGRES_URL")
# A round interrupted by a crash must resume from its short aggregation lease, not stall for the old 300 s one. The
# bound is loose so that a loaded machine cannot fail it; the time is printed (`-s`) and judged against the
# issue's 5 s goal in the notes, not here (speed goals are not asserted in unit tests).
RESUME_BOUND_S = 30.0
PATIENT = RetryPolicy(max_attempts=8, base_delay_s=0.5, max_delay_s=4.0)
DELTAS = (0.001, 0.003)  # two devices' constant deltas: exactly-once aggregation gives base + 0.002


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.skipif(
    not POSTGRES_URL, reason="set FEDZOO_TEST_POSTGRES_URL to run against PostgreSQL"))])
def database_env(request):
    """Environment for `fedzoo serve`: nothing for the data dir's SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield {}
        return
    name = f"fedzoo_faults_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield {"FEDZOO_DATABASE_URL": make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)}
    finally:
        drop_test_database(admin, name)
        admin.dispose()


class Fleet:
    """A server under test (restartable on the same port and data), the federation's devices and a round."""

    def __init__(self, federation, tmp_path: Path, database_env: dict[str, str], crash_at: str | None = None):
        self.federation, self.tmp_path, self.database_env = federation, tmp_path, database_env
        self.marker = tmp_path / "crashed"
        crash = {"FEDZOO_CRASH_AT": f"{crash_at}:{self.marker}"} if crash_at else {}
        self.server = start_gunicorn(tmp_path / "data", workers=1, env={**database_env, **crash})
        self.simulation = Simulation(federation, self.server.base_url, ADMIN_TOKEN, cache_root=tmp_path / "devices")
        self.simulation.publish_base_model()
        self.simulation.register_devices()

    def restart(self) -> float:
        """Kill the whole server if it still runs, start a fresh one (no crash point); returns when it is up."""
        kill_gunicorn(self.server)
        port = int(self.server.base_url.rsplit(":", 1)[1])
        self.server = start_gunicorn(self.tmp_path / "data", workers=1, env=self.database_env, port=port)
        return time.monotonic()

    def device(self, index, base_url=None):
        """A device client patient enough to outlast a server restart (a few seconds)."""
        device = device_client(self.simulation, index) if base_url is None else FedzooClient(
            base_url, token=self.simulation.tokens[index], cache_dir=self.simulation.cache_root / f"device-{index}")
        device.http.retry = PATIENT
        return device

    def round(self, round_id):
        return self.simulation.admin.fl_round(round_id)

    def wait_for_state(self, round_id, states, timeout_s=30.0):
        """Poll (each poll also advances overdue rounds, as any request does) until the round is in `states`."""
        give_up = time.monotonic() + timeout_s
        while (view := self.round(round_id))["state"] not in states:
            assert time.monotonic() < give_up, f"round {round_id} still {view['state']} after {timeout_s} s"
            time.sleep(0.05)
        return view

    def wait_for_crash(self, timeout_s=30.0):
        give_up = time.monotonic() + timeout_s
        while not self.marker.exists():
            assert time.monotonic() < give_up, "the crash point was never reached"
            time.sleep(0.02)

    def assert_published_exactly_once(self, round_id, updates=len(DELTAS)):
        view = self.round(round_id)
        assert view["state"] == "closed" and view["accepted_updates"] == view["outcome"]["accepted_updates"] == updates
        versions = [card for card in self.simulation.admin.list_models(task="digits")["models"]
                    if card["parent_id"] == self.federation.card.id]
        assert [card["id"] for card in versions] == [view["result_model_id"]]
        card = self.simulation.admin.card(view["result_model_id"])
        published = read_float_initializers(self.simulation.admin.download_model(card).read_bytes())
        base = read_float_initializers(self.federation.model)
        for name, value in published.items():  # each stored delta counted once: base + their mean
            np.testing.assert_allclose(value, base[name] + np.mean(DELTAS[:updates]), atol=1e-6)

    def close(self):
        self.simulation.close()
        kill_gunicorn(self.server)  # the checks are done: no need to wait for a graceful stop


@pytest.fixture
def fleet_factory(federation, tmp_path, database_env):
    fleets = []

    def make(crash_at=None):
        fleets.append(Fleet(federation, tmp_path, database_env, crash_at))
        return fleets[-1]

    yield make
    for fleet in fleets:
        fleet.close()


def _open_gate_round(fleet, **overrides):
    """A round of two devices whose publication gate is open: these tests are about exactly-once."""
    round_id = fleet.simulation.start_plan({**round_config(min_clients=2, target_clients=2, max_accuracy_drop=1.0),
                                            **overrides})
    devices = [fleet.device(index) for index in range(2)]
    tasks = [device.fl_task("digits")["task"] for device in devices]
    return round_id, devices, tasks


def _deliver(device, task, scale):
    metadata = {"base_version": task["base_version"], "num_examples": 10, "metrics": {}}
    payload = encode_update(honest_delta(device_model(device, task), scale), "fp32")
    return deliver_update(device, task["upload"]["url"], metadata, payload)


def device_model(device, task) -> bytes:
    return device.download(task["model_url"], task["model_sha256"]).read_bytes()


def test_a_crash_mid_aggregation_resumes_within_seconds_and_answers_the_device(fleet_factory):
    fleet = fleet_factory(crash_at="aggregation.claimed")
    round_id, devices, tasks = _open_gate_round(fleet)
    assert _deliver(devices[0], tasks[0], DELTAS[0]) == "accepted"
    outcome = {}
    uploader = threading.Thread(target=lambda: outcome.update(last=_deliver(devices[1], tasks[1], DELTAS[1])))
    uploader.start()  # its upload triggers the aggregation, during which the worker dies
    fleet.wait_for_crash()
    restarted = fleet.restart()  # and then the whole server goes down and comes back
    uploader.join(timeout=60)
    assert outcome == {"last": "accepted"}  # the device whose upload triggered it still hears success
    fleet.wait_for_state(round_id, {"closed", "failed"}, timeout_s=RESUME_BOUND_S * 3)
    resumed_after_s = time.monotonic() - restarted
    print(f"round resumed {resumed_after_s:.2f} s after the restart")
    assert resumed_after_s <= RESUME_BOUND_S
    fleet.assert_published_exactly_once(round_id)


def test_a_crash_while_publishing_leaves_the_round_to_be_published_once_after_restart(fleet_factory):
    fleet = fleet_factory(crash_at="aggregation.publishing")
    round_id, devices, tasks = _open_gate_round(fleet)
    assert _deliver(devices[0], tasks[0], DELTAS[0]) == "accepted"
    outcome = {}
    uploader = threading.Thread(target=lambda: outcome.update(last=_deliver(devices[1], tasks[1], DELTAS[1])))
    uploader.start()
    fleet.wait_for_crash()
    restarted = fleet.restart()
    uploader.join(timeout=60)
    assert outcome == {"last": "accepted"}
    fleet.wait_for_state(round_id, {"closed", "failed"}, timeout_s=RESUME_BOUND_S * 3)
    assert time.monotonic() - restarted <= RESUME_BOUND_S
    fleet.assert_published_exactly_once(round_id)


def test_crashes_after_storing_and_mid_upload_lose_nothing_and_count_each_update_once(fleet_factory):
    fleet = fleet_factory(crash_at="upload.stored")
    round_id, devices, tasks = _open_gate_round(fleet)
    # the worker dies after committing the update, before answering; the SDK re-sends once gunicorn has a
    # new worker, hears 409 duplicate_update, and counts the update as delivered
    assert _deliver(devices[0], tasks[0], DELTAS[0]) == "accepted"
    assert fleet.marker.exists() and fleet.round(round_id)["accepted_updates"] == 1
    # half an upload on the wire when the machine dies
    payload = encode_update(honest_delta(device_model(devices[1], tasks[1]), DELTAS[1]), "fp32")
    host, port = fleet.server.base_url.rsplit("/", 1)[1].split(":")
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(
            f"POST {tasks[1]['upload']['url']} HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {fleet.simulation.tokens[1]}\r\n"
            f"Content-Type: multipart/form-data; boundary=x\r\nContent-Length: {len(payload) + 500}\r\n\r\n".encode()
            + b"--x\r\nContent-Disposition: form-data; name=\"delta\"; filename=\"d\"\r\n\r\n" + payload[:1000])
        fleet.restart()
    view = fleet.round(round_id)
    assert (view["state"], view["accepted_updates"]) == ("collecting", 1)
    assert _deliver(devices[1], tasks[1], DELTAS[1]) == "accepted"
    fleet.wait_for_state(round_id, {"closed", "failed"})
    fleet.assert_published_exactly_once(round_id)


def test_a_deadline_that_passes_while_the_server_is_down_is_handled_at_restart(fleet_factory):
    fleet = fleet_factory()
    round_id, devices, tasks = _open_gate_round(fleet, deadline_s=3, target_clients=3)  # 2 of 3: waits
    for index in range(2):
        assert _deliver(devices[index], tasks[index], DELTAS[index]) == "accepted"
    kill_gunicorn(fleet.server)
    deadline = datetime.fromisoformat(tasks[0]["deadline_at"])
    time.sleep(max(0.0, (deadline - datetime.now(timezone.utc)).total_seconds()) + 0.2)  # passes while down
    restarted = fleet.restart()
    # no request from here on: the restarted server's background check must aggregate the overdue round
    while _round_state_in_database(fleet, round_id) not in ("closed", "failed"):
        assert time.monotonic() - restarted < RESUME_BOUND_S, "the overdue round was not handled after the restart"
        time.sleep(0.1)
    fleet.assert_published_exactly_once(round_id)


def _round_state_in_database(fleet, round_id) -> str:
    url = fleet.database_env.get("FEDZOO_DATABASE_URL") or f"sqlite:///{fleet.tmp_path / 'data' / 'registry.db'}"
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(text("SELECT state FROM fl_rounds WHERE id = :id"), {"id": round_id}).scalar()
    finally:
        engine.dispose()


def test_two_servers_on_one_database_aggregate_exactly_once(fleet_factory, tmp_path):
    fleet = fleet_factory()
    other = start_gunicorn(tmp_path / "data", workers=2, env=fleet.database_env)
    try:
        round_id, devices, tasks = _open_gate_round(fleet)
        results = [None, None]

        def deliver(index, base_url):  # one device through each server, at the same moment
            results[index] = _deliver(fleet.device(index, base_url), tasks[index], DELTAS[index])

        threads = [threading.Thread(target=deliver, args=(0, fleet.server.base_url)),
                   threading.Thread(target=deliver, args=(1, other.base_url))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert results == ["accepted", "accepted"]
        fleet.wait_for_state(round_id, {"closed", "failed"})
        fleet.assert_published_exactly_once(round_id)
        assert stop_gunicorn(other) == 0
    finally:
        stop_gunicorn(other)
