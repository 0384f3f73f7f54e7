"""The server side of DP-FedAvg: Gaussian noise on the sum of clipped deltas, equal weights, and clipping
bounds that are fixed or adapt to the updates' norms (Andrew et al. 2021).

Every device clips its delta to L2 norm C, so adding or removing one device moves the sum by at most C (its
sensitivity); noise of standard deviation z C per coordinate then makes each round a Gaussian mechanism with noise
multiplier z. The noise is a discrete Gaussian on the sum put on an integer grid, drawn exactly from `os.urandom`
(`fedzoo.dp.discrete_gaussian`): no floating-point sampler and no seed anyone could replay. The mean divides by the
expected cohort size, not the number that arrived (McMahan et al.'s fixed-denominator estimator), so that count
reveals nothing either. Weights are equal: weighting by examples would let a device claim a large weight and escape
the bound.

Quantised updates (SecAgg+) round each coordinate by up to one step, which can lengthen a clipped
delta by up to step x sqrt(d); `quantised_sensitivity` bounds that and the noise scales with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedzoo.dp.accountant import PrivacyLedger
from fedzoo.dp.discrete_gaussian import SecureRandom, discrete_gaussian_noise
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


DEFAULT_GRID_STEPS_PER_CLIP = 1000  # a clear sum's grid: rounding adds at most clip_norm / 1000 to the sensitivity


def quantised_sensitivity(clip_norm: float, quantisation_step: float, dimension: int) -> float:
    """An upper bound on the L2 norm of a clipped delta after each coordinate moved by less than one step."""
    return clip_norm + quantisation_step * math.sqrt(dimension)


def noised_unclipped_fraction(unclipped_count: int, contributors: int, expected_clients: float,
                              count_stddev: float, noise: NoiseSource) -> float:
    """The noised fraction of devices whose delta was not clipped, for adaptive clipping (Andrew et al. 2021 as
    TF-Privacy implements it): each device adds its bit centred, b - 1/2, so adding or removing one device moves
    the sum by 1/2, the sensitivity the noise split of `DpFedAvg` assumes (a raw 0/1 count moves by 1 and would
    spend up to twice the privacy stated). The noise is drawn on the doubled, integer sum: sum(2b - 1)."""
    if not 0 <= unclipped_count <= contributors:
        raise InvalidInputError(f"unclipped_count must lie in [0, {contributors}], got {unclipped_count}",
                                field="unclipped_count")
    doubled_centred_sum = 2 * int(unclipped_count) - int(contributors)  # sensitivity 1 on this integer
    noised = doubled_centred_sum + float(noise.integer_noise(2 * count_stddev, 1)[0])
    return noised / (2 * expected_clients) + 0.5


class NoiseSource:
    """Secure noise: the discrete Gaussian from `os.urandom` on an integer grid (`fedzoo.dp.discrete_gaussian`);
    what the server uses. `reproducible` is False: nobody can replay it."""

    reproducible = False

    def __init__(self) -> None:
        self._source = SecureRandom()

    def integer_noise(self, sigma_steps: float, size: int) -> np.ndarray:
        return discrete_gaussian_noise(sigma_steps, size, self._source)


class SeededNoise(NoiseSource):
    """Reproducible noise from a seeded numpy generator, for simulations that compare settings on the same draws.
    Whoever knows the seed can subtract it: a model noised this way has no privacy at all."""

    reproducible = True

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def integer_noise(self, sigma_steps: float, size: int) -> np.ndarray:
        return np.rint(self.rng.normal(0.0, sigma_steps, size=size)).astype(np.int64)


class DpFedAvg:
    """One plan's DP-FedAvg state: the clip norm devices use, the noise, and the privacy ledger.

    Per round: `check_budget()` before devices work, send them `clip_norm`, then `noised_mean` of the
    sum of their clipped deltas (and, with adaptive clipping, how many of them were within the bound).
    Noise is secure unless a `seed` is given (`SeededNoise`: reproducible, hence not private).
    """

    def __init__(self, ledger: PrivacyLedger, expected_clients: float, clip_norm: float,
                 adaptive: AdaptiveClipping | None = None, seed: int | None = None) -> None:
        if not expected_clients > 0:
            raise InvalidInputError(f"expected_clients must be positive, got {expected_clients}",
                                    field="expected_clients")
        if not math.isfinite(clip_norm) or clip_norm <= 0:
            raise InvalidInputError(f"clip_norm must be a positive number, got {clip_norm}", field="clip_norm")
        self.ledger, self.expected_clients, self.clip_norm, self.adaptive = ledger, expected_clients, clip_norm, adaptive
        self.noise: NoiseSource = SeededNoise(seed) if seed is not None else NoiseSource()
        self.delta_noise_multiplier = ledger.noise_multiplier
        self.clipped_count_stddev: float | None = None
        self.released_sensitivity: float | None = None  # of the last noised sum (clip_norm plus any rounding)
        self.released_unclipped_fraction: float | None = None  # adaptive: the last noised fraction (released)
        if adaptive is not None:
            self.clipped_count_stddev, self.delta_noise_multiplier = adaptive_noise_split(
                ledger.noise_multiplier, expected_clients, adaptive.clipped_count_stddev)

    def check_budget(self) -> float:
        """Epsilon after the coming round; raises PrivacyBudgetExhausted if that is over the plan's budget."""
        return self.ledger.require_budget_for_next_round()

    def noise_stddev(self, sensitivity: float | None = None) -> float:
        """The standard deviation of the noise on each coordinate of the sum, in model units."""
        return self.delta_noise_multiplier * (sensitivity if sensitivity is not None else self.clip_norm)

    def noised_mean(self, clipped_sum: np.ndarray, unclipped_count: int | None = None, contributors: int | None = None,
                    sensitivity: float | None = None, grid_step: float | None = None) -> np.ndarray:
        """(sum + noise) / expected_clients; records the round in the ledger and, with adaptive clipping, moves
        `clip_norm` for the next round from the noised `unclipped_count` of `contributors`.

        The sum is put on a grid of `grid_step` (a SecAgg+ sum already lies on its quantisation grid; default: a
        grid fine enough to add at most 0.1% of clip_norm to the sensitivity) and the noise is integer, of
        standard deviation noise_stddev / grid_step steps: z x sensitivity in model units. `sensitivity` (default
        `clip_norm`) is the sum's before the default grid's rounding, which adds step x sqrt(d) to it."""
        clipped_sum = np.asarray(clipped_sum, dtype=np.float64)
        sensitivity = sensitivity if sensitivity is not None else self.clip_norm
        if sensitivity < self.clip_norm:
            raise InvalidInputError(f"sensitivity {sensitivity} is below clip_norm {self.clip_norm}", field="sensitivity")
        if grid_step is None:  # rounding a clear sum onto the grid moves each coordinate by less than one step
            dimension = max(1, clipped_sum.size)
            grid_step = self.clip_norm / (DEFAULT_GRID_STEPS_PER_CLIP * math.sqrt(dimension))
            sensitivity = quantised_sensitivity(sensitivity, grid_step, dimension)
        if self.adaptive is not None and (unclipped_count is None or contributors is None):
            raise InvalidInputError("adaptive clipping needs the count of unclipped deltas and of contributors",
                                    field="unclipped_count")
        self.check_budget()
        self.released_sensitivity = sensitivity
        steps = np.rint(clipped_sum / grid_step).astype(np.int64)
        noised = (steps + self.noise.integer_noise(self.noise_stddev(sensitivity) / grid_step, steps.size)
                  .reshape(steps.shape)) * grid_step
        if self.adaptive is not None:
            fraction = noised_unclipped_fraction(unclipped_count, contributors, self.expected_clients,
                                                 self.clipped_count_stddev, self.noise)
            self.clip_norm = next_clip_norm(self.clip_norm, fraction, self.adaptive)
            self.released_unclipped_fraction = fraction
        self.ledger.record_round()
        return noised / self.expected_clients


