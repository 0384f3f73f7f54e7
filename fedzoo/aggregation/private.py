"""Private aggregation as layers around any mean-only strategy: DP-FedAvg's clipping and noise (Flower wraps a
strategy the same way, `dp_fixed_clipping.py`), server momentum, and what a SecAgg+ sum itself proves.

- `DifferentialPrivacy(strategy, mechanism)`: clip each delta to the mechanism's `clip_norm`, sum, add the
  mechanism's noise (`fedzoo.dp.noise.DpFedAvg`, which charges the privacy ledger and, with adaptive clipping,
  moves `clip_norm` from the noised, centred count of unclipped deltas) and hand the noised mean to the strategy's
  step. Under SecAgg+ the sum arrives already added up: `apply_noised_sum`.
- `ServerMomentum(strategy, beta)`: FedAvgM, v <- beta v + mean, the strategy's step along v (under DP it is
  post-processing and costs no privacy).
- `check_secure_sum`: the envelope an unmasked SecAgg+ sum of clipped, weight <= 1 updates must lie in.
- `with_unclipped_bit` / `split_unclipped_count`: adaptive clipping under SecAgg+, each device's "not clipped" bit
  carried as one more coordinate of its masked vector, so the server only learns the count.

The server's private rounds (`fedzoo.server.fl.secure_rounds`) and the in-process engine
(`fedzoo.cloud.inprocess`) both aggregate through these; neither has its own copy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from fedzoo.aggregation.strategies import (ClientUpdate, Parameters, Strategy, require_secure_aggregation_support,
                                           weighted_mean_delta)
from fedzoo.dp.clipping import clip_delta, l2_norm
from fedzoo.dp.noise import DpFedAvg, quantised_sensitivity
from fedzoo.errors import InvalidInputError
from fedzoo.secagg.encoding import flatten, unflatten


# A delta its device clipped arrives at the bound up to float32 rounding (a relative 1e-7): within this much of the
# bound it counts as clipped, else rounding would count about half the clipped devices as unclipped.
AT_THE_BOUND = 1e-5


def clipped_sum(deltas: Iterable[Parameters], clip_norm: float, vector_length: int) -> tuple[np.ndarray, int, int]:
    """The flattened sum of the deltas, each clipped to L2 norm `clip_norm` (a device's own clipping is not
    trusted), how many were within the bound (and not at it: `AT_THE_BOUND`), and how many were summed; one delta
    in memory at a time."""
    total = np.zeros(vector_length)
    unclipped = count = 0
    for delta in deltas:
        unclipped += l2_norm(delta) < clip_norm * (1 - AT_THE_BOUND)
        total += flatten(clip_delta(delta, clip_norm)[0])
        count += 1
    return total, unclipped, count


class DifferentialPrivacy(Strategy):
    """DP-FedAvg around a strategy that needs only the mean delta (FedAvg, FedProx, FedAdam, or those with server
    momentum): equal weights, each delta clipped, noise on the sum, the strategy's step from the noised mean."""

    name = "dp"

    def __init__(self, strategy: Strategy, mechanism: DpFedAvg) -> None:
        require_secure_aggregation_support(strategy)  # the same property: the rule needs only the (noised) sum
        self.strategy, self.mechanism = strategy, mechanism
        self.name = f"dp({strategy.name})"

    def configure_fit(self, round_number: int) -> dict[str, Any]:
        return self.strategy.configure_fit(round_number)

    @property
    def clip_norm(self) -> float:
        """The bound devices clip to this round (adaptive clipping moves it after each noised round)."""
        return self.mechanism.clip_norm

    def aggregate_fit(self, global_parameters: Parameters, updates: Sequence[ClientUpdate]) -> Parameters:
        vector_length = sum(value.size for value in global_parameters.values())
        total, unclipped, count = clipped_sum((update.load_delta() for update in updates), self.clip_norm,
                                              vector_length)
        return self.apply_noised_sum(global_parameters, total, unclipped, count)

    def apply_noised_sum(self, global_parameters: Parameters, total: np.ndarray, unclipped: int | None,
                         contributors: int, sensitivity: float | None = None,
                         grid_step: float | None = None) -> Parameters:
        """The strategy's step from the noised mean of a sum of clipped deltas (a SecAgg+ sum lies on its own
        `grid_step` with its quantised `sensitivity`); charges the ledger."""
        mean = self.mechanism.noised_mean(total, unclipped, contributors, sensitivity, grid_step)
        shapes = {name: value.shape for name, value in global_parameters.items()}
        return self.strategy.apply_mean_delta(global_parameters, unflatten(mean, shapes))

    def apply_noised_secure_sum(self, global_parameters: Parameters, total: np.ndarray, survivors: int,
                                clip_range: float, levels: int) -> Parameters:
        """The strategy's step from an unmasked SecAgg+ sum (dequantised, weights split off) of `survivors` clipped
        deltas quantised to `levels` steps of +-clip_range: with adaptive clipping its last coordinate is the count
        of unclipped deltas (`with_unclipped_bit`), split off and noised on its own; the deltas' sum is noised at
        the quantised sensitivity on its own grid. Both engines' SecAgg+ rounds under DP aggregate here."""
        unclipped = None
        if self.mechanism.adaptive is not None:
            total, unclipped = split_unclipped_count(total, clip_range)
        grid_step = clip_range / levels
        return self.apply_noised_sum(global_parameters, total, unclipped, survivors,
                                     quantised_sensitivity(clip_range, grid_step, total.size), grid_step)

    def state(self) -> Parameters:
        return self.strategy.state()

    def load_state(self, state: Parameters) -> None:
        self.strategy.load_state(state)


