"""The device's connection to a fedzoo server: httpx with retries, backoff and typed errors.

Transient failures are retried with exponential backoff and full jitter (delay drawn from
[0, min(max, base * 2^attempt)], as in the AWS architecture blog's "Exponential Backoff and
Jitter"), honouring a `Retry-After` header. Every other error status raises the exception type of
`fedzoo.clients.errors`.

Which failures are retried depends on the method. GET, HEAD, PUT and DELETE are idempotent: any
transport error, timeout, 429 or 5xx is retried. A POST (a registration, an update upload) is
re-sent only when the server certainly did not act on it: the connection could not be opened, or
the server answered 429 or 503 (refused before doing anything). After a timeout, a dropped
connection or another 5xx it may have stored the request, so the caller decides: the participation
loop re-sends an update because the server keeps one per device and round and answers a repeat with
409 `duplicate_update`, which counts as delivered.
"""

from __future__ import annotations

import functools
import json
import random
import ssl
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from fedzoo.clients.errors import ServerUnavailableError, error_for_response

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# what a server answers without having acted on the request: safe to re-send even a POST
NOT_PROCESSED_STATUSES = frozenset({429, 503})
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context per process: loading the CA bundle costs ~50 ms, too much per client."""
    return ssl.create_default_context()


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a transient failure."""

    max_attempts: int = 5
    base_delay_s: float = 0.2
    max_delay_s: float = 10.0

    def delay_s(self, attempt: int, retry_after_s: float | None = None, rng: random.Random | None = None) -> float:
        """Seconds to wait before attempt `attempt + 1` (attempt counts from 0)."""
        if retry_after_s is not None:
            return min(self.max_delay_s, max(0.0, retry_after_s))
        ceiling = min(self.max_delay_s, self.base_delay_s * (2**attempt))
        return (rng or random).uniform(0.0, ceiling)


class FedzooHTTP:
    """Authenticated requests to one server; `request` retries, raises typed errors and returns the response."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        retry: RetryPolicy | None = None,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.retry = retry or RetryPolicy()
        self.sleep = sleep
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout_s, transport=transport, verify=_tls_context())

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> FedzooHTTP:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _headers(self, extra: dict[str, str] | None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        headers.update(extra or {})
        return headers

    def request(self, method: str, path: str, *, expected: tuple[int, ...] = (200,), **kwargs: Any) -> httpx.Response:
        """Send a request, retrying transient failures; raise the typed error of any other failure."""
        kwargs["headers"] = self._headers(kwargs.get("headers"))
        idempotent = method.upper() in IDEMPOTENT_METHODS
        last_problem = ""
        for attempt in range(self.retry.max_attempts):
            retry_after_s = None
            try:
                response = self._client.request(method, path, **kwargs)
            except (httpx.TransportError, httpx.TimeoutException) as error:
                last_problem = f"{type(error).__name__}: {error}"
                never_sent = isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout))
                if not (idempotent or never_sent):
                    raise ServerUnavailableError(f"{method} {self.base_url}{path} failed and may or may not have "
                                                 f"been processed; not re-sent: {last_problem}") from None
            else:
                if response.status_code in expected:
                    return response
                if response.status_code not in RETRY_STATUSES:
                    raise error_for_response(response.status_code, _json_or_text(response))
                last_problem = f"HTTP {response.status_code}"
                if not (idempotent or response.status_code in NOT_PROCESSED_STATUSES):
                    raise ServerUnavailableError(f"{method} {self.base_url}{path} answered {last_problem}; it may "
                                                 "have been processed, so it was not re-sent")
                retry_after_s = _retry_after_s(response)
            if attempt + 1 < self.retry.max_attempts:
                self.sleep(self.retry.delay_s(attempt, retry_after_s))
        raise ServerUnavailableError(
            f"{method} {self.base_url}{path} failed {self.retry.max_attempts} times; last problem: {last_problem}"
        )

    @contextmanager
    def stream(self, method: str, path: str, headers: dict[str, str] | None = None) -> Iterator[httpx.Response]:
        """A streamed response (for downloads); raises the typed error of an error status, no retries here."""
        with self._client.stream(method, path, headers=self._headers(headers)) as response:
            if response.status_code >= 400:
                response.read()
                raise error_for_response(response.status_code, _json_or_text(response))
            yield response

    def get_json(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs).json()

    def post_json(self, path: str, body: Any, expected: tuple[int, ...] = (200, 201)) -> Any:
        return self.request("POST", path, json=body, expected=expected).json()


def _json_or_text(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text


def _retry_after_s(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
