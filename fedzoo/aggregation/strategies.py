"""Aggregation strategies: pluggable objects shaped like Flower's `Strategy`.

A strategy does two things for a round: it adds its own fields to the configuration sent to the
clients (`configure_fit`), and it turns the base parameters plus the accepted updates into the
next global parameters (`aggregate_fit`). Updates arrive as lazy `ClientUpdate`s whose delta is
read from disk only when the strategy asks, one at a time, so:

- FedAvg, FedProx, FedAdam and norm clipping stream: memory is O(model) whatever the client count.
- Coordinate-wise median and trimmed mean need every update's value at each coordinate, and
  Multi-Krum every pairwise distance. They spill the flattened deltas to a memory-mapped file on
  disk (n x P float32) and read it in column blocks of at most `working_memory_bytes`, so memory is
  O(model + working_memory_bytes) (plus n x n distances for Multi-Krum) and disk is O(n x model).

FedAdam keeps server optimizer state (first and second moments) across rounds; `state()` and
`load_state()` let the round service persist it between rounds and across restarts.

Under secure aggregation (`fedzoo.secagg`) the server only ever sees the sum of the updates, so only
rules that are a function of that sum can run: `supports_secure_aggregation` says which, and
`apply_mean_delta` is their entry point. Median, trimmed mean, Multi-Krum and norm clipping need each
update (or its norm) and refuse, see `require_secure_aggregation_support`.
"""

from __future__ import annotations

import math
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fedzoo.errors import InvalidInputError

Parameters = dict[str, np.ndarray]
DEFAULT_WORKING_MEMORY_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class ClientUpdate:
    """One accepted update: who sent it, its weight (the examples it trained on, as the round bounds them), and
    a loader for its delta."""

    device_id: str
    num_examples: float
    load_delta: Callable[[], Parameters]
    norm: float
    metrics: dict[str, float] = field(default_factory=dict)


class Strategy(ABC):
    """How a round is configured for clients and how accepted updates become the next global model."""

    name: ClassVar[str]
    # True when the rule needs only the (weighted) sum of the deltas, so it can run on a SecAgg+ output
    supports_secure_aggregation: ClassVar[bool] = False

    def configure_fit(self, round_number: int) -> dict[str, Any]:
        """Fields this strategy adds to every client's round configuration (e.g. `proximal_mu`)."""
        return {}

    @abstractmethod
    def aggregate_fit(self, global_parameters: Parameters, updates: Sequence[ClientUpdate]) -> Parameters:
        """The next global parameters, given the round's base parameters and its accepted updates."""

    def state(self) -> Parameters:
        """Server-side state to carry to the next round (empty for stateless strategies)."""
        return {}

    def load_state(self, state: Parameters) -> None:
        """Restore what `state()` returned in an earlier round."""

    def apply_mean_delta(self, global_parameters: Parameters, mean_delta: Parameters) -> Parameters:
        """The next global parameters from the round's mean delta alone (what secure aggregation yields);
        only strategies with `supports_secure_aggregation` implement it."""
        raise SecureAggregationUnsupportedError(
            f"strategy {self.name!r} needs every client's update and cannot run on a securely aggregated sum; "
            f"use one of {sorted(SECURE_AGGREGATION_STRATEGIES)}", field="strategy.name")


class SecureAggregationUnsupportedError(InvalidInputError):
    """A round asks for secure aggregation with a rule that needs the individual updates."""


def require_secure_aggregation_support(strategy: Strategy) -> None:
    """Refuse a strategy that cannot aggregate under SecAgg+: median, trimmed mean and Multi-Krum look at
    every update's values, norm clipping at every update's norm; the server sees neither, only the sum."""
    if not strategy.supports_secure_aggregation:
        raise SecureAggregationUnsupportedError(
            f"strategy {strategy.name!r} cannot run under secure aggregation: the server sees only the sum of "
            f"the updates, and this rule needs each update; use one of {sorted(SECURE_AGGREGATION_STRATEGIES)} "
            "(clip on the devices instead, as DP-FedAvg does)", field="strategy.name")


