"""Enrollment and the device token lifecycle against the real server on loopback (real SQLite): enrollment
tokens that are shown once, stored hashed, used up, expired and revoked; open enrollment; token expiry,
rotation with a grace period, and revocation read from the database on every request; rate limits with
429 + Retry-After; the operator's `fedzoo enrollment` commands."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import logging
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from server_helpers import (
    ADMIN_TOKEN, VIEWER_TOKEN, config_for_tests, device_profile, log_in, make_card, running_live_server,
    tiny_onnx_model,
)
from sqlalchemy import update

from fedzoo.cli import main as fedzoo_main
from fedzoo.secagg import signatures
from fedzoo.server.app import create_app
from fedzoo.server.tables import DeviceRecord, EnrollmentToken

GOOD_LOOKUP = {"task": "digits", "latency_budget_ms": 100.0}


@pytest.fixture
def published(live_server):
    blob = tiny_onnx_model(seed=1)
    assert live_server.publish(make_card(blob, "m1", 0.9, 1000), blob).status_code == 201


def register(live_server, device_id: str, enrollment_token: str | None, signing_public_key: str | None = None,
             **profile) -> httpx.Response:
    body = device_profile(device_id, **profile)
    if signing_public_key is not None:
        body["signing_public_key"] = signing_public_key
    with live_server.client(enrollment_token) as client:
        return client.post("/v1/devices", json=body)


def error_of(response: httpx.Response) -> tuple[int, str, str | None]:
    error = response.json()["error"]
    return response.status_code, error["code"], error["field"]


def set_columns(live_server, table, **values) -> None:
    """Move stored times (an expiry, a grace period) into the past, as the clock would."""
    with live_server.app.extensions["fedzoo"].db.session() as session:
        session.execute(update(table).values(**values))


def past() -> datetime:
    return datetime.now(timezone.utc) - timedelta(seconds=1)


def test_an_enrollment_token_is_shown_once_listed_without_secrets_and_stored_hashed(live_server):
    with live_server.admin() as admin:
        created = admin.post("/v1/enrollment-tokens", json={"max_uses": 3, "expires_in_s": 3600, "label": "bench 3",
                                                            "device_class": "pi4"})
        listed = admin.get("/v1/enrollment-tokens")
    assert created.status_code == 201
    issued = created.json()
    token, token_hash = issued["token"], hashlib.sha256(issued["token"].encode()).hexdigest()
    assert issued["state"] == "active" and issued["uses"] == 0 and issued["max_uses"] == 3
    page = listed.json()
    assert page["total"] == 1 and page["next_offset"] is None and page["limit"] == 50 and page["offset"] == 0
    assert page["enrollment_tokens"][0]["id"] == issued["id"] and "token" not in page["enrollment_tokens"][0]
    assert token not in listed.text and token_hash not in listed.text
    stored = repr(live_server.snapshot()["enrollment_tokens"])
    assert token not in stored and token_hash in stored


def test_a_token_enrolls_max_uses_devices_and_then_is_used_up(live_server, published):
    token = live_server.enrollment_token(max_uses=2)
    assert register(live_server, "d1", token).status_code == 201
    assert register(live_server, "d1", token).status_code == 409  # a failed registration gives its use back
    second = register(live_server, "d2", token)
    assert second.status_code == 201 and second.json()["token_expires_in_s"] == live_server.config.device_token_ttl_s
    assert error_of(register(live_server, "d3", token)) == (401, "enrollment_token_used_up", "Authorization")
    with live_server.admin() as admin:
        listed = admin.get("/v1/enrollment-tokens").json()["enrollment_tokens"][0]
    assert (listed["uses"], listed["state"]) == (2, "used_up")
    with live_server.client(second.json()["token"]) as device:  # the enrolled devices work
        assert device.post("/v1/lookup", json=GOOD_LOOKUP).status_code == 200


def stored_signing_key(live_server, device_id: str) -> bytes | None:
    with live_server.app.extensions["fedzoo"].db.session() as session:
        return session.get(DeviceRecord, device_id).signing_public_key


def test_a_device_registers_its_signing_key_and_a_key_that_is_not_ed25519_is_refused_naming_it(live_server):
    token = live_server.enrollment_token(max_uses=10)
    public_key = signatures.public_bytes(signatures.new_signing_key())
    assert register(live_server, "keyed", token, base64.b64encode(public_key).decode()).status_code == 201
    assert stored_signing_key(live_server, "keyed") == public_key
    assert register(live_server, "keyless", token).status_code == 201  # plain rounds only
    assert stored_signing_key(live_server, "keyless") is None
    not_a_point = next(candidate for candidate in (bytes([y]) + bytes(30) + bytes([x]) for y in range(256)
                                                   for x in (0, 128))
                       if not signatures.is_signing_public_key(candidate))
    for bad in (base64.b64encode(not_a_point).decode(), "short", base64.b64encode(bytes(33)).decode()):
        assert error_of(register(live_server, "refused", token, bad)) == (422, "invalid_field", "signing_public_key")
    assert register(live_server, "refused", token, base64.b64encode(public_key).decode()).status_code == 201


def test_expired_and_revoked_enrollment_tokens_are_refused_with_their_own_codes(live_server):
    expired = live_server.enrollment_token()
    set_columns(live_server, EnrollmentToken, expires_at=past())
    assert error_of(register(live_server, "d1", expired)) == (401, "enrollment_token_expired", "Authorization")
    revoked = live_server.enrollment_token()
    enrolled = register(live_server, "d2", revoked)
    with live_server.admin() as admin:
        token_id = admin.get("/v1/enrollment-tokens").json()["enrollment_tokens"][0]["id"]
        answer = admin.post(f"/v1/enrollment-tokens/{token_id}/revoke")
    assert answer.status_code == 200 and answer.json()["state"] == "revoked"
    assert error_of(register(live_server, "d3", revoked)) == (401, "enrollment_token_revoked", "Authorization")
    with live_server.client(enrolled.json()["token"]) as device:  # devices it enrolled stay registered
        assert device.post("/v1/telemetry", json={"model_id": "none", "median_ms": 1.0}).status_code == 404


def test_a_device_class_token_enrolls_only_that_class_and_keeps_its_use_otherwise(live_server):
    token = live_server.enrollment_token(max_uses=1, device_class="pi4")
    assert error_of(register(live_server, "laptop", token)) == (403, "enrollment_class_mismatch", "device_class")
    assert register(live_server, "pi", token, device_class="pi4").status_code == 201


def test_registration_is_closed_by_default_and_open_enrollment_is_visible_and_logged(tmp_path, caplog):
    closed = config_for_tests(tmp_path / "closed")
    with running_live_server(closed) as server:
        assert error_of(register(server, "d1", None)) == (401, "enrollment_required", "Authorization")
        assert httpx.get(f"{server.base_url}/v1/health").json() == {"status": "ok", "open_enrollment": False}
    with caplog.at_level(logging.WARNING, logger="fedzoo.server.app"):
        create_app(dataclasses.replace(closed, open_enrollment=True), migrate=False)
    assert any("OPEN ENROLLMENT" in record.message for record in caplog.records)
    with running_live_server(dataclasses.replace(config_for_tests(tmp_path / "open"), open_enrollment=True)) as server:
        assert register(server, "d1", None).status_code == 201
        assert error_of(register(server, "d2", "made-up")) == (401, "invalid_enrollment_token", "Authorization")
        assert httpx.get(f"{server.base_url}/v1/health").json()["open_enrollment"] is True


def test_an_expired_device_token_is_refused_as_expired(live_server, published):
    token = live_server.register(device_profile("d1"))
    set_columns(live_server, DeviceRecord, token_expires_at=past())
    with live_server.client(token) as device:
        assert error_of(device.post("/v1/lookup", json=GOOD_LOOKUP)) == (401, "token_expired", "Authorization")


def test_rotation_gives_a_new_token_and_the_old_one_works_only_for_the_grace(live_server, published):
    old = live_server.register(device_profile("d1"))
    with live_server.client(old) as device:
        rotated = device.post("/v1/devices/d1/token")
        assert rotated.status_code == 201 and rotated.json()["token_expires_in_s"] > 0
        assert device.post("/v1/lookup", json=GOOD_LOOKUP).status_code == 200  # inside the grace period
    new = rotated.json()["token"]
    stored = repr(live_server.snapshot()["devices"])
    assert new not in stored and old not in stored and hashlib.sha256(new.encode()).hexdigest() in stored
    set_columns(live_server, DeviceRecord, previous_token_valid_until=past())
    with live_server.client(old) as device:
        assert error_of(device.post("/v1/lookup", json=GOOD_LOOKUP)) == (401, "token_replaced", "Authorization")
    with live_server.client(new) as device:
        assert device.post("/v1/lookup", json=GOOD_LOOKUP).status_code == 200


def test_a_superseded_token_cannot_rotate_even_inside_its_grace(live_server, published):
    """A stolen copy of a replaced token must not buy a fresh full-lifetime token that locks the device out."""
    old = live_server.register(device_profile("d1"))
    with live_server.client(old) as device:
        new = device.post("/v1/devices/d1/token").json()["token"]
        assert device.post("/v1/lookup", json=GOOD_LOOKUP).status_code == 200  # still inside its grace
        assert error_of(device.post("/v1/devices/d1/token")) == (401, "token_replaced", "Authorization")
    with live_server.client(new) as device:
        assert device.post("/v1/lookup", json=GOOD_LOOKUP).status_code == 200  # the newest token is untouched
        assert device.post("/v1/devices/d1/token").status_code == 201


def test_a_revoked_device_is_refused_from_its_next_request_with_every_token(live_server, published):
    old = live_server.register(device_profile("d1"))
    with live_server.client(old) as device:
        new = device.post("/v1/devices/d1/token").json()["token"]
        assert device.post("/v1/lookup", json=GOOD_LOOKUP).status_code == 200
    with live_server.admin() as admin:
        revoked = admin.post("/v1/devices/d1/revoke")
        again = admin.post("/v1/devices/d1/revoke")
    assert revoked.status_code == 200 and again.json()["revoked_at"] == revoked.json()["revoked_at"]
    for token in (old, new):
        with live_server.client(token) as device:
            assert error_of(device.post("/v1/lookup", json=GOOD_LOOKUP))[:2] in ((401, "device_revoked"),
                                                                                 (401, "invalid_token"))
            assert error_of(device.post("/v1/devices/d1/token"))[:2] in ((401, "device_revoked"),
                                                                         (401, "invalid_token"))
    with live_server.client(new) as device:
        assert error_of(device.get("/v1/fl/task", params={"task": "digits"}))[:2] == (401, "device_revoked")


def test_rate_limits_answer_429_with_retry_after_per_address_and_per_device(tmp_path):
    limits = {"register_per_address": "3/minute", "lookup_per_device": "2/minute", "lookup_per_address": "5/minute"}
    base = config_for_tests(tmp_path)
    with running_live_server(dataclasses.replace(base, rate_limits={**base.rate_limits, **limits})) as server:
        blob = tiny_onnx_model(seed=1)
        assert server.publish(make_card(blob, "m1", 0.9, 1000), blob).status_code == 201
        token = server.enrollment_token()
        tokens = [register(server, f"d{index}", token).json()["token"] for index in range(3)]
        refused = register(server, "d3", token)
        assert error_of(refused) == (429, "rate_limited", None)
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert refused.json()["error"]["retry_after_s"] == int(refused.headers["Retry-After"])
        statuses = []
        for device_token in tokens:  # 2 per device; 5 requests from this address, answered or not
            with server.client(device_token) as device:
                statuses += [device.post("/v1/lookup", json=GOOD_LOOKUP).status_code for _ in range(3)]
        assert statuses == [200, 200, 429, 200, 200, 429, 429, 429, 429]


def test_a_spray_of_bad_operator_tokens_from_the_proxys_address_does_not_lock_the_admin_out(tmp_path):
    """Everyone behind the operator's proxy shares one address: an outside caller spraying wrong tokens from it
    uses up the global ceiling (its later guesses are refused unseen), yet the admin's and the viewer's right
    tokens keep working, over the API and at the dashboard's login."""
    base = config_for_tests(tmp_path)
    limits = {**base.rate_limits, "operator_auth_failures_per_token_prefix": "3/minute",
              "operator_auth_failures_global": "5/minute"}
    with running_live_server(dataclasses.replace(base, rate_limits=limits)) as server:
        spray = []
        for guess in range(12):
            with server.client(f"{guess:02d}-sprayed-token-of-the-right-length-xxxxxxxx") as outsider:
                spray.append(outsider.get("/v1/devices").status_code)
        with server.client(ADMIN_TOKEN[:8] + "but-the-rest-is-wrong-xxxxxxxxxxxx") as close_guess:
            close = close_guess.get("/v1/devices")  # past the ceiling: told nothing the other guesses are not
        with server.client(ADMIN_TOKEN) as admin:
            admin_statuses = [admin.get("/v1/devices").status_code,
                              admin.post("/v1/enrollment-tokens", json={}).status_code]
        with server.client(VIEWER_TOKEN) as viewer:
            viewer_status = viewer.get("/v1/devices").status_code
        with httpx.Client(base_url=server.base_url) as browser:
            login = log_in(browser, VIEWER_TOKEN)
    assert spray == [401] * 5 + [429] * 7  # the global ceiling still limits a spray of guesses
    assert error_of(close)[:2] == (429, "rate_limited")
    assert admin_statuses == [200, 201] and viewer_status == 200 and login.status_code == 302


