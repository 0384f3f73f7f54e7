"""Devices: registration (profile in, token out), authentication by token, token rotation and
revocation, and latency telemetry."""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, bindparam, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from fedzoo.device import DeviceProfile
from fedzoo.errors import NotFoundError
from fedzoo.secagg import signatures
from fedzoo.server import online_calibration
from fedzoo.server.auth import hash_token, new_device_token
from fedzoo.server.config import DEFAULT_DEVICE_TOKEN_TTL_S
from fedzoo.server.errors import Conflict, Unauthorized, ValidationFailed
from fedzoo.server.latency import (
    MEASURED_WINDOW_REPORTS, DeviceScales, LatencyEstimator, measured_median_ms, slot_values,
)
from fedzoo.server.tables import (
    SCALE_COLUMNS, DeviceRecord, LatencyReport, MeasuredLatency, ModelRecord, as_utc, utc_now,
)


# After a rotation the previous token keeps working this long, so a request sent with it just before the
# device switched (another thread, a retry) does not fail; after it, only the new token works.
ROTATION_GRACE_S = 120

LAST_SEEN_RESOLUTION_S = 60.0
LAST_SEEN_FLUSH_INTERVAL_S = 5.0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Registration:
    device_id: str
    token: str
    token_expires_in_s: int
    latency_scales: dict[str, float]  # estimator group -> scale
    latency_scales_basis: str


@dataclass(frozen=True)
class AuthenticatedDevice:
    """Who the calling device is. Its latency scales are not here: telemetry changes them, so the lookup
    reads them in its own query."""

    id: str
    device_class: str | None
    memory_mb: int
    superseded: bool = False  # authenticated by a token a rotation replaced (still inside its grace)


_DEVICE_COLUMNS = (DeviceRecord.id, DeviceRecord.device_class, DeviceRecord.memory_mb,
                   DeviceRecord.token_expires_at, DeviceRecord.revoked_at)
_BY_TOKEN = select(*_DEVICE_COLUMNS).where(DeviceRecord.token_hash == bindparam("token_hash"))
_BY_PREVIOUS_TOKEN = select(*_DEVICE_COLUMNS[:-2], DeviceRecord.previous_token_valid_until, DeviceRecord.revoked_at
                            ).where(DeviceRecord.previous_token_hash == bindparam("token_hash"))
_DEVICES = DeviceRecord.__table__
_SET_LAST_SEEN = (update(_DEVICES).where(_DEVICES.c.id == bindparam("device_id"))
                  .values(last_seen_at=bindparam("seen_at")))
REREGISTER = "register again with an enrollment token (POST /v1/devices)"


@dataclass(frozen=True)
class TelemetryResult:
    device_id: str
    model_id: str
    measured_median_ms: float
    reports: int


def signing_public_key(text: str | None) -> bytes | None:
    """The raw key of a registration's base64 `signing_public_key`; 422 if it is not an Ed25519 public key."""
    if text is None:
        return None
    raw = base64.b64decode(text)
    if not signatures.is_signing_public_key(raw):
        raise ValidationFailed("signing_public_key is not an Ed25519 public key (base64 of its raw 32 bytes)",
                               field="signing_public_key")
    return raw


def register(session: Session, estimator: LatencyEstimator, profile: DeviceProfile,
             token_ttl_s: int = DEFAULT_DEVICE_TOKEN_TTL_S, enrollment_token_id: str | None = None,
             scales: DeviceScales | None = None, signing_public_key: bytes | None = None) -> Registration:
    """Store a new device and return its token (shown once), valid for `token_ttl_s`. A taken device_id is
    a conflict: the token of an existing device is never replaced by someone who merely knows its id.
    `scales` (default: computed here) may be computed before the transaction takes a write lock: it can
    take seconds, and on SQLite every other writer waits meanwhile. `signing_public_key` (raw Ed25519) is
    stored for good: SecAgg+ rounds check the device's signatures against it."""
    if session.get(DeviceRecord, profile.device_id) is not None:
        raise Conflict(f"device {profile.device_id!r} is already registered; use the token it was given",
                       field="device_id", code="device_exists")
    token = new_device_token()
    scales = scales if scales is not None else estimator.device_scales(profile)
    session.add(DeviceRecord(
        id=profile.device_id,
        token_hash=hash_token(token),
        token_expires_at=utc_now() + timedelta(seconds=token_ttl_s),
        enrollment_token_id=enrollment_token_id,
        device_class=profile.device_class,
        memory_mb=profile.memory_mb,
        latency_scales_basis=scales.basis[:200],
        latency_signature=estimator.signature,
        profile_json=profile.model_dump_json(),
        signing_public_key=signing_public_key,
        **dict(zip(SCALE_COLUMNS, slot_values(scales.scales, 1.0))),
    ))
    session.flush()
    return Registration(profile.device_id, token, token_ttl_s, dict(zip(estimator.groups, scales.scales)),
                        scales.basis)


