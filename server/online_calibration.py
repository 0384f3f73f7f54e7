"""Online recalibration: every telemetry report refines the reporting device's latency scales.

The lookup predicts a model's latency on a device as `p = sum_g cost_g * scale_g` (see
`fedzoo.server.latency`). The scales come from 8 calibration timings at registration, and they do not
carry one CPU's kernel costs to another microarchitecture well (issue 25: 50-70% within ±10% on a Xeon the
reference never saw). A device's telemetry says how far off they are, model by model, so each report is
one step of an extended Kalman filter on the log scales `theta_g = log scale_g`:

    innovation r = log(measured) - log(p),   H_g = d log p / d theta_g = cost_g * scale_g / p
    S = H P H' + R,   K = P H' / S,   theta += K r,   P -= K H P

`P` starts as a common component (every group off by the same factor: a faster or slower CPU) plus an
independent one per group (INT8 vs fp32, dense vs depthwise); `R` is what no group scale explains (a
model's own residual and the timing noise). The cost is O(slots^2) per report whatever the history.
Only a (device, model) pair's first report updates the scales: a repeat of the same model would pull the
scales toward that one model's own residual, and the lookup already uses the measured median for it.

The device's prediction uncertainty (log space) is `sqrt(max_g P_gg + R_hat)`: an upper bound of
`sqrt(H P H' + R_hat)` for every model (H is a share vector), where `R_hat` starts at `R` and follows the
post-update residuals of the device's reports. The lookup uses it as the margin `exp(k sigma)`.

Class: for devices of a class without telemetry of their own, the lookup multiplies their scales by the
class's factors: per slot, the median over the class's most recently recalibrated devices (at least
`CLASS_MIN_DEVICES`) of `exp(theta - theta_at_registration)`, bounded to `CLASS_FACTOR_BOUNDS`. A device's
telemetry thus reaches other devices only through a bounded median of several devices' corrections.

Model: what no device's scales explain is often the model's own: the reference predictor misjudges a
layer shape on every CPU alike (on the emulated fleet, one model's residual correlated 0.5-0.9 across
device classes). So each device's first report of a model also leaves its residual against the device's
registration scales, `log(measured / predicted)`, and the model's `latency_factor` (which multiplies its
predicted latency for every device, the filter's costs included) is the median over its most recent
devices of that residual *minus the same device's mean residual over its other reported models*: the
device's own speed cancels, only the model's difference stays. It needs `MODEL_MIN_DEVICES` devices with at
least two reported models each and is bounded to `MODEL_FACTOR_BOUNDS`: a few devices' word moves no model
far, for anyone. A federated version has its parent's graph with new weights, hence its parent's latency:
until enough devices ran the version itself, it takes its parent's factor (when their costs are the same).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from statistics import median
from typing import Iterable, Sequence

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fedzoo.server.tables import (
    COST_COLUMNS, FACTOR_COLUMNS, LATENCY_SLOTS, SCALE_COLUMNS, ClassLatencyCalibration, DeviceRecord,
    MeasuredLatency, ModelRecord, utc_now,
)

# Prior log-scale uncertainty (common to every group, and per group) and what no scale explains (a model's own
# residual plus the drift between a report and a later lookup). Chosen on one fleet-bench run's saved timings
# (bench/latency_fleet.py, 4 emulated classes x 2 passes, 6 settings side by side): 0.05 / 0.04 / 0.07 put
# 86.4% / 85.4% of unreported models within ±10% after 1 / 3 reports (83.2% before); the wider 0.10 / 0.08 /
# 0.05 gave 80.2% / 82.0% (one report of a model with its own 4% residual moved every prediction by ~4%).
PRIOR_COMMON_LOG_SIGMA = 0.05
PRIOR_GROUP_LOG_SIGMA = 0.04
REPORT_LOG_SIGMA = 0.07
RESIDUAL_PRIOR_REPORTS = 2.0  # weight of REPORT_LOG_SIGMA^2 in the device's running residual variance
# Uncertainty of the other latency bases (log space): a device's own median; a card's device-class figure.
MEASURED_LOG_SIGMA = 0.03
CARD_CLASS_LOG_SIGMA = 0.10
CLASS_MIN_DEVICES = 3
CLASS_RECENT_DEVICES = 50
CLASS_FACTOR_BOUNDS = (0.5, 2.0)
MODEL_MIN_DEVICES = 3
MODEL_RECENT_DEVICES = 50
# The factors bench/latency_fleet.py's zoo needs lay within 0.89-1.14 (two runs, 56 models); the bound leaves
# room for a CPU that differs more, and no more, whatever the devices claim.
MODEL_FACTOR_BOUNDS = (0.75, 1.33)
DEVICE_MODELS_REFRESHED = 20  # a first report refreshes the factors of at most this many of the device's models


@dataclass
class CalibrationState:
    """What the filter keeps per device besides the scale columns themselves."""

    registered_log_scales: list[float]
    covariance: list[list[float]]
    residual_variance: float
    reports: int = 0

    @classmethod
    def initial(cls, scales: tuple[float, ...], groups: int) -> CalibrationState:
        """The prior for a device registered with `scales`; slots past the estimator's `groups` stay fixed."""
        covariance = np.zeros((LATENCY_SLOTS, LATENCY_SLOTS))
        covariance[:groups, :groups] = PRIOR_COMMON_LOG_SIGMA**2 + PRIOR_GROUP_LOG_SIGMA**2 * np.eye(groups)
        return cls([math.log(scale) for scale in scales], covariance.tolist(), REPORT_LOG_SIGMA**2)

    @classmethod
    def from_json(cls, text: str | None, scales: tuple[float, ...], groups: int) -> CalibrationState:
        return cls(**json.loads(text)) if text else cls.initial(scales, groups)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def predicted_log_sigma(self) -> float:
        return math.sqrt(max(np.diag(self.covariance)) + self.residual_variance)


