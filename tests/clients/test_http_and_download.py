"""The SDK's transport against real loopback servers: retries with backoff, typed errors, resumable
sha256-checked downloads."""

import hashlib
import json
import re

import pytest

from fedzoo.clients.download import BlobCache, download_blob
from fedzoo.clients.errors import (
    ConflictError,
    IntegrityError,
    NotFoundAPIError,
    ServerUnavailableError,
    BadRequestError,
)
from fedzoo.clients.http import FedzooHTTP, RetryPolicy
from fedzoo.errors import InvalidInputError, NotFoundError

BLOB = bytes(range(256)) * 400  # 102,400 bytes
BLOB_SHA = hashlib.sha256(BLOB).hexdigest()


def _json(handler, status, payload, headers=None):
    data = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(data)


def _http(server, sleeps):
    return FedzooHTTP(server.url, token="secret", retry=RetryPolicy(max_attempts=4, base_delay_s=0.01),
                      sleep=sleeps.append)


def test_transient_failures_are_retried_with_growing_jittered_backoff(scripted_server):
    statuses = iter([503, 502, 200])
    scripted_server.handle = lambda h: _json(h, next(statuses), {"ok": True})
    sleeps = []
    assert _http(scripted_server, sleeps).get_json("/v1/models") == {"ok": True}
    assert len(scripted_server.requests) == 3
    assert len(sleeps) == 2 and 0 <= sleeps[0] <= 0.01 and 0 <= sleeps[1] <= 0.02
    assert scripted_server.requests[0]["headers"]["authorization"] == "Bearer secret"


def test_retry_after_is_honoured_and_persistent_failure_raises_unavailable(scripted_server):
    scripted_server.handle = lambda h: _json(h, 503, {"error": {"code": "busy", "message": "later"}},
                                             {"Retry-After": "0.5"})
    sleeps = []
    with pytest.raises(ServerUnavailableError, match="failed 4 times; last problem: HTTP 503"):
        _http(scripted_server, sleeps).get_json("/v1/models")
    assert sleeps == [0.5, 0.5, 0.5]


def test_connection_refused_raises_unavailable_after_retries():
    sleeps = []
    http = FedzooHTTP("http://127.0.0.1:9", retry=RetryPolicy(max_attempts=3, base_delay_s=0.01), sleep=sleeps.append)
    with pytest.raises(ServerUnavailableError, match="ConnectError"):
        http.get_json("/v1/models")
    assert len(sleeps) == 2


@pytest.mark.parametrize(
    ("status", "code", "kind", "also"),
    [(404, "not_found", NotFoundAPIError, NotFoundError), (409, "duplicate_update", ConflictError, ConflictError),
     (422, "invalid_field", BadRequestError, InvalidInputError)],
)
def test_error_statuses_map_to_typed_exceptions_keeping_code_and_field(scripted_server, status, code, kind, also):
    scripted_server.handle = lambda h: _json(h, status, {"error": {"code": code, "message": "nope", "field": "delta"}})
    with pytest.raises(kind) as error:
        _http(scripted_server, []).get_json("/v1/x")
    assert isinstance(error.value, also)
    assert (error.value.status, error.value.code, error.value.field) == (status, code, "delta")
    assert "HTTP" in str(error.value) and "delta" in str(error.value)
    assert len(scripted_server.requests) == 1  # client errors are not retried


def _serve_blob(data, cut_first_response_at=None):
    """A blob server honouring `Range: bytes=N-`; the first full response is cut off after some bytes."""
    state = {"cut": cut_first_response_at}

    def handle(handler):
        start = 0
        match = re.fullmatch(r"bytes=(\d+)-", handler.headers.get("Range", ""))
        if match:
            start = int(match.group(1))
            if start >= len(data):
                return _json(handler, 416, {"error": {"code": "range_not_satisfiable", "message": "past end"}})
            handler.send_response(206)
            handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            handler.send_response(200)
        body = data[start:]
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if state["cut"] is not None:
            handler.wfile.write(body[: state["cut"]])
            handler.wfile.flush()
            handler.close_connection = True
            state["cut"] = None
            return
        handler.wfile.write(body)

    return handle


