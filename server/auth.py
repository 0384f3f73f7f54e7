"""Tokens: one admin token and one read-only viewer token from the settings, one device token per
registered device.

Device tokens are `secrets.token_urlsafe(32)`; only their sha256 is stored, so a copy of the
database does not let anyone act as a device. A sha256 of a 256-bit random token needs no salt or
slow hash: it cannot be guessed, only stolen, and the hash is looked up through a unique index.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from fedzoo.server.errors import Forbidden, Unauthorized

DEVICE_TOKEN_BYTES = 32
MAX_TOKEN_CHARS = 256
# Failed operator tokens are counted per prefix (fedzoo.server.ratelimit): 8 characters of a
# `secrets.token_urlsafe` token are 48 bits, more than a spray of guesses ever shares with the admin's token.
TOKEN_PREFIX_CHARS = 8


def new_device_token() -> str:
    """A fresh unguessable device token (shown to the device once, never stored)."""
    return secrets.token_urlsafe(DEVICE_TOKEN_BYTES)


def hash_token(token: str) -> str:
    """The stored form of a token."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_prefix_key(token: str) -> str:
    """The rate-limit key of a presented token: a digest of its first `TOKEN_PREFIX_CHARS` characters (the
    counters' store never holds token material)."""
    return hashlib.sha256(token[:TOKEN_PREFIX_CHARS].encode("utf-8")).hexdigest()[:32]


def begins_like_operator_token(token: str, admin_token: str | None, viewer_token: str | None) -> bool:
    """Whether `token` has the prefix of the admin or the viewer token (compared in constant time)."""
    prefix = token[:TOKEN_PREFIX_CHARS]
    return any(_same(prefix, expected[:TOKEN_PREFIX_CHARS]) for expected in (admin_token, viewer_token)
               if expected is not None)


def bearer_token(authorization_header: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header; 401 when it is missing or malformed."""
    if not authorization_header:
        raise Unauthorized("this endpoint needs an 'Authorization: Bearer <token>' header", field="Authorization")
    scheme, _, token = authorization_header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_CHARS or " " in token:
        raise Unauthorized("the Authorization header must be 'Bearer <token>'", field="Authorization")
    return token


def _same(token: str, expected: str | None) -> bool:
    return expected is not None and hmac.compare_digest(token.encode("utf-8"), expected.encode("utf-8"))


def reader_role(token: str, admin_token: str | None, viewer_token: str | None) -> str | None:
    """`admin` or `viewer` for the operator's tokens (compared in constant time), None for any other token."""
    if _same(token, admin_token):
        return "admin"
    if _same(token, viewer_token):
        return "viewer"
    return None


def require_reader(authorization_header: str | None, admin_token: str | None, viewer_token: str | None) -> str:
    """The role (`admin` or `viewer`) of the bearer token; 403 when the server has neither token, 401 for any
    other token (a device token included: devices never read the operator's view)."""
    if admin_token is None and viewer_token is None:
        raise Forbidden("the operator's view is disabled: the server has no FEDZOO_VIEWER_TOKEN or "
                        "FEDZOO_ADMIN_TOKEN set", code="viewer_disabled")
    role = reader_role(bearer_token(authorization_header), admin_token, viewer_token)
    if role is None:
        raise Unauthorized("this endpoint needs the viewer or the admin token", field="Authorization",
                           code="invalid_token")
    return role


def require_admin(authorization_header: str | None, admin_token: str | None) -> None:
    """Pass only when the bearer token equals the configured admin token (compared in constant time)."""
    if admin_token is None:
        raise Forbidden("publishing is disabled: the server has no FEDZOO_ADMIN_TOKEN set", code="admin_disabled")
    if not _same(bearer_token(authorization_header), admin_token):
        raise Unauthorized("the admin token is not valid", field="Authorization", code="invalid_token")
