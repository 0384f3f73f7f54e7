"""Per-element aggregation over a supernet: every element is averaged over the devices whose subnet covers
it, and an element no device covered (or fewer than `min_coverage` devices) keeps its value.

Each device's delta arrives mapped onto the supernet (`fedzoo.nas.subnet_mapping.map_back`): a delta and a
coverage mask per supernet tensor. The mean of element `j` is `sum_i w_i m_ij d_ij / sum_i w_i m_ij` with
`w_i` the device's counted examples (capped by the server, never the device's word alone). That mean, scaled
per element by the cohorts covering it (`coverage_step_scale`: `max(1, n_j / devices per subnet) ** e`, so a
weight that several subnets' cohorts trained moves about as far as their per-model steps together at `e = 1`,
and a round of one subnet gets the plain mean), is the pseudo-gradient of a strategy that needs only the mean
delta (`Strategy.apply_mean_delta`: FedAvg, FedProx, FedAdam); rules that need each update's values (median,
trimmed mean, Multi-Krum, norm clipping) have no per-element meaning over partly covering subnets and are
refused. Elements below `min_coverage` are never moved, so no released element depends on fewer than
`min_coverage` devices' updates (FedAdam's moments on them decay as with a zero pseudo-gradient; the weights
stay).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedzoo.aggregation.settings import MappedDelta
from fedzoo.aggregation.strategies import Parameters, Strategy
from fedzoo.errors import InvalidInputError


def require_mean_only(strategy: Strategy) -> None:
    """Refuse a strategy that needs every update's values: per element over partial subnets it has no meaning."""
    if not strategy.supports_secure_aggregation:  # the same property: the rule needs only the mean delta
        raise InvalidInputError(
            f"strategy {strategy.name!r} needs each update's values, which zoo-wide rounds average per element over "
            "the devices covering it; use fedavg, fedprox or fedadam", field="strategy.name")


class CoverageSum:
    """Running weighted sums and coverage counts per supernet element (two float64 arrays and one int32 array
    per tensor: the updates are streamed in one at a time)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        self.sums = {name: np.zeros(shape, np.float64) for name, shape in shapes.items()}
        self.weights = {name: np.zeros(shape, np.float64) for name, shape in shapes.items()}
        self.counts = {name: np.zeros(shape, np.int32) for name, shape in shapes.items()}
        self.devices_by_subnet: dict[str, int] = {}

    def add(self, mapped: MappedDelta, weight: float, subnet: str = "") -> None:
        """Add one device's mapped delta with its weight (its counted examples) and the subnet it trained
        (any key naming the arch; all updates share one cohort when left out)."""
        if not weight > 0:
            raise InvalidInputError(f"an update's weight must be positive, got {weight}", field="num_examples")
        self._accumulate({name: delta.astype(np.float64) * weight for name, delta in mapped.deltas.items()},
                         mapped.masks, weight, 1, subnet)

    def add_sum(self, mapped: MappedDelta, total_weight: float, devices: int, subnet: str) -> None:
        """Add a cohort's sum: the weighted deltas of `devices` devices that trained one subnet (so one coverage
        mask), added up (SecAgg+ reveals only this), with their weights' total."""
        if not (total_weight > 0 and devices >= 1):
            raise InvalidInputError(f"a cohort's sum needs a positive weight and devices, got {total_weight} and "
                                    f"{devices}", field="num_examples")
        self._accumulate(mapped.deltas, mapped.masks, total_weight, devices, subnet)

    def _accumulate(self, weighted: dict[str, np.ndarray], masks: dict[str, np.ndarray], weight: float, devices: int,
                    subnet: str) -> None:
        self.devices_by_subnet[subnet] = self.devices_by_subnet.get(subnet, 0) + devices
        for name, delta in weighted.items():
            mask = masks[name]
            self.sums[name] += np.where(mask, delta.astype(np.float64), 0.0)
            self.weights[name] += mask * weight
            self.counts[name] += mask * devices

    @property
    def devices_per_subnet(self) -> float:
        """The mean cohort: devices added per distinct subnet (1 before any update)."""
        return sum(self.devices_by_subnet.values()) / len(self.devices_by_subnet) if self.devices_by_subnet else 1.0

    def released(self, min_coverage: int) -> dict[str, np.ndarray]:
        """Per tensor, the mask of elements covered by at least `min_coverage` (>= 1) devices."""
        return {name: counts >= max(min_coverage, 1) for name, counts in self.counts.items()}

    def mean(self, released: dict[str, np.ndarray]) -> Parameters:
        """The per-element weighted mean delta; zero where not released."""
        return {name: np.where(released[name], self.sums[name] / np.maximum(self.weights[name], 1e-300), 0.0)
                .astype(np.float32) for name in self.sums}


def apply_per_element(strategy: Strategy, weights: Parameters, mean_delta: Parameters,
                      released: dict[str, np.ndarray]) -> Parameters:
    """The strategy's step on the released elements; every other element keeps its value."""
    stepped = strategy.apply_mean_delta({name: weights[name] for name in mean_delta}, mean_delta)
    return {name: np.where(released[name], stepped[name], weights[name]).astype(np.float32) for name in mean_delta}


STATISTICS = ("running_mean", "running_var")
MIN_RUNNING_VARIANCE = 1e-5


