"""Blobs: upload (admin), and download of a model's ONNX file or of any blob by sha256.

`GET /v1/models/<id>/blob` serves the model's ONNX file; `GET /v1/blobs/<sha256>` serves any stored
blob (training graphs, other artifacts named in a card), except the server's own data sets: a blob a round
names as its root set or evaluation set needs the viewer or admin token. Both send `ETag: "<sha256>"`, the header
`X-Content-SHA256`, `Accept-Ranges: bytes`; `If-None-Match` with that ETag answers 304,
`Range: bytes=a-b` (or `a-` / `-n`) answers 206 with `Content-Range` (a suffix `-n` longer than the
blob gets the whole blob, as RFC 9110 says), a range starting past the end 416 with
`Content-Range: bytes */<size>`. Only one range per request.
"""

from __future__ import annotations

from collections.abc import Iterator

from flask import Blueprint, Response, request
from sqlalchemy import or_, select
from sqlalchemy.orm import Session
from werkzeug.http import parse_range_header

from fedzoo.cards import SHA256_PATTERN
from fedzoo.server import registry
from fedzoo.server.blobstore import BlobStore, check_digest
from fedzoo.server.errors import BadRequest, NotFound, RangeNotSatisfiable, UnsupportedMediaType
from fedzoo.server.fl.tables import FLRound
from fedzoo.server.openapi import OCTET_STREAM, documented
from fedzoo.server.routes.common import context, json_response, raw_body, require_admin_token, require_reader_token
from fedzoo.server.routes.models import MODEL_ID
from fedzoo.server.schemas import BlobUploadResponse
from fedzoo.server.tables import ModelRecord

blueprint = Blueprint("blobs", __name__)
SHA256_PARAM = {"sha256": {"type": "string", "pattern": SHA256_PATTERN}}
STREAM_CHUNK_BYTES = 256 * 1024
OPERATOR_DATA_FIELDS = ("root_sha256", "evaluation_sha256")  # a round config's blobs only the operator reads
DOWNLOAD_HEADERS = {
    "ETag": 'the quoted sha256 of the whole blob', "X-Content-SHA256": "sha256 of the whole blob (hex)",
    "Accept-Ranges": "bytes",
}
DOWNLOAD_DOC = dict(
    response_media_type=OCTET_STREAM, errors=(404, 416, 422), response_headers=DOWNLOAD_HEADERS,
    extra_responses={206: "the requested byte range (Content-Range says which)",
                     304: "If-None-Match matched the ETag"},
)


def _stream(store: BlobStore, sha256: str, start: int, stop: int) -> Iterator[bytes]:
    with store.open(sha256) as blob:
        blob.seek(start)
        remaining = stop - start
        while remaining > 0:
            chunk = blob.read(min(STREAM_CHUNK_BYTES, remaining))
            if not chunk:
                return
            remaining -= len(chunk)
            yield chunk


def _bounds(byte_range: tuple[int, int | None], size: int) -> tuple[int, int] | None:
    """[start, stop) of one range of a `size`-byte blob, or None when unsatisfiable (RFC 9110 §14.1.2: a
    suffix `-n` longer than the blob means the whole blob; a first byte past the end is unsatisfiable)."""
    start, stop = byte_range
    if start < 0:  # suffix range "-n": the last n bytes, all of them when n >= size
        return (max(0, size + start), size) if size > 0 else None
    if start >= size:
        return None
    return start, size if stop is None else min(stop, size)


def blob_response(sha256: str) -> Response:
    """The blob, honouring If-None-Match and a single Range."""
    store = context().store
    if not store.exists(sha256):
        raise NotFound(f"blob {sha256} is not stored", field="sha256")
    size = store.size(sha256)
    headers = {"ETag": f'"{sha256}"', "X-Content-SHA256": sha256, "Accept-Ranges": "bytes",
               "Cache-Control": "public, max-age=31536000, immutable"}
    if sha256 in request.if_none_match or request.if_none_match.star_tag:
        return Response(status=304, headers=headers)
    start, stop, status = 0, size, 200
    range_header = request.headers.get("Range")
    if range_header is not None and (not request.if_range.etag or request.if_range.etag == sha256):
        parsed = parse_range_header(range_header)
        if parsed is None or parsed.units != "bytes" or len(parsed.ranges) != 1:
            raise BadRequest(f"Range must be one 'bytes=start-end' range, got {range_header[:100]!r}", field="Range")
        bounds = _bounds(parsed.ranges[0], size)
        if bounds is None:
            raise RangeNotSatisfiable(f"Range {range_header[:100]!r} is outside the blob's {size} bytes",
                                      field="Range", size_bytes=size)
        start, stop, status = bounds[0], bounds[1], 206
        headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
    headers["Content-Length"] = str(stop - start)
    return Response(_stream(store, sha256, start, stop), status=status, headers=headers, mimetype=OCTET_STREAM,
                    direct_passthrough=True)


@documented(blueprint, "GET", "/v1/models/<model_id>/blob", summary="Download a model's ONNX file",
            path_params=MODEL_ID, **DOWNLOAD_DOC)
def download_model(model_id: str) -> Response:
    with context().db.session() as session:
        sha256 = registry.model_sha256(session, model_id)
    return blob_response(sha256)


@documented(blueprint, "GET", "/v1/blobs/<sha256>",
            summary="Download a blob (model, training graph, artifact); a round's root or evaluation set needs the "
                    "viewer or admin token", path_params=SHA256_PARAM,
            **{**DOWNLOAD_DOC, "errors": (401, 403, 404, 416, 422)})
def download_blob(sha256: str) -> Response:
    check_digest(sha256)
    with context().db.session() as session:
        if is_operator_data(session, sha256):
            require_reader_token()
    return blob_response(sha256)


def is_operator_data(session: Session, sha256: str) -> bool:
    """Whether the blob is a round's root training set or evaluation set: the server's own data, which only the
    operator's tokens read (with the root set an outsider recomputes the server's FLTrust reference update and
    shapes a poisoned update to pass it). A model's blob is public whatever else names it."""
    if session.scalar(select(ModelRecord.id).where(ModelRecord.sha256 == sha256).limit(1)) is not None:
        return False
    named = or_(*(FLRound.config_json.contains(f'"{field}":"{sha256}"') for field in OPERATOR_DATA_FIELDS))
    return session.scalar(select(FLRound.id).where(named).limit(1)) is not None


@documented(blueprint, "PUT", "/v1/blobs/<sha256>", summary="Upload a blob; its bytes must hash to the URL's sha256",
            auth="admin", path_params=SHA256_PARAM, request_media_type=OCTET_STREAM, response=BlobUploadResponse,
            description="The body's sha256 must equal the path's `sha256`, else 422 with field `sha256` and nothing "
                        "is stored. Sent chunked or not, a body over the server's request limit is 413.",
            status=201, extra_responses={200: "the blob was already stored"}, errors=(403, 422))
def upload_blob(sha256: str) -> Response:
    require_admin_token()
    check_digest(sha256)
    if request.mimetype != OCTET_STREAM:
        raise UnsupportedMediaType(f"send the blob as {OCTET_STREAM}, not {request.mimetype or 'nothing'!r}",
                                   field="Content-Type")
    store = context().store
    existed = store.exists(sha256)
    data = raw_body(context().config.max_request_bytes)
    store.put(data, expected_sha256=sha256)
    return json_response(BlobUploadResponse(sha256=sha256, size_bytes=len(data), created=not existed),
                         status=200 if existed else 201)
