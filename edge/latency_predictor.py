"""Predict a model's latency on a device it never ran on, kernel by kernel, in the manner of nn-Meter.

Entry point for the server and NAS (no torch; needs `onnx`, imported lazily, to parse the graph):

    from fedzoo.edge.latency_predictor import KernelLatencyPredictor, predict_for_device
    predictor = KernelLatencyPredictor.for_device(profile.benchmarks)  # [{model, median_ms}, ...]
    predictor.predict_ms("model.onnx")                                 # path, bytes or ModelProto -> ms
    predict_for_device(model_bytes, profile.benchmarks)                # the same, in one call

How it works. `fedzoo.edge.kernels` splits the graph into fused kernels (Conv+BN+activation, QLinearConv,
Gemm, pools, ...). The *reference* predictor gives each kernel type a linear cost over its shape features,
`per_kernel + per_mac * MACs + per_padded_mac * MACs-with-channels-in-blocks-of-16 + per_pixel * output
pixels + per_element * (inputs + outputs) + per_weight * weights`, plus one
per-inference overhead; the coefficients are fitted (non-negative least squares on relative error) to whole
models measured on the reference device, once as it runs them (NCHWc convs) and once with the NCHWc kernels
off (where the runtime also fuses less: see `fedzoo.edge.kernels`), and shipped as `reference_latency_model.json`
beside this file, with the reference's own timings of the calibration models (its "anchors").
A new device only times the handful of calibration models (`fedzoo.edge.calibration_models`): `calibrated`
then scales the reference's cost *groups* (the per-inference overhead; dense and depthwise convs, each in fp32
and INT8; everything else), since threads, runtime builds and CPUs speed these up by different factors. That
is 6 numbers, fitted in milliseconds from 8 timings, pulled toward a single common scale so few timings
cannot overfit. Each calibration model's cost is anchored to its measured reference median, so the scales
compare the device with the reference's measurements, not with its predictions (the reference's residuals on
the calibration models biased INT8 predictions by -6% before). Calibration also decides from the timings
whether the device runs fp32 convs in onnxruntime's x86 NCHWc layout (like the reference) or all in plain
NCHW (ARM builds, lower optimisation levels).
Last, the calibrated predictor corrects each prediction by the calibration models *like* the model: their
measured / predicted ratios on the device, averaged with Gaussian weights over how close each one's mix of
group costs (and size) is to the model's. A device's speed changes unevenly across kernels (a shared VM's
slow spells hit small zoo models harder than the dense calibration model), and the scales alone cannot
follow that: judged offline on the timings of six fleet-bench runs, it raised the zoo's predictions
within ±10% from 79% to 86%.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from fedzoo.errors import InvalidInputError

REFERENCE_MODEL_PATH = Path(__file__).with_name("reference_latency_model.json")
FEATURES = ("kernels", "macs", "padded_macs", "pixels", "elements", "weights")
CHANNEL_BLOCK = 16  # onnxruntime's NCHWc block on AVX-512: channels are computed in blocks of 16
CALIBRATION_GROUPS = ("overhead", "dense-fp32", "depthwise-fp32", "dense-int8", "depthwise-int8", "other")
DENSE_CATEGORIES = frozenset({"conv", "conv-pw", "conv-stem", "gemm"})
CALIBRATION_PRIOR_WEIGHT = 0.1  # how strongly group scales are pulled toward the one common scale
# The similarity correction: a calibration model's weight for a model is exp(-distance^2 / (2 width^2)), the
# distance over their group-cost shares plus SIMILARITY_SIZE_WEIGHT x log of their reference latency (ms).
SIMILARITY_WIDTH = 0.3
SIMILARITY_SIZE_WEIGHT = 0.3
ModelSource = Any  # a path, ONNX bytes or an onnx.ModelProto


class LatencyPredictor(ABC):
    """Estimates the batch-1 latency of an ONNX model on one device."""

    @abstractmethod
    def fit(self, models: Sequence[ModelSource], latencies_ms: Sequence[float]) -> LatencyPredictor:
        """Learn from `models` measured at `latencies_ms` on the device; returns self."""

    @abstractmethod
    def predict_ms(self, model: ModelSource) -> float:
        """Predicted median latency of one batch-1 inference of `model`, in milliseconds."""


def kernel_features(model: ModelSource, all_plain_layout: bool = False) -> dict[str, np.ndarray]:
    """Per kernel key (e.g. "conv-pw/int8"), the summed FEATURES of that model's kernels of that key
    (`all_plain_layout`: as a runtime without NCHWc kernels would run them)."""
    from fedzoo.edge.kernels import split_kernels

    return features_of_kernels(split_kernels(model, all_plain_layout))


def features_of_kernels(kernels: Iterable[Any]) -> dict[str, np.ndarray]:
    """`kernel_features` of a list of kernels (`fedzoo.edge.kernels.Kernel`): a model's features are the
    sum of its parts', so NAS can tabulate them per block."""
    features: dict[str, np.ndarray] = {}
    for kernel in kernels:
        row = np.array(
            [
                1.0,
                kernel.macs,
                padded_macs(kernel),
                kernel.output_pixels,
                kernel.input_elements + kernel.output_elements,
                kernel.weight_elements,
            ],
            np.float64,
        )
        features[kernel.key] = features.get(kernel.key, np.zeros(len(FEATURES))) + row
    return features