def initial_log_sigma() -> float:
    """A device's prediction uncertainty before any telemetry (what the lookup assumes for NULL)."""
    return CalibrationState.initial((1.0,) * LATENCY_SLOTS, LATENCY_SLOTS).predicted_log_sigma()


def kalman_update(state: CalibrationState, scales: np.ndarray, costs_ms: np.ndarray, measured_ms: float
                  ) -> np.ndarray:
    """One report's step (module docstring); updates `state` in place and returns the new scales."""
    contributions = costs_ms * scales
    predicted_ms = float(contributions.sum())
    if predicted_ms <= 0.0:
        return scales
    jacobian = contributions / predicted_ms
    covariance = np.asarray(state.covariance)
    innovation = math.log(measured_ms / predicted_ms)
    spread = covariance @ jacobian
    innovation_variance = float(jacobian @ spread) + REPORT_LOG_SIGMA**2
    gain = spread / innovation_variance
    state.covariance = (covariance - np.outer(gain, spread)).tolist()
    residual = innovation * REPORT_LOG_SIGMA**2 / innovation_variance  # log(measured / updated prediction)
    state.reports += 1
    state.residual_variance = (
        (RESIDUAL_PRIOR_REPORTS + state.reports - 1) * state.residual_variance + residual**2
    ) / (RESIDUAL_PRIOR_REPORTS + state.reports)
    return np.exp(np.log(scales) + gain * innovation)


def recalibrate(session: Session, measured: MeasuredLatency, groups: int) -> None:
    """Refine the device's scales from its first report of a model (`measured`, the pair's new row), then
    the factors of its models and of its class (`groups`: how many slots the estimator uses)."""
    device = session.get(DeviceRecord, measured.device_id, with_for_update=True)  # two reports at once: one waits
    model = session.get(ModelRecord, measured.model_id)
    if device is None or model is None or device.latency_signature != model.latency_signature:
        return  # costs and scales from different estimators do not multiply
    scales = np.array([getattr(device, column) for column in SCALE_COLUMNS])
    state = CalibrationState.from_json(device.latency_calibration_json, tuple(scales), groups)
    costs = np.array([getattr(model, column) for column in COST_COLUMNS])
    registered_ms = float(costs @ np.exp(state.registered_log_scales))
    if registered_ms > 0.0:
        measured.log_residual = math.log(measured.median_ms / registered_ms)
    updated = kalman_update(state, scales, costs * (model.latency_factor or 1.0), measured.median_ms)
    for column, value in zip(SCALE_COLUMNS, updated):
        setattr(device, column, float(value))
    device.latency_calibration_json = state.to_json()
    device.latency_log_sigma = state.predicted_log_sigma()
    device.latency_reports = state.reports
    device.latency_calibrated_at = utc_now()
    session.flush()
    refresh_model_factors(session, device.id, model.id)
    if device.device_class:
        update_class_factors(session, device.device_class, device.latency_signature)


def relative_residuals(residuals: Iterable[tuple[float, float, int]]) -> list[float]:
    """From a model's devices' (log residual of the model, mean log residual over all the device's reported
    models, how many): `residual - mean of the device's other residuals`, for the devices with at least two
    (one model alone cannot tell the device's speed from the model's)."""
    return [count * (residual - mean) / (count - 1) for residual, mean, count in residuals if count >= 2]