def test_failed_operator_tokens_are_limited_per_token_prefix_before_the_token_is_compared(tmp_path):
    """Guesses sharing a prefix (the only ones that could be the real token) are refused once the prefix used
    up its failures, right token or not; successes never count; other prefixes are untouched."""
    base = config_for_tests(tmp_path)
    limits = {**base.rate_limits, "operator_auth_failures_per_token_prefix": "3/minute",
              "operator_auth_failures_global": "off"}
    with running_live_server(dataclasses.replace(base, rate_limits=limits)) as server:
        with server.client(ADMIN_TOKEN) as admin:
            assert all(admin.get("/v1/devices").status_code == 200 for _ in range(5))  # successes are free
        with server.client(VIEWER_TOKEN[:8] + "-a-wrong-viewer-token-of-the-right-length") as guesser:
            assert [guesser.post("/v1/enrollment-tokens", json={}).status_code,
                    guesser.get("/v1/devices").status_code] == [401, 401]
        with httpx.Client(base_url=server.base_url) as browser:
            assert log_in(browser, VIEWER_TOKEN[:8] + "-another-wrong-token").status_code == 401
            refused_login = log_in(browser, VIEWER_TOKEN)
        with server.client(VIEWER_TOKEN) as viewer:
            refused = viewer.get("/v1/devices")
        with server.client(ADMIN_TOKEN) as admin:
            admin_status = admin.get("/v1/devices").status_code
    assert error_of(refused) == (429, "rate_limited", None) and 1 <= int(refused.headers["Retry-After"]) <= 60
    assert refused_login.status_code == 429 and admin_status == 200


