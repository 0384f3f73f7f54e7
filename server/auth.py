"""Tokens: one admin token from the settings, one device token per registered device.

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


def new_device_token() -> str:
    """A fresh unguessable device token (shown to the device once, never stored)."""
    return secrets.token_urlsafe(DEVICE_TOKEN_BYTES)


def hash_token(token: str) -> str:
    """The stored form of a token."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def bearer_token(authorization_header: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header; 401 when it is missing or malformed."""
    if not authorization_header:
        raise Unauthorized("this endpoint needs an 'Authorization: Bearer <token>' header", field="Authorization")
    scheme, _, token = authorization_header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_CHARS or " " in token:
        raise Unauthorized("the Authorization header must be 'Bearer <token>'", field="Authorization")
    return token


def require_admin(authorization_header: str | None, admin_token: str | None) -> None:
    """Pass only when the bearer token equals the configured admin token (compared in constant time)."""
    if admin_token is None:
        raise Forbidden("publishing is disabled: the server has no FEDZOO_ADMIN_TOKEN set", code="admin_disabled")
    token = bearer_token(authorization_header)
    if not hmac.compare_digest(token.encode("utf-8"), admin_token.encode("utf-8")):
        raise Unauthorized("the admin token is not valid", field="Authorization", code="invalid_token")