class ServerMomentum(Strategy):
    """FedAvgM (Hsu et al. 2019): v <- beta v + mean delta, then the strategy's step along v."""

    name = "momentum"
    supports_secure_aggregation = True

    def __init__(self, strategy: Strategy, momentum: float) -> None:
        if strategy.name not in ("fedavg", "fedprox"):
            raise InvalidInputError(f"server_momentum applies to fedavg and fedprox, not {strategy.name!r}",
                                    field="server_momentum")
        if not 0 <= momentum < 1:
            raise InvalidInputError(f"server_momentum must lie in [0, 1), got {momentum}", field="server_momentum")
        self.strategy, self.momentum = strategy, momentum
        self.name = f"{strategy.name}+momentum"
        self.velocity: Parameters | None = None

    def configure_fit(self, round_number: int) -> dict[str, Any]:
        return self.strategy.configure_fit(round_number)

    def aggregate_fit(self, global_parameters: Parameters, updates: Sequence[ClientUpdate]) -> Parameters:
        return self.apply_mean_delta(global_parameters, weighted_mean_delta(global_parameters, updates))

    def apply_mean_delta(self, global_parameters: Parameters, mean_delta: Parameters) -> Parameters:
        if self.velocity is None:
            self.velocity = {name: np.zeros_like(value, dtype=np.float64) for name, value in mean_delta.items()}
        for name, value in mean_delta.items():
            self.velocity[name] = self.momentum * self.velocity[name] + value
        return self.strategy.apply_mean_delta(global_parameters, self.velocity)


def check_secure_sum(total: np.ndarray, total_weight: float, survivors: int, clip_range: float, equal: bool,
                     noise_slack: float = 0.0, unclipped_bit: bool = False) -> None:
    """What the unmasked sum itself proves: every device's weight is at most 1 (exactly 1 under equal weights)
    and every coordinate it adds is within +-clip_range x its weight, so no coordinate of the sum may exceed
    `total_weight x clip_range` (plus `noise_slack` where the devices noised their inputs); with `unclipped_bit`
    the last coordinate is a count of bits in {0, 1} (`with_unclipped_bit`), so it must be a whole number in
    [0, survivors]. A sum outside that envelope means some device sent values its SDK would not have: the round is
    refused (InvalidInputError), since the server cannot tell which device did it."""
    if equal and not math.isclose(total_weight, survivors):
        raise InvalidInputError(f"the weights of the {survivors} survivors sum to {total_weight:.3f}: every update "
                                "must weigh the same (1)", field="weight")
    if not 0 < total_weight <= survivors * (1 + 1e-9):
        raise InvalidInputError(f"the weights of the {survivors} survivors sum to {total_weight:.3f}, outside "
                                f"(0, {survivors}]: some device sent a weight above 1", field="weight")
    if unclipped_bit:
        count = float(total[-1]) / clip_range
        if not (-1e-6 <= count <= survivors + 1e-6 and abs(count - round(count)) <= 1e-6):
            raise InvalidInputError(f"the unclipped bits of the {survivors} survivors sum to {count:.6g}, not a whole "
                                    f"number in [0, {survivors}]: some device sent a bit other than 0 or 1",
                                    field="unclipped_bit")
        total = total[:-1]
    largest = float(np.max(np.abs(total))) if total.size else 0.0
    if largest > total_weight * clip_range * (1 + 1e-9) + noise_slack:
        raise InvalidInputError(f"a coordinate of the unmasked sum is {largest:.6g}, more than {total_weight:.3f} "
                                f"updates clipped to +-{clip_range:g} can add up to: some device sent values outside "
                                "the clipping range", field="clip_range")


def with_unclipped_bit(vector: np.ndarray, within: bool, clip_range: float) -> np.ndarray:
    """A device's flattened delta with its "not clipped" bit appended as +-clip_range levels (0 or clip_range), so
    that under SecAgg+ the server learns only how many devices were within the bound."""
    return np.append(vector, clip_range * within)


def split_unclipped_count(total: np.ndarray, clip_range: float) -> tuple[np.ndarray, int]:
    """The unmasked sum of `with_unclipped_bit` vectors as (the deltas' sum, the count of unclipped devices)."""
    return total[:-1], round(float(total[-1]) / clip_range)