def padded_macs(kernel: Any) -> int:
    """MACs with channels rounded up to whole CHANNEL_BLOCKs: what a blocked conv kernel really computes."""
    if not kernel.out_channels:
        return kernel.macs
    kernel_area = kernel.kernel_size * kernel.kernel_size
    out_channels = _round_up(kernel.out_channels, CHANNEL_BLOCK)
    if kernel.category == "conv-dw":
        return kernel.output_pixels * out_channels * kernel_area
    in_per_group = _round_up(kernel.in_channels // kernel.groups, CHANNEL_BLOCK)
    return kernel.output_pixels * out_channels * in_per_group * kernel_area


def _round_up(value: int, block: int) -> int:
    return -(-value // block) * block


def calibration_group(key: str) -> str:
    """Which calibration group scales the cost of kernels of `key`: dense or depthwise convs per precision,
    or the rest (pools, element-wise ops, quantize/dequantize), which a device speeds up by its own factor."""
    category, _, precision = key.partition("/")
    base_category = category.split("+")[0]
    if base_category in DENSE_CATEGORIES:
        return f"dense-{precision}"
    if base_category == "conv-dw":
        return f"depthwise-{precision}"
    return "other"


@dataclass
class KernelLatencyPredictor(LatencyPredictor):
    """Per-kernel-type linear costs (the reference device) times per-device group scales."""

    coefficients: dict[str, list[float]] = field(default_factory=dict)  # key -> ms per unit of each FEATURE
    overhead_ms: float = 0.0  # per inference (session.run and graph entry/exit)
    group_scales: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CALIBRATION_GROUPS, 1.0))
    reference_device: dict[str, Any] = field(default_factory=dict)
    all_plain_layout: bool = False  # the device runs every fp32 conv in plain NCHW (found by calibration)
    # The calibration models' medians measured on the reference device, by layout ("nchwc", "plain"): a
    # device's timings are compared with these, so the reference's own residuals on them do not bias a device.
    calibration_anchors_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    # Set by calibration: per calibration model, its similarity descriptor and measured / predicted ratio.
    calibration_residuals: list[tuple[list[float], float]] = field(default_factory=list)

    # ---- fitting the reference -------------------------------------------------------------------------
    def fit(self, models: Sequence[ModelSource], latencies_ms: Sequence[float]) -> KernelLatencyPredictor:
        """Fit every kernel type's coefficients to whole-model timings (non-negative, relative error)."""
        return self.fit_features([kernel_features(model) for model in models], latencies_ms)

    def fit_features(
        self, features: Sequence[Mapping[str, np.ndarray]], latencies_ms: Sequence[float]
    ) -> KernelLatencyPredictor:
        """`fit` from precomputed `kernel_features`, so a bench can split each graph once."""
        targets = _positive_latencies(latencies_ms, len(features))
        keys = sorted({key for row in features for key in row})
        design = np.zeros((len(features), 1 + len(keys) * len(FEATURES)))
        design[:, 0] = 1.0
        for index, row in enumerate(features):
            for position, key in enumerate(keys):
                if key in row:
                    design[index, 1 + position * len(FEATURES): 1 + (position + 1) * len(FEATURES)] = row[key]
        solution = _relative_nonnegative_least_squares(design, targets)
        self.overhead_ms = float(solution[0])
        self.coefficients = {
            key: solution[1 + position * len(FEATURES): 1 + (position + 1) * len(FEATURES)].tolist()
            for position, key in enumerate(keys)
        }
        self.group_scales = dict.fromkeys(CALIBRATION_GROUPS, 1.0)
        return self

    # ---- predicting -------------------------------------------------------------------------------------
    def predict_ms(self, model: ModelSource) -> float:
        return self.predict_from_features(kernel_features(model, self.all_plain_layout))

    def predict_from_features(self, features: Mapping[str, np.ndarray]) -> float:
        """`predict_ms` from precomputed `kernel_features`."""
        costs = self._reference_group_costs_ms(features)
        return float(sum(self._scaled(costs).values())) * self._similarity_factor(costs)

    def group_costs_ms(self, features: Mapping[str, np.ndarray]) -> dict[str, float]:
        """The prediction split by calibration group (reference cost times that group's scale), before the
        similarity correction."""
        return self._scaled(self._reference_group_costs_ms(features))

    def _scaled(self, reference_costs: Mapping[str, float]) -> dict[str, float]:
        return {group: cost * self.group_scales.get(group, 1.0) for group, cost in reference_costs.items()}

    def similarity_correction(self, features: Mapping[str, np.ndarray]) -> float:
        """The factor calibration found for models like this one (1.0 before calibration): the calibration
        models' measured / predicted ratios, weighted by how similar each one is to the model."""
        return self._similarity_factor(self._reference_group_costs_ms(features))

    def _similarity_factor(self, reference_costs: Mapping[str, float]) -> float:
        if not self.calibration_residuals:
            return 1.0
        descriptors = np.array([descriptor for descriptor, _ in self.calibration_residuals])
        ratios = np.array([ratio for _, ratio in self.calibration_residuals])
        distances = np.sum((descriptors - _similarity_descriptor(reference_costs)) ** 2, axis=1)
        weights = np.exp(-(distances - distances.min()) / (2 * SIMILARITY_WIDTH**2))  # the nearest weighs 1
        return float(weights @ ratios / weights.sum())

    def _reference_group_costs_ms(self, features: Mapping[str, np.ndarray]) -> dict[str, float]:
        """The reference device's cost of the model per calibration group."""
        if not self.coefficients:
            raise InvalidInputError("the latency predictor is not fitted; call fit() or load a reference", "predictor")
        costs = dict.fromkeys(CALIBRATION_GROUPS, 0.0)
        costs["overhead"] = self.overhead_ms
        for key, values in features.items():
            costs[calibration_group(key)] += float(np.dot(values, self._coefficients_for(key)))
        return costs

    def _coefficients_for(self, key: str) -> list[float]:
        """The key's own coefficients; for a kernel type never fitted, the plain kernel of its category (no
        fused activation, default layout) at that precision, else at another, else the element-wise costs
        of that precision (an unseen op is most likely memory-bound)."""
        category, _, precision = key.partition("/")
        base = category.split("+")[0].split(":")[0]
        candidates = [
            key,
            f"{base}/{precision}",
            *sorted(k for k in self.coefficients if k.split("+")[0].split(":")[0].split("/")[0] == base),
            f"elementwise/{precision}",
        ]
        for candidate in candidates:
            if candidate in self.coefficients:
                return self.coefficients[candidate]
        return [float(np.median([c[index] for c in self.coefficients.values()])) for index in range(len(FEATURES))]

    # ---- adapting to a device ---------------------------------------------------------------------------
    def calibrated(
        self, benchmarks: Iterable[Any], calibration_models: Mapping[str, bytes] | None = None
    ) -> KernelLatencyPredictor:
        """A copy adapted to the device that measured `benchmarks` (`{model, median_ms}` of calibration models)."""
        timings = _benchmark_timings(benchmarks)
        if calibration_models is not None:
            unknown = sorted(set(timings) - set(calibration_models))
            if unknown:
                raise InvalidInputError(f"no calibration model named {unknown[0]!r}", field="benchmarks")
        features = {}
        for plain in (False, True):
            features[plain] = [
                kernel_features(calibration_models[name], plain) if calibration_models is not None
                else _calibration_model_features(name, plain)
                for name in timings
            ]
        return self.calibrated_from_features(features[False], list(timings.values()), features[True], list(timings))

    def calibrated_from_features(
        self,
        features: Sequence[Mapping[str, np.ndarray]],
        latencies_ms: Sequence[float],
        plain_layout_features: Sequence[Mapping[str, np.ndarray]] | None = None,
        names: Sequence[str] | None = None,
    ) -> KernelLatencyPredictor:
        """`calibrated` from precomputed calibration-model features and their timings on the device. Given the
        features also as a runtime without NCHWc kernels would run the models, it keeps whichever of the two
        explains the timings better: a device's layout is found from its timings, not declared. Given the
        models' `names`, each one's predicted cost is anchored to its measured reference median (see
        `calibration_anchors_ms`): the scales then say only how this device differs from the reference.
        Last, each calibration model's measured / predicted ratio is kept for the similarity correction."""
        targets = _positive_latencies(latencies_ms, len(features))
        candidates = [(False, features)] + ([(True, plain_layout_features)] if plain_layout_features else [])
        fits = [
            (self._fit_group_scales(rows, targets, self._anchors(names, plain)), plain, rows) for plain, rows in candidates
        ]
        (scales, _), plain, rows = min(fits, key=lambda fit: fit[0][1])  # the smaller residual
        calibrated = KernelLatencyPredictor(
            self.coefficients, self.overhead_ms, dict(zip(CALIBRATION_GROUPS, scales.tolist())),
            self.reference_device, plain, self.calibration_anchors_ms,
        )
        calibrated.calibration_residuals = [
            (_similarity_descriptor(self._reference_group_costs_ms(row)).tolist(),
             float(target / sum(calibrated.group_costs_ms(row).values())))
            for row, target in zip(rows, targets)
        ]
        return calibrated

    def _anchors(self, names: Sequence[str] | None, all_plain_layout: bool) -> np.ndarray | None:
        """Reference medians of the named calibration models in that layout; None unless all are known."""
        anchors = self.calibration_anchors_ms.get("plain" if all_plain_layout else "nchwc", {})
        if names is None or not all(name in anchors for name in names):
            return None
        return np.array([anchors[name] for name in names])

    def _fit_group_scales(
        self, features: Sequence[Mapping[str, np.ndarray]], targets: np.ndarray, anchors_ms: np.ndarray | None
    ) -> tuple[np.ndarray, float]:
        """Group scales for these timings, and the squared relative error they leave on them."""
        costs = np.array([[self._reference_group_costs_ms(row)[g] for g in CALIBRATION_GROUPS] for row in features])
        if anchors_ms is not None:  # each model's cost split by group, summing to what the reference measured
            costs = costs * (anchors_ms / np.maximum(costs.sum(axis=1), 1e-12))[:, None]
        ratios = costs.sum(axis=1) / targets
        common_scale = float(np.sum(ratios) / np.sum(ratios**2))  # best single scale on relative error
        # Relative-error rows, plus prior rows pulling each scale toward the common one.
        prior = np.sqrt(CALIBRATION_PRIOR_WEIGHT) * np.eye(len(CALIBRATION_GROUPS))
        design = np.vstack([costs / targets[:, None], prior])
        target = np.concatenate([np.ones(len(targets)), prior @ np.full(len(CALIBRATION_GROUPS), common_scale)])
        scales = _nonnegative_least_squares(design, target)
        residual = float(np.sum((costs @ scales / targets - 1.0) ** 2))
        return scales, residual

    @classmethod
    def for_device(cls, benchmarks: Iterable[Any], reference: str | Path = REFERENCE_MODEL_PATH) -> KernelLatencyPredictor:
        """The shipped reference predictor, adapted to the device whose calibration `benchmarks` are given."""
        return cls.load(reference).calibrated(benchmarks)

    # ---- persistence ------------------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(
            {
                "features": list(FEATURES),
                "overhead_ms": self.overhead_ms,
                "coefficients": self.coefficients,
                "group_scales": self.group_scales,
                "reference_device": self.reference_device,
                "all_plain_layout": self.all_plain_layout,
                "calibration_anchors_ms": self.calibration_anchors_ms,
                "calibration_residuals": self.calibration_residuals,
            },
            indent=1,
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> KernelLatencyPredictor:
        data = json.loads(text)
        if data.get("features") != list(FEATURES):
            raise InvalidInputError(f"predictor features {data.get('features')} != {list(FEATURES)}", "features")
        return cls(
            data["coefficients"], data["overhead_ms"], data["group_scales"], data.get("reference_device", {}),
            bool(data.get("all_plain_layout", False)), data.get("calibration_anchors_ms", {}),
            [(list(descriptor), float(ratio)) for descriptor, ratio in data.get("calibration_residuals", [])],
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path = REFERENCE_MODEL_PATH) -> KernelLatencyPredictor:
        return cls.from_json(Path(path).read_text())