def _require_updates(updates: Sequence[ClientUpdate]) -> None:
    if not updates:
        raise InvalidInputError("aggregation needs at least one accepted update", field="updates")


def weighted_mean_delta(
    global_parameters: Parameters,
    updates: Sequence[ClientUpdate],
    scale: Callable[[ClientUpdate], float] = lambda update: 1.0,
) -> Parameters:
    """Σ n_i s_i Δ_i / Σ n_i (n = num_examples, s = a per-client scale such as a clipping factor).

    Reads one delta at a time, so memory is one float64 accumulator per parameter.
    """
    _require_updates(updates)
    total = {name: np.zeros(value.shape, dtype=np.float64) for name, value in global_parameters.items()}
    total_examples = 0
    for update in updates:
        delta = update.load_delta()
        weight = update.num_examples * scale(update)
        for name in total:
            total[name] += weight * delta[name]
        total_examples += update.num_examples
        del delta
    if total_examples <= 0:
        raise InvalidInputError("aggregation needs updates with num_examples >= 1", field="num_examples")
    return {name: (value / total_examples).astype(np.float32) for name, value in total.items()}


def _apply(global_parameters: Parameters, delta: Parameters, server_learning_rate: float = 1.0) -> Parameters:
    return {name: (value + server_learning_rate * delta[name]).astype(np.float32)
            for name, value in global_parameters.items()}


def _checked_server_learning_rate(value: float) -> float:
    """The server step size of Reddi et al. 2021. Above 1 it gives back length the aggregate loses: a mean
    of label-skewed deltas moves about as far as one client's local steps, not the cohort's, and a median
    is shorter still."""
    if not math.isfinite(value) or not 0 < value <= 10:
        raise InvalidInputError(f"server_learning_rate must lie in (0, 10], got {value}", field="server_learning_rate")
    return value


class FedAvg(Strategy):
    """McMahan et al. 2017: the average of client deltas weighted by their number of examples."""

    name = "fedavg"
    supports_secure_aggregation = True

    def __init__(self, server_learning_rate: float = 1.0) -> None:
        self.server_learning_rate = _checked_server_learning_rate(server_learning_rate)

    def aggregate_fit(self, global_parameters: Parameters, updates: Sequence[ClientUpdate]) -> Parameters:
        return self.apply_mean_delta(global_parameters, weighted_mean_delta(global_parameters, updates))

    def apply_mean_delta(self, global_parameters: Parameters, mean_delta: Parameters) -> Parameters:
        return _apply(global_parameters, mean_delta, self.server_learning_rate)


class FedProx(FedAvg):
    """Li et al. 2020: FedAvg aggregation; clients add `proximal_mu * (w - w_global)` to each gradient."""

    name = "fedprox"

    def __init__(self, proximal_mu: float = 0.01, server_learning_rate: float = 1.0) -> None:
        super().__init__(server_learning_rate)
        if not math.isfinite(proximal_mu) or proximal_mu < 0:
            raise InvalidInputError(f"proximal_mu must be a non-negative number, got {proximal_mu}", field="proximal_mu")
        self.proximal_mu = proximal_mu

    def configure_fit(self, round_number: int) -> dict[str, Any]:
        return {"proximal_mu": self.proximal_mu}


