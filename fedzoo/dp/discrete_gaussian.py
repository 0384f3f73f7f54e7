"""The discrete Gaussian, sampled exactly (Canonne, Kamath and Steinke 2020, "The Discrete Gaussian for
Differential Privacy", Algorithms 1-3), from the operating system's CSPRNG.

Why not `numpy.random.normal`: a floating-point Gaussian sampler leaks through the gaps and the rounding of its
outputs (Mironov, CCS 2012), and numpy's generator is predictable from its state. Here every step is integer or
`Fraction` arithmetic on uniform integers drawn from `os.urandom`: no float enters the sampling loop. The
discrete Gaussian N_Z(0, sigma^2) with integer sensitivity satisfies the same Renyi/zero-concentrated DP bound as
the continuous Gaussian of the same sigma (CKS 2020, Theorem 4), so the accountant's Gaussian events stay sound.

The caller puts its sum on an integer grid and asks for sigma in grid steps (`fedzoo.dp.noise`).
"""

from __future__ import annotations

import math
import os
from fractions import Fraction

import numpy as np

from fedzoo.errors import InvalidInputError

SIGMA_SQUARED_DENOMINATOR = 2**20  # sigma^2 is rounded UP to a multiple of 2^-20: more noise, never less


class SecureRandom:
    """Uniform integers from `os.urandom`, read in blocks (one system call per `block_bytes`, not per draw)."""

    def __init__(self, block_bytes: int = 1 << 16) -> None:
        self._block_bytes = block_bytes
        self._buffer = b""
        self._position = 0

    def _bytes(self, count: int) -> bytes:
        if self._position + count > len(self._buffer):
            self._buffer, self._position = os.urandom(max(self._block_bytes, count)), 0
        chunk = self._buffer[self._position:self._position + count]
        self._position += count
        return chunk

    def read(self, count: int) -> bytes:
        """`count` uniform bytes."""
        return self._bytes(count)

    def below(self, bound: int) -> int:
        """A uniform integer in [0, bound) (rejection sampling: no modulo bias)."""
        if bound <= 0:
            raise InvalidInputError(f"bound must be positive, got {bound}", field="bound")
        bits = (bound - 1).bit_length()
        if bits == 0:
            return 0
        excess = (-bits) % 8
        while True:
            value = int.from_bytes(self._bytes((bits + 7) // 8), "little") >> excess
            if value < bound:
                return value


def _bernoulli(numerator: int, denominator: int, source: SecureRandom) -> bool:
    """Bernoulli(numerator / denominator)."""
    return source.below(denominator) < numerator


def _bernoulli_exp_minus(numerator: int, denominator: int, source: SecureRandom) -> bool:
    """Bernoulli(exp(-gamma)) for gamma = numerator / denominator >= 0 (CKS Algorithm 1)."""
    while numerator > denominator:  # exp(-gamma) = exp(-1)^floor(gamma) x exp(-(gamma - floor(gamma)))
        if not _bernoulli_exp_minus(1, 1, source):
            return False
        numerator -= denominator
    k = 1
    while _bernoulli(numerator, denominator * k, source):
        k += 1
    return k % 2 == 1


def _discrete_laplace(scale: int, source: SecureRandom) -> int:
    """P(x) proportional to exp(-|x| / scale) over the integers, for a whole `scale` >= 1 (CKS Algorithm 2)."""
    while True:
        remainder = source.below(scale)
        if not _bernoulli_exp_minus(remainder, scale, source):
            continue
        failures = 0  # a geometric count: Bernoulli(exp(-1)) successes before the first failure
        while _bernoulli_exp_minus(1, 1, source):
            failures += 1
        magnitude = failures * scale + remainder
        negative = _bernoulli(1, 2, source)
        if negative and magnitude == 0:
            continue
        return -magnitude if negative else magnitude


def sample_discrete_gaussian(sigma_squared: Fraction, source: SecureRandom) -> int:
    """One draw of N_Z(0, sigma_squared): P(x) proportional to exp(-x^2 / (2 sigma^2)) (CKS Algorithm 3)."""
    if sigma_squared <= 0:
        raise InvalidInputError(f"sigma^2 must be positive, got {sigma_squared}", field="sigma")
    a, b = sigma_squared.numerator, sigma_squared.denominator
    scale = math.isqrt(a // b) + 1
    while True:
        candidate = _discrete_laplace(scale, source)
        # bias = (|x| - sigma^2 / scale)^2 / (2 sigma^2) = (|x| b scale - a)^2 / (2 a b scale^2)
        if _bernoulli_exp_minus((abs(candidate) * b * scale - a) ** 2, 2 * a * b * scale * scale, source):
            return candidate


def sigma_squared_at_least(sigma: float) -> Fraction:
    """sigma^2 as a small-denominator fraction, rounded up (the float only sets the scale, outside the loop)."""
    if not math.isfinite(sigma) or sigma <= 0:
        raise InvalidInputError(f"the noise's sigma must be a positive number, got {sigma}", field="sigma")
    return Fraction(math.ceil(sigma * sigma * SIGMA_SQUARED_DENOMINATOR) + 1, SIGMA_SQUARED_DENOMINATOR)


def discrete_gaussian_noise(sigma: float, size: int, source: SecureRandom | None = None) -> np.ndarray:
    """`size` independent draws of N_Z(0, sigma^2) (sigma in grid steps) as int64, from `os.urandom`."""
    if size < 0:
        raise InvalidInputError(f"size must be non-negative, got {size}", field="size")
    sigma_squared = sigma_squared_at_least(sigma)
    source = source if source is not None else SecureRandom()
    return np.fromiter((sample_discrete_gaussian(sigma_squared, source) for _ in range(size)), dtype=np.int64,
                       count=size)