def fit_reference_predictor(
    device_class: Any = None, architectures: int = 300, seed: int = 1000, holdout_every: int = 0, rounds: int = 100
) -> tuple[KernelLatencyPredictor, dict[str, float]]:
    """Fit the reference predictor on `device_class` (default: the fleet's first class) from random
    MobileNet-style models (half broad, half sampled around the zoo's search space), fp32 and INT8, measured
    there in interleaved rounds at real-time priority, twice: as the class runs them (NCHWc) and with the
    runtime's NCHWc kernels off, so plain-layout kernels get costs measured in their own fusions.
    With `holdout_every` = k, every k-th architecture is held out and the returned figures say how well the
    fit predicts them; the shipped reference is fitted on all of them. `rounds` of interleaved timing per
    layout: on a VM whose speed drifts, 100 rounds held out 91% within ±10% where 30 held out 85% (NCHWc; the
    same machine, 9 minutes against 3)."""
    from dataclasses import replace

    from fedzoo.edge.calibration_models import build_model, calibration_models, random_architecture, zoo_like_architecture
    from fedzoo.edge.fleet import DEFAULT_FLEET, run_on_device_class

    device_class = device_class or DEFAULT_FLEET[0]
    plain_class = replace(device_class, name=f"{device_class.name}-no-nchwc", graph_optimization="extended")
    models: dict[str, bytes] = {}
    for index in range(architectures):  # half broad MobileNet-style, half around the zoo's search space
        sampler = random_architecture if index % 2 else zoo_like_architecture
        architecture = sampler(seed + index)
        for precision in ("fp32", "int8"):
            models[f"random-{index}-{precision}"] = build_model(architecture, precision, seed + index)  # type: ignore[arg-type]
    calibration = calibration_models()
    models.update(calibration)
    names = list(models)
    features, latencies = {}, {}
    for layout, measured_class in (("nchwc", device_class), ("plain", plain_class)):
        measured = run_on_device_class(
            measured_class, models, rounds=rounds, runs_per_round=2, realtime=True, timeout_s=3600.0
        )
        features[layout] = [kernel_features(models[name], layout == "plain") for name in names]
        latencies[layout] = [measured[name].median_ms for name in names]
    figures: dict[str, float] = {"models": float(len(names)), "layouts": 2.0}
    if holdout_every:
        held_out = [name.startswith("random-") and int(name.split("-")[1]) % holdout_every == 0 for name in names]
        train = [index for index, out in enumerate(held_out) if not out]
        test = [index for index, out in enumerate(held_out) if out]
        trial = fit_reference_from_measurements(
            {layout: [rows[i] for i in train] for layout, rows in features.items()},
            {layout: [values[i] for i in train] for layout, values in latencies.items()},
        )
        for layout in features:
            errors = np.array([trial.predict_from_features(features[layout][i]) / latencies[layout][i] - 1.0 for i in test])
            figures.update({
                f"{layout}_holdout_models": float(len(test)),
                f"{layout}_holdout_within_10pct": float(np.mean(np.abs(errors) <= 0.10)),
                f"{layout}_holdout_within_20pct": float(np.mean(np.abs(errors) <= 0.20)),
                f"{layout}_holdout_median_abs_error": float(np.median(np.abs(errors))),
            })
    predictor = fit_reference_from_measurements(features, latencies)
    predictor.calibration_anchors_ms = {
        layout: {name: latencies[layout][names.index(name)] for name in calibration} for layout in latencies
    }
    predictor.reference_device = {
        "device_class": device_class.name,
        "threads": device_class.threads,
        "graph_optimization": f"{device_class.graph_optimization} and extended (no NCHWc)",
        "models": len(names),
        "architecture_seeds": [seed, seed + architectures],
    }
    return predictor, figures


