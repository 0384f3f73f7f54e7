"""Content-addressed blob storage: ONNX models, training graphs and other artifacts, keyed by sha256.

`BlobStore` is the interface (an S3-compatible store can implement it later); `FileBlobStore` keeps
blobs as files `<root>/<aa>/<sha256>`. The digest is the only thing that ever becomes part of a
path, and it is checked to be exactly 64 lowercase hex digits first, so no request can name a file
outside the store.
"""

from __future__ import annotations

import hashlib
import re
from abc import ABC, abstractmethod
from pathlib import Path
from typing import BinaryIO

from fedzoo.errors import InvalidInputError, NotFoundError
from fedzoo.zoo import atomic_write_bytes

SHA256_RE = re.compile(r"[0-9a-f]{64}")
_CHUNK_BYTES = 1 << 20


def check_digest(sha256: str, field: str = "sha256") -> str:
    """The digest itself if it is 64 lowercase hex digits; InvalidInputError otherwise."""
    if not isinstance(sha256, str) or not SHA256_RE.fullmatch(sha256):
        shown = sha256[:80] if isinstance(sha256, str) else type(sha256).__name__
        raise InvalidInputError(f"{field} must be 64 lowercase hex digits, got {shown!r}", field=field)
    return sha256


class BlobStore(ABC):
    """Immutable blobs addressed by the sha256 of their bytes."""

    @abstractmethod
    def put(self, data: bytes, expected_sha256: str | None = None) -> str:
        """Store bytes and return their sha256; InvalidInputError if they do not hash to `expected_sha256`.
        Storing bytes that are already stored is a no-op."""

    @abstractmethod
    def open(self, sha256: str) -> BinaryIO:
        """A binary stream of the blob, positioned at 0; NotFoundError if it is not stored."""

    @abstractmethod
    def exists(self, sha256: str) -> bool:
        """True when the blob is stored."""

    @abstractmethod
    def size(self, sha256: str) -> int:
        """Length of the blob in bytes; NotFoundError if it is not stored."""


class FileBlobStore(BlobStore):
    """Blobs as files under one root, written atomically (temporary file, fsync, rename). `fsync=False` skips the
    fsync (still atomic for readers, not durable across a power cut): for a throwaway server such as a simulation's."""

    def __init__(self, root: str | Path, fsync: bool = True) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync

    def _path(self, sha256: str) -> Path:
        check_digest(sha256)
        return self.root / sha256[:2] / sha256

    def put(self, data: bytes, expected_sha256: str | None = None) -> str:
        digest = hashlib.sha256(data).hexdigest()
        if expected_sha256 is not None and digest != check_digest(expected_sha256):
            raise InvalidInputError(
                f"the blob's bytes hash to {digest}, not to the declared sha256 {expected_sha256}", field="sha256"
            )
        target = self._path(digest)
        if target.is_file():
            return digest
        atomic_write_bytes(target, data, fsync=self.fsync)
        return digest

    def put_file(self, path: str | Path, expected_sha256: str | None = None) -> str:
        """Store a local file's bytes (used when importing a zoo directory)."""
        return self.put(Path(path).read_bytes(), expected_sha256)

    def open(self, sha256: str) -> BinaryIO:
        try:
            return open(self._path(sha256), "rb")
        except FileNotFoundError:
            raise NotFoundError(f"blob {sha256} is not stored") from None

    def exists(self, sha256: str) -> bool:
        return self._path(sha256).is_file()

    def size(self, sha256: str) -> int:
        try:
            return self._path(sha256).stat().st_size
        except FileNotFoundError:
            raise NotFoundError(f"blob {sha256} is not stored") from None
