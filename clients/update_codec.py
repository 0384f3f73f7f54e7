"""Weight deltas on the wire: `.npz` archives keyed by initializer name, float32 or INT8.

A device uploads `delta = trained - global` for every trainable parameter, never its data. The
archive is written by numpy without pickles and has one of two encodings:

- ``fp32``: one float32 array per parameter, the key is the initializer name.
- ``int8``: one int8 array ``q`` per parameter (same key) plus two bookkeeping arrays,
  ``@names`` (the parameter names, unicode) and ``@scales`` (one float32 per name, same order).
  The delta is ``q * scale`` with a symmetric per-tensor scale ``max|delta| / 127``, so each
  element is off by at most ``scale / 2`` and the upload is about 4x smaller than float32.

The server decodes with `decode_update`, which also guards against archives that expand to more
than `max_decoded_bytes` (a zip bomb) before reading any array.
"""

from __future__ import annotations

import io
import zipfile
from typing import Literal

import numpy as np

from fedzoo.errors import InvalidInputError

Encoding = Literal["fp32", "int8"]
ENCODINGS: tuple[Encoding, ...] = ("fp32", "int8")
NAMES_KEY = "@names"
SCALES_KEY = "@scales"
INT8_LEVELS = 127


class UpdateFormatError(InvalidInputError):
    """An uploaded update is not a well-formed delta archive."""


def quantize_int8(delta: np.ndarray) -> tuple[np.ndarray, float]:
    """Symmetric per-tensor INT8: values `q` in [-127, 127] and the scale with `delta ≈ q * scale`."""
    delta = np.asarray(delta, dtype=np.float32)
    largest = float(np.max(np.abs(delta))) if delta.size else 0.0
    # the scale travels as float32: keep it a positive normal number even for all-but-zero deltas
    scale = max(largest / INT8_LEVELS, float(np.finfo(np.float32).tiny)) if largest > 0 else 1.0
    quantized = np.clip(np.rint(delta / scale), -INT8_LEVELS, INT8_LEVELS).astype(np.int8)
    return quantized, scale


def encode_update(delta: dict[str, np.ndarray], encoding: Encoding = "fp32") -> bytes:
    """The `.npz` bytes of a delta in the given encoding (see the module docstring)."""
    if encoding not in ENCODINGS:
        raise InvalidInputError(f"unknown update encoding {encoding!r}; use one of {list(ENCODINGS)}", field="encoding")
    if not delta:
        raise InvalidInputError("an update needs at least one parameter delta", field="delta")
    for name in delta:
        if name.startswith("@"):
            raise InvalidInputError(f"parameter name {name!r} may not start with '@' (reserved)", field="delta")
    arrays: dict[str, np.ndarray] = {}
    if encoding == "fp32":
        arrays = {name: np.asarray(value, dtype=np.float32) for name, value in delta.items()}
    else:
        names = sorted(delta)
        scales = np.empty(len(names), dtype=np.float32)
        for index, name in enumerate(names):
            arrays[name], scales[index] = quantize_int8(delta[name])
        arrays[NAMES_KEY] = np.array(names, dtype=np.str_)
        arrays[SCALES_KEY] = scales
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def decoded_size_bytes(data: bytes) -> int:
    """How many bytes the archive's members expand to, read from the zip directory alone."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return sum(member.file_size for member in archive.infolist())
    except zipfile.BadZipFile as error:
        raise UpdateFormatError(f"update is not an .npz archive: {error}", field="delta") from None


def decode_update(data: bytes, max_decoded_bytes: int | None = None) -> tuple[dict[str, np.ndarray], Encoding]:
    """The float32 delta per parameter and the encoding the archive used.

    Raises UpdateFormatError when the bytes are not an archive of this format, or expand to more
    than `max_decoded_bytes`.
    """
    expanded = decoded_size_bytes(data)
    if max_decoded_bytes is not None and expanded > max_decoded_bytes:
        raise UpdateFormatError(
            f"update expands to {expanded} bytes, more than the {max_decoded_bytes} this round's model needs",
            field="delta",
        )
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (ValueError, OSError, zipfile.BadZipFile) as error:
        raise UpdateFormatError(f"update is not a readable .npz archive: {error}", field="delta") from None
    if NAMES_KEY in arrays or SCALES_KEY in arrays:
        return _dequantize(arrays), "int8"
    for name, value in arrays.items():
        if value.dtype != np.float32:
            raise UpdateFormatError(f"delta {name!r} has dtype {value.dtype}; fp32 updates must be float32", field=name)
    return arrays, "fp32"


def _dequantize(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = arrays.pop(NAMES_KEY, None)
    scales = arrays.pop(SCALES_KEY, None)
    if names is None or scales is None:
        raise UpdateFormatError(f"an int8 update needs both {NAMES_KEY!r} and {SCALES_KEY!r}", field="delta")
    if names.ndim != 1 or names.dtype.kind != "U" or scales.shape != names.shape or scales.dtype != np.float32:
        raise UpdateFormatError(
            f"{NAMES_KEY!r} must be a list of names and {SCALES_KEY!r} one float32 scale per name, "
            f"got shapes {names.shape} and {scales.shape}",
            field="delta",
        )
    if sorted(names.tolist()) != sorted(arrays):
        raise UpdateFormatError(
            f"{NAMES_KEY!r} lists {sorted(names.tolist())} but the archive holds {sorted(arrays)}", field="delta"
        )
    if not np.all(np.isfinite(scales)) or np.any(scales <= 0):
        raise UpdateFormatError("int8 scales must be finite and positive", field="delta")
    delta = {}
    for name, scale in zip(names.tolist(), scales.tolist()):
        quantized = arrays[name]
        if quantized.dtype != np.int8:
            raise UpdateFormatError(f"delta {name!r} has dtype {quantized.dtype}; int8 updates must be int8", field=name)
        delta[name] = quantized.astype(np.float32) * np.float32(scale)
    return delta
