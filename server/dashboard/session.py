"""The dashboard's login: the viewer or admin token, typed once into a form, becomes a signed session cookie
that holds only the role (never the token). Forms carry a double-submit token against cross-site requests:
a random value in a SameSite=Strict cookie that the form repeats, which another site can neither read nor set.

The cookie is signed with `FEDZOO_SECRET_KEY`, or else with a key generated once in the data directory
(mode 0600), so every gunicorn worker and every restart signs alike.
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

from flask import Flask, Request, Response, request, session
from flask.sessions import SecureCookieSessionInterface, SessionMixin

from fedzoo.server.auth import reader_role
from fedzoo.server.config import ServerConfig
from fedzoo.server.errors import Forbidden

SECRET_KEY_FILE = "ui-secret-key"
FORM_COOKIE = "fedzoo_form"
FORM_FIELD = "form_token"
SESSION_HOURS = 12


def secret_key(config: ServerConfig) -> str:
    """`FEDZOO_SECRET_KEY`, or the data directory's generated key (created atomically the first time)."""
    if config.secret_key:
        return config.secret_key
    path = config.data_dir / SECRET_KEY_FILE
    if not path.exists():
        config.data_dir.mkdir(parents=True, exist_ok=True)
        draft = config.data_dir / f".{SECRET_KEY_FILE}.{secrets.token_hex(8)}"
        descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as stream:
            stream.write(secrets.token_urlsafe(48))
        try:
            os.link(draft, path)  # atomic, and refuses to replace: of two workers, the first key wins
        except FileExistsError:
            pass
        finally:
            Path(draft).unlink()
    return path.read_text().strip()


class DashboardSessionInterface(SecureCookieSessionInterface):
    """Flask's signed-cookie session, opened only under /ui: the REST API's requests carry no session, and
    opening one (building the signing serializer) took ~6% of a lookup's sampled time."""

    def open_session(self, app: Flask, request: Request) -> SessionMixin | None:
        if request.path != "/ui" and not request.path.startswith("/ui/"):
            return self.make_null_session(app)
        return super().open_session(app, request)


def configure(app: Flask, config: ServerConfig) -> None:
    """Sign the session cookie and keep it to the dashboard, HttpOnly and SameSite=Strict."""
    app.secret_key = secret_key(config)
    app.session_interface = DashboardSessionInterface()
    app.config.update(SESSION_COOKIE_NAME="fedzoo_ui", SESSION_COOKIE_PATH="/ui", SESSION_COOKIE_HTTPONLY=True,
                      SESSION_COOKIE_SAMESITE="Strict", PERMANENT_SESSION_LIFETIME=SESSION_HOURS * 3600)


def current_role() -> str | None:
    """`viewer` or `admin` for a logged-in browser, else None."""
    role = session.get("role")
    return role if role in ("viewer", "admin") else None


def log_in(token: str, config: ServerConfig) -> str | None:
    """Start a session holding only the token's role; None (and no session) for any other token."""
    role = reader_role(token, config.admin_token, config.viewer_token) if token else None
    session.clear()
    if role is not None:
        session["role"] = role
        session.permanent = True
    return role


def log_out() -> None:
    session.clear()


def form_token() -> str:
    """The double-submit value for this browser's forms (a new one if it has none yet)."""
    return request.cookies.get(FORM_COOKIE) or secrets.token_urlsafe(24)


def remember_form_token(response: Response, token: str) -> None:
    response.set_cookie(FORM_COOKIE, token, path="/ui", httponly=True, samesite="Strict", secure=request.is_secure)


def check_form_token() -> None:
    """A form post must repeat its cookie's value; a cross-site form cannot."""
    cookie, field = request.cookies.get(FORM_COOKIE, ""), request.form.get(FORM_FIELD, "")
    if not cookie or not hmac.compare_digest(cookie.encode(), field.encode()):
        raise Forbidden("the form's token does not match this browser's; reload the page and try again",
                        field=FORM_FIELD, code="bad_form_token")
