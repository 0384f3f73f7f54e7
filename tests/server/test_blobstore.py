"""The file blob store: content addressing, sha256 verification on put, and digests as the only
way into the filesystem."""

from __future__ import annotations

import hashlib
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedzoo.errors import InvalidInputError, NotFoundError
from fedzoo.server.blobstore import FileBlobStore, check_digest


def test_put_open_exists_size_round_trip(tmp_path):
    store = FileBlobStore(tmp_path / "blobs")
    digest = store.put(b"hello onnx")
    assert digest == hashlib.sha256(b"hello onnx").hexdigest()
    assert store.exists(digest) and store.size(digest) == 10
    with store.open(digest) as stream:
        assert stream.read() == b"hello onnx"
    assert store.put(b"hello onnx", expected_sha256=digest) == digest  # idempotent


def test_put_refuses_bytes_that_do_not_match_the_declared_digest_and_stores_nothing(tmp_path):
    store = FileBlobStore(tmp_path / "blobs")
    wrong = hashlib.sha256(b"other").hexdigest()
    with pytest.raises(InvalidInputError, match="hash to"):
        store.put(b"payload", expected_sha256=wrong)
    assert not any(path.is_file() for path in (tmp_path / "blobs").rglob("*"))


def test_a_missing_blob_is_not_found(tmp_path):
    store = FileBlobStore(tmp_path / "blobs")
    with pytest.raises(NotFoundError):
        store.open("0" * 64)
    with pytest.raises(NotFoundError):
        store.size("0" * 64)
    assert not store.exists("0" * 64)


@pytest.mark.parametrize("digest", ["../" * 10 + "etc/passwd", "..", "/etc/passwd", "A" * 64, "0" * 63, "0" * 65,
                                    "0" * 62 + "/x", "0" * 63 + "\0", ""])
def test_anything_but_a_digest_is_refused_before_touching_the_filesystem(tmp_path, digest):
    store = FileBlobStore(tmp_path / "blobs")
    for operation in (store.open, store.exists, store.size):
        with pytest.raises(InvalidInputError, match="64 lowercase hex"):
            operation(digest)


@given(st.text(max_size=80).filter(lambda text: not (len(text) == 64 and set(text) <= set("0123456789abcdef"))))
def test_check_digest_accepts_only_64_lowercase_hex_digits(text):
    with pytest.raises(InvalidInputError):
        check_digest(text)


@given(st.text(alphabet=string.digits + "abcdef", min_size=64, max_size=64))
def test_check_digest_accepts_every_hex_digest(text):
    assert check_digest(text) == text


def test_without_fsync_a_blob_is_still_written_whole_and_read_back(tmp_path, monkeypatch):
    """`fsync=False` (a simulation's throwaway server) skips only the fsync, not the atomic rename."""
    import os

    def no_fsync(_descriptor):
        raise AssertionError("fsync called")

    monkeypatch.setattr(os, "fsync", no_fsync)
    store = FileBlobStore(tmp_path / "blobs", fsync=False)
    digest = store.put(b"an update")
    with store.open(digest) as stream:
        assert stream.read() == b"an update"
    assert not [path for path in (tmp_path / "blobs").rglob("*.tmp")]  # no temporary file left behind
    with pytest.raises(AssertionError, match="fsync called"):
        FileBlobStore(tmp_path / "durable").put(b"an update")  # the default fsyncs


def test_fsync_blobs_is_on_unless_the_environment_turns_it_off(tmp_path):
    from fedzoo.server.config import ServerConfig

    assert ServerConfig.from_env({}, data_dir=tmp_path).fsync_blobs is True
    assert ServerConfig.from_env({"FEDZOO_FSYNC_BLOBS": "off"}, data_dir=tmp_path).fsync_blobs is False
    with pytest.raises(InvalidInputError, match="FEDZOO_FSYNC_BLOBS"):
        ServerConfig.from_env({"FEDZOO_FSYNC_BLOBS": "sometimes"}, data_dir=tmp_path)
