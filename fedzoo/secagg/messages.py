"""How protocol values travel: JSON-compatible dicts, bytes as base64 and vectors as little-endian base64.

Every message is a plain dict with a `stage` field, so a REST layer can carry it as it is, and the
Java SDK reads and writes the same shapes (see tests/vectors/secagg_*.json).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np

from fedzoo.secagg.crypto import MASK_DTYPES
from fedzoo.secagg.errors import ProtocolViolation

STAGES = ("advertise_keys", "share_keys", "masked_input", "consistency_check", "unmask")


def to_base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def from_base64(text: Any, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise ProtocolViolation(f"{what} is not valid base64", reason="malformed") from None


def vector_to_base64(vector: np.ndarray, modulus_bits: int) -> str:
    return to_base64(np.asarray(vector, dtype=MASK_DTYPES[modulus_bits]).tobytes())


def vector_from_base64(text: Any, length: int, modulus_bits: int, what: str) -> np.ndarray:
    data = from_base64(text, what)
    dtype = MASK_DTYPES[modulus_bits]
    if len(data) != length * dtype.itemsize:
        raise ProtocolViolation(f"{what} must hold {length} values of {dtype.itemsize} bytes, got {len(data)} bytes",
                                reason="malformed")
    return np.frombuffer(data, dtype=dtype).copy()


def expect_stage(message: Any, stage: str) -> dict[str, Any]:
    """The message as a dict if it is one for `stage`; else the client refuses it."""
    if not isinstance(message, dict) or message.get("stage") != stage:
        got = message.get("stage") if isinstance(message, dict) else type(message).__name__
        raise ProtocolViolation(f"expected a {stage!r} message, got {got!r}", reason="wrong_stage")
    return message


def client_ids(values: Any, num_clients: int, what: str) -> list[int]:
    """A list of distinct client numbers in [0, num_clients), or the message is malformed."""
    if not isinstance(values, list) or any(type(v) is not int or not 0 <= v < num_clients for v in values):
        raise ProtocolViolation(f"{what} must be a list of client numbers in [0, {num_clients})", reason="malformed")
    if len(set(values)) != len(values):
        raise ProtocolViolation(f"{what} lists a client twice", reason="malformed")
    return values


def listed_entries(request: dict[str, Any], list_name: str, id_name: str, num_clients: int
                   ) -> tuple[list[int], list[dict[str, Any]]]:
    """The client numbers and entries of a request's list of per-client dicts (e.g. `public_keys`)."""
    entries = request.get(list_name)
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise ProtocolViolation(f"{request.get('stage')} needs a list {list_name!r} of objects", reason="malformed")
    ids = client_ids([entry.get(id_name) for entry in entries], num_clients, f"{list_name}' {id_name}s")
    return ids, entries
