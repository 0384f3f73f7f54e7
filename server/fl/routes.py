"""The federated-learning endpoints: a thin layer that parses, calls the round service, serialises.

Update upload wire format (`POST /v1/fl/rounds/<id>/updates`, device token): `multipart/form-data`
with two parts,

- `metadata`: JSON `{"base_version", "num_examples", "metrics"}` (see `UpdateMetadata`), as a form field
  or a part of type `application/json`; types are strict (`"num_examples": "100"` is refused with 422
  naming the field);
- `delta`: the `.npz` of `fedzoo.update_codec` (float32 or INT8 deltas keyed by initializer
  name), at most `task.upload.max_bytes` bytes.

201 means the update is stored and counts, with the weight `counted_examples` (the device's
`num_examples`, capped by the round); it says so even when aggregating the round failed afterwards
(the update stays stored and the aggregation is retried). Refusals: 403 `not_selected`; 409 `duplicate_update`,
`stale_update` (wrong `base_version`), `round_not_accepting` (deadline passed, target reached, or
closed); 413 over the size limit; 422 naming the tensor whose name, shape, dtype or values are wrong.

A device checking in declares what it can do (`secure_aggregation` version, `dp_clipping`, `encodings`: see
`fedzoo.capabilities`); a round whose plan needs more does not select it. A selected device that cannot or will
not do its task says so at `POST /v1/fl/rounds/<id>/decline` (`{"reason", "message"}`), which the round records.

SecAgg+ rounds (`privacy.secure_aggregation`) take no delta upload (409 `secure_round`): the device replies
to each stage that `GET /v1/fl/task` shows it (`task.privacy.secure_aggregation`) at
`POST /v1/fl/rounds/<id>/secagg/<stage>`: `advertise_keys` and `consistency_check` as JSON, each signed with
the device's registered key (422 `signature` when it does not verify); `share_keys` and `unmask` as JSON or,
about half the bytes, as `application/octet-stream` framed by `fedzoo.secagg.framing` (what the SDK sends);
`masked_input` as `application/octet-stream` (the masked vector's little-endian ring values, 2 or 4 bytes
each). The device's client number comes from its token, never from the body. 201 means
the reply is stored and counts; 409 `wrong_stage` (the stage is closed or not open yet), `duplicate_reply`,
`dropped_out` (the device missed an earlier stage), `not_a_secure_round`; 403 `not_selected`, `not_in_cohort`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, current_app, request
from pydantic import Field, ValidationError

from fedzoo.secagg.errors import ProtocolViolation
from fedzoo.secagg.framing import decode_share_keys, decode_unmask, encode_share_keys, encode_unmask
from fedzoo.server.errors import BadRequest, UnsupportedMediaType, ValidationFailed
from fedzoo.server.fl.round_context import MAX_ROUND_ID
from fedzoo.server.fl.rounds import RoundService
from fedzoo.server.fl.schemas import (
    AdvertiseKeysReply, ConsistencyCheckReply, DeclineReceipt, DeclineRequest, RoundConfig, RoundView, SecureReplyReceipt,
    ShareKeysReply, TaskQuery, TaskResponse, UnmaskReply, UpdateMetadata, UpdateReceipt,
)
from fedzoo.server.openapi import OCTET_STREAM, documented
from fedzoo.server.routes.common import (
    EXTENSION_KEY, authenticated_rate_limited, calling_device, context, json_body, json_response, parse_json,
    query_args, raw_body, require_admin_token, require_reader_token, validation_error,
)
from fedzoo.server.schemas import StrictRequest

blueprint = Blueprint("fl", __name__)
SERVICE_KEY = "fedzoo.fl"
ROUND_ID = {"round_id": {"type": "integer", "minimum": 1, "maximum": MAX_ROUND_ID}}
MULTIPART = "multipart/form-data"


class UpdateUpload(StrictRequest):
    """The two parts of an update upload."""

    metadata: UpdateMetadata = Field(description="a JSON part: sent as a form field or as a part of type "
                                                 "application/json")
    delta: bytes = Field(description="the .npz of weight deltas (fp32 or int8, see fedzoo.update_codec)")


# OpenAPI `encoding`: what each part of the multipart upload holds
UPLOAD_ENCODING = {"metadata": {"contentType": "application/json"}, "delta": {"contentType": "application/octet-stream"}}


@blueprint.record_once
def _create_service(state) -> None:
    server = state.app.extensions[EXTENSION_KEY]
    state.app.extensions[SERVICE_KEY] = RoundService(
        server.db, server.store, server.estimator, server.keys.server_key, spill_dir=server.config.data_dir / "fl-spill",
        max_examples_per_update=server.config.fl_max_examples_per_update,
        dp_line_max_epsilon=server.config.dp_line_max_epsilon, dp_max_delta=server.config.dp_max_delta)


def service() -> RoundService:
    return current_app.extensions[SERVICE_KEY]


@documented(blueprint, "POST", "/v1/fl/rounds", summary="Start a plan of federated rounds on a published model",
            auth="admin", request=RoundConfig, response=RoundView, status=201, errors=(403, 404, 422))
def create_round() -> Response:
    require_admin_token()
    config = json_body(RoundConfig, strict=False)
    if config.zoo is not None:
        raise ValidationFailed("a zoo-wide plan starts with POST /v1/fl/zoo-rounds", field="zoo")
    round_id = service().create_round(config)
    return json_response(RoundView(**service().round_view(round_id)), status=201)


@documented(blueprint, "POST", "/v1/fl/zoo-rounds",
            summary="Start a zoo-wide plan: each device trains the subnet its lookup picks, the supernet and every "
                    "zoo model improve (docs/zoo-federated.md)",
            auth="admin", request=RoundConfig, response=RoundView, status=201, errors=(403, 404, 422))
def create_zoo_round() -> Response:
    require_admin_token()
    config = json_body(RoundConfig, strict=False)
    if config.zoo is None:
        raise ValidationFailed("a zoo-wide plan needs its `zoo` settings (latency_budget_ms, calibration_sha256)",
                               field="zoo")
    round_id = service().create_round(config)
    return json_response(RoundView(**service().round_view(round_id)), status=201)


@documented(blueprint, "GET", "/v1/fl/rounds/<int:round_id>", summary="A round's state, counts, bytes and outcome "
            "(under DP, no contributor counts)", auth="viewer", response=RoundView, path_params=ROUND_ID,
            errors=(401, 403, 404))
def get_round(round_id: int) -> Response:
    require_reader_token()
    return json_response(RoundView(**service().round_view(round_id)))


@documented(blueprint, "GET", "/v1/fl/task",
            summary="Check in: be selected for a round of this task, or learn when to ask again (pace steering)",
            auth="device", query=TaskQuery, response=TaskResponse, errors=(422,))
def get_task() -> Response:
    device = calling_device()
    query = query_args(TaskQuery)
    return json_response(service().check_in(device.id, query.task, query.family, query.capabilities()))


@documented(blueprint, "POST", "/v1/fl/rounds/<int:round_id>/decline",
            summary="A selected device declines the round's task, with a reason (one it cannot do, or a server that "
                    "broke the protocol); the round records it", auth="device", request=DeclineRequest,
            response=DeclineReceipt, status=201, path_params=ROUND_ID, errors=(403, 404, 422))
def decline_task(round_id: int) -> Response:
    device = calling_device()
    body = json_body(DeclineRequest)
    return json_response(DeclineReceipt(**service().decline(device.id, round_id, body.reason, body.message)),
                         status=201)


@documented(blueprint, "POST", "/v1/fl/rounds/<int:round_id>/updates",
            summary="Upload this device's weight delta for a round (multipart: metadata JSON + delta .npz)",
            auth="device", request=UpdateUpload, request_media_type=MULTIPART, request_encoding=UPLOAD_ENCODING,
            response=UpdateReceipt, status=201,
            path_params=ROUND_ID, errors=(403, 404, 409, 413, 422, 429))
def upload_update(round_id: int) -> Response:
    with context().db.read() as connection:
        device = authenticated_rate_limited(connection, "upload")
    if request.mimetype != MULTIPART:
        raise BadRequest(f"send the update as {MULTIPART} with parts 'metadata' and 'delta'", field="Content-Type")
    # the JSON part arrives as a plain form field (our SDK) or, with a filename, as a file part (other clients)
    raw_metadata: str | bytes | None = request.form.get("metadata")
    if raw_metadata is None and "metadata" in request.files:
        raw_metadata = request.files["metadata"].read()
    if raw_metadata is None or "delta" not in request.files:
        raise BadRequest("the upload needs a 'metadata' JSON part and a 'delta' file part", field="delta")
    try:  # the same JSON rules as every JSON body: strict types ("100" is no integer), bounded nesting
        document = parse_json(raw_metadata.encode("utf-8") if isinstance(raw_metadata, str) else raw_metadata)
        metadata = UpdateMetadata.model_validate(document, strict=True)
    except ValidationError as error:
        raise validation_error(error, "metadata") from None
    data = request.files["delta"].read()
    receipt = service().submit_update(device.id, round_id, metadata, data)
    return json_response(UpdateReceipt(**receipt), status=201)


SECURE_ERRORS = (403, 404, 409, 422)


def _secure_reply(device_id: str, round_id: int, stage: str, body: bytes) -> Response:
    receipt = service().submit_secure_reply(device_id, round_id, stage, body)
    return json_response(SecureReplyReceipt(**receipt), status=201)


@documented(blueprint, "POST", "/v1/fl/rounds/<int:round_id>/secagg/advertise_keys",
            summary="SecAgg+ stage 1: this device's two fresh X25519 public keys, signed with its registered key",
            auth="device",
            request=AdvertiseKeysReply, response=SecureReplyReceipt, status=201, path_params=ROUND_ID,
            errors=SECURE_ERRORS)
def secagg_advertise_keys(round_id: int) -> Response:
    return _json_reply(round_id, "advertise_keys", AdvertiseKeysReply)


@documented(blueprint, "POST", "/v1/fl/rounds/<int:round_id>/secagg/share_keys",
            summary="SecAgg+ stage 2: encrypted Shamir shares for each neighbour, with commitments (JSON, or "
                    "application/octet-stream framed by fedzoo.secagg.framing)", auth="device",
            request=ShareKeysReply, response=SecureReplyReceipt, status=201, path_params=ROUND_ID,
            errors=SECURE_ERRORS)
def secagg_share_keys(round_id: int) -> Response:
    return _framed_reply(round_id, "share_keys", ShareKeysReply, encode_share_keys, decode_share_keys)


@documented(blueprint, "POST", "/v1/fl/rounds/<int:round_id>/secagg/masked_input",
            summary="SecAgg+ stage 3: the masked vector (little-endian ring values, application/octet-stream)",
            auth="device", request_media_type=OCTET_STREAM, response=SecureReplyReceipt, status=201,
            path_params=ROUND_ID, errors=SECURE_ERRORS)
def secagg_masked_input(round_id: int) -> Response:
    device = calling_device()
    if request.mimetype != OCTET_STREAM:
        raise UnsupportedMediaType(f"send the masked vector as {OCTET_STREAM}", field="Content-Type")
    return _secure_reply(device.id, round_id, "masked_input", raw_body(service().max_masked_vector_bytes(round_id)))


@documented(blueprint, "POST", "/v1/fl/rounds/<int:round_id>/secagg/consistency_check",
            summary="SecAgg+ stage 4: this device's signature on the survivor set it was sent", auth="device",
            request=ConsistencyCheckReply, response=SecureReplyReceipt, status=201, path_params=ROUND_ID,
            errors=SECURE_ERRORS)
def secagg_consistency_check(round_id: int) -> Response:
    return _json_reply(round_id, "consistency_check", ConsistencyCheckReply)


def _json_reply(round_id: int, stage: str, model: type[AdvertiseKeysReply | ConsistencyCheckReply]) -> Response:
    device = calling_device()
    return _secure_reply(device.id, round_id, stage, json_body(model).model_dump_json().encode())


@documented(blueprint, "POST", "/v1/fl/rounds/<int:round_id>/secagg/unmask",
            summary="SecAgg+ stage 5: one share per neighbour (self-mask seed if it survived, mask key if it dropped; "
                    "JSON, or application/octet-stream framed by fedzoo.secagg.framing)",
            auth="device", request=UnmaskReply, response=SecureReplyReceipt, status=201, path_params=ROUND_ID,
            errors=SECURE_ERRORS)
def secagg_unmask(round_id: int) -> Response:
    return _framed_reply(round_id, "unmask", UnmaskReply, encode_unmask, decode_unmask)


def _framed_reply(round_id: int, stage: str, model: type[ShareKeysReply | UnmaskReply],
                  encode: Callable[[dict[str, Any]], bytes], decode: Callable[[bytes], dict[str, Any]]) -> Response:
    """A share-carrying reply as JSON or framed bytes; stored framed (the compact form), checked either way."""
    device = calling_device()
    try:
        if request.mimetype == OCTET_STREAM:
            data = raw_body(context().config.max_json_bytes)
            model.model_validate(decode(data))
        else:
            data = encode(json_body(model).model_dump())
    except ProtocolViolation as error:
        raise ValidationFailed(f"the {stage} reply is malformed: {error}", field="body") from None
    except ValidationError as error:
        raise validation_error(error, "body") from None
    return _secure_reply(device.id, round_id, stage, data)
