"""The kernel-level latency predictor: fitting, calibration to a device, persistence, the server entry point."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedzoo.device import CalibrationBenchmark
from fedzoo.edge.benchmark import benchmark_models_interleaved
from fedzoo.edge.calibration_models import (
    CALIBRATION_MODEL_NAMES,
    Architecture,
    Block,
    build_model,
    calibration_model,
)
from fedzoo.edge.latency_predictor import (
    CALIBRATION_GROUPS,
    KernelLatencyPredictor,
    _nonnegative_least_squares,
    kernel_features,
    predict_for_device,
)
from fedzoo.errors import InvalidInputError


@pytest.fixture(scope="module")
def reference() -> KernelLatencyPredictor:
    return KernelLatencyPredictor.load()


@pytest.fixture(scope="module")
def calibration_features() -> dict[str, dict]:
    return {name: kernel_features(calibration_model(name)) for name in CALIBRATION_MODEL_NAMES}


def width_family(width: int) -> Architecture:
    return Architecture((1, 28, 28), width, (Block(4, width, 2), Block(4, width), Block(4, 2 * width, 2)), 4 * width)


def test_shipped_reference_is_monotonic_in_macs_for_a_width_family(reference: KernelLatencyPredictor) -> None:
    predictions = [reference.predict_ms(build_model(width_family(width))) for width in (8, 16, 32, 64)]
    assert all(a < b for a, b in zip(predictions, predictions[1:])), predictions
    assert predictions[-1] > 2 * predictions[0]  # 64x the MACs: clearly slower, not just overhead


def family_member(seed: int) -> Architecture:
    """MobileNet-style nets of one family (widths in multiples of 8, relu6): the same kernel types recur."""
    rng = np.random.default_rng(seed)
    width = int(rng.choice([8, 16, 24, 32]))
    blocks = tuple(
        Block(int(rng.choice([2, 4, 6])), width * int(rng.choice([1, 2])), int(rng.choice([1, 2])), int(rng.choice([3, 5])))
        for _ in range(int(rng.integers(1, 4)))
    )
    return Architecture((1, 28, 28), width, blocks, 8 * int(rng.choice([4, 8, 16])), stem_stride=2)


@pytest.mark.slow
def test_fit_then_predict_held_out_models_within_a_loose_factor() -> None:
    models = {f"m{seed}": build_model(family_member(seed), "fp32", seed) for seed in range(48)}
    measured = benchmark_models_interleaved(models, threads=1, rounds=5, runs_per_round=3, warmup_runs=2)
    names = list(models)
    train, held_out = names[:40], names[40:]
    predictor = KernelLatencyPredictor().fit([models[n] for n in train], [measured[n].median_ms for n in train])
    ratios = np.array([predictor.predict_ms(models[n]) / measured[n].median_ms for n in held_out])
    # A shared CPU makes timings noisy; a working model still lands within 2.5x on every held-out model,
    # and within 1.5x for most (an unfitted or broken one is off by orders of magnitude).
    assert np.all((ratios > 0.4) & (ratios < 2.5)), ratios
    assert np.mean((ratios > 1 / 1.5) & (ratios < 1.5)) >= 0.6, ratios


def test_calibration_to_a_uniformly_slower_device_scales_every_prediction(
    reference: KernelLatencyPredictor, calibration_features: dict
) -> None:
    features = list(calibration_features.values())
    slower = [3.0 * reference.predict_from_features(f) for f in features]
    device = reference.calibrated_from_features(features, slower)
    assert device.group_scales == pytest.approx(dict.fromkeys(CALIBRATION_GROUPS, 3.0), rel=1e-6)
    zoo_like = kernel_features(build_model(width_family(16), "int8"))
    assert device.predict_from_features(zoo_like) == pytest.approx(3 * reference.predict_from_features(zoo_like))


def test_calibration_finds_the_group_a_device_is_slow_at(
    reference: KernelLatencyPredictor, calibration_features: dict
) -> None:
    """A device whose fp32 depthwise convs are 4x slower (like a runtime without NCHWc kernels)."""
    features = list(calibration_features.values())
    timings = []
    for f in features:
        costs = reference.group_costs_ms(f)
        timings.append(sum(costs.values()) + 3.0 * costs["depthwise-fp32"])
    device = reference.calibrated_from_features(features, timings)
    assert device.group_scales["depthwise-fp32"] > 2.0
    assert device.group_scales["depthwise-fp32"] > 1.5 * max(
        scale for group, scale in device.group_scales.items() if group != "depthwise-fp32"
    )


def test_for_device_takes_profile_benchmarks_and_predicts(reference: KernelLatencyPredictor) -> None:
    """A device twice as slow as the reference was when it measured the calibration models: twice what the
    reference device predicts for itself (its scales are 1; its similarity correction carries the
    reference's own residuals on the calibration models)."""
    anchors = reference.calibration_anchors_ms["nchwc"]
    itself = [{"model": name, "median_ms": anchors[name]} for name in CALIBRATION_MODEL_NAMES]
    benchmarks = [{"model": name, "median_ms": 2.0 * anchors[name]} for name in CALIBRATION_MODEL_NAMES]
    model = build_model(width_family(8))
    on_reference = predict_for_device(model, itself)
    assert on_reference == pytest.approx(reference.predict_ms(model), rel=0.15)
    assert predict_for_device(model, benchmarks) == pytest.approx(2.0 * on_reference, rel=1e-3)
    as_objects = [CalibrationBenchmark(**benchmark) for benchmark in benchmarks]
    device = KernelLatencyPredictor.for_device(as_objects)
    assert device.predict_ms(model) == pytest.approx(2.0 * on_reference, rel=1e-3)


def test_similarity_correction_follows_the_calibration_models_like_the_model(
    reference: KernelLatencyPredictor, calibration_features: dict
) -> None:
    """A device where only the zoo-like fp32 calibration model runs 30% slower than the reference predicts:
    the group scales alone miss it, the correction follows it there and leaves unlike (INT8) models alone."""
    names = list(calibration_features)
    features = [calibration_features[name] for name in names]
    timings = [reference.predict_from_features(f) * (1.3 if name == "cal-mobilenet-fp32" else 1.0)
               for name, f in zip(names, features)]
    device = reference.calibrated_from_features(features, timings)
    assert all(reference.similarity_correction(f) == 1.0 for f in features)  # nothing to correct before calibration
    slow = names.index("cal-mobilenet-fp32")
    scales_only = sum(device.group_costs_ms(features[slow]).values())
    assert scales_only < 0.85 * timings[slow]
    assert device.predict_from_features(features[slow]) == pytest.approx(timings[slow], rel=0.10)
    for name, f in zip(names, features):
        if name.endswith("-int8"):
            assert device.similarity_correction(f) == pytest.approx(1.0, abs=0.01)
    loaded = KernelLatencyPredictor.from_json(device.to_json())
    assert loaded.predict_from_features(features[slow]) == pytest.approx(device.predict_from_features(features[slow]))


@pytest.mark.parametrize(
    ("benchmarks", "problem"),
    [
        ([{"model": "cal-tiny-fp32", "median_ms": 0.1}], "at least 2 calibration-model benchmarks"),
        ([{"model": "cal-tiny-fp32", "median_ms": 0.1}, {"model": "resnet", "median_ms": 1.0}], "'resnet'"),
        ([{"model": "cal-tiny-fp32", "median_ms": 0.1}, {"model": "cal-tiny-int8", "median_ms": -1.0}], "positive"),
    ],
)
def test_bad_benchmarks_are_refused(reference: KernelLatencyPredictor, benchmarks: list, problem: str) -> None:
    with pytest.raises(InvalidInputError, match=problem):
        reference.calibrated(benchmarks)


def test_json_round_trip_and_unfitted_predictor(reference: KernelLatencyPredictor, tmp_path) -> None:
    path = tmp_path / "predictor.json"
    reference.save(path)
    loaded = KernelLatencyPredictor.load(path)
    model = calibration_model("cal-mobilenet-int8")
    assert loaded.predict_ms(model) == reference.predict_ms(model)
    assert loaded.reference_device == reference.reference_device
    with pytest.raises(InvalidInputError, match="not fitted"):
        KernelLatencyPredictor().predict_ms(model)


def test_unseen_kernel_type_falls_back_to_a_related_one(reference: KernelLatencyPredictor) -> None:
    seen = {"conv-pw/int8": np.array([1.0, 1e5, 1e5, 100, 2e3, 256])}
    unseen = {"conv-pw+tanh/int8": seen["conv-pw/int8"]}
    assert reference.predict_from_features(unseen) == pytest.approx(reference.predict_from_features(seen))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(3, 12), st.integers(1, 6))
