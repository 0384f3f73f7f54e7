"""A SecAgg+ round's public parameters: who takes part, how many neighbours, the threshold, the ring.

The server chooses them and sends them to every client with the setup message; both sides derive
the same communication graph and quantisation from them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from fedzoo.errors import InvalidInputError

INT8_LEVELS = 127  # the int8 update encoding's range: values are integers in [-127, 127]
MIN_CLIENTS = 3  # the least cohort: of two, each reads the other's input from the sum


def least_survivors(threshold: int) -> int:
    """The fewest inputs a sum may hold: 3 (with 2, each reads the other's input), and t (fewer survivors than t
    cannot give t shares of a neighbour's secret anyway)."""
    return max(MIN_CLIENTS, threshold)


@dataclass(frozen=True)
class SecAggConfig:
    """Public parameters of one round (see docs/privacy.md for how to size them).

    - `round_id`: binds every key, ciphertext and commitment to this round.
    - `num_clients`: clients are numbered 0 .. num_clients - 1 in this round.
    - `neighbour_count` (k): each client masks and shares with k others (even, k < num_clients).
    - `threshold` (t): shares needed to recover a secret; k/2 < t <= k, so an honest client's
      refusal to reveal both secrets of a neighbour leaves the server short of one of them.
    - `vector_length`: coordinates of the (flattened) update.
    - `clip_range`: each coordinate is clipped to [-clip_range, clip_range] before quantisation.
    - `levels`: quantised values are integers in [-levels, levels] (127: the int8 encoding).
    - `minimum_survivors`: clients refuse to unmask a sum of fewer inputs than this; at least max(3, t)
      (with 2, each survivor would read the other's input from the sum), which is the default.
    """

    round_id: str
    num_clients: int
    neighbour_count: int
    threshold: int
    vector_length: int
    clip_range: float
    levels: int = INT8_LEVELS
    minimum_survivors: int | None = None

    def __post_init__(self) -> None:
        if not self.round_id:
            raise InvalidInputError("round_id must be a non-empty string", field="round_id")
        if self.num_clients < MIN_CLIENTS:
            raise InvalidInputError(f"num_clients must be at least {MIN_CLIENTS}, got {self.num_clients}",
                                    field="num_clients")
        if not 2 <= self.neighbour_count < self.num_clients or self.neighbour_count % 2:
            raise InvalidInputError(f"neighbour_count must be even and lie in [2, {self.num_clients - 1}], got "
                                    f"{self.neighbour_count}", field="neighbour_count")
        if not self.neighbour_count / 2 < self.threshold <= self.neighbour_count:
            raise InvalidInputError(f"threshold must lie in ({self.neighbour_count // 2}, {self.neighbour_count}] "
                                    f"(more than half the neighbours), got {self.threshold}", field="threshold")
        if self.vector_length < 1:
            raise InvalidInputError(f"vector_length must be at least 1, got {self.vector_length}", field="vector_length")
        if not math.isfinite(self.clip_range) or self.clip_range <= 0:
            raise InvalidInputError(f"clip_range must be a positive number, got {self.clip_range}", field="clip_range")
        if not 1 <= self.levels <= 2**15 - 1:
            raise InvalidInputError(f"levels must lie in [1, 32767], got {self.levels}", field="levels")
        if self.minimum_survivors is None:
            object.__setattr__(self, "minimum_survivors", least_survivors(self.threshold))
        least = least_survivors(self.threshold)
        if type(self.minimum_survivors) is not int or not least <= self.minimum_survivors <= self.num_clients:
            raise InvalidInputError(f"minimum_survivors must lie in [max(3, threshold) = {least}, {self.num_clients}]"
                                    f", got {self.minimum_survivors}", field="minimum_survivors")
        if 2 * self.levels * self.num_clients + 1 > 2**32:
            raise InvalidInputError("num_clients x levels is too large for a 32-bit ring", field="levels")

    @property
    def modulus_bits(self) -> int:
        """16 when every possible sum of quantised values fits in Z_{2^16} (n x 127 < 2^15: n <= 258), else 32."""
        return 16 if 2 * self.levels * self.num_clients + 1 <= 2**16 else 32

    @property
    def context(self) -> bytes:
        """What keys and ciphertexts of this round are bound to."""
        return f"round={self.round_id};n={self.num_clients};k={self.neighbour_count};t={self.threshold}".encode()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SecAggConfig:
        try:
            return cls(**data)
        except TypeError as error:
            raise InvalidInputError(f"bad SecAgg+ configuration: {error}", field="secagg") from None