def test_interrupted_download_resumes_with_range_and_is_verified(scripted_server, tmp_path):
    scripted_server.handle = _serve_blob(BLOB, cut_first_response_at=30_000)
    cache = BlobCache(tmp_path)
    path, transferred = download_blob(_http(scripted_server, []), "/v1/blobs/x", BLOB_SHA, cache)
    assert path.read_bytes() == BLOB
    assert path == cache.blob_path(BLOB_SHA)
    assert transferred == len(BLOB)  # 30,000 then the remaining 72,400, nothing twice
    assert scripted_server.requests[1]["headers"]["range"] == "bytes=30000-"
    assert scripted_server.requests[1]["headers"]["if-range"] == f'"{BLOB_SHA}"'
    # a second download is served from the cache without any request
    count = len(scripted_server.requests)
    assert download_blob(_http(scripted_server, []), "/v1/blobs/x", BLOB_SHA, cache) == (path, 0)
    assert len(scripted_server.requests) == count


def test_corrupt_download_is_discarded_and_raises(scripted_server, tmp_path):
    scripted_server.handle = _serve_blob(b"tampered" + BLOB[8:])
    cache = BlobCache(tmp_path)
    with pytest.raises(IntegrityError, match="download discarded"):
        download_blob(_http(scripted_server, []), "/v1/blobs/x", BLOB_SHA, cache)
    assert cache.get(BLOB_SHA) is None
    assert not cache.partial_path(BLOB_SHA).exists()


def test_partial_file_past_the_end_starts_over(scripted_server, tmp_path):
    scripted_server.handle = _serve_blob(BLOB)
    cache = BlobCache(tmp_path)
    cache.partial_path(BLOB_SHA).write_bytes(b"x" * (len(BLOB) + 10))
    path, _ = download_blob(_http(scripted_server, []), "/v1/blobs/x", BLOB_SHA, cache)
    assert path.read_bytes() == BLOB


def test_cache_refuses_a_digest_that_is_not_one(tmp_path):
    with pytest.raises(InvalidInputError, match="64 lowercase hex"):
        BlobCache(tmp_path).blob_path("../../etc/passwd")


def _drop_connection(handler):
    """The server read the request, then vanished without answering (a crash after storing it)."""
    handler.close_connection = True
    handler.wfile.flush()


def test_a_post_that_may_have_been_processed_is_never_re_sent(scripted_server):
    for failure in (lambda h: _json(h, 500, {"error": {"code": "internal_error", "message": "x"}}), _drop_connection):
        scripted_server.requests.clear()
        scripted_server.handle = failure
        with pytest.raises(ServerUnavailableError, match="not re-sent"):
            _http(scripted_server, []).request("POST", "/v1/fl/rounds/1/updates", content=b"delta")
        assert len(scripted_server.requests) == 1
    # the same failures on a GET are retried: reading twice changes nothing
    scripted_server.requests.clear()
    with pytest.raises(ServerUnavailableError, match="failed 4 times"):
        _http(scripted_server, []).get_json("/v1/models")
    assert len(scripted_server.requests) == 4


def test_a_post_the_server_refused_before_acting_is_re_sent(scripted_server):
    statuses = iter([429, 503, 201])
    scripted_server.handle = lambda h: _json(h, next(statuses), {"ok": True})
    answer = _http(scripted_server, []).request("POST", "/v1/devices", expected=(201,), json={})
    assert answer.json() == {"ok": True} and len(scripted_server.requests) == 3


def test_an_upload_whose_answer_was_lost_is_re_sent_once_and_a_duplicate_counts_as_delivered(scripted_server,
                                                                                           tmp_path):
    from fedzoo.clients.client import FedzooClient
    from fedzoo.clients.participation import deliver_update

    answers = iter([_drop_connection,
                    lambda h: _json(h, 409, {"error": {"code": "duplicate_update", "message": "have it"}})])
    scripted_server.handle = lambda h: next(answers)(h)
    client = FedzooClient(scripted_server.url, token="secret", cache_dir=tmp_path)
    client.http.sleep = lambda seconds: None
    assert deliver_update(client, "/v1/fl/rounds/1/updates", {"num_examples": 3}, b"delta") == "accepted"
    assert [request["method"] for request in scripted_server.requests] == ["POST", "POST"]
