"""Devices: registration (profile in, token out), authentication by token, and latency telemetry."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, select
from sqlalchemy.orm import Session

from fedzoo.device import DeviceProfile
from fedzoo.errors import NotFoundError
from fedzoo.server import online_calibration
from fedzoo.server.auth import hash_token, new_device_token
from fedzoo.server.errors import Conflict, Unauthorized
from fedzoo.server.latency import MEASURED_WINDOW_REPORTS, LatencyEstimator, measured_median_ms, slot_values
from fedzoo.server.models import SCALE_COLUMNS, DeviceRecord, LatencyReport, MeasuredLatency, ModelRecord


@dataclass(frozen=True)
class Registration:
    device_id: str
    token: str
    latency_scales: dict[str, float]  # estimator group -> scale
    latency_scales_basis: str


@dataclass(frozen=True)
class AuthenticatedDevice:
    """Who the calling device is. Its latency scales are not here: telemetry changes them, so the lookup
    reads them in its own query."""

    id: str
    device_class: str | None
    memory_mb: int


_AUTHENTICATE = select(DeviceRecord.id, DeviceRecord.device_class, DeviceRecord.memory_mb
                       ).where(DeviceRecord.token_hash == bindparam("token_hash"))


@dataclass(frozen=True)
class TelemetryResult:
    device_id: str
    model_id: str
    measured_median_ms: float
    reports: int


def register(session: Session, estimator: LatencyEstimator, profile: DeviceProfile) -> Registration:
    """Store a new device and return its token (shown once). A taken device_id is a conflict: the token
    of an existing device is never replaced by someone who merely knows its id."""
    if session.get(DeviceRecord, profile.device_id) is not None:
        raise Conflict(f"device {profile.device_id!r} is already registered; use the token it was given",
                       field="device_id", code="device_exists")
    token = new_device_token()
    scales = estimator.device_scales(profile)
    session.add(DeviceRecord(
        id=profile.device_id,
        token_hash=hash_token(token),
        device_class=profile.device_class,
        memory_mb=profile.memory_mb,
        latency_scales_basis=scales.basis[:200],
        latency_signature=estimator.signature,
        profile_json=profile.model_dump_json(),
        **dict(zip(SCALE_COLUMNS, slot_values(scales.scales, 1.0))),
    ))
    session.flush()
    return Registration(profile.device_id, token, dict(zip(estimator.groups, scales.scales)), scales.basis)


def authenticate(session: Session | Connection, token: str) -> AuthenticatedDevice:
    """The device a token belongs to; 401 for any token that is not one."""
    row = session.execute(_AUTHENTICATE, {"token_hash": hash_token(token)}).first()
    if row is None:
        raise Unauthorized("the device token is not valid; register with POST /v1/devices", field="Authorization",
                           code="invalid_token")
    return AuthenticatedDevice(row[0], row[1], row[2])


class DeviceCache:
    """Recently authenticated devices by token hash, per process, so a lookup costs one query, not two.
    Safe because what it holds never changes while the server runs: tokens are never reissued
    (re-registration is refused), and the latency scales that telemetry refines are not cached. Entries expire
    after `ttl_s` anyway, so a future revocation takes effect within that time."""

    def __init__(self, max_entries: int = 100_000, ttl_s: float = 60.0) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._entries: OrderedDict[str, tuple[float, AuthenticatedDevice]] = OrderedDict()
        self._lock = threading.Lock()

    def authenticate(self, connection: Session | Connection, token: str) -> AuthenticatedDevice:
        key = hash_token(token)
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and now - entry[0] < self.ttl_s:
                self._entries.move_to_end(key)
                return entry[1]
        device = authenticate(connection, token)
        with self._lock:
            self._entries[key] = (now, device)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return device


def report_latency(session: Session, device_id: str, model_id: str, median_ms: float, p90_ms: float | None,
                   threads: int | None, *, groups: int) -> TelemetryResult:
    """Record one measurement, refresh the median the lookup uses for this (device, model) and, on the pair's
    first report, recalibrate the device's scales for the other models (`online_calibration`; `groups`: how
    many latency groups the server's estimator has)."""
    if session.get(ModelRecord, model_id) is None:
        raise NotFoundError(f"no model {model_id!r} is published")
    session.add(LatencyReport(device_id=device_id, model_id=model_id, median_ms=median_ms, p90_ms=p90_ms,
                              threads=threads))
    session.flush()
    recent = list(session.scalars(
        select(LatencyReport.median_ms)
        .where(LatencyReport.device_id == device_id, LatencyReport.model_id == model_id)
        .order_by(LatencyReport.id.desc())
        .limit(MEASURED_WINDOW_REPORTS)
    ))
    value = measured_median_ms(recent)
    aggregate = session.get(MeasuredLatency, (device_id, model_id))
    if aggregate is None:
        session.add(MeasuredLatency(device_id=device_id, model_id=model_id, median_ms=value, reports=1))
        reports = 1
        online_calibration.recalibrate(session, device_id, model_id, median_ms, groups)
    else:
        aggregate.median_ms = value
        aggregate.reports += 1
        reports = aggregate.reports
    session.flush()
    return TelemetryResult(device_id, model_id, value, reports)
