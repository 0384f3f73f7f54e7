"""How fast a model runs on a device, as the lookup sees it.

For a (device, model) pair the lookup takes the first of:

1. **measured** — the median of this device's own recent telemetry for this model;
2. **card device class** — the card's `latency_ms[device.device_class]`, when the card has that class;
3. **predictor** — `model_factor * sum over groups g of model_cost_ms[g] * device_scale[g]` (the factor is
   what the fleet's telemetry says of the model, `fedzoo.server.online_calibration`; 1 until then).

Step 3 is the form of the kernel-level predictor in `fedzoo.edge.latency_predictor`: a model's
latency on the reference device splits into a few cost groups (per-inference overhead, dense and
depthwise convs in fp32 and int8, the rest), and a device's calibration benchmarks give one scale per
group. So the costs are computed once when a model is published and the scales once when a device
registers, both stored in slot columns (slot i = the estimator's i-th group), and a lookup is one
indexed query with a short dot product. Rows carry the estimator's `signature`; when the estimator
changes (new groups, new reference coefficients) `fedzoo.server.registry.refresh_latency_estimates`
recomputes them at start-up. This form leaves out the edge predictor's similarity correction (a factor per
model *and* device, from the calibration models like the model): storing it would take per-model weights
over the calibration models and per-device ratios beside the slots. `bench/latency_fleet.py` judges the
predictor with and without it.

`LatencyEstimator` is that seam. `KernelPredictorEstimator` uses the edge predictor;
`CalibrationScalingEstimator` is the fallback when it cannot be used (no reference model file, a
device with fewer than two known calibration benchmarks): the model's reference latency (the card's
"reference" latency, else MACs at a nominal rate) in one group, scaled by the geometric mean of the
device's calibration timings over the reference's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from statistics import median

from fedzoo.cards import ModelCard
from fedzoo.device import DeviceProfile
from fedzoo.errors import FedzooError
from fedzoo.server.tables import LATENCY_SLOTS

# The card's latency under this device class is the reference device's (used by the fallback).
REFERENCE_DEVICE_CLASS = "reference"
# Fallback for cards without a reference latency: ~1 GMAC/s batch-1 ONNX Runtime, plus a per-call overhead.
REFERENCE_MACS_PER_MS = 1.0e6
REFERENCE_OVERHEAD_MS = 0.05
# Telemetry keeps the median of the most recent reports, so a device that gets slower is followed.
MEASURED_WINDOW_REPORTS = 20

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelCosts:
    """A model's latency on the reference device per group (ms, in the estimator's group order)."""

    costs_ms: tuple[float, ...]
    basis: str

    @property
    def reference_ms(self) -> float:
        return sum(self.costs_ms)


@dataclass(frozen=True)
class DeviceScales:
    """Per group, device time / reference time (in the estimator's group order), and their basis."""

    scales: tuple[float, ...]
    basis: str


class LatencyEstimator(ABC):
    """The predictor behind step 3; its methods run at publish / registration time, never per lookup."""

    groups: tuple[str, ...]

    @property
    @abstractmethod
    def signature(self) -> str:
        """Identifies the estimator and its parameters; stored with every cost and scale it computed."""

    @abstractmethod
    def model_costs(self, card: ModelCard, model_bytes: bytes) -> ModelCosts:
        """The model's reference latency split by `groups` (every value >= 0, sum > 0)."""

    @abstractmethod
    def device_scales(self, profile: DeviceProfile) -> DeviceScales:
        """One scale (> 0) per group for the device with this profile."""


class CalibrationScalingEstimator(LatencyEstimator):
    """Reference latency from the card (or its MACs); one device speed factor from calibration ratios."""

    groups = ("all",)

    def __init__(self, reference_calibration_ms: dict[str, float] | None = None) -> None:
        self.reference_calibration_ms = dict(reference_calibration_ms or {})

    @property
    def signature(self) -> str:
        table = json.dumps(self.reference_calibration_ms, sort_keys=True).encode()
        return f"calibration-scaling/{hashlib.sha256(table).hexdigest()[:16]}"

    def model_costs(self, card: ModelCard, model_bytes: bytes) -> ModelCosts:
        reference = card.latency_ms.get(REFERENCE_DEVICE_CLASS)
        if reference is not None:
            return ModelCosts((reference.median_ms,), "card reference latency")
        return ModelCosts((REFERENCE_OVERHEAD_MS + card.macs / REFERENCE_MACS_PER_MS,), "card MACs at a nominal rate")

    def speed_factor(self, profile: DeviceProfile) -> tuple[float, str]:
        ratios = [
            benchmark.median_ms / self.reference_calibration_ms[benchmark.model]
            for benchmark in profile.benchmarks
            if self.reference_calibration_ms.get(benchmark.model, 0.0) > 0.0
        ]
        if not ratios:
            return 1.0, "no calibration benchmark known; assumed reference speed"
        factor = math.exp(sum(math.log(ratio) for ratio in ratios) / len(ratios))
        return factor, f"geometric mean of {len(ratios)} calibration ratios"

    def device_scales(self, profile: DeviceProfile) -> DeviceScales:
        factor, basis = self.speed_factor(profile)
        return DeviceScales((factor,), basis)


class KernelPredictorEstimator(LatencyEstimator):
    """The edge's kernel-level predictor: group costs from the ONNX graph, group scales from calibration."""

    def __init__(self) -> None:
        from fedzoo.edge import latency_predictor

        self._module = latency_predictor
        self.reference = latency_predictor.KernelLatencyPredictor.load()
        self.groups = tuple(latency_predictor.CALIBRATION_GROUPS)
        if len(self.groups) > LATENCY_SLOTS:
            raise ValueError(f"the predictor has {len(self.groups)} groups; the registry stores {LATENCY_SLOTS}")
        self._signature = "kernel-predictor/" + hashlib.sha256(self.reference.to_json().encode()).hexdigest()[:16]
        self._fallback = CalibrationScalingEstimator()
        self._costs_by_blob: dict[str, tuple[float, ...]] = {}  # many cards share one blob (e.g. versions)

    @property
    def signature(self) -> str:
        return self._signature

    def model_costs(self, card: ModelCard, model_bytes: bytes) -> ModelCosts:
        cached = self._costs_by_blob.get(card.sha256)
        if cached is not None:
            return ModelCosts(cached, "kernel predictor")
        try:
            costs = self.reference.group_costs_ms(self._module.kernel_features(model_bytes))
        except (FedzooError, ValueError, KeyError) as error:
            log.warning("predictor cannot cost model %s (%s); using its card latency", card.id, error)
            return self._fallback_costs(card, model_bytes)
        values = tuple(max(float(costs.get(group, 0.0)), 0.0) for group in self.groups)
        if sum(values) <= 0.0:  # a zero latency would make the model fit every budget
            log.warning("predictor gives model %s 0 ms; using its card latency", card.id)
            return self._fallback_costs(card, model_bytes)
        if len(self._costs_by_blob) < 100_000:
            self._costs_by_blob[card.sha256] = values
        return ModelCosts(values, "kernel predictor")

    def _fallback_costs(self, card: ModelCard, model_bytes: bytes) -> ModelCosts:
        """The card's reference latency (or MACs), all in the first group (scaled like per-op overhead)."""
        fallback = self._fallback.model_costs(card, model_bytes)
        return ModelCosts((fallback.reference_ms,) + (0.0,) * (len(self.groups) - 1), f"fallback: {fallback.basis}")

    def device_scales(self, profile: DeviceProfile) -> DeviceScales:
        timings = tuple(sorted({benchmark.model: benchmark.median_ms for benchmark in profile.benchmarks}.items()))
        return self._scales_for_timings(timings)

    @functools.lru_cache(maxsize=4096)  # noqa: B019  (devices of one hardware type report the same timings)
    def _scales_for_timings(self, timing_items: tuple[tuple[str, float], ...]) -> DeviceScales:
        timings = dict(timing_items)
        features = _calibration_features()
        known = [name for name in timings if name in features]
        if len(known) < 2:
            return DeviceScales((1.0,) * len(self.groups),
                                "fewer than 2 known calibration benchmarks; assumed reference speed")
        calibrated = self.reference.calibrated_from_features([features[name] for name in known],
                                                             [timings[name] for name in known], names=known)
        scales = tuple(max(float(calibrated.group_scales.get(group, 1.0)), 1e-6) for group in self.groups)
        return DeviceScales(scales, f"kernel predictor calibrated on {len(known)} benchmarks")


@functools.cache
def _calibration_features() -> dict:
    """Kernel features of every calibration model, built once per process (building them takes seconds)."""
    from fedzoo.edge.calibration_models import CALIBRATION_MODEL_NAMES, calibration_model
    from fedzoo.edge.latency_predictor import kernel_features

    return {name: kernel_features(calibration_model(name)) for name in CALIBRATION_MODEL_NAMES}


def default_estimator() -> LatencyEstimator:
    """The kernel predictor when the edge ships a usable one, else calibration scaling."""
    try:
        return KernelPredictorEstimator()
    except Exception as error:  # any failure to load it (missing file, changed API) means: use the fallback
        log.warning("kernel latency predictor unavailable (%s); using calibration scaling", error)
        return CalibrationScalingEstimator()


def slot_values(values: tuple[float, ...], missing: float) -> tuple[float, ...]:
    """Values padded to every slot column (unused slots: cost 0, scale 1)."""
    return tuple(values) + (missing,) * (LATENCY_SLOTS - len(values))


def measured_median_ms(recent_reports_ms: list[float]) -> float:
    """The device's measured latency of a model: the median of its most recent reports."""
    return float(median(recent_reports_ms[-MEASURED_WINDOW_REPORTS:]))