def fit_reference_from_measurements(
    features: Mapping[str, Sequence[Mapping[str, np.ndarray]]], latencies_ms: Mapping[str, Sequence[float]]
) -> KernelLatencyPredictor:
    """One predictor fitted jointly to models measured in each layout ("nchwc", "plain"): kernel types both
    layouts run alike (INT8 element-wise ops, pools, the classifier) share costs, the rest are keyed apart."""
    rows = [row for layout in features for row in features[layout]]
    targets = [value for layout in features for value in latencies_ms[layout]]
    return KernelLatencyPredictor().fit_features(rows, targets)


def _similarity_descriptor(reference_costs: Mapping[str, float]) -> np.ndarray:
    """Where a model lies for the similarity correction: its reference cost shares per group, and its size."""
    costs = np.array([reference_costs[group] for group in CALIBRATION_GROUPS])
    total = max(float(costs.sum()), 1e-12)
    return np.append(costs / total, SIMILARITY_SIZE_WEIGHT * np.log(total))


def predict_for_device(model: ModelSource, benchmarks: Iterable[Any]) -> float:
    """Predicted latency (ms) of `model` on the device that measured these calibration `benchmarks`."""
    return KernelLatencyPredictor.for_device(benchmarks).predict_ms(model)


@lru_cache(maxsize=None)
def _calibration_model_features(name: str, all_plain_layout: bool) -> dict[str, np.ndarray]:
    """Kernel features of a named calibration model, built once per process (a server calibrates often)."""
    from fedzoo.edge.calibration_models import CALIBRATION_MODEL_NAMES, calibration_model

    if name not in CALIBRATION_MODEL_NAMES:
        raise InvalidInputError(
            f"no calibration model named {name!r}; known: {', '.join(CALIBRATION_MODEL_NAMES)}", field="benchmarks"
        )
    return kernel_features(calibration_model(name), all_plain_layout)


