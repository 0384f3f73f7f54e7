"""The Python SDK's side of enrollment and the token lifecycle, against the real server on loopback: it
registers with an enrollment token, keeps the token and its expiry in the state file, rotates the token
once half its lifetime has passed (transparently, inside an ordinary call), and turns a revoked or expired
token into an error that says to register again with an enrollment token."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from fedzoo.admin.operator_client import OperatorClient
from fedzoo.clients.client import REFRESH_AT_LIFETIME_FRACTION, FedzooClient
from fedzoo.clients.errors import AuthenticationError, ReregistrationRequiredError
from fedzoo.device import CpuInfo, DeviceProfile, RuntimeInfo
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN, LoopbackServer

TOKEN_TTL_S = 4


def profile(device_id: str) -> DeviceProfile:
    return DeviceProfile(device_id=device_id, platform="linux-x86_64", cpu=CpuInfo(model="python", cores=1),
                         memory_mb=1024, runtime=RuntimeInfo(onnxruntime="python", threads=1))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    environ = {"FEDZOO_DEVICE_TOKEN_TTL_S": str(TOKEN_TTL_S)}
    with LoopbackServer(tmp_path_factory.mktemp("server"), environ=environ) as running:
        yield running


@pytest.fixture
def enrollment_token(server, tmp_path):
    with OperatorClient(server.url, cache_dir=tmp_path / "admin") as admin:
        return admin.create_enrollment_token(DEFAULT_ADMIN_TOKEN, max_uses=5)["token"]


def test_registering_needs_an_enrollment_token(server, tmp_path):
    with FedzooClient(server.url, cache_dir=tmp_path / "cache") as client:
        with pytest.raises(AuthenticationError) as refused:
            client.register(profile("unenrolled"))
    assert refused.value.code == "enrollment_required" and not isinstance(refused.value, ReregistrationRequiredError)


class DeviceClock:
    """The device's clock, which decides when its token is due for rotation: it moves only when the test says."""

    def __init__(self) -> None:
        self.now_s = time.time()

    def __call__(self) -> float:
        return self.now_s


def test_the_token_is_rotated_transparently_at_half_its_life_and_survives_a_restart(server, enrollment_token,
                                                                                      tmp_path):
    state_file, clock = tmp_path / "state.json", DeviceClock()
    with FedzooClient(server.url, cache_dir=tmp_path / "cache", state_file=state_file, clock=clock) as client:
        registered_at = time.monotonic()
        registration = client.register(profile("rotating"), enrollment_token)
        assert registration["token_expires_in_s"] == TOKEN_TTL_S
        first = client.token
        saved = json.loads(state_file.read_text())
        assert saved["token"] == first and saved["device_id"] == "rotating"
        assert saved["token_refresh_at_s"] - saved["token_expires_at_s"] == pytest.approx(
            -TOKEN_TTL_S * (1 - REFRESH_AT_LIFETIME_FRACTION))
        assert client.fl_task("digits")["task"] is None  # not due yet on the device's clock: same token
        assert client.token == first
        # the server's own clock is real: rotate once half the first token's real lifetime has passed, so the
        # rotated token outlives the first by that much
        time.sleep(max(0.0, registered_at + TOKEN_TTL_S * REFRESH_AT_LIFETIME_FRACTION - time.monotonic()))
        clock.now_s = saved["token_refresh_at_s"]
        assert client.fl_task("digits")["task"] is None  # due: rotated first, then asked
        assert client.token != first and json.loads(state_file.read_text())["token"] == client.token
    assert state_file.stat().st_mode & 0o777 == 0o600
    with FedzooClient(server.url, cache_dir=tmp_path / "cache", state_file=state_file, clock=clock) as restarted:
        assert restarted.token == client.token and restarted.device_id == "rotating"
        time.sleep(max(0.0, registered_at + TOKEN_TTL_S + 0.1 - time.monotonic()))  # the first token's life is over
        assert restarted.fl_task("digits")["task"] is None  # its rotated token still works


def test_a_revoked_device_is_told_to_register_again_with_an_enrollment_token(server, enrollment_token, tmp_path):
    with FedzooClient(server.url, cache_dir=tmp_path / "cache") as client:
        client.register(profile("to-revoke"), enrollment_token)
        revoked = httpx.post(f"{server.url}/v1/devices/to-revoke/revoke",
                             headers={"Authorization": f"Bearer {DEFAULT_ADMIN_TOKEN}"})
        assert revoked.status_code == 200
        with pytest.raises(ReregistrationRequiredError) as refused:
            client.fl_task("digits")
        assert refused.value.code == "device_revoked" and "enrollment token" in str(refused.value)
        client.register(profile("to-revoke-2"), enrollment_token)  # a new identity, through enrollment
        assert client.fl_task("digits")["task"] is None