def test_the_server_refuses_to_start_with_an_admin_token_shorter_than_32_bytes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FEDZOO_ADMIN_TOKEN", "x" * 31)
    with pytest.raises(SystemExit) as exited:
        fedzoo_main(["serve", "--data-dir", str(tmp_path / "data"), "--import-only"])
    assert exited.value.code != 0
    message = capsys.readouterr().err
    assert "FEDZOO_ADMIN_TOKEN has 31 bytes" in message and "x" * 31 not in message  # the secret is not shown
    assert not (tmp_path / "data").exists()  # refused before anything was created
    monkeypatch.setenv("FEDZOO_ADMIN_TOKEN", "x" * 32)
    fedzoo_main(["serve", "--data-dir", str(tmp_path / "data"), "--import-only"])


def test_the_operator_cli_creates_lists_and_revokes(live_server, capsys, monkeypatch, published):
    monkeypatch.setenv("FEDZOO_SERVER", live_server.base_url)
    monkeypatch.delenv("FEDZOO_ADMIN_TOKEN", raising=False)
    with pytest.raises(SystemExit) as exited:
        fedzoo_main(["enrollment", "list"])
    assert exited.value.code == 2 and "no admin token" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fedzoo_main(["enrollment", "--admin-token", "wrong", "list"])
    assert capsys.readouterr().err.startswith("error: the admin token is not valid")

    monkeypatch.setenv("FEDZOO_ADMIN_TOKEN", ADMIN_TOKEN)
    fedzoo_main(["enrollment", "create", "--uses", "2", "--expires-in", "12h", "--label", "lab"])
    created = capsys.readouterr()
    token = created.out.strip().splitlines()[-1]
    assert "shown only now" in created.err and "enrolls up to 2 device(s)" in created.out
    assert register(live_server, "cli-device", token).status_code == 201
    fedzoo_main(["enrollment", "list"])
    listed = capsys.readouterr().out
    assert "active" in listed and "1/2" in listed and "lab" in listed and token not in listed
    token_id = listed.splitlines()[1].split()[0]
    fedzoo_main(["enrollment", "revoke", token_id])
    assert f"revoked {token_id} (1 of 2 uses taken)" in capsys.readouterr().out
    fedzoo_main(["enrollment", "revoke-device", "cli-device"])
    assert "revoked device cli-device" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        fedzoo_main(["enrollment", "revoke-device", "nobody"])
    assert "no device 'nobody'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fedzoo_main(["enrollment", "create", "--expires-in", "soon"])
    assert "not a duration" in capsys.readouterr().err
