"""Downloads of content-addressed blobs: resumable with HTTP Range, sha256-checked, cached on disk.

Cache layout: `<cache_dir>/blobs/<sha256>` holds verified blobs; `<cache_dir>/partial/<sha256>.part`
holds the bytes of an interrupted download, which the next attempt continues with
`Range: bytes=<have>-` (and `If-Range: "<sha256>"`, so a server that would send different bytes
sends the whole blob instead). A blob is moved into `blobs/` only after its bytes hash to the
expected sha256; a mismatch deletes the partial file and raises IntegrityError.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import httpx

from fedzoo.clients.errors import IntegrityError, RangeNotSatisfiableError, ServerUnavailableError
from fedzoo.clients.http import FedzooHTTP
from fedzoo.clients.metered import ProgressCallback
from fedzoo.errors import InvalidInputError

SHA256_RE = re.compile(r"[0-9a-f]{64}")
CONTENT_RANGE_RE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def default_cache_dir() -> Path:
    """`$FEDZOO_CACHE_DIR`, else `~/.cache/fedzoo`."""
    return Path(os.environ.get("FEDZOO_CACHE_DIR") or Path.home() / ".cache" / "fedzoo")


def sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class BlobCache:
    """Verified blobs on disk, by sha256, plus the partial files of interrupted downloads."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        (self.root / "partial").mkdir(parents=True, exist_ok=True)

    @staticmethod
    def _check(sha256: str) -> str:
        if not SHA256_RE.fullmatch(sha256):
            raise InvalidInputError(f"sha256 must be 64 lowercase hex digits, got {sha256!r}", field="sha256")
        return sha256

    def blob_path(self, sha256: str) -> Path:
        return self.root / "blobs" / self._check(sha256)

    def partial_path(self, sha256: str) -> Path:
        return self.root / "partial" / f"{self._check(sha256)}.part"

    def get(self, sha256: str) -> Path | None:
        """The cached blob's path, or None when it is not cached."""
        path = self.blob_path(sha256)
        return path if path.is_file() else None


def download_blob(
    http: FedzooHTTP, url_path: str, sha256: str, cache: BlobCache, max_attempts: int = 5,
    progress: ProgressCallback | None = None,
) -> tuple[Path, int]:
    """The verified local path of a blob and how many bytes this call transferred (0 when cached).

    An interrupted transfer is resumed from where it stopped, up to `max_attempts` times; `progress`
    hears the bytes held so far against the blob's size as they arrive.
    """
    cached = cache.get(sha256)
    if cached is not None:
        return cached, 0
    partial = cache.partial_path(sha256)
    transferred = 0
    for attempt in range(max_attempts):
        have = partial.stat().st_size if partial.exists() else 0
        # identity encoding: byte offsets must be offsets into the blob, not into a compressed stream
        headers = {"Accept-Encoding": "identity"}
        if have:
            headers.update({"Range": f"bytes={have}-", "If-Range": f'"{sha256}"'})
        try:
            with http.stream("GET", url_path, headers=headers) as response:
                append = response.status_code == 206 and _range_start(response) == have
                held = have if append else 0
                total_bytes = _total_bytes(response, held)
                with open(partial, "ab" if append else "wb") as stream:
                    for chunk in response.iter_bytes():  # as received, so a cut keeps what arrived
                        stream.write(chunk)
                        transferred += len(chunk)
                        held += len(chunk)
                        if progress is not None:
                            progress(f"download {sha256[:12]}", held, total_bytes)
            break
        except RangeNotSatisfiableError:
            partial.unlink(missing_ok=True)  # we hold bytes past the blob's end: start over
        except (httpx.TransportError, httpx.TimeoutException):
            if attempt + 1 < max_attempts:
                http.sleep(http.retry.delay_s(attempt))
    else:
        raise ServerUnavailableError(f"download of {url_path} did not finish after {max_attempts} attempts")
    actual = sha256_of_file(partial)
    if actual != sha256:
        partial.unlink(missing_ok=True)
        raise IntegrityError(f"{url_path} sent bytes hashing to {actual}, not the expected {sha256}; download discarded")
    target = cache.blob_path(sha256)
    os.replace(partial, target)
    return target, transferred


def _range_start(response: httpx.Response) -> int | None:
    match = CONTENT_RANGE_RE.fullmatch(response.headers.get("Content-Range", ""))
    return int(match.group(1)) if match else None


def _total_bytes(response: httpx.Response, held: int) -> int | None:
    """The whole blob's size: Content-Range's total on a resumed answer, else what is held plus Content-Length."""
    match = CONTENT_RANGE_RE.fullmatch(response.headers.get("Content-Range", ""))
    if match and match.group(3) != "*":
        return int(match.group(3))
    length = response.headers.get("Content-Length")
    return held + int(length) if length and length.isdigit() else None
