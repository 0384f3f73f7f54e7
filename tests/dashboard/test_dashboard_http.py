"""The dashboard over plain HTTP (no browser): vendored files match their checksums, nothing points off
origin, security headers, the login form's CSRF token, the signed role-only cookie and its key file."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import stat
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
    assert f"dashboard: {server.base_url}/ui/" in server.process.stdout.read()