def _benchmark_timings(benchmarks: Iterable[Any]) -> dict[str, float]:
    """`{model: median_ms}` from CalibrationBenchmark objects or dicts; at least two are needed."""
    timings: dict[str, float] = {}
    for benchmark in benchmarks:
        name = benchmark["model"] if isinstance(benchmark, Mapping) else benchmark.model
        median_ms = benchmark["median_ms"] if isinstance(benchmark, Mapping) else benchmark.median_ms
        timings[str(name)] = float(median_ms)
    if len(timings) < 2:
        raise InvalidInputError(
            f"calibration needs at least 2 calibration-model benchmarks, got {len(timings)}", field="benchmarks"
        )
    return timings


def _positive_latencies(latencies_ms: Sequence[float], count: int) -> np.ndarray:
    targets = np.asarray(latencies_ms, np.float64)
    if targets.shape != (count,):
        raise InvalidInputError(f"got {targets.size} latencies for {count} models", field="latencies_ms")
    if not np.all(np.isfinite(targets) & (targets > 0)):
        raise InvalidInputError("latencies must be positive and finite", field="latencies_ms")
    return targets


def _relative_nonnegative_least_squares(design: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Non-negative x minimising sum(((design @ x) - t) / t)^2, with columns rescaled for conditioning."""
    weighted = design / targets[:, None]
    norms = np.linalg.norm(weighted, axis=0)
    norms[norms == 0] = 1.0
    return _nonnegative_least_squares(weighted / norms, np.ones(len(targets))) / norms


def _nonnegative_least_squares(matrix: np.ndarray, target: np.ndarray, max_iterations: int = 500) -> np.ndarray:
    """Lawson-Hanson active-set NNLS in numpy (scipy is not a device- or server-side dependency)."""
    columns = matrix.shape[1]
    solution = np.zeros(columns)
    passive = np.zeros(columns, bool)
    tolerance = 1e-12 * max(1.0, float(np.abs(matrix).max()))
    for _ in range(max_iterations):
        gradient = matrix.T @ (target - matrix @ solution)
        candidates = ~passive & (gradient > tolerance)
        if not candidates.any():
            break
        passive[np.argmax(np.where(candidates, gradient, -np.inf))] = True
        while True:
            trial = np.zeros(columns)
            trial[passive] = np.linalg.lstsq(matrix[:, passive], target, rcond=None)[0]
            if np.all(trial[passive] > 0):
                solution = trial
                break
            blocking = passive & (trial <= 0)
            step = np.min(solution[blocking] / (solution[blocking] - trial[blocking]))
            solution = solution + step * (trial - solution)
            passive &= solution > tolerance
            solution[~passive] = 0.0
    return solution


if __name__ == "__main__":  # python -m fedzoo.edge.latency_predictor [out.json]: refit the reference (default: the shipped one)
    import sys

    fitted, fit_figures = fit_reference_predictor(holdout_every=4)
    fitted.save(sys.argv[1] if len(sys.argv) > 1 else REFERENCE_MODEL_PATH)
    print(json.dumps(fit_figures, indent=1))
