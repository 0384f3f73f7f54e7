"""Compact binary framing of the two share-carrying replies, the bulk of SecAgg+'s traffic after the vector.

As JSON, a neighbour costs ≈ 350 bytes (base64 ciphertext, two base64 commitments, the unmask share);
framed, ≈ 173: 137 to share keys with it, 36 to reveal one of its shares. Both replies are otherwise the
dicts of `fedzoo.secagg.client` (without `stage` and `client`, which the transport knows). Integers are
big-endian; client numbers are 16-bit, so a framed round has at most 65,536 clients.

    share_keys: seed_commitment (32) | count (u16) | count x [holder (u16) | ciphertext length (u8) |
                ciphertext | self_mask_commitment (16) | mask_key_commitment (16)]
    unmask:     count (u16) | count x [owner (u16) | kind (u8: 0 self_mask, 1 mask_key) | value (33)] |
                undecryptable count (u16) | undecryptable x owner (u16)
"""

from __future__ import annotations

import json
from typing import Any

from fedzoo.secagg.client import SHARE_COMMITMENT_BYTES
from fedzoo.secagg.errors import ProtocolViolation
from fedzoo.secagg.messages import from_base64, to_base64
from fedzoo.secagg.shamir import SHARE_BYTES

MAX_CLIENTS = 2**16
DIGEST_BYTES = 32
KINDS = ("self_mask", "mask_key")


def rest_reply(reply: dict[str, Any]) -> dict[str, Any] | bytes:
    """How a client's reply (a `SecAggClient` dict) travels over REST: the masked vector as its raw ring values,
    the share replies framed, the keys as JSON; never `stage` or `client` (the URL and the token say them)."""
    stage = reply.get("stage")
    if stage == "masked_input":
        return from_base64(reply["masked_vector"], "masked_vector")
    if stage in FRAMED:
        return FRAMED[stage](reply)
    return {key: value for key, value in reply.items() if key not in ("stage", "client")}


def rest_reply_bytes(reply: dict[str, Any]) -> int:
    """The bytes of `rest_reply`'s body."""
    body = rest_reply(reply)
    return len(body) if isinstance(body, bytes) else len(json.dumps(body).encode())


def encode_share_keys(reply: dict[str, Any]) -> bytes:
    """The share_keys reply (`SecAggClient.share_keys`' dict) as bytes."""
    out = bytearray(_fixed(reply.get("self_mask_seed_commitment"), DIGEST_BYTES, "self_mask_seed_commitment"))
    shares = _list(reply.get("shares"), "shares")
    out += _u16(len(shares), "shares")
    for entry in shares:
        ciphertext = from_base64(entry.get("ciphertext"), "ciphertext")
        if not 0 < len(ciphertext) < 256:
            raise ProtocolViolation("a share ciphertext must hold 1 to 255 bytes", reason="malformed")
        out += _u16(entry.get("holder"), "holder") + bytes([len(ciphertext)]) + ciphertext
        out += _fixed(entry.get("self_mask_commitment"), SHARE_COMMITMENT_BYTES, "self_mask_commitment")
        out += _fixed(entry.get("mask_key_commitment"), SHARE_COMMITMENT_BYTES, "mask_key_commitment")
    return bytes(out)


def decode_share_keys(data: bytes) -> dict[str, Any]:
    """`encode_share_keys`' inverse; raises ProtocolViolation (malformed) for bytes it did not write."""
    reader = _Reader(data)
    seed_commitment = to_base64(reader.take(DIGEST_BYTES))
    shares = []
    for _ in range(reader.u16()):
        holder = reader.u16()
        ciphertext = reader.take(reader.u8())
        shares.append({"holder": holder, "ciphertext": to_base64(ciphertext),
                       "self_mask_commitment": to_base64(reader.take(SHARE_COMMITMENT_BYTES)),
                       "mask_key_commitment": to_base64(reader.take(SHARE_COMMITMENT_BYTES))})
    reader.end()
    return {"shares": shares, "self_mask_seed_commitment": seed_commitment}


def encode_unmask(reply: dict[str, Any]) -> bytes:
    """The unmask reply (`SecAggClient.unmask`' dict) as bytes."""
    shares = _list(reply.get("shares"), "shares")
    out = bytearray(_u16(len(shares), "shares"))
    for entry in shares:
        if entry.get("kind") not in KINDS:
            raise ProtocolViolation(f"a share's kind must be one of {KINDS}", reason="malformed")
        out += _u16(entry.get("owner"), "owner") + bytes([KINDS.index(entry["kind"])])
        out += _fixed(entry.get("value"), SHARE_BYTES, "value")
    undecryptable = _list(reply.get("undecryptable", []), "undecryptable")
    out += _u16(len(undecryptable), "undecryptable")
    for owner in undecryptable:
        out += _u16(owner, "undecryptable")
    return bytes(out)


def decode_unmask(data: bytes) -> dict[str, Any]:
    """`encode_unmask`' inverse; raises ProtocolViolation (malformed) for bytes it did not write."""
    reader = _Reader(data)
    shares = []
    for _ in range(reader.u16()):
        owner, kind = reader.u16(), reader.u8()
        if kind >= len(KINDS):
            raise ProtocolViolation(f"share kind {kind} is neither 0 (self_mask) nor 1 (mask_key)", reason="malformed")
        shares.append({"owner": owner, "kind": KINDS[kind], "value": to_base64(reader.take(SHARE_BYTES))})
    undecryptable = [reader.u16() for _ in range(reader.u16())]
    reader.end()
    return {"shares": shares, "undecryptable": undecryptable}


FRAMED = {"share_keys": encode_share_keys, "unmask": encode_unmask}


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list) or len(value) >= MAX_CLIENTS:
        raise ProtocolViolation(f"{what} must be a list of fewer than {MAX_CLIENTS} entries", reason="malformed")
    return value


def _u16(value: Any, what: str) -> bytes:
    if type(value) is not int or not 0 <= value < MAX_CLIENTS:
        raise ProtocolViolation(f"{what} must be an integer in [0, {MAX_CLIENTS})", reason="malformed")
    return value.to_bytes(2, "big")


def _fixed(value: Any, size: int, what: str) -> bytes:
    data = from_base64(value, what)
    if len(data) != size:
        raise ProtocolViolation(f"{what} must be {size} bytes, got {len(data)}", reason="malformed")
    return data


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.position = data, 0

    def take(self, count: int) -> bytes:
        if self.position + count > len(self.data):
            raise ProtocolViolation("the framed reply ends early", reason="malformed")
        self.position += count
        return self.data[self.position - count : self.position]

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "big")

    def end(self) -> None:
        if self.position != len(self.data):
            raise ProtocolViolation(f"{len(self.data) - self.position} bytes follow the framed reply", reason="malformed")
