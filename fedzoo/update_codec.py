"""Weight deltas on the wire: `.npz` archives keyed by initializer name, float32 or INT8.

A device uploads `delta = trained - global` for every trainable parameter, never its data. The
archive is written by numpy without pickles and has one of two encodings:

- ``fp32``: one float32 array per parameter, the key is the initializer name.
- ``int8``: three arrays, deflate-compressed: ``@layout`` (JSON ``[[name, shape], ...]`` as one
  unicode string), ``@scales`` (one float32 per entry, same order) and ``@values`` (every
  parameter's int8 values ``q``, flattened and concatenated in that order). The delta is
  ``q * scale`` with a symmetric per-tensor scale ``max|delta| / 127``, so each element is off by at
  most ``scale / 2``. One packed array instead of one per tensor matters for small models: a zip
  member costs ~200 bytes of headers, as much as a 50-weight tensor's int8 values.

BatchNorm running statistics (graphs built with `batch_norm="training"`) travel in the same archive,
in either encoding, as entries named `running.<statistic>` holding `trained - global` of that
statistic (`statistics_delta`); the server averages them apart from the parameters' deltas
(`fedzoo.aggregation.running_statistics`).

The server decodes with `decode_update`, which also guards against archives that expand to more
than `max_decoded_bytes` (a zip bomb), or whose array headers declare more values than they hold,
before reading any array.
"""

from __future__ import annotations

import io
import json
import math
import zipfile
from typing import Literal

import numpy as np

from fedzoo.errors import InvalidInputError

Encoding = Literal["fp32", "int8"]
ENCODINGS: tuple[Encoding, ...] = ("fp32", "int8")
LAYOUT_KEY = "@layout"
SCALES_KEY = "@scales"
VALUES_KEY = "@values"
INT8_KEYS = {LAYOUT_KEY, SCALES_KEY, VALUES_KEY}
INT8_LEVELS = 127
# the entries of running statistics: the training graph's name of an updated statistic (fedzoo.edge.trainer's
# RUNNING_PREFIX, not imported: the server reads updates without loading onnxruntime)
RUNNING_PREFIX = "running."
# the .npy format versions numpy writes for plain arrays, and their header readers
NPY_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


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


def statistics_delta(trained: dict[str, np.ndarray], initial: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The update entries of the running statistics: `running.<name>` -> trained - initial value."""
    return {RUNNING_PREFIX + name: (value - initial[name]).astype(np.float32) for name, value in trained.items()}


def split_statistics(update: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """An update's parameter deltas and its running-statistic deltas (keyed by the statistic's name)."""
    parameters = {name: value for name, value in update.items() if not name.startswith(RUNNING_PREFIX)}
    statistics = {name[len(RUNNING_PREFIX):]: value for name, value in update.items() if name.startswith(RUNNING_PREFIX)}
    return parameters, statistics


def encode_update(delta: dict[str, np.ndarray], encoding: Encoding = "fp32") -> bytes:
    """The `.npz` bytes of a delta in the given encoding (see the module docstring)."""
    if encoding not in ENCODINGS:
        raise InvalidInputError(f"unknown update encoding {encoding!r}; use one of {list(ENCODINGS)}", field="encoding")
    if not delta:
        raise InvalidInputError("an update needs at least one parameter delta", field="delta")
    for name in delta:
        if name.startswith("@"):
            raise InvalidInputError(f"parameter name {name!r} may not start with '@' (reserved)", field="delta")
    buffer = io.BytesIO()
    if encoding == "fp32":
        np.savez(buffer, **{name: np.asarray(value, dtype=np.float32) for name, value in delta.items()})
        return buffer.getvalue()
    names = sorted(delta)
    quantized, scales = zip(*(quantize_int8(delta[name]) for name in names))
    layout = json.dumps([[name, list(np.shape(delta[name]))] for name in names])
    np.savez_compressed(buffer, **{
        LAYOUT_KEY: np.array(layout, dtype=np.str_),
        SCALES_KEY: np.array(scales, dtype=np.float32),
        VALUES_KEY: np.concatenate([values.reshape(-1) for values in quantized]),
    })
    return buffer.getvalue()


def decode_update(data: bytes, max_decoded_bytes: int | None = None) -> tuple[dict[str, np.ndarray], Encoding]:
    """The float32 delta per parameter and the encoding the archive used.

    Raises UpdateFormatError when the bytes are not an archive of this format, or expand to more
    than `max_decoded_bytes`. One pass over the archive: the zip directory's sizes are checked first,
    then each member's `.npy` header before its array is allocated.
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as error:
        raise UpdateFormatError(f"update is not an .npz archive: {error}", field="delta") from None
    with archive:
        members = archive.infolist()
        expanded = sum(member.file_size for member in members)
        if max_decoded_bytes is not None and expanded > max_decoded_bytes:
            raise UpdateFormatError(
                f"update expands to {expanded} bytes, more than the {max_decoded_bytes} this round's model needs",
                field="delta",
            )
        try:
            arrays = {member.filename.removesuffix(".npy"): _read_member(archive, member) for member in members}
        except UpdateFormatError:
            raise
        except (ValueError, OSError, zipfile.BadZipFile, EOFError) as error:
            raise UpdateFormatError(f"update is not a readable .npz archive: {error}", field="delta") from None
    if INT8_KEYS & set(arrays):
        return _dequantize(arrays), "int8"
    for name, value in arrays.items():
        if value.dtype != np.float32:
            raise UpdateFormatError(f"delta {name!r} has dtype {value.dtype}; fp32 updates must be float32", field=name)
    return arrays, "fp32"


