"""Request bodies that report their bytes as httpx sends them, so uploads can show progress.

Both can be sent again from the start: httpx re-iterates a body that is not a generator, and seeks a
multipart file back to 0, so the retries of `FedzooHTTP.request` resend the whole body.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator

CHUNK_BYTES = 64 * 1024
# called as bytes move: (what is moving, bytes done so far, total bytes or None when unknown)
ProgressCallback = Callable[[str, int, "int | None"], None]


class MeteredBytes:
    """A raw request body (`content=`) sent in chunks, each reported to `progress`."""

    def __init__(self, data: bytes, label: str, progress: ProgressCallback) -> None:
        self.data, self.label, self.progress = data, label, progress

    def __iter__(self) -> Iterator[bytes]:
        for start in range(0, len(self.data), CHUNK_BYTES):
            chunk = self.data[start:start + CHUNK_BYTES]
            self.progress(self.label, start + len(chunk), len(self.data))
            yield chunk


class MeteredFile(io.BytesIO):
    """A multipart file part (`files=`) whose reads are reported to `progress`."""

    def __init__(self, data: bytes, label: str, progress: ProgressCallback) -> None:
        super().__init__(data)
        self.size_bytes, self.label, self.progress = len(data), label, progress

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.progress(self.label, self.tell(), self.size_bytes)
        return chunk
