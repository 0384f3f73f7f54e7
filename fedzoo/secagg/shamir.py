"""Shamir secret sharing of 32-byte secrets over the prime field GF(2^256 + 297).

A secret is the constant term of a random polynomial of degree `threshold - 1`; holder `x` gets the
polynomial's value at `x`. Any `threshold` shares give the secret back (Lagrange interpolation at 0);
fewer reveal nothing about it. 2^256 + 297 is the smallest prime above 2^256: it holds a whole
32-byte secret (an X25519 private key or a mask seed) in one element, so there is no chunking to get
wrong, and a share is 33 bytes (a 2^521 - 1 field would double that, and the upload with it).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from fedzoo.errors import InvalidInputError

PRIME = 2**256 + 297
SECRET_BYTES = 32
SHARE_BYTES = 33  # a share's value as fixed-length big-endian bytes

Share = tuple[int, int]  # (x, polynomial value at x), 1 <= x, 0 <= value < PRIME


class ShareError(InvalidInputError):
    """Shares that cannot give a secret back: too few, duplicated, out of range, or inconsistent."""


def split_secret(secret: bytes, threshold: int, holders: Sequence[int]) -> list[Share]:
    """One share per holder x (distinct, 1 <= x < PRIME) such that any `threshold` of them recover `secret`."""
    if len(secret) != SECRET_BYTES:
        raise InvalidInputError(f"a secret is {SECRET_BYTES} bytes, got {len(secret)}", field="secret")
    if len(set(holders)) != len(holders) or any(not 1 <= x < PRIME for x in holders):
        raise InvalidInputError("holders must be distinct integers in [1, PRIME)", field="holders")
    if not 1 <= threshold <= len(holders):
        raise InvalidInputError(f"threshold must lie in [1, {len(holders)}] (the holder count), got {threshold}",
                                field="threshold")
    coefficients = [int.from_bytes(secret, "big")] + [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    return [(x, _evaluate(coefficients, x)) for x in holders]


def combine_shares(shares: Sequence[Share], threshold: int) -> bytes:
    """The secret from the first `threshold` shares; raises ShareError when they cannot be one."""
    if len(shares) < threshold:
        raise ShareError(f"{len(shares)} shares cannot recover a secret shared with threshold {threshold}",
                         field="shares")
    chosen = list(shares[:threshold])
    xs = [x for x, _ in chosen]
    if len(set(xs)) != len(xs) or any(not 1 <= x < PRIME or not 0 <= y < PRIME for x, y in chosen):
        raise ShareError("shares must have distinct x in [1, PRIME) and values in [0, PRIME)", field="shares")
    secret = 0
    for index, (x_i, y_i) in enumerate(chosen):
        numerator, denominator = 1, 1
        for other, x_j in enumerate(xs):
            if other != index:
                numerator = numerator * x_j % PRIME
                denominator = denominator * (x_j - x_i) % PRIME
        secret = (secret + y_i * numerator * pow(denominator, -1, PRIME)) % PRIME
    if secret >= 2 ** (8 * SECRET_BYTES):
        raise ShareError("the shares are inconsistent: they interpolate to no 32-byte secret", field="shares")
    return secret.to_bytes(SECRET_BYTES, "big")


def share_value_bytes(value: int) -> bytes:
    """A share's value as fixed-length bytes (for encryption and commitments)."""
    return value.to_bytes(SHARE_BYTES, "big")


def _evaluate(coefficients: Sequence[int], x: int) -> int:
    result = 0
    for coefficient in reversed(coefficients):  # Horner's rule
        result = (result * x + coefficient) % PRIME
    return result
