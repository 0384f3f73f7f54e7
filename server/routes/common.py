"""Request parsing shared by every blueprint: JSON bodies, query strings, tokens, the server context."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from flask import Response, current_app, request
from pydantic import BaseModel, ValidationError
from sqlalchemy import Connection
from sqlalchemy.orm import Session

from fedzoo.server.auth import bearer_token, begins_like_operator_token, require_admin, require_reader, token_prefix_key
from fedzoo.server.context import ServerContext
from fedzoo.server.devices import AuthenticatedDevice, authenticate
from fedzoo.server.errors import (
    MalformedJSON, PayloadTooLarge, TooManyRequests, Unauthorized, UnsupportedMediaType, ValidationFailed,
)

Model = TypeVar("Model", bound=BaseModel)
EXTENSION_KEY = "fedzoo"
OPERATOR_AUTH_FAILURES_PER_TOKEN_PREFIX = "operator_auth_failures_per_token_prefix"
OPERATOR_AUTH_FAILURES_GLOBAL = "operator_auth_failures_global"
EVERYONE = "everyone"  # the global ceiling's one key


def context() -> ServerContext:
    return current_app.extensions[EXTENSION_KEY]


def validation_error(error: ValidationError, where: str) -> ValidationFailed:
    """One error naming the first bad field, with pydantic's explanation; when the whole part is bad
    (e.g. not JSON at all), the field named is the part itself (`where`)."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    if not field:
        return ValidationFailed(f"{where}: {first['msg']}", field=where)
    return ValidationFailed(f"{where} field '{field}': {first['msg']}", field=field)


def raw_body(limit_bytes: int) -> bytes:
    """The request body, refused with 413 beyond `limit_bytes` (also when it is sent chunked)."""
    if request.content_length is not None and request.content_length > limit_bytes:
        raise PayloadTooLarge(f"the body has {request.content_length} bytes; this endpoint takes at most {limit_bytes}")
    if request.content_length is None and "wsgi.input_terminated" in request.environ:
        # chunked: werkzeug's stream ends quietly at MAX_CONTENT_LENGTH, which would pass a truncated body
        # on as if whole; read the server's terminated input and look one byte past the limit ourselves
        data = _read_at_most(request.environ["wsgi.input"], limit_bytes + 1)
    else:
        data = request.stream.read(limit_bytes + 1)
    if len(data) > limit_bytes:
        raise PayloadTooLarge(f"the body is larger than the {limit_bytes} bytes this endpoint takes")
    return data


