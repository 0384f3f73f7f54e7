"""The API's errors: each has an HTTP status and a stable code, and serialises as
`{"error": {"code", "message", "field"}}` (field is null when no single field is at fault)."""

from __future__ import annotations

from typing import Any

from fedzoo.errors import FedzooError, InvalidInputError, NotFoundError


class APIError(FedzooError):
    """Base of every error a route returns on purpose."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, field: str | None = None, code: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code
        self.details = details

    def headers(self) -> dict[str, str]:
        """Extra response headers this error needs (none by default)."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message, "field": self.field}
        body.update(self.details)
        return {"error": body}


class BadRequest(APIError):
    status, code = 400, "bad_request"


class MalformedJSON(APIError):
    status, code = 400, "malformed_json"


class ValidationFailed(APIError):
    status, code = 422, "invalid_field"


class BreaksPrivacyTerms(ValidationFailed):
    """A plan every default device would refuse under the operator's newest privacy terms
    (`fedzoo.server.fl.terms_gate`)."""

    code = "breaks_privacy_terms"


class Unauthorized(APIError):
    status, code = 401, "unauthorized"


class Forbidden(APIError):
    status, code = 403, "forbidden"


class NotFound(APIError):
    status, code = 404, "not_found"


class MethodNotAllowed(APIError):
    status, code = 405, "method_not_allowed"


class Conflict(APIError):
    status, code = 409, "conflict"


class NoModelFits(Conflict):
    """Models exist for the task, but none fits the device's budgets; `closest` names the nearest miss."""

    code = "no_model_fits"


class PayloadTooLarge(APIError):
    status, code = 413, "payload_too_large"


class UnsupportedMediaType(APIError):
    status, code = 415, "unsupported_media_type"


class TooManyRequests(APIError):
    """A rate limit is used up; `Retry-After` says in how many seconds the window resets."""

    status, code = 429, "rate_limited"

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.details["retry_after_s"])}


class RangeNotSatisfiable(APIError):
    status, code = 416, "range_not_satisfiable"

    def headers(self) -> dict[str, str]:
        return {"Content-Range": f"bytes */{self.details['size_bytes']}"}


def from_domain_error(error: FedzooError) -> APIError:
    """Map an error from the domain layer (which knows nothing of HTTP) to the API error it means."""
    if isinstance(error, APIError):
        return error
    if isinstance(error, NotFoundError):
        return NotFound(str(error))
    if isinstance(error, InvalidInputError):
        return ValidationFailed(str(error), field=error.field)
    return BadRequest(str(error))
