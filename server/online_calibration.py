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
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from statistics import median

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from fedzoo.server.models import (
    COST_COLUMNS, FACTOR_COLUMNS, LATENCY_SLOTS, SCALE_COLUMNS, ClassLatencyCalibration, DeviceRecord, ModelRecord,
    utc_now,
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


def recalibrate(session: Session, device_id: str, model_id: str, measured_ms: float, groups: int) -> None:
    """Refine the device's scales from its first report of a model, then its class's factors (`groups`:
    how many slots the estimator uses)."""
    device = session.get(DeviceRecord, device_id, with_for_update=True)  # two reports at once: one waits
    model = session.get(ModelRecord, model_id)
    if device is None or model is None or device.latency_signature != model.latency_signature:
        return  # costs and scales from different estimators do not multiply
    scales = np.array([getattr(device, column) for column in SCALE_COLUMNS])
    state = CalibrationState.from_json(device.latency_calibration_json, tuple(scales), groups)
    costs = np.array([getattr(model, column) for column in COST_COLUMNS])
    updated = kalman_update(state, scales, costs, measured_ms)
    for column, value in zip(SCALE_COLUMNS, updated):
        setattr(device, column, float(value))
    device.latency_calibration_json = state.to_json()
    device.latency_log_sigma = state.predicted_log_sigma()
    device.latency_reports = state.reports
    device.latency_calibrated_at = utc_now()
    session.flush()
    if device.device_class:
        update_class_factors(session, device.device_class, device.latency_signature)


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