class FedAdam(Strategy):
    """Reddi et al. 2021 (Algorithm 2): the weighted mean delta is a pseudo-gradient for a server-side Adam
    step, with Adam's bias-corrected step size (Kingma & Ba 2015, the alpha_t right before their section
    2.1), t = the number of server steps taken so far, this one included (t = 1 in the first round)."""

    name = "fedadam"
    supports_secure_aggregation = True

    def __init__(self, server_lr: float = 0.01, beta_1: float = 0.9, beta_2: float = 0.99, tau: float = 1e-3) -> None:
        for field_name, value in (("server_lr", server_lr), ("tau", tau)):
            if not math.isfinite(value) or value <= 0:
                raise InvalidInputError(f"{field_name} must be a positive number, got {value}", field=field_name)
        for field_name, value in (("beta_1", beta_1), ("beta_2", beta_2)):
            if not 0 <= value < 1:
                raise InvalidInputError(f"{field_name} must lie in [0, 1), got {value}", field=field_name)
        self.server_lr, self.beta_1, self.beta_2, self.tau = server_lr, beta_1, beta_2, tau
        self.first_moment: Parameters = {}
        self.second_moment: Parameters = {}
        self.step = 0

    def aggregate_fit(self, global_parameters: Parameters, updates: Sequence[ClientUpdate]) -> Parameters:
        return self.apply_mean_delta(global_parameters, weighted_mean_delta(global_parameters, updates))

    def apply_mean_delta(self, global_parameters: Parameters, mean_delta: Parameters) -> Parameters:
        pseudo_gradient = mean_delta
        self.step += 1
        # Kingma & Ba's alpha_t with t = steps taken. Flower's FedAdam cites the same formula but uses
        # t = server_round + 1 (server_round starts at 1), one step ahead of this: its round-1 step is
        # sqrt(1 - 0.99^2) / (1 - 0.9^2) = 0.74 of server_lr where this one is 1.0 (defaults), the 1.35x
        # gap; from the second round on the two differ by less than that, and the gap fades as t grows.
        step_size = self.server_lr * math.sqrt(1 - self.beta_2**self.step) / (1 - self.beta_1**self.step)
        new_parameters = {}
        for name, value in global_parameters.items():
            delta = pseudo_gradient[name]
            m = self.first_moment.get(name, np.zeros_like(delta))
            v = self.second_moment.get(name, np.zeros_like(delta))
            m = self.beta_1 * m + (1 - self.beta_1) * delta
            v = self.beta_2 * v + (1 - self.beta_2) * delta * delta
            self.first_moment[name], self.second_moment[name] = m.astype(np.float32), v.astype(np.float32)
            new_parameters[name] = (value + step_size * m / (np.sqrt(v) + self.tau)).astype(np.float32)
        return new_parameters

    def state(self) -> Parameters:
        state = {f"m/{name}": value for name, value in self.first_moment.items()}
        state.update({f"v/{name}": value for name, value in self.second_moment.items()})
        state["step"] = np.array(self.step, dtype=np.int64)
        return state

    def load_state(self, state: Parameters) -> None:
        self.step = int(state.get("step", 0))
        self.first_moment = {key[2:]: value for key, value in state.items() if key.startswith("m/")}
        self.second_moment = {key[2:]: value for key, value in state.items() if key.startswith("v/")}


class NormClipping(Strategy):
    """Sun et al. 2019: clip each delta to L2 norm `max_norm` (default: the round's median norm), then FedAvg,
    applied with `server_learning_rate`."""

    name = "norm_clipping"

    def __init__(self, max_norm: float | None = None, server_learning_rate: float = 1.0) -> None:
        if max_norm is not None and (not math.isfinite(max_norm) or max_norm <= 0):
            raise InvalidInputError(f"max_norm must be a positive number, got {max_norm}", field="max_norm")
        self.max_norm = max_norm
        self.server_learning_rate = _checked_server_learning_rate(server_learning_rate)

    def clip_norm(self, updates: Sequence[ClientUpdate]) -> float:
        """The clipping bound for this round: fixed, or the median of the updates' norms (recorded at upload)."""
        return self.max_norm if self.max_norm is not None else float(np.median([u.norm for u in updates]))

    def aggregate_fit(self, global_parameters: Parameters, updates: Sequence[ClientUpdate]) -> Parameters:
        _require_updates(updates)
        bound = self.clip_norm(updates)

        # Clipping is a per-client scale factor, so it folds into the weighted sum: one pass, O(model).
        def clip_factor(update: ClientUpdate) -> float:
            return min(1.0, bound / update.norm) if update.norm > 0 else 1.0

        return _apply(global_parameters, weighted_mean_delta(global_parameters, updates, clip_factor),
                      self.server_learning_rate)