def _read_member(archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> np.ndarray:
    """One `.npy` member, refused before allocation when its header declares more values than the member
    holds (numpy would allocate the declared size first: a 200-byte member declaring 1e12 float32 values is
    a MemoryError)."""
    with archive.open(member) as stream:
        version = np.lib.format.read_magic(stream)
        if version not in NPY_HEADER_READERS:
            raise ValueError(f"member {member.filename!r} has .npy format {version}")
        shape, fortran_order, dtype = NPY_HEADER_READERS[version](stream)
        data_bytes = member.file_size - stream.tell()
        declared = math.prod(shape) * dtype.itemsize
        if dtype.hasobject or declared > data_bytes:
            raise UpdateFormatError(f"member {member.filename!r} declares {shape} {dtype} ({declared} bytes) but holds "
                                    f"{data_bytes} bytes of data", field="delta")
        array = np.empty(shape[::-1] if fortran_order else shape, dtype=dtype)
        if stream.readinto(memoryview(array.reshape(-1)).cast("B")) != declared:
            raise ValueError(f"member {member.filename!r} ends before its {declared} bytes of data")
    return array.T if fortran_order else array


def _dequantize(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if set(arrays) != INT8_KEYS:
        raise UpdateFormatError(f"an int8 update holds exactly {sorted(INT8_KEYS)}, got {sorted(arrays)}", field="delta")
    layout_array, scales, values = arrays[LAYOUT_KEY], arrays[SCALES_KEY], arrays[VALUES_KEY]
    try:
        layout = json.loads(str(layout_array)) if layout_array.ndim == 0 and layout_array.dtype.kind == "U" else None
        entries = [(str(name), tuple(int(size) for size in shape)) for name, shape in layout]
    except (TypeError, ValueError):
        entries = None
    if entries is None or any(size < 0 for _, shape in entries for size in shape) or len({n for n, _ in entries}) != len(entries):
        raise UpdateFormatError(f"{LAYOUT_KEY!r} must be a JSON list of distinct [name, shape] pairs", field="delta")
    if scales.shape != (len(entries),) or scales.dtype != np.float32:
        raise UpdateFormatError(f"{SCALES_KEY!r} must hold one float32 scale per {LAYOUT_KEY!r} entry, "
                                f"got shape {scales.shape} and dtype {scales.dtype}", field="delta")
    if not np.all(np.isfinite(scales)) or np.any(scales <= 0):
        raise UpdateFormatError("int8 scales must be finite and positive", field="delta")
    sizes = [math.prod(shape) for _, shape in entries]
    if values.dtype != np.int8 or values.shape != (sum(sizes),):
        raise UpdateFormatError(f"{VALUES_KEY!r} must be {sum(sizes)} int8 values (the layout's sizes), got "
                                f"shape {values.shape} and dtype {values.dtype}", field="delta")
    delta, start = {}, 0
    for (name, shape), size, scale in zip(entries, sizes, scales.tolist()):
        delta[name] = values[start : start + size].astype(np.float32).reshape(shape) * np.float32(scale)
        start += size
    return delta
