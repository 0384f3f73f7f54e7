"""Rate limits per client address and per device, counted in a store every worker shares.

A table of rules, each a `limits` string ("20/minute;200/hour": every window must allow the request):

    rule                  key             default
    register_per_address  client address  20/minute;200/hour   POST /v1/devices
    token_per_device      device id       10/hour              POST /v1/devices/<id>/token
    lookup_per_address    client address  6000/minute          POST /v1/lookup
    lookup_per_device     device id       120/minute           POST /v1/lookup
    upload_per_address    client address  600/minute           POST /v1/fl/rounds/<id>/updates
    upload_per_device     device id       30/minute            POST /v1/fl/rounds/<id>/updates
    operator_auth_failures_per_token_prefix
                          token prefix    10/minute;100/hour   failed admin or viewer tokens (API, dashboard login)
    operator_auth_failures_global
                          (one counter)   100/minute;1000/hour every failed admin or viewer token, from anywhere

`FEDZOO_RATE_LIMIT_<RULE>` (e.g. `FEDZOO_RATE_LIMIT_LOOKUP_PER_DEVICE=60/minute`) replaces a default; `off`
switches that rule off. The client address is the TCP peer: behind a reverse proxy every device shares the
proxy's address, so raise the per-address rules there (or let the proxy limit).

Counters are fixed windows (`limits.FixedWindowRateLimiter`) in the store at `FEDZOO_RATE_LIMIT_STORAGE_URI`:
`redis://…` or `memcached://…` for a fleet of hosts; by default a SQLite file next to the registry
(`sqlite:///<data_dir>/rate-limits.db`, the `SQLiteCounterStorage` below), which the gunicorn workers of one
host share without any extra service; there a request's windows (a lookup's per-address and per-device ones)
are counted in one statement. Refused requests get 429 `rate_limited` with `Retry-After`.

The two operator rules count only failures, and never per address: behind the operator's proxy everyone shares
one address, and a per-address count let any caller lock the admin out. A failed token counts against its own
prefix (its first `TOKEN_PREFIX_CHARS` characters, stored as a digest) and against the global ceiling. A token
whose prefix used up its failures is refused with 429 before it is compared: a guess can only succeed if it
begins like the real token, so guesses at one operator token are limited to the prefix rule's rate, while a
spray of other tokens never touches the admin's prefix. Once the global ceiling is used up, only tokens that
begin like one of the operator's tokens are compared at all, and every failure answers 429 (a wrong token that
shares the prefix is told nothing the others are not); the admin's own token keeps working throughout.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

from limits import RateLimitItem, parse_many
from limits.storage import Storage, storage_from_string
from limits.strategies import FixedWindowRateLimiter

from fedzoo.errors import InvalidInputError
from fedzoo.server.errors import TooManyRequests

DEFAULT_RATE_LIMITS: dict[str, str] = {
    "register_per_address": "20/minute;200/hour",
    "token_per_device": "10/hour",
    "lookup_per_address": "6000/minute",
    "lookup_per_device": "120/minute",
    "upload_per_address": "600/minute",
    "upload_per_device": "30/minute",
    "operator_auth_failures_per_token_prefix": "10/minute;100/hour",
    "operator_auth_failures_global": "100/minute;1000/hour",
}
OFF = "off"


def rate_limits_from_env(env: dict[str, str]) -> dict[str, str]:
    """Each rule's limits: `FEDZOO_RATE_LIMIT_<RULE>` where set, else the default; refused when unparsable."""
    rules = {}
    for rule, default in DEFAULT_RATE_LIMITS.items():
        name = f"FEDZOO_RATE_LIMIT_{rule.upper()}"
        text = (env.get(name) or default).strip()
        if text.lower() != OFF:
            try:
                parse_many(text)
            except ValueError:
                raise InvalidInputError(f"{name} must be like '20/minute;200/hour' or 'off', got {text!r}",
                                        field=name) from None
        rules[rule] = text
    return rules