def _read_at_most(stream: Any, count: int) -> bytes:
    """Up to `count` bytes, or fewer at the end of the stream (a read may return less than asked)."""
    chunks, remaining = [], count
    while remaining > 0:
        chunk = stream.read(min(remaining, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _json_number(text: str) -> int | float:
    """JSON has one number type: 61.0 is the integer 61 (as JSON Schema says); non-finite numbers are refused."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def parse_json(data: bytes) -> Any:
    """Decode UTF-8 JSON; MalformedJSON (400) saying where it broke."""
    if not data.strip():
        raise MalformedJSON("the body is empty; send a JSON object")
    try:
        return json.loads(data.decode("utf-8"), parse_float=_json_number, parse_constant=_refuse_constant)
    except UnicodeDecodeError as error:
        raise MalformedJSON(f"the body is not UTF-8: {error.reason} at byte {error.start}") from None
    except ValueError as error:  # json.JSONDecodeError is a ValueError
        raise MalformedJSON(f"the body is not valid JSON: {error}") from None
    except RecursionError:  # the decoder recurses once per level: ~1,000 nested arrays exhaust the stack
        raise MalformedJSON("the body nests arrays or objects too deeply to be a request of this API") from None


def json_body(model: type[Model], strict: bool = True) -> Model:
    """The body parsed as `model`; 415 unless JSON, 400 for malformed JSON, 422 naming a bad field.
    `strict` refuses coercions ("10" for a number); integral numbers (61.0) count as integers."""
    if request.mimetype != "application/json":
        raise UnsupportedMediaType(f"send the body as application/json, not {request.mimetype or 'nothing'!r}",
                                   field="Content-Type")
    document = parse_json(raw_body(context().config.max_json_bytes))
    try:
        return model.model_validate(document, strict=strict)
    except ValidationError as error:
        raise validation_error(error, "body") from None


def query_args(model: type[Model]) -> Model:
    """The query string parsed as `model` (repeated keys are refused)."""
    values: dict[str, Any] = {}
    for key in request.args:
        items = request.args.getlist(key)
        if len(items) > 1:
            raise ValidationFailed(f"query parameter '{key}' is given {len(items)} times", field=key)
        values[key] = items[0]
    try:
        return model.model_validate(values)
    except ValidationError as error:
        raise validation_error(error, "query") from None


def calling_device(session: Session | None = None) -> AuthenticatedDevice:
    """The device whose token is in the Authorization header (looked up in `session`, or in a new one);
    its last-seen time is recorded."""
    token = bearer_token(request.headers.get("Authorization"))
    if session is not None:
        device = authenticate(session, token)
    else:
        with context().db.session() as own_session:
            device = authenticate(own_session, token)
    context().last_seen.seen(device.id)
    return device


def client_address() -> str:
    return request.remote_addr or "unknown"


def rate_limit(rule: str, key: str | None = None) -> None:
    """Count this request against a rate-limit rule (`fedzoo.server.ratelimit`), keyed by `key` (a device
    id) or, without one, by the client's address; 429 when the rule's window is used up."""
    context().limiter.hit((rule, key if key is not None else client_address()))


def authenticated_rate_limited(connection: Session | Connection, action: str) -> AuthenticatedDevice:
    """The calling device, with this request counted against `<action>_per_address` and `<action>_per_device`
    in one go once the token is known (a refused token counts against the address alone); its last-seen time
    is recorded."""
    try:
        device = authenticate(connection, bearer_token(request.headers.get("Authorization")))
    except Unauthorized:
        rate_limit(f"{action}_per_address")
        raise
    context().limiter.hit((f"{action}_per_address", client_address()), (f"{action}_per_device", device.id))
    context().last_seen.seen(device.id)
    return device


def next_offset(offset: int, returned: int, total: int) -> int | None:
    """The `next_offset` of a list page: where the next page starts, or None after the last one."""
    following = offset + returned
    return following if following < total else None


def require_admin_token() -> None:
    with operator_auth_limited():
        require_admin(request.headers.get("Authorization"), context().config.admin_token)


def require_reader_token() -> str:
    """The caller's role (`admin` or `viewer`): the operator's read endpoints take either token."""
    config = context().config
    with operator_auth_limited():
        return require_reader(request.headers.get("Authorization"), config.admin_token, config.viewer_token)


@contextmanager
def operator_auth_limited() -> Iterator[None]:
    """Limit failed admin and viewer tokens per token prefix and globally (`fedzoo.server.ratelimit`), never per
    address, so a caller behind the operator's proxy cannot lock the admin out. A request without an
    Authorization header guesses nothing: it is told 401 and not counted."""
    header = request.headers.get("Authorization")
    if not header:
        yield
        return
    token = header.partition(" ")[2].strip() or header
    ceiling = refuse_operator_guess(token)
    try:
        yield
    except Unauthorized:
        count_operator_auth_failure(token, ceiling)
        raise


def refuse_operator_guess(token: str) -> TooManyRequests | None:
    """Before `token` is compared: 429 when its prefix used up its failures, or when the global ceiling is used
    up and it does not begin like one of the operator's tokens. Answers the ceiling's 429 when it is used up."""
    limiter, config = context().limiter, context().config
    limiter.require_unused(OPERATOR_AUTH_FAILURES_PER_TOKEN_PREFIX, token_prefix_key(token))
    ceiling = limiter.refusal(OPERATOR_AUTH_FAILURES_GLOBAL, EVERYONE)
    if ceiling is not None and not begins_like_operator_token(token, config.admin_token, config.viewer_token):
        raise ceiling
    return ceiling


def count_operator_auth_failure(token: str, ceiling: TooManyRequests | None) -> None:
    """Count one failed admin or viewer token against its prefix and the global ceiling. The attempt answers
    401, or 429 once the ceiling was used up, so that a wrong token sharing an operator token's prefix is told
    nothing the other guesses are not."""
    try:
        context().limiter.hit((OPERATOR_AUTH_FAILURES_PER_TOKEN_PREFIX, token_prefix_key(token)),
                              (OPERATOR_AUTH_FAILURES_GLOBAL, EVERYONE))
    except TooManyRequests:
        pass  # a window is used up now: the next guess is refused before its token is compared
    if ceiling is not None:
        raise ceiling


def json_response(model: BaseModel, status: int = 200) -> Response:
    """Serialise a response model (pydantic's JSON, no re-encoding through dicts)."""
    return Response(model.model_dump_json(), status=status, mimetype="application/json")
