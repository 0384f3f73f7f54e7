"""What a device signs with its long-term Ed25519 key in a SecAgg+ round, and how the signed bytes are laid out.

Against a server that lies (Bonawitz et al. 2017, §6), two statements are signed:

- its advertised X25519 keys (stage 1), so the server cannot put its own keys in a neighbour's place;
- the survivor set it was shown (stage 4, the consistency check), so the server cannot tell neighbours
  different stories about who dropped out: a device reveals shares only under t neighbours' signatures on
  its own set.

Both are bound to the round (`SecAggConfig.context`) and to a digest of the whole configuration, so a
signature from one round, or from a neighbour given other parameters, does not verify. Every signed
message is `fedzoo-secagg/v2/<label> 0x00` followed by length-prefixed parts (u32 big-endian length, then
the bytes); the Java SDK builds the same bytes (tests/vectors/secagg_vectors.json, `signing`).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from fedzoo.secagg.config import SecAggConfig

SIGNING_KEY_BYTES = 32
SIGNATURE_BYTES = 64
PREFIX = b"fedzoo-secagg/v2/"


def signed_message(label: str, *parts: bytes) -> bytes:
    """The bytes a signature covers: a label that says what is signed, then the length-prefixed parts."""
    return PREFIX + label.encode() + b"\x00" + b"".join(len(part).to_bytes(4, "big") + part for part in parts)


def config_digest(config: SecAggConfig) -> bytes:
    """SHA-256 of every parameter of the round, so signatures also prove the signer was given the same ones."""
    return hashlib.sha256(signed_message(
        "config", config.round_id.encode(), _u32(config.num_clients), _u32(config.neighbour_count),
        _u32(config.threshold), _u32(config.vector_length), struct.pack(">d", config.clip_range),
        _u32(config.levels), _u32(config.minimum_survivors))).digest()


def advertise_payload(config: SecAggConfig, client: int, cipher_public_key: bytes, mask_public_key: bytes) -> bytes:
    """What stage 1's signature covers: this client's two X25519 public keys in this round."""
    return signed_message("advertise_keys", config.context, config_digest(config), _u32(client),
                          cipher_public_key, mask_public_key)


def consistency_payload(config: SecAggConfig, client: int, survivors: Iterable[int]) -> bytes:
    """What stage 4's signature covers: the survivor set this client was shown, as sorted u32s."""
    return signed_message("consistency_check", config.context, config_digest(config), _u32(client),
                          b"".join(_u32(survivor) for survivor in sorted(survivors)))


def new_signing_key() -> Ed25519PrivateKey:
    """A device's long-term key: made once, kept in its state, its public half registered with the server."""
    return Ed25519PrivateKey.generate()


def load_signing_key(raw: bytes) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(raw)


def private_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def public_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def is_signing_public_key(raw: bytes) -> bool:
    """Whether `raw` is a 32-byte Ed25519 public key (a point on the curve)."""
    if len(raw) != SIGNING_KEY_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        return False
    return True


def verify(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """Whether `signature` is the holder of `public_key`'s Ed25519 signature on `message`."""
    if len(signature) != SIGNATURE_BYTES or not is_signing_public_key(public_key):
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except InvalidSignature:
        return False
    return True


def _u32(value: int) -> bytes:
    return value.to_bytes(4, "big")
