"""The server side of DP-FedAvg: Gaussian noise on the sum of clipped deltas, equal weights, and clipping
bounds that are fixed or adapt to the updates' norms (Andrew et al. 2021).

Every device clips its delta to L2 norm C, so adding or removing one device moves the sum by at most
C (its sensitivity); noise N(0, (z C)^2) per coordinate then makes each round a Gaussian mechanism
with noise multiplier z. The mean divides by the expected cohort size, not the number that arrived
(McMahan et al.'s fixed-denominator estimator), so that count reveals nothing either. Weights are equal:
weighting by examples would let a device claim a large weight and escape the bound.

Quantised updates (SecAgg+) round each coordinate by up to one step, which can lengthen a clipped
delta by up to step x sqrt(d); `quantised_sensitivity` bounds that and the noise scales with it.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import numpy as np

from fedzoo.dp.accountant import PrivacyLedger
from fedzoo.errors import InvalidInputError


@dataclass(frozen=True)
class AdaptiveClipping:
    """Andrew et al. 2021: move C towards the `target_unclipped_quantile` of the update norms, geometrically,
    from a noised count of the devices that were not clipped (Flower's defaults)."""

    target_unclipped_quantile: float = 0.5
    clip_learning_rate: float = 0.2
    # default: expected_clients / 20 (Andrew et al.), raised to the noise multiplier when that is larger, so
    # the count never takes more than a quarter of the round's privacy (the deltas get 1.15x z at most)
    clipped_count_stddev: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.target_unclipped_quantile < 1:
            raise InvalidInputError(f"target_unclipped_quantile must lie in (0, 1), got "
                                    f"{self.target_unclipped_quantile}", field="target_unclipped_quantile")
        if not math.isfinite(self.clip_learning_rate) or self.clip_learning_rate <= 0:
            raise InvalidInputError(f"clip_learning_rate must be a positive number, got {self.clip_learning_rate}",
                                    field="clip_learning_rate")
        if self.clipped_count_stddev is not None and not self.clipped_count_stddev > 0:
            raise InvalidInputError(f"clipped_count_stddev must be positive, got {self.clipped_count_stddev}",
                                    field="clipped_count_stddev")


def quantised_sensitivity(clip_norm: float, quantisation_step: float, dimension: int) -> float:
    """An upper bound on the L2 norm of a clipped delta after each coordinate moved by less than one step."""
    return clip_norm + quantisation_step * math.sqrt(dimension)


class DpFedAvg:
    """One plan's DP-FedAvg state: the clip norm devices use, the noise, and the privacy ledger.

    Per round: `check_budget()` before devices work, send them `clip_norm`, then `noised_mean` of the
    sum of their clipped deltas (and of their unclipped bits, with adaptive clipping).
    """

    def __init__(self, ledger: PrivacyLedger, expected_clients: float, clip_norm: float,
                 adaptive: AdaptiveClipping | None = None, seed: int | None = None) -> None:
        if not expected_clients > 0:
            raise InvalidInputError(f"expected_clients must be positive, got {expected_clients}",
                                    field="expected_clients")
        if not math.isfinite(clip_norm) or clip_norm <= 0:
            raise InvalidInputError(f"clip_norm must be a positive number, got {clip_norm}", field="clip_norm")
        self.ledger, self.expected_clients, self.clip_norm, self.adaptive = ledger, expected_clients, clip_norm, adaptive
        self.rng = np.random.default_rng(seed if seed is not None else secrets.randbits(128))
        self.delta_noise_multiplier = ledger.noise_multiplier
        self.clipped_count_stddev: float | None = None
        if adaptive is not None:
            # Andrew et al. sec. 3: split the plan's z between the deltas and the count so the total stays z
            self.clipped_count_stddev = (adaptive.clipped_count_stddev
                                         or max(expected_clients / 20, ledger.noise_multiplier))
            remainder = ledger.noise_multiplier**-2 - (2 * self.clipped_count_stddev) ** -2
            if remainder <= 0:
                raise InvalidInputError(f"clipped_count_stddev={self.clipped_count_stddev} is too small for noise "
                                        f"multiplier {ledger.noise_multiplier}: it needs more than z / 2",
                                        field="clipped_count_stddev")
            self.delta_noise_multiplier = remainder**-0.5

    def check_budget(self) -> float:
        """Epsilon after the coming round; raises PrivacyBudgetExhausted if that is over the plan's budget."""
        return self.ledger.require_budget_for_next_round()

    def noise_stddev(self, sensitivity: float | None = None) -> float:
        """The standard deviation of the noise on each coordinate of the sum."""
        return self.delta_noise_multiplier * (sensitivity if sensitivity is not None else self.clip_norm)

    def noised_mean(self, clipped_sum: np.ndarray, unclipped_count: float | None = None,
                    sensitivity: float | None = None) -> np.ndarray:
        """(sum + N(0, noise_stddev^2)) / expected_clients; records the round in the ledger and, with adaptive
        clipping, moves `clip_norm` for the next round. `sensitivity` defaults to `clip_norm`."""
        if sensitivity is not None and sensitivity < self.clip_norm:
            raise InvalidInputError(f"sensitivity {sensitivity} is below clip_norm {self.clip_norm}", field="sensitivity")
        if self.adaptive is not None and unclipped_count is None:
            raise InvalidInputError("adaptive clipping needs the count of unclipped deltas", field="unclipped_count")
        self.check_budget()
        clipped_sum = np.asarray(clipped_sum, dtype=np.float64)
        noised = clipped_sum + self.rng.normal(0.0, self.noise_stddev(sensitivity), size=clipped_sum.shape)
        if self.adaptive is not None:
            noised_fraction = (unclipped_count + self.rng.normal(0.0, self.clipped_count_stddev)) / self.expected_clients
            self.clip_norm *= math.exp(-self.adaptive.clip_learning_rate
                                       * (noised_fraction - self.adaptive.target_unclipped_quantile))
        self.ledger.record_round()
        return noised / self.expected_clients