def adaptive_noise_split(noise_multiplier: float, expected_clients: float,
                         clipped_count_stddev: float | None) -> tuple[float, float]:
    """(the count's noise stddev, the deltas' noise multiplier) so that the round, both releases together, is a
    Gaussian mechanism of noise multiplier z (Andrew et al. sec. 3): z^-2 = z_delta^-2 + (2 sigma_count)^-2, which
    holds for the centred count of `noised_unclipped_fraction` (sensitivity 1/2). Default count stddev:
    expected_clients / 20, raised to z when that is larger, so the deltas get at most 1.15 z."""
    count_stddev = clipped_count_stddev or max(expected_clients / 20, noise_multiplier)
    remainder = noise_multiplier**-2 - (2 * count_stddev) ** -2
    if remainder <= 0:
        raise InvalidInputError(f"clipped_count_stddev={count_stddev} is too small for noise multiplier "
                                f"{noise_multiplier}: it needs more than z / 2", field="clipped_count_stddev")
    return count_stddev, remainder**-0.5


def next_clip_norm(clip_norm: float, noised_unclipped_fraction: float, adaptive: AdaptiveClipping) -> float:
    """The geometric update: C x exp(-eta (fraction unclipped - target quantile))."""
    return clip_norm * math.exp(-adaptive.clip_learning_rate
                                * (noised_unclipped_fraction - adaptive.target_unclipped_quantile))