def authenticate(session: Session | Connection, token: str) -> AuthenticatedDevice:
    """The device a token belongs to, read from the database on every call (no cache: a revocation or an
    expiry holds from the next request on, on every worker); 401 naming why for any other token."""
    token_hash = hash_token(token)
    row = session.execute(_BY_TOKEN, {"token_hash": token_hash}).first()
    replaced = row is None
    if replaced:  # rare: a token replaced by a rotation, still inside its grace period?
        row = session.execute(_BY_PREVIOUS_TOKEN, {"token_hash": token_hash}).first()
    if row is None:
        raise Unauthorized(f"the device token is not valid; {REREGISTER}", field="Authorization",
                           code="invalid_token")
    *device, valid_until, revoked_at = row
    if revoked_at is not None:
        raise Unauthorized(f"device {device[0]!r} was revoked by the operator; {REREGISTER}",
                           field="Authorization", code="device_revoked")
    if valid_until is None or as_utc(valid_until) <= utc_now():
        if replaced:
            raise Unauthorized(f"the device token was replaced by a rotation and its {ROTATION_GRACE_S} s grace is "
                               f"over; use the newest token, or {REREGISTER}", field="Authorization",
                               code="token_replaced")
        raise Unauthorized(f"the device token expired; {REREGISTER}", field="Authorization", code="token_expired")
    return AuthenticatedDevice(device[0], device[1], device[2], superseded=replaced)


def rotate_token(session: Session, device: AuthenticatedDevice, token_ttl_s: int) -> tuple[str, int]:
    """A fresh token for `device` (returned once) and its lifetime; the replaced one keeps working for
    `ROTATION_GRACE_S`, then stops. A token already replaced cannot rotate (401 `token_replaced`): its grace
    serves requests already in flight, and whoever holds a stolen copy must not trade it for a fresh
    full-lifetime token that locks the device out."""
    if device.superseded:
        raise Unauthorized("this device token was replaced by a rotation: it works for the rest of its grace, "
                           "but only the newest token may rotate", field="Authorization", code="token_replaced")
    record = session.get(DeviceRecord, device.id, with_for_update=True)
    token = new_device_token()
    now = utc_now()
    record.previous_token_hash = record.token_hash
    record.previous_token_valid_until = now + timedelta(seconds=ROTATION_GRACE_S)
    record.token_hash = hash_token(token)
    record.token_expires_at = now + timedelta(seconds=token_ttl_s)
    session.flush()
    return token, token_ttl_s


def revoke(session: Session, device_id: str) -> DeviceRecord:
    """Refuse every token of `device_id` from now on (idempotent); its pending round updates are not
    aggregated. Registering again needs an enrollment token and a new device id."""
    record = session.get(DeviceRecord, device_id)
    if record is None:
        raise NotFoundError(f"no device {device_id!r} is registered")
    if record.revoked_at is None:
        record.revoked_at = utc_now()
        record.previous_token_hash = None
        record.previous_token_valid_until = None
        session.flush()
    return record


class LastSeenRecorder:
    """Keeps each device's `last_seen_at` for the fleet view without a write on every request: a process
    notes a device at most once per `resolution_s` and writes the noted devices together, in one statement,
    `flush_interval_s` after the first of them (a timer thread, so no request waits for the write). The fleet
    view flushes its own process first; another worker's devices show at most `flush_interval_s` late, and a
    killed worker loses at most that much."""

    def __init__(self, engine: Engine, resolution_s: float = LAST_SEEN_RESOLUTION_S,
                 flush_interval_s: float = LAST_SEEN_FLUSH_INTERVAL_S, max_entries: int = 100_000) -> None:
        self.engine = engine
        self.resolution_s = resolution_s
        self.flush_interval_s = flush_interval_s
        self.max_entries = max_entries
        self._noted: OrderedDict[str, float] = OrderedDict()  # device id -> monotonic time last noted
        self._pending: dict[str, datetime] = {}  # device id -> when seen, not written yet
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def seen(self, device_id: str) -> None:
        """Note that `device_id` made an authenticated request now."""
        now = time.monotonic()
        with self._lock:
            noted = self._noted.get(device_id)
            if noted is not None and now - noted < self.resolution_s:
                return
            self._noted[device_id] = now
            self._noted.move_to_end(device_id)
            while len(self._noted) > self.max_entries:
                self._noted.popitem(last=False)
            self._pending[device_id] = utc_now()
            if self._timer is None:
                self._timer = threading.Timer(self.flush_interval_s, self.flush)
                self._timer.daemon = True
                self._timer.start()

    def flush(self) -> None:
        """Write every noted time now, in one statement."""
        with self._lock:
            pending, self._pending = self._pending, {}
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        if not pending:
            return
        try:
            with self.engine.begin() as connection:
                connection.execute(_SET_LAST_SEEN, [{"device_id": device_id, "seen_at": seen_at}
                                                    for device_id, seen_at in pending.items()])
        except SQLAlchemyError:  # a missed last-seen time must never fail a request
            log.warning("could not record when %d devices were last seen", len(pending), exc_info=True)


def report_latency(session: Session, device_id: str, model_id: str, median_ms: float, p90_ms: float | None,
                   threads: int | None, *, groups: int) -> TelemetryResult:
    """Record one measurement, refresh the median the lookup uses for this (device, model) and, on the pair's
    first report, recalibrate the device's scales for the other models and the model's fleet factor
    (`online_calibration`; `groups`: how many latency groups the server's estimator has)."""
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
        aggregate = MeasuredLatency(device_id=device_id, model_id=model_id, median_ms=value, reports=1)
        session.add(aggregate)
        reports = 1
        online_calibration.recalibrate(session, aggregate, groups)
    else:
        aggregate.median_ms = value
        aggregate.reports += 1
        reports = aggregate.reports
    session.flush()
    return TelemetryResult(device_id, model_id, value, reports)
