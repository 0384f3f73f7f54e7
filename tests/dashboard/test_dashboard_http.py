"""The dashboard over plain HTTP (no browser): vendored files match their checksums, nothing points off
origin, security headers, the login form's CSRF token, the signed role-only cookie and its key file."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sqlite3
import stat
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest
from server_helpers import ADMIN_TOKEN, VIEWER_TOKEN, config_for_tests, log_in, running_live_server

from fedzoo.server.dashboard import session as dashboard_session

DASHBOARD = Path(dashboard_session.__file__).parent
VENDOR = DASHBOARD / "static" / "vendor"


def test_vendored_files_match_their_pinned_checksums_and_licences_are_kept():
    listed = dict(reversed(line.split()) for line in (VENDOR / "SHA256SUMS").read_text().splitlines())
    assert set(listed) == {"chart.umd.min.js", "htmx.min.js"}
    for name, digest in listed.items():
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, f"{name} drifted from SHA256SUMS"
    assert (VENDOR / "chart.js.LICENSE.md").read_text().startswith("The MIT License")
    assert "BSD" in (VENDOR / "htmx.org.LICENSE").read_text()
    assert b"Chart.js v4.6.1" in (VENDOR / "chart.umd.min.js").read_bytes()[:200]
    assert b'version:"2.0.11"' in (VENDOR / "htmx.min.js").read_bytes()


def test_templates_and_own_static_files_point_nowhere_off_origin():
    own = [*DASHBOARD.glob("templates/*.html"), *DASHBOARD.glob("static/*.js"), *DASHBOARD.glob("static/*.css")]
    assert len(own) >= 10
    for path in own:
        text = path.read_text()
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", text), path
        assert "<script>" not in text and " style=" not in text and "<style" not in text, path  # CSP: none inline


@pytest.fixture
def server(tmp_path):
    with running_live_server(config_for_tests(tmp_path)) as running:
        yield running


def test_pages_carry_a_strict_csp_and_no_store(server):
    with httpx.Client(base_url=server.base_url) as client:
        log_in(client, VIEWER_TOKEN)
        response = client.get("/ui/fleet")
    assert response.status_code == 200
    policy = response.headers["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "script-src 'self';" in policy and "unsafe" not in policy
    assert response.headers["Cache-Control"] == "no-store" and response.headers["X-Content-Type-Options"] == "nosniff"


def test_the_session_cookie_is_signed_and_holds_only_the_role(server):
    with httpx.Client(base_url=server.base_url) as client:
        response = log_in(client, ADMIN_TOKEN)
        assert response.status_code == 302 and response.headers["location"] == "/ui/fleet"
        cookie = client.cookies["fedzoo_ui"]
        payload = cookie.split(".")[0]
        assert json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))) == \
            {"role": "admin", "_permanent": True}
        forged = cookie[:-4] + ("AAAA" if not cookie.endswith("AAAA") else "BBBB")
    with httpx.Client(base_url=server.base_url, cookies={"fedzoo_ui": forged}) as client:
        assert client.get("/ui/fleet").status_code == 302  # a bad signature is no session


def test_a_login_post_without_the_form_token_is_refused(server):
    with httpx.Client(base_url=server.base_url) as client:
        response = client.post("/ui/login", data={"token": VIEWER_TOKEN})
        assert response.status_code == 403 and "fedzoo_ui" not in client.cookies
        client.get("/ui/login")  # the form's cookie, but a forged field
        response = client.post("/ui/login", data={"token": VIEWER_TOKEN, "form_token": "guessed"})
        assert response.status_code == 403 and "fedzoo_ui" not in client.cookies
        assert log_in(client, "not-a-token").status_code == 401 and "fedzoo_ui" not in client.cookies


def test_the_login_redirects_only_within_the_dashboard(server):
    with httpx.Client(base_url=server.base_url) as client:
        form = client.get("/ui/login")
        form_token = re.search(r'name="form_token" value="([^"]+)"', form.text).group(1)
        response = client.post("/ui/login", data={"form_token": form_token, "token": VIEWER_TOKEN,
                                                  "next": "https://elsewhere.example/"})
    assert response.headers["location"] == "/ui/"


def test_bad_page_arguments_and_unknown_things_get_error_pages(server):
    with httpx.Client(base_url=server.base_url) as client:
        log_in(client, VIEWER_TOKEN)
        bad = client.get("/ui/rounds", params={"state": "finished"})
        missing = client.get("/ui/models/ghost")
        no_round = client.get("/ui/rounds/42")
    assert bad.status_code == 422 and "state" in bad.text
    assert missing.status_code == 404 and "ghost" in missing.text
    assert no_round.status_code == 404


def test_the_generated_secret_key_is_private_and_reused(tmp_path):
    config = config_for_tests(tmp_path)
    first = dashboard_session.secret_key(config)
    key_file = config.data_dir / dashboard_session.SECRET_KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and len(first) >= 40
    assert dashboard_session.secret_key(config) == first  # every worker and restart signs alike
    assert list(config.data_dir.glob(".ui-secret-key.*")) == []


@pytest.mark.slow
def test_fedzoo_serve_prints_the_dashboard_url_and_serves_it_from_every_worker(tmp_path):
    from server_helpers import start_gunicorn, stop_gunicorn

    server = start_gunicorn(tmp_path / "data", workers=2, env={"FEDZOO_VIEWER_TOKEN": VIEWER_TOKEN})
    try:
        with httpx.Client(base_url=server.base_url) as client:
            assert log_in(client, VIEWER_TOKEN).status_code == 302
            # any worker accepts the cookie: they share the key generated once in the data directory
            assert all(client.get("/ui/fleet").status_code == 200 for _ in range(6))
    finally:
        stop_gunicorn(server)
    assert f"dashboard: {server.base_url}/ui/" in server.log()


def _forged_admin_cookie(guessed_key: str) -> str:
    """The session cookie a viewer who guessed the signing key writes for itself: the role set to admin."""
    from flask import Flask
    from flask.sessions import SecureCookieSessionInterface

    app = Flask("forger")
    app.secret_key = guessed_key
    return SecureCookieSessionInterface().get_signing_serializer(app).dumps({"role": "admin", "_permanent": True})


@pytest.mark.parametrize("name", ["FEDZOO_SECRET_KEY", "FEDZOO_VIEWER_TOKEN"])
def test_a_weak_secret_key_or_viewer_token_stops_the_server_at_start_up(tmp_path, monkeypatch, capsys, name):
    """With `FEDZOO_SECRET_KEY=dashboard-secret` a viewer forged an admin session cookie and released a
    quarantined device: a key (or viewer token) shorter than 32 bytes is now refused before anything starts."""
    from fedzoo.cli import main as fedzoo_main
    from fedzoo.errors import InvalidInputError
    from fedzoo.server.config import ServerConfig

    monkeypatch.setenv(name, "dashboard-secret")
    with pytest.raises(SystemExit) as exited:
        fedzoo_main(["serve", "--data-dir", str(tmp_path / "data"), "--import-only"])
    message = capsys.readouterr().err
    assert exited.value.code != 0 and f"{name} has 16 bytes" in message and "dashboard-secret" not in message
    assert not (tmp_path / "data").exists()  # refused before anything was created
    with pytest.raises(InvalidInputError) as refused:  # the in-process servers (LoopbackServer) read it alike
        ServerConfig.from_env({name: "dashboard-secret"}, data_dir=tmp_path / "data")
    assert refused.value.field == name


def test_a_session_forged_with_a_guessed_key_releases_nothing(server):
    """A viewer who guesses a weak key forges `{"role": "admin"}`; the server never signs with such a key, so
    the forged session is no session and the quarantine action is not run."""
    with httpx.Client(base_url=server.base_url) as viewer:
        log_in(viewer, VIEWER_TOKEN)
        form_token = re.search(r'name="form_token" value="([^"]+)"', viewer.get("/ui/quarantine").text).group(1)
    cookies = {"fedzoo_ui": _forged_admin_cookie("dashboard-secret"), "fedzoo_form": form_token}
    with httpx.Client(base_url=server.base_url, cookies=cookies) as forger:
        response = forger.post("/ui/quarantine/some-device/release", data={"form_token": form_token})
    assert response.status_code == 302 and response.headers["location"].startswith("/ui/login")


def test_the_round_page_shows_the_background_publication_progress(federation, tmp_path):
    """A zoo round's publication runs after the round closes (server/fl/background.py); its page and the polled
    state cell show how far it got, then how long it took."""
    from fl_helpers import ready_simulation, round_config

    from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN, LoopbackServer

    with LoopbackServer(tmp_path / "server") as server, \
            ready_simulation(federation, server.url, tmp_path / "devices") as simulation:
        round_id = simulation.admin.create_rounds({"model_id": federation.card.id, **round_config(),
                                                   "evaluation_sha256": simulation.evaluation_sha256},
                                                  DEFAULT_ADMIN_TOKEN)["id"]
        lease = (datetime.now(timezone.utc) + timedelta(minutes=10)).isoformat(sep=" ")

        def record(state: str, publication: dict) -> None:  # as a publishing worker (not this request) writes it
            with sqlite3.connect(server.data_dir / "registry.db") as connection:
                connection.execute("UPDATE fl_rounds SET state = ?, aggregation_owner = 'another-worker', "
                                   "aggregation_lease_until = ?, publication_json = ? WHERE id = ?",
                                   (state, lease, json.dumps(publication), round_id))

        with httpx.Client(base_url=server.url) as browser:
            log_in(browser, DEFAULT_ADMIN_TOKEN)
            assert 'id="round-publication"' not in browser.get(f"/ui/rounds/{round_id}").text  # none yet
            record("aggregating", {"stage": "re-extracting", "zoo_models_done": 2, "zoo_models_total": 5})
            for path in (f"/ui/rounds/{round_id}", f"/ui/rounds/{round_id}/state"):  # the page and its polled cell
                page = " ".join(browser.get(path).text.split())
                assert "publication: re-extracting, 2 of 5 zoo models re-extracted</span>" in page, page
            record("closed", {"stage": "published", "zoo_models_done": 5, "zoo_models_total": 5, "seconds": 12.5,
                              "new_versions": 3})
            page = " ".join(browser.get(f"/ui/rounds/{round_id}").text.split())
            assert ("publication: published, 5 of 5 zoo models re-extracted, took 12.5 s, 3 new versions</span>"
                    in page), page
