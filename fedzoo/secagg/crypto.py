"""The cryptographic building blocks of SecAgg+, all from `cryptography` (OpenSSL).

- Key agreement: X25519. Each client has two key pairs per round: one whose pairwise secrets seed
  the masks, one whose pairwise secrets encrypt the Shamir shares sent through the server.
- Key derivation: HKDF-SHA256 over the X25519 secret, with the round and the purpose in `info`, so a
  secret never serves two purposes or two rounds.
- Share encryption: ChaCha20-Poly1305 (authenticated; the sender, receiver and round are bound in as
  associated data, so the server cannot swap ciphertexts between clients).
- Masks: AES-256-CTR keystream under an HKDF-derived key, read as little-endian unsigned integers
  modulo 2^bits. A cipher in counter mode is a cryptographic generator; Flower's masks instead come
  from numpy's Mersenne Twister seeded with 32 bits of the secret, which anyone can brute-force.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from fedzoo.errors import InvalidInputError

KEY_BYTES = 32
NONCE_BYTES = 12
MASK_DTYPES = {16: np.dtype("<u2"), 32: np.dtype("<u4")}


class DecryptionError(InvalidInputError):
    """A ciphertext that does not open under the expected key and context (tampered, or not for us)."""


def new_key_pair() -> tuple[X25519PrivateKey, bytes]:
    """A fresh X25519 key pair: (private key, raw public key bytes)."""
    private = X25519PrivateKey.generate()
    return private, public_bytes(private)


def private_bytes(private_key: X25519PrivateKey) -> bytes:
    """The raw 32 bytes of a private key (what gets secret-shared)."""
    return private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def load_private_key(raw: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(raw)


def public_bytes(private_key: X25519PrivateKey) -> bytes:
    """The raw public key that belongs to a private key (also checks a reconstructed key)."""
    return private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def is_usable_public_key(public_key: bytes) -> bool:
    """Whether a 32-byte X25519 public key gives a key agreement (low-order points give none)."""
    return _gives_key_agreement(bytes(public_key))


@functools.lru_cache(maxsize=4096)
def _gives_key_agreement(public_key: bytes) -> bool:
    """Cached: the answer depends on the key only (a low-order point gives the all-zero secret with any private
    key), and each neighbour's key is checked once per stage it appears in."""
    try:
        X25519PrivateKey.generate().exchange(X25519PublicKey.from_public_bytes(public_key))
    except ValueError:
        return False
    return True


def derive_key(secret: bytes, purpose: str, context: bytes) -> bytes:
    """A 32-byte key for one purpose and one round from a secret (HKDF-SHA256)."""
    info = b"fedzoo-secagg/v1/" + purpose.encode() + b"/" + context
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(secret)


def agree(private_key: X25519PrivateKey, peer_public_key: bytes, purpose: str, context: bytes) -> bytes:
    """The key two clients share for `purpose`: HKDF of their X25519 secret (symmetric in the two parties)."""
    try:
        shared = private_key.exchange(X25519PublicKey.from_public_bytes(peer_public_key))
    except ValueError as error:
        raise InvalidInputError(f"bad X25519 key: {error}", field="public_key") from None
    return derive_key(shared, purpose, context)


def encrypt(key: bytes, plaintext: bytes, associated_data: bytes) -> bytes:
    """nonce || ChaCha20-Poly1305(plaintext), authenticating `associated_data` too."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + ChaCha20Poly1305(key).encrypt(nonce, plaintext, associated_data)


def decrypt(key: bytes, ciphertext: bytes, associated_data: bytes) -> bytes:
    """The plaintext of `encrypt`'s output; raises DecryptionError if anything was altered."""
    try:
        return ChaCha20Poly1305(key).decrypt(ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:], associated_data)
    except (InvalidTag, ValueError):
        raise DecryptionError("a share ciphertext does not open: tampered, truncated or not for this client",
                              field="encrypted_shares") from None


def mask(key: bytes, length: int, modulus_bits: int) -> np.ndarray:
    """`length` uniform integers modulo 2^modulus_bits from the AES-256-CTR keystream under `key`."""
    dtype = MASK_DTYPES[modulus_bits]
    # the key is used for this one stream only (fresh per pair, round and purpose), so a zero nonce is safe
    encryptor = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    stream = encryptor.update(bytes(length * dtype.itemsize)) + encryptor.finalize()
    return np.frombuffer(stream, dtype=dtype).copy()


def commitment(*parts: bytes, size: int = 32) -> str:
    """SHA-256 over length-prefixed parts, its first `size` bytes in base64: binds a value without revealing it
    (the values are random)."""
    digest = hashlib.sha256(b"fedzoo-secagg/v1/commitment")
    for part in parts:
        digest.update(len(part).to_bytes(4, "big") + part)
    return base64.b64encode(digest.digest()[:size]).decode("ascii")
