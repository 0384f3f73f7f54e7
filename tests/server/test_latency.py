"""Latency estimators: the fallback's arithmetic, the edge predictor behind the same interface, and the
start-up refresh that recomputes what another estimator stored."""

from __future__ import annotations

import pytest
from server_helpers import REFERENCE_CALIBRATION_MS, device_profile, make_card, tiny_onnx_model
from sqlalchemy import func, select

from fedzoo.device import DeviceProfile
from fedzoo.server import devices, migrations, registry
from fedzoo.server.blobstore import FileBlobStore
from fedzoo.server.db import Database
from fedzoo.server.latency import CalibrationScalingEstimator, KernelPredictorEstimator
from fedzoo.server.lookup import LookupQuery, lookup
from fedzoo.server.tables import FACTOR_COLUMNS, ClassLatencyCalibration, DeviceRecord, MeasuredLatency, ModelRecord


def test_calibration_scaling_is_the_geometric_mean_of_the_ratios():
    estimator = CalibrationScalingEstimator({"a": 1.0, "b": 4.0})
    profile = DeviceProfile.model_validate({**device_profile("d"), "benchmarks": [
        {"model": "a", "median_ms": 2.0}, {"model": "b", "median_ms": 32.0}, {"model": "unknown", "median_ms": 9.0}]})
    scales = estimator.device_scales(profile)
    assert scales.scales == (pytest.approx(4.0),) and "2 calibration ratios" in scales.basis  # sqrt(2 * 8)
    unknown = estimator.device_scales(DeviceProfile.model_validate({**device_profile("e"), "benchmarks": []}))
    assert unknown.scales == (1.0,) and "assumed reference speed" in unknown.basis


def test_the_fallback_costs_a_card_by_its_reference_latency_else_its_macs():
    estimator = CalibrationScalingEstimator()
    blob = tiny_onnx_model(seed=1)
    measured = make_card(blob, "m", 0.9, 5_000_000, latency_ms={"reference": {"median_ms": 2.5, "source": "measured"}})
    assert estimator.model_costs(measured, blob).reference_ms == 2.5
    assert estimator.model_costs(make_card(blob, "n", 0.9, 5_000_000), blob).reference_ms == pytest.approx(5.05)


def kernel_estimator() -> KernelPredictorEstimator:
    """The server's kernel-predictor estimator; the reference model ships in the package, so it must load."""
    return KernelPredictorEstimator()


def test_the_kernel_predictor_costs_models_in_its_groups_and_scales_slower_devices_up():
    estimator = kernel_estimator()
    blob = tiny_onnx_model(seed=2, hidden=64)
    costs = estimator.model_costs(make_card(blob, "m", 0.9, 1000), blob)
    assert len(costs.costs_ms) == len(estimator.groups) and costs.reference_ms > 0
    from fedzoo.edge.latency_predictor import KernelLatencyPredictor

    predicted_ms = KernelLatencyPredictor.load().predict_ms(blob)
    if predicted_ms > 0:
        assert costs.reference_ms == pytest.approx(predicted_ms) and costs.basis == "kernel predictor"
    else:  # a predictor that says 0 ms would let the model fit any budget: the card's figures are used
        assert costs.basis.startswith("fallback") and costs.reference_ms == pytest.approx(0.05 + 1000 / 1e6)
    from fedzoo.edge.calibration_models import CALIBRATION_MODEL_NAMES

    def profile(slowdown: float) -> DeviceProfile:
        return DeviceProfile.model_validate({**device_profile("d"), "benchmarks": [
            {"model": name, "median_ms": (1.0 + index / 4) * slowdown} for index, name in enumerate(CALIBRATION_MODEL_NAMES)]})

    fast, slow = estimator.device_scales(profile(1.0)), estimator.device_scales(profile(3.0))
    fast_ms = sum(c * s for c, s in zip(costs.costs_ms, fast.scales))
    slow_ms = sum(c * s for c, s in zip(costs.costs_ms, slow.scales))
    assert 2 * fast_ms < slow_ms < 4 * fast_ms and "calibrated on 8" in slow.basis  # timings 3x slower


def test_refresh_recomputes_what_another_estimator_stored(tmp_path):
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    migrations.upgrade(url)
    database = Database(url)
    store = FileBlobStore(tmp_path / "blobs")
    old = CalibrationScalingEstimator()
    new = CalibrationScalingEstimator(REFERENCE_CALIBRATION_MS)  # now knows the calibration timings
    blob = tiny_onnx_model(seed=3)
    store.put(blob)
    with database.session() as session:
        registry.publish(session, store, old, make_card(blob, "m", 0.9, 4_000_000))  # 4.05 ms on the reference
        registry.publish(session, store, old, make_card(blob, "reported", 0.5, 1_000_000, task="mnist"))
        token = devices.register(session, old, DeviceProfile.model_validate(device_profile("d", slowdown=3.0))).token
    query = LookupQuery(task="digits", latency_budget_ms=5.0)
    with database.session() as session:
        assert lookup(session, devices.authenticate(session, token), query).chosen.latency_ms == pytest.approx(4.05)
    with database.session() as session:  # telemetry refines the old estimator's scales; a class learnt factors
        devices.report_latency(session, "d", "reported", 1.2, None, None, groups=len(old.groups))
        session.add(ClassLatencyCalibration(device_class="pi4", devices=3, **dict.fromkeys(FACTOR_COLUMNS, 1.5)))
        session.get(ModelRecord, "m").latency_factor = 1.2  # and the fleet a model factor
    with database.session() as session:
        assert session.scalar(select(DeviceRecord.latency_reports)) == 1
        assert session.scalar(select(MeasuredLatency.log_residual)) is not None
        assert registry.refresh_latency_estimates(session, store, new) == (2, 1)
        assert registry.refresh_latency_estimates(session, store, new) == (0, 0)
    with database.session() as session:
        record = session.get(DeviceRecord, "d")
        assert (record.latency_reports, record.latency_calibration_json, record.latency_log_sigma) == (0, None, None)
        assert session.scalar(select(func.count()).select_from(ClassLatencyCalibration)) == 0
        assert session.scalar(select(DeviceRecord.scale_0)) == pytest.approx(3.0)
        assert session.scalar(select(ModelRecord.latency_signature)) == new.signature
        assert session.get(ModelRecord, "m").latency_factor is None
        assert session.scalar(select(MeasuredLatency.log_residual)) is None
        with pytest.raises(Exception, match="none of the 1 digits models fits"):
            lookup(session, devices.authenticate(session, token), query)  # 12.15 ms now
    database.dispose()
