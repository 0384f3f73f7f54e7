"""Server settings, read from the environment (`FEDZOO_*`) with defaults that work out of the box."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from fedzoo.errors import InvalidInputError

DEFAULT_DATA_DIR = Path.home() / ".fedzoo" / "server"
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024  # a published ONNX model travels in one request
DEFAULT_MAX_JSON_BYTES = 256 * 1024  # every JSON-only endpoint: cards, profiles, lookups
# The most examples one device holds for a task: an FL update's weight is capped there unless a round says
# otherwise. 10,000 is twice a whole MNIST-5k training split: no honest phone-sized shard comes near it.
DEFAULT_FL_MAX_EXAMPLES_PER_UPDATE = 10_000
DEFAULT_DEVICE_TOKEN_TTL_S = 30 * 24 * 3600  # a device rotates its token well within a month (SDKs: at half)
# A model line's lifetime privacy budget (epsilon at each plan's delta, docs/privacy.md): every DP plan on the
# line composes with the earlier ones, and a plan that would take the line past it is refused.
DEFAULT_DP_LINE_MAX_EPSILON = 10.0
# The largest delta a DP plan may account at: delta is the chance the guarantee fails outright, so it stays well
# below one over the number of people whose data is protected (docs/privacy.md).
DEFAULT_DP_MAX_DELTA = 1e-5
# The admin token publishes models and starts rounds, the viewer token reads the fleet, and the secret key signs
# the dashboard's session cookie (whoever knows it forges an admin session): 32 bytes (what
# `secrets.token_urlsafe(32)` gives, and more) leaves guessing each hopeless even without the rate limit.
MIN_SECRET_BYTES = 32


@dataclass(frozen=True)
class ServerConfig:
    """Where the registry lives, who is admin, and how large a request may be."""

    data_dir: Path
    database_url: str
    admin_token: str | None = None
    viewer_token: str | None = None  # read-only: the operator's view (/v1 read endpoints and /ui)
    secret_key: str | None = None  # signs the dashboard's session cookie; None: generated once in data_dir
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES
    fl_max_examples_per_update: int = DEFAULT_FL_MAX_EXAMPLES_PER_UPDATE
    open_enrollment: bool = False  # devices register without an enrollment token: labs and demos only
    device_token_ttl_s: int = DEFAULT_DEVICE_TOKEN_TTL_S
    # rule -> limits (fedzoo.server.ratelimit); from_env fills in the defaults, an empty dict limits nothing
    rate_limits: dict[str, str] = field(default_factory=dict)
    rate_limit_storage_uri: str | None = None  # None: a SQLite file in data_dir, shared by one host's workers
    # card signing (docs/signed-models.md): the server's own key, the operator keys it trusts, and whether an
    # unsigned card may be published
    signing_key_path: Path | None = None
    trusted_keys_path: Path | None = None
    require_signed_cards: bool = False
    dp_line_max_epsilon: float = DEFAULT_DP_LINE_MAX_EPSILON
    dp_max_delta: float = DEFAULT_DP_MAX_DELTA
    # fsync every stored blob (an accepted update is on disk before the device hears so); a simulation's
    # throwaway server turns it off (fedzoo.server.testing.LOOPBACK_ENVIRONMENT)
    fsync_blobs: bool = True

    def __post_init__(self) -> None:
        for name, secret in (("FEDZOO_ADMIN_TOKEN", self.admin_token), ("FEDZOO_VIEWER_TOKEN", self.viewer_token),
                             ("FEDZOO_SECRET_KEY", self.secret_key)):
            _require_strong(name, secret)

    @property
    def blob_dir(self) -> Path:
        return self.data_dir / "blobs"

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: object) -> ServerConfig:
        """Settings from `FEDZOO_DATA_DIR`, `FEDZOO_DATABASE_URL`, `FEDZOO_ADMIN_TOKEN`, `FEDZOO_VIEWER_TOKEN`,
        `FEDZOO_SECRET_KEY`, `FEDZOO_MAX_REQUEST_BYTES`, `FEDZOO_MAX_JSON_BYTES`, `FEDZOO_FL_MAX_EXAMPLES_PER_UPDATE`,
        `FEDZOO_OPEN_ENROLLMENT`, `FEDZOO_DEVICE_TOKEN_TTL_S`, `FEDZOO_RATE_LIMIT_STORAGE_URI`,
        `FEDZOO_RATE_LIMIT_<RULE>` (see `fedzoo.server.ratelimit`), `FEDZOO_SERVER_SIGNING_KEY`, `FEDZOO_TRUSTED_KEYS`,
        `FEDZOO_REQUIRE_SIGNED_CARDS`, `FEDZOO_DP_LINE_MAX_EPSILON`, `FEDZOO_DP_MAX_DELTA`, `FEDZOO_FSYNC_BLOBS`; keyword overrides win."""
        from fedzoo.server.ratelimit import rate_limits_from_env

        env = dict(os.environ if environ is None else environ)
        data_dir = Path(str(overrides.pop("data_dir", None) or env.get("FEDZOO_DATA_DIR") or DEFAULT_DATA_DIR))
        data_dir = data_dir.expanduser().resolve()
        values: dict[str, object] = {
            "data_dir": data_dir,
            "database_url": env.get("FEDZOO_DATABASE_URL") or f"sqlite:///{data_dir / 'registry.db'}",
            "admin_token": env.get("FEDZOO_ADMIN_TOKEN") or None,
            "viewer_token": env.get("FEDZOO_VIEWER_TOKEN") or None,
            "secret_key": env.get("FEDZOO_SECRET_KEY") or None,
            "max_request_bytes": _positive_int(env, "FEDZOO_MAX_REQUEST_BYTES", DEFAULT_MAX_REQUEST_BYTES),
            "max_json_bytes": _positive_int(env, "FEDZOO_MAX_JSON_BYTES", DEFAULT_MAX_JSON_BYTES),
            "fl_max_examples_per_update": _positive_int(env, "FEDZOO_FL_MAX_EXAMPLES_PER_UPDATE",
                                                        DEFAULT_FL_MAX_EXAMPLES_PER_UPDATE),
            "open_enrollment": _switch(env, "FEDZOO_OPEN_ENROLLMENT", False),
            "device_token_ttl_s": _positive_int(env, "FEDZOO_DEVICE_TOKEN_TTL_S", DEFAULT_DEVICE_TOKEN_TTL_S),
            "rate_limits": rate_limits_from_env(env),
            "rate_limit_storage_uri": env.get("FEDZOO_RATE_LIMIT_STORAGE_URI") or None,
            "signing_key_path": _optional_path(env, "FEDZOO_SERVER_SIGNING_KEY"),
            "trusted_keys_path": _optional_path(env, "FEDZOO_TRUSTED_KEYS"),
            # on by default once the operator named the keys to trust; off out of the box (docs/signed-models.md)
            "require_signed_cards": _switch(env, "FEDZOO_REQUIRE_SIGNED_CARDS", bool(env.get("FEDZOO_TRUSTED_KEYS"))),
            "dp_line_max_epsilon": _positive_float(env, "FEDZOO_DP_LINE_MAX_EPSILON", DEFAULT_DP_LINE_MAX_EPSILON),
            "dp_max_delta": _positive_float(env, "FEDZOO_DP_MAX_DELTA", DEFAULT_DP_MAX_DELTA),
            "fsync_blobs": _switch(env, "FEDZOO_FSYNC_BLOBS", True),
        }
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)  # type: ignore[arg-type]


def _require_strong(name: str, secret: str | None) -> None:
    """Refuse a secret shorter than MIN_SECRET_BYTES, naming its variable (never its value)."""
    if secret is not None and len(secret.encode("utf-8")) < MIN_SECRET_BYTES:
        raise InvalidInputError(
            f"{name} has {len(secret.encode('utf-8'))} bytes; it needs at least {MIN_SECRET_BYTES}: generate "
            "one with python3 -c 'import secrets; print(secrets.token_urlsafe(32))'", field=name)


def _positive_int(env: dict[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInputError(f"{name} must be a whole number, got {raw!r}", field=name) from None
    if value <= 0:
        raise InvalidInputError(f"{name} must be positive, got {value}", field=name)
    return value


def _positive_float(env: dict[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidInputError(f"{name} must be a number, got {raw!r}", field=name) from None
    if not math.isfinite(value) or value <= 0:
        raise InvalidInputError(f"{name} must be a positive number, got {raw!r}", field=name)
    return value


def _optional_path(env: dict[str, str], name: str) -> Path | None:
    raw = env.get(name)
    return Path(raw).expanduser() if raw else None


def _switch(env: dict[str, str], name: str, default: bool) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise InvalidInputError(f"{name} must be 1 or 0 (true/false, yes/no, on/off), got {raw!r}", field=name)
    return raw in ("1", "true", "yes", "on")