def test_nonnegative_least_squares_matches_scipy(seed: int, rows: int, columns: int) -> None:
    from scipy.optimize import nnls

    rng = np.random.default_rng(seed)
    matrix, target = rng.standard_normal((rows, columns)), rng.standard_normal(rows)
    ours = _nonnegative_least_squares(matrix, target)
    expected, _ = nnls(matrix, target)
    assert np.all(ours >= 0)
    assert np.linalg.norm(matrix @ ours - target) == pytest.approx(np.linalg.norm(matrix @ expected - target), abs=1e-7)


def test_calibration_tells_a_device_without_nchwc_kernels_from_timings(reference: KernelLatencyPredictor) -> None:
    names = list(CALIBRATION_MODEL_NAMES)
    nchwc = [kernel_features(calibration_model(name)) for name in names]
    plain = [kernel_features(calibration_model(name), all_plain_layout=True) for name in names]
    plain_device_ms = [1.2 * reference.predict_from_features(f) for f in plain]
    device = reference.calibrated_from_features(nchwc, plain_device_ms, plain)
    assert device.all_plain_layout
    model = build_model(width_family(16))
    expected = 1.2 * reference.predict_from_features(kernel_features(model, all_plain_layout=True))
    assert device.predict_ms(model) == pytest.approx(expected, rel=1e-3)
    nchwc_device_ms = [1.2 * reference.predict_from_features(f) for f in nchwc]
    assert not reference.calibrated_from_features(nchwc, nchwc_device_ms, plain).all_plain_layout


def test_calibration_is_anchored_to_the_reference_measurements(
    reference: KernelLatencyPredictor, calibration_features: dict
) -> None:
    """The reference device itself calibrates to scale 1 everywhere, whatever the reference's own residuals on
    the calibration models; without the names (no anchors) those residuals would leak into the scales."""
    names = list(calibration_features)
    features = [calibration_features[name] for name in names]
    anchors = reference.calibration_anchors_ms["nchwc"]
    assert set(anchors) == set(CALIBRATION_MODEL_NAMES)
    timings = [anchors[name] for name in names]
    same = reference.calibrated_from_features(features, timings, names=names)
    assert same.group_scales == pytest.approx(dict.fromkeys(CALIBRATION_GROUPS, 1.0), abs=1e-6)
    residuals = [reference.predict_from_features(f) / t - 1.0 for f, t in zip(features, timings)]
    unanchored = reference.calibrated_from_features(features, timings)
    assert max(map(abs, residuals)) > 1e-3 and unanchored.group_scales != same.group_scales
    loaded = KernelLatencyPredictor.from_json(same.to_json())
    assert loaded.calibration_anchors_ms == reference.calibration_anchors_ms
