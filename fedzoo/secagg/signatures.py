"""What a device signs with its long-term Ed25519 key in a SecAgg+ round, and how the signed bytes are laid out.

Against a server that lies (Bonawitz et al. 2017, §6), two statements are signed:

- its advertised X25519 keys (stage 1), so the server cannot put its own keys in a neighbour's place;
- the survivor set it was shown (stage 4, the consistency check), so the server cannot tell neighbours
  different stories about who dropped out: a device reveals shares only under t neighbours' signatures on
  its own set.

Both are bound to the round (`SecAggConfig.context`) and to a digest of the whole configuration, so a
signature from one round, or from a neighbour given other parameters, does not verify. Both also name the
signer's own stage-1 keys and the fresh nonce it drew for this run of the round, and the survivor-set
signature names the graph seed (a digest of every advertised nonce), so a signature collected in a
"preparation" run under the same round id never verifies in another run: those keys and nonces are new
each time (issue #44). Every signed message is `fedzoo-secagg/v3/<label> 0x00` followed by length-prefixed
parts (u32 big-endian length, then the bytes); the Java SDK builds the same bytes
(tests/vectors/secagg_vectors.json, `signing`).
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Iterable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from fedzoo.secagg.config import SecAggConfig

SIGNING_KEY_BYTES = 32
SIGNATURE_BYTES = 64
PREFIX = b"fedzoo-secagg/v3/"
NONCE_BYTES = 32  # a device's fresh contribution to each run of a round (stage 1)
_FIELD = 2**255 - 19  # Ed25519's curve is over GF(2^255 - 19); d is its curve constant (RFC 8032, 5.1)
_D = -121665 * pow(121666, -1, _FIELD) % _FIELD


def signed_message(label: str, *parts: bytes) -> bytes:
    """The bytes a signature covers: a label that says what is signed, then the length-prefixed parts."""
    return PREFIX + label.encode() + b"\x00" + b"".join(len(part).to_bytes(4, "big") + part for part in parts)


def config_digest(config: SecAggConfig) -> bytes:
    """SHA-256 of every parameter of the round, so signatures also prove the signer was given the same ones."""
    return hashlib.sha256(signed_message(
        "config", config.round_id.encode(), _u32(config.num_clients), _u32(config.neighbour_count),
        _u32(config.threshold), _u32(config.vector_length), struct.pack(">d", config.clip_range),
        _u32(config.levels), _u32(config.minimum_survivors))).digest()


def advertise_payload(config: SecAggConfig, client: int, cipher_public_key: bytes, mask_public_key: bytes,
                      nonce: bytes) -> bytes:
    """What stage 1's signature covers: this client's two X25519 public keys and its nonce in this round."""
    return signed_message("advertise_keys", config.context, config_digest(config), _u32(client),
                          cipher_public_key, mask_public_key, nonce)


def consistency_payload(config: SecAggConfig, client: int, cipher_public_key: bytes, mask_public_key: bytes,
                        nonce: bytes, graph_seed: bytes, survivors: Iterable[int]) -> bytes:
    """What stage 4's signature covers: the signer's own stage-1 keys and nonce, the run's graph seed
    (`graph.graph_seed`), and the survivor set this client was shown, as sorted u32s."""
    return signed_message("consistency_check", config.context, config_digest(config), _u32(client),
                          cipher_public_key, mask_public_key, nonce, graph_seed,
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
    """Whether `raw` encodes a point of Ed25519 (RFC 8032, 5.1.3). OpenSSL takes any 32 bytes as a public key and
    only fails when verifying, so a registration is checked here instead."""
    return _is_curve_point(bytes(raw))


@functools.lru_cache(maxsize=4096)
def _is_curve_point(raw: bytes) -> bool:
    """Cached: a device checks each neighbour's key again with every signature it verifies, and the check (two
    modular exponentiations in Python) cost a third of a SecAgg+ round's CPU."""
    if len(raw) != SIGNING_KEY_BYTES:
        return False
    y = int.from_bytes(raw, "little") & (2**255 - 1)
    if y >= _FIELD:
        return False
    x_squared = (y * y - 1) * pow(_D * y * y + 1, -1, _FIELD) % _FIELD
    if x_squared == 0:
        return raw[31] >> 7 == 0  # x = 0 has no negative
    x = pow(x_squared, (_FIELD + 3) // 8, _FIELD)
    if x * x % _FIELD != x_squared:
        x = x * pow(2, (_FIELD - 1) // 4, _FIELD) % _FIELD
    return x * x % _FIELD == x_squared


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