def is_statistic(name: str) -> bool:
    """A BatchNorm running statistic: averaged per element, but not a parameter any strategy steps."""
    return name.rsplit(".", 1)[-1] in STATISTICS


def coverage_step_scale(counts: dict[str, np.ndarray], released: dict[str, np.ndarray], devices_per_subnet: float,
                        exponent: float) -> dict[str, np.ndarray]:
    """Per element `max(1, count / devices_per_subnet) ** exponent` (0 where not released).

    A per-model plan moves each model's copy of a weight by its own cohort's mean delta; a zoo-wide round
    holds one copy, and the plain per-element mean moves it as far as one cohort would, however many
    cohorts trained it. With exponent 1 an element that `k` cohorts' worth of devices covered moves `k`
    times that mean, about the sum of the cohorts' steps; with 0.5, as far as keeps the noise of the mean
    (about `1/sqrt(n)` of one device's drift) at one cohort's. The scale lies in `[1, subnets ** exponent]`;
    a round of one subnet (a single-model plan's shape) gets 1 everywhere."""
    if not math.isfinite(exponent) or not 0 <= exponent <= 1:
        raise InvalidInputError(f"the coverage step exponent must lie in [0, 1], got {exponent}",
                                field="zoo.coverage_step_exponent")
    if not devices_per_subnet > 0:
        raise InvalidInputError(f"devices per subnet must be positive, got {devices_per_subnet}")
    return {name: np.where(released[name], np.maximum(count / devices_per_subnet, 1.0) ** exponent, 0.0)
            for name, count in counts.items()}


def step_supernet(strategy: Strategy, weights: Parameters, total: CoverageSum, min_coverage: int,
                  coverage_step_exponent: float = 0.0) -> tuple[Parameters, dict[str, np.ndarray]]:
    """The supernet after a round, and the released masks: the strategy's step on the released elements of the
    covered parameters, their mean delta first scaled by `coverage_step_scale` (exponent 0: the plain
    per-element mean); running statistics moved by their per-element mean delta (variances kept positive);
    every other element as it was."""
    released = total.released(min_coverage)
    mean = total.mean(released)
    parameters = [name for name in mean if not is_statistic(name)]
    scale = coverage_step_scale({name: total.counts[name] for name in parameters},
                                {name: released[name] for name in parameters}, total.devices_per_subnet,
                                coverage_step_exponent)
    updated = dict(weights)
    updated.update(apply_per_element(strategy, weights, {name: (mean[name] * scale[name]).astype(np.float32)
                                                         for name in parameters},
                                     {name: released[name] for name in parameters}))
    for name in mean:
        if is_statistic(name):
            moved = np.where(released[name], weights[name] + mean[name], weights[name])
            if name.endswith("running_var"):
                moved = np.maximum(moved, MIN_RUNNING_VARIANCE)
            updated[name] = moved.astype(np.float32)
    return updated, released


@dataclass(frozen=True)
class TensorCoverage:
    """How many devices covered a supernet tensor's elements: the operator's and the privacy check's view."""

    elements: int
    uncovered: int  # no device
    single: int  # exactly one device: its update alone would be revealed
    released: int  # at least min_coverage devices: moved this round
    min_count: int
    max_count: int
    mean_count: float

    def as_dict(self) -> dict[str, float | int]:
        return {"elements": self.elements, "uncovered": self.uncovered, "single": self.single,
                "released": self.released, "min_count": self.min_count, "max_count": self.max_count,
                "mean_count": round(self.mean_count, 4)}


def coverage_report(counts: dict[str, np.ndarray], released: dict[str, np.ndarray]) -> dict[str, TensorCoverage]:
    """Coverage per supernet tensor."""
    return {name: TensorCoverage(int(count.size), int((count == 0).sum()), int((count == 1).sum()),
                                 int(released[name].sum()), int(count.min()) if count.size else 0, int(count.max()) if count.size else 0,
                                 float(count.mean()) if count.size else 0.0)
            for name, count in counts.items()}


def layer_of(supernet_name: str) -> str:
    """The layer a supernet tensor belongs to, for the per-layer view: `stages.2.1.expand_norm.bias` is
    `stages.2.1`, `stem.1.weight` is `stem`."""
    parts = supernet_name.split(".")
    return ".".join(parts[:3]) if parts[0] == "stages" else parts[0]


def coverage_by_layer(report: dict[str, TensorCoverage]) -> dict[str, dict[str, float | int]]:
    """The per-tensor coverage summed per layer (mean count weighted by elements)."""
    layers: dict[str, dict[str, float | int]] = {}
    for name, tensor in report.items():
        layer = layers.setdefault(layer_of(name), {"elements": 0, "uncovered": 0, "single": 0, "released": 0,
                                                   "min_count": tensor.min_count, "max_count": 0, "mean_count": 0.0})
        for key in ("elements", "uncovered", "single", "released"):
            layer[key] += getattr(tensor, key)
        layer["min_count"] = min(layer["min_count"], tensor.min_count)
        layer["max_count"] = max(layer["max_count"], tensor.max_count)
        layer["mean_count"] += tensor.mean_count * tensor.elements
    for layer in layers.values():
        layer["mean_count"] = round(layer["mean_count"] / max(layer["elements"], 1), 4)
    return layers
