"""What can go wrong talking to a fedzoo server, as a small hierarchy of exception types.

The server answers errors as `{"error": {"code", "message", "field"}}`; `error_for_response` turns
that into the exception type of its HTTP status (a table, not a chain of ifs), keeping the server's
code, message and field so the caller can act on them (e.g. a 409 `duplicate_update` means the
server already has this device's update).

With pinned keys, a card the device must not use raises `CardSignatureError` (re-exported here from
`fedzoo.errors`) whose `reason` is one of `unsigned`, `unknown_key`, `bad_signature`, `field_mismatch`,
`expired`, `rollback`; a blob whose bytes differ from the digest its card signs raises `IntegrityError`.
"""

from __future__ import annotations

from typing import Any

from fedzoo.errors import CardSignatureError  # noqa: F401  (re-exported: the SDK's refusal of a card)
from fedzoo.errors import FedzooError, InvalidInputError, NotFoundError


class ClientError(FedzooError):
    """Base of every error the client SDK raises."""


class ServerUnavailableError(ClientError):
    """The server could not be reached, or kept failing, after every retry."""


class IntegrityError(ClientError):
    """Downloaded bytes do not hash to the sha256 the server promised."""


class APIError(ClientError):
    """The server refused a request; `status`, `code` and `field` say why."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None, body: Any = None) -> None:
        super().__init__(f"{message} (HTTP {status} {code}{f', field {field!r}' if field else ''})")
        self.status, self.code, self.message, self.field, self.body = status, code, message, field, body


class BadRequestError(APIError, InvalidInputError):
    """400/422: the request itself is wrong (a field, a body, a format)."""


class AuthenticationError(APIError):
    """401: no token, or a token the server does not know."""


class ReregistrationRequiredError(AuthenticationError):
    """401 `token_expired`, `token_replaced` or `device_revoked`: this device's token will never work again. Register anew with an
    enrollment token from the fleet's operator (`FedzooClient.register(profile, enrollment_token)`)."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None, body: Any = None) -> None:
        super().__init__(status, code, message, field, body)
        self.args = (f"{self.args[0]}; this device must register again with an enrollment token from the fleet's "
                     "operator: FedzooClient.register(profile, enrollment_token)",)


class PermissionDeniedError(APIError):
    """403: the token is valid but may not do this."""


class NotFoundAPIError(APIError, NotFoundError):
    """404: the model, blob or round does not exist."""


class ConflictError(APIError):
    """409: the request clashes with the server's state (a taken id, a duplicate or stale update, a closed round)."""


class PayloadTooLargeError(APIError):
    """413: the body is larger than the server accepts."""


class RangeNotSatisfiableError(APIError):
    """416: a resumed download asked for bytes past the end of the blob."""


ERRORS_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundAPIError,
    409: ConflictError,
    413: PayloadTooLargeError,
    416: RangeNotSatisfiableError,
    422: BadRequestError,
}


# 401 codes after which the same token never works again (fedzoo.server.devices.authenticate)
REREGISTRATION_CODES = frozenset({"token_expired", "token_replaced", "device_revoked"})


def error_for_response(status: int, body: Any) -> APIError:
    """The exception for an error response, from its status and the server's JSON error body."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        error = {"code": f"http_{status}", "message": str(body)[:500] if body else f"HTTP {status}"}
    kind = ERRORS_BY_STATUS.get(status, APIError)
    if status == 401 and error.get("code") in REREGISTRATION_CODES:
        kind = ReregistrationRequiredError
    return kind(status, str(error.get("code", f"http_{status}")), str(error.get("message", "")), error.get("field"), body)