class SQLiteCounterStorage(Storage):
    """Fixed-window counters in one SQLite file: one UPSERT per hit, shared by every process that opens it.

    The counters are throwaway (a lost window only lets a few requests more through), so the file runs
    with `synchronous=OFF`: no fsync on the request path."""

    STORAGE_SCHEME = ["sqlite"]
    PURGE_EVERY_HITS = 10_000

    def __init__(self, uri: str, wrap_exceptions: bool = False, **options: float | str | bool) -> None:
        super().__init__(uri, wrap_exceptions=wrap_exceptions, **options)
        self.path = Path(urlparse(uri).path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._hits = 0
        self._connection().execute("CREATE TABLE IF NOT EXISTS counters (key TEXT PRIMARY KEY, "
                                   "count INTEGER NOT NULL, expires_at REAL NOT NULL) WITHOUT ROWID")

    @property
    def base_exceptions(self) -> type[Exception]:
        return sqlite3.Error

    def _connection(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:  # one per thread: sqlite3 connections are not shared between threads
            connection = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=OFF")
            self._local.connection = connection
        return connection

    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        return self.incr_many([(key, expiry)], amount)[0]

    def incr_many(self, keys: list[tuple[str, int]], amount: int = 1) -> list[int]:
        """`incr` of several (key, expiry) at once: one statement, one transaction (a lookup counts two)."""
        now = time.time()
        self._hits += 1
        if self._hits % self.PURGE_EVERY_HITS == 0:
            self._connection().execute("DELETE FROM counters WHERE expires_at <= ?", (now,))
        rows = self._connection().execute(
            "INSERT INTO counters (key, count, expires_at) VALUES "
            + ", ".join("(?, ?, ?)" for _ in keys)
            + " ON CONFLICT (key) DO UPDATE SET count = CASE WHEN expires_at <= ? THEN excluded.count "
              "ELSE count + excluded.count END, "
              "expires_at = CASE WHEN expires_at <= ? THEN excluded.expires_at ELSE expires_at END "
              "RETURNING key, count",
            [value for key, expiry in keys for value in (key, amount, now + expiry)] + [now, now],
        ).fetchall()
        counts = dict(rows)
        return [counts[key] for key, _ in keys]

    def _row(self, key: str) -> tuple[int, float] | None:
        return self._connection().execute("SELECT count, expires_at FROM counters WHERE key = ? AND expires_at > ?",
                                          (key, time.time())).fetchone()

    def get(self, key: str) -> int:
        row = self._row(key)
        return row[0] if row else 0

    def get_expiry(self, key: str) -> float:
        row = self._row(key)
        return row[1] if row else time.time()

    def check(self) -> bool:
        self._connection().execute("SELECT 1")
        return True

    def reset(self) -> int | None:
        return self._connection().execute("DELETE FROM counters").rowcount

    def clear(self, key: str) -> None:
        self._connection().execute("DELETE FROM counters WHERE key = ?", (key,))


class RateLimiter:
    """`hit((rule, key), ...)` counts one request against each rule and raises 429 when a window is used up."""

    def __init__(self, rules: dict[str, str], storage_uri: str) -> None:
        self.storage = storage_from_string(storage_uri)
        self.strategy = FixedWindowRateLimiter(self.storage)
        self.items: dict[str, list[RateLimitItem]] = {
            rule: parse_many(text) for rule, text in rules.items() if text.lower() != OFF
        }

    def require_unused(self, rule: str, key: str) -> None:
        """429 when a window of `rule` is already used up for `key`; counts nothing."""
        refusal = self.refusal(rule, key)
        if refusal is not None:
            raise refusal

    def refusal(self, rule: str, key: str) -> TooManyRequests | None:
        """The 429 a request would get when a window of `rule` is already used up for `key`, else None;
        counts nothing."""
        for item in self.items.get(rule, ()):
            if not self.strategy.test(item, rule, key):
                return self._refusal(item, rule, key)
        return None

    def hit(self, *rule_keys: tuple[str, str]) -> None:
        windows = [(item, rule, key) for rule, key in rule_keys for item in self.items.get(rule, ())]
        if not windows:
            return
        if isinstance(self.storage, SQLiteCounterStorage):  # the default store: every window in one statement
            counts = self.storage.incr_many([(item.key_for(rule, key), item.get_expiry())
                                             for item, rule, key in windows])
            allowed = [count <= item.amount for count, (item, _, _) in zip(counts, windows)]
        else:
            allowed = [self.strategy.hit(item, rule, key) for item, rule, key in windows]
        for ok, (item, rule, key) in zip(allowed, windows):
            if not ok:
                raise self._refusal(item, rule, key)

    def _refusal(self, item: RateLimitItem, rule: str, key: str) -> TooManyRequests:
        reset_at, _ = self.strategy.get_window_stats(item, rule, key)
        retry_after_s = max(1, math.ceil(reset_at - time.time()))
        return TooManyRequests(f"too many requests: the limit {item} ({rule.replace('_', ' ')}) is used up; "
                              f"retry in {retry_after_s} s", retry_after_s=retry_after_s)