def _blocks(total_size: int, block_columns: int) -> list[tuple[int, int]]:
    return [(start, min(total_size, start + block_columns)) for start in range(0, total_size, block_columns)]


class _SpilledUpdates(Strategy):
    """Rules that need every update at once: spill the flattened deltas to a memory map on disk (n x P
    float32) and read it back in column blocks of at most `working_memory_bytes`; the reduced delta is
    applied with `server_learning_rate`."""

    def __init__(self, working_memory_bytes: int = DEFAULT_WORKING_MEMORY_BYTES, spill_dir: str | Path | None = None,
                 server_learning_rate: float = 1.0) -> None:
        if working_memory_bytes < 1024:
            raise InvalidInputError(
                f"working_memory_bytes must be at least 1024, got {working_memory_bytes}", field="working_memory_bytes"
            )
        self.working_memory_bytes = working_memory_bytes
        self.spill_dir = spill_dir
        self.server_learning_rate = _checked_server_learning_rate(server_learning_rate)

    @abstractmethod
    def reduce(self, spill: np.ndarray, updates: Sequence[ClientUpdate], block_columns: int) -> np.ndarray:
        """The aggregate delta, flattened, from the spilled deltas (one row per update)."""

    def aggregate_fit(self, global_parameters: Parameters, updates: Sequence[ClientUpdate]) -> Parameters:
        _require_updates(updates)
        names = sorted(global_parameters)
        sizes = [global_parameters[name].size for name in names]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        with tempfile.TemporaryDirectory(dir=self.spill_dir, prefix="fedzoo-aggregate-") as folder:
            spill = np.lib.format.open_memmap(
                Path(folder) / "deltas.npy", mode="w+", dtype=np.float32, shape=(len(updates), int(offsets[-1]))
            )
            for row, update in enumerate(updates):
                delta = update.load_delta()
                for name, start, stop in zip(names, offsets[:-1], offsets[1:]):
                    spill[row, start:stop] = delta[name].reshape(-1)
                del delta
            spill.flush()
            # a block holds n rows x block_columns float32, plus as much again for sorting or products
            block_columns = max(1, self.working_memory_bytes // (2 * 4 * len(updates)))
            reduced = self.reduce(spill, updates, block_columns)
            del spill
        delta = {name: reduced[start:stop].reshape(global_parameters[name].shape)
                 for name, start, stop in zip(names, offsets[:-1], offsets[1:])}
        return _apply(global_parameters, delta, self.server_learning_rate)


class _CoordinateWise(_SpilledUpdates):
    """Rules applied independently at each coordinate."""

    @abstractmethod
    def reduce_block(self, block: np.ndarray) -> np.ndarray:
        """One value per column of `block` (rows are clients, columns are coordinates)."""

    def reduce(self, spill: np.ndarray, updates: Sequence[ClientUpdate], block_columns: int) -> np.ndarray:
        reduced = np.empty(spill.shape[1], dtype=np.float32)
        for start, stop in _blocks(spill.shape[1], block_columns):
            reduced[start:stop] = self.reduce_block(np.asarray(spill[:, start:stop]))
        return reduced


class CoordinateMedian(_CoordinateWise):
    """Yin et al. 2018: the coordinate-wise median of the deltas (unweighted; robust to < 50% outliers)."""

    name = "median"

    def reduce_block(self, block: np.ndarray) -> np.ndarray:
        return np.median(block, axis=0)


class TrimmedMean(_CoordinateWise):
    """Yin et al. 2018: per coordinate, drop the `trim_fraction` largest and smallest deltas and average the rest."""

    name = "trimmed_mean"

    def __init__(self, trim_fraction: float = 0.2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not 0 <= trim_fraction < 0.5:
            raise InvalidInputError(f"trim_fraction must lie in [0, 0.5), got {trim_fraction}", field="trim_fraction")
        self.trim_fraction = trim_fraction

    def reduce_block(self, block: np.ndarray) -> np.ndarray:
        trimmed = int(math.floor(self.trim_fraction * block.shape[0]))
        ordered = np.sort(block, axis=0)
        return ordered[trimmed : block.shape[0] - trimmed].mean(axis=0)


class MultiKrum(_SpilledUpdates):
    """Blanchard et al. 2017 (Multi-Krum): score each delta by its squared distances to its n - f - 2 nearest
    neighbours, keep the n - f best scored and average them weighted by examples, where f is the assumed
    number of Byzantine updates (`byzantine_fraction` of the round). Distances come from the Gram matrix
    accumulated over column blocks, so memory is O(n^2 + model + working_memory_bytes)."""

    name = "multi_krum"

    def __init__(self, byzantine_fraction: float = 0.2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not 0 <= byzantine_fraction < 0.5:
            raise InvalidInputError(f"byzantine_fraction must lie in [0, 0.5), got {byzantine_fraction}",
                                    field="byzantine_fraction")
        self.byzantine_fraction = byzantine_fraction

    def selected(self, spill: np.ndarray, block_columns: int) -> np.ndarray:
        """Indices of the updates Multi-Krum keeps."""
        count = spill.shape[0]
        byzantine = int(math.floor(self.byzantine_fraction * count))
        gram = np.zeros((count, count), dtype=np.float64)
        for start, stop in _blocks(spill.shape[1], block_columns):
            block = np.asarray(spill[:, start:stop], dtype=np.float64)
            gram += block @ block.T
        squared_norms = np.diag(gram)
        distances = np.maximum(squared_norms[:, None] + squared_norms[None, :] - 2 * gram, 0.0)
        neighbours = max(1, count - byzantine - 2)
        scores = np.sort(distances, axis=1)[:, 1 : neighbours + 1].sum(axis=1)  # column 0 is the distance to itself
        return np.sort(np.argsort(scores, kind="stable")[: max(1, count - byzantine)])

    def reduce(self, spill: np.ndarray, updates: Sequence[ClientUpdate], block_columns: int) -> np.ndarray:
        keep = self.selected(spill, block_columns)
        weights = np.array([updates[index].num_examples for index in keep], dtype=np.float64)
        weights /= weights.sum()
        reduced = np.empty(spill.shape[1], dtype=np.float32)
        for start, stop in _blocks(spill.shape[1], block_columns):
            reduced[start:stop] = weights @ np.asarray(spill[keep, start:stop], dtype=np.float64)
        return reduced


STRATEGIES: dict[str, type[Strategy]] = {
    strategy.name: strategy
    for strategy in (FedAvg, FedProx, FedAdam, NormClipping, CoordinateMedian, TrimmedMean, MultiKrum)
}
SECURE_AGGREGATION_STRATEGIES = frozenset(name for name, kind in STRATEGIES.items() if kind.supports_secure_aggregation)


def make_strategy(spec: dict[str, Any], spill_dir: str | Path | None = None) -> Strategy:
    """A strategy from its JSON spec, e.g. `{"name": "trimmed_mean", "trim_fraction": 0.2}`; coordinate-wise
    rules spill to `spill_dir` (the server passes a folder on its data disk, not a RAM-backed /tmp)."""
    options = dict(spec)
    name = options.pop("name", "fedavg")
    if name not in STRATEGIES:
        raise InvalidInputError(f"unknown strategy {name!r}; use one of {sorted(STRATEGIES)}", field="strategy.name")
    if "spill_dir" in options:
        raise InvalidInputError("spill_dir is the server's to choose, not a strategy option", field="strategy.spill_dir")
    if spill_dir is not None and issubclass(STRATEGIES[name], _SpilledUpdates):
        options["spill_dir"] = spill_dir
    try:
        return STRATEGIES[name](**options)
    except TypeError as error:
        raise InvalidInputError(f"bad options for strategy {name!r}: {error}", field="strategy") from None