def model_factor(relative: Sequence[float]) -> float | None:
    """A model's latency factor (module docstring) from its devices' `relative_residuals`: their median, bounded;
    None below MODEL_MIN_DEVICES."""
    if len(relative) < MODEL_MIN_DEVICES:
        return None
    low, high = MODEL_FACTOR_BOUNDS
    return min(max(math.exp(median(relative)), low), high)


def refresh_model_factors(session: Session, device_id: str, reported_model_id: str) -> None:
    """The factors of the model just reported and of (some of) the device's other models, whose devices'
    means this report changed: four queries and the updates, whatever the fleet's size."""
    others = session.scalars(
        select(MeasuredLatency.model_id)
        .where(MeasuredLatency.device_id == device_id, MeasuredLatency.model_id != reported_model_id,
               MeasuredLatency.log_residual.is_not(None))
        .order_by(MeasuredLatency.model_id)
        .limit(DEVICE_MODELS_REFRESHED - 1)
    ).all()
    update_model_factors(session, [reported_model_id, *others])


def update_model_factors(session: Session, model_ids: list[str]) -> None:
    """These models' factors, each from its most recently recalibrated devices that are not revoked."""
    residual = MeasuredLatency.log_residual
    ranked = (
        select(MeasuredLatency.model_id, MeasuredLatency.device_id, residual,
               func.row_number().over(partition_by=MeasuredLatency.model_id,
                                      order_by=DeviceRecord.latency_calibrated_at.desc()).label("recency"))
        .join(DeviceRecord, DeviceRecord.id == MeasuredLatency.device_id)
        .where(MeasuredLatency.model_id.in_(model_ids), residual.is_not(None), DeviceRecord.revoked_at.is_(None))
        .subquery()
    )
    by_model: dict[str, list[tuple[str, float]]] = {model_id: [] for model_id in model_ids}
    for model_id, device_id, value in session.execute(
        select(ranked.c.model_id, ranked.c.device_id, ranked.c.log_residual)
        .where(ranked.c.recency <= MODEL_RECENT_DEVICES)
    ):
        by_model[model_id].append((device_id, value))
    device_ids = {device_id for rows in by_model.values() for device_id, _ in rows}
    device_means = {device_id: (mean, count) for device_id, mean, count in session.execute(
        select(MeasuredLatency.device_id, func.avg(residual), func.count(residual))
        .where(MeasuredLatency.device_id.in_(device_ids))
        .group_by(MeasuredLatency.device_id)
    )}
    models = {model.id: model for model in session.scalars(select(ModelRecord).where(ModelRecord.id.in_(model_ids)))}
    for model_id, rows in by_model.items():
        model = models[model_id]
        relative = relative_residuals((value, *device_means[device_id]) for device_id, value in rows)
        factor = model_factor(relative)
        if factor is not None:
            model.latency_factor, model.latency_factor_devices = factor, len(relative)
        else:
            inherit_model_factor(session, model)
    session.flush()


def inherit_model_factor(session: Session, model: ModelRecord) -> None:
    """The parent's factor for a model with the parent's costs (a federated version), else none."""
    parent = session.get(ModelRecord, model.parent_id) if model.parent_id else None
    same_costs = parent is not None and parent.latency_signature == model.latency_signature and all(
        math.isclose(getattr(parent, column), getattr(model, column), rel_tol=1e-9) for column in COST_COLUMNS)
    model.latency_factor = parent.latency_factor if same_costs else None
    model.latency_factor_devices = parent.latency_factor_devices if same_costs else 0


def update_class_factors(session: Session, device_class: str, signature: str) -> None:
    """The class's factors from its most recently recalibrated devices (bounded work per report)."""
    recent = session.execute(
        select(DeviceRecord.latency_calibration_json, *(getattr(DeviceRecord, c) for c in SCALE_COLUMNS))
        .where(DeviceRecord.device_class == device_class, DeviceRecord.latency_reports > 0,
               DeviceRecord.latency_signature == signature)
        .order_by(DeviceRecord.latency_calibrated_at.desc())
        .limit(CLASS_RECENT_DEVICES)
    ).all()
    if len(recent) < CLASS_MIN_DEVICES:
        return
    corrections = np.array([
        np.log(row[1:]) - np.array(json.loads(row[0])["registered_log_scales"])
        for row in recent
    ])
    low, high = CLASS_FACTOR_BOUNDS
    factors = [min(max(math.exp(median(corrections[:, slot])), low), high) for slot in range(LATENCY_SLOTS)]
    record = session.get(ClassLatencyCalibration, device_class)
    if record is None:
        record = ClassLatencyCalibration(device_class=device_class, devices=len(recent))
        session.add(record)
    record.devices = len(recent)
    for column, value in zip(FACTOR_COLUMNS, factors):
        setattr(record, column, value)
    session.flush()
