"""Registry tables: published models, registered devices and the latencies devices report.

A model row keeps the whole card as JSON (the contract) plus the columns a lookup filters and sorts
on, and figures precomputed at publish time so that a lookup is one indexed query and a little
arithmetic: `memory_mb` (see `fedzoo.server.lookup.estimate_memory_mb`) and the reference latency
split into the latency estimator's cost groups (`cost_<i>_ms`, slot i = the estimator's i-th group),
which a device's `scale_<i>` columns scale (see `fedzoo.server.latency`). `latency_signature` names
the estimator that computed them, so rows computed by another one are recomputed at start-up.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import BigInteger, DateTime, Float, ForeignKey, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from fedzoo.server.db import Base


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(moment: datetime) -> datetime:
    """SQLite hands datetimes back without a zone; every stored time is UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


class ModelRecord(Base):
    """One published model card and its lookup columns."""

    __tablename__ = "models"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    family: Mapped[str] = mapped_column(String(200))
    parent_id: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True,
                                                  doc="the card's parent_id, so lineage is an indexed walk")
    version: Mapped[int] = mapped_column(Integer)
    # the card's line_id: one card per line and version (ux_models_line_version); NULL only for a card that
    # already repeated a version before 0013_line_versions
    line_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    task: Mapped[str] = mapped_column(String(128))
    precision: Mapped[str] = mapped_column(String(16))
    accuracy: Mapped[float] = mapped_column(Float)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    macs: Mapped[int] = mapped_column(BigInteger)
    params: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    memory_mb: Mapped[float] = mapped_column(Float)
    reference_latency_ms: Mapped[float] = mapped_column(Float)
    latency_cost_basis: Mapped[str] = mapped_column(String(200))
    latency_signature: Mapped[str] = mapped_column(String(100))
    cost_0_ms: Mapped[float] = mapped_column(Float)
    cost_1_ms: Mapped[float] = mapped_column(Float)
    cost_2_ms: Mapped[float] = mapped_column(Float)
    cost_3_ms: Mapped[float] = mapped_column(Float)
    cost_4_ms: Mapped[float] = mapped_column(Float)
    cost_5_ms: Mapped[float] = mapped_column(Float)
    cost_6_ms: Mapped[float] = mapped_column(Float)
    cost_7_ms: Mapped[float] = mapped_column(Float)
    card_json: Mapped[str] = mapped_column(Text)
    # The fleet's word on this model (`fedzoo.server.online_calibration`): its predicted latency times this
    # factor, the median of several devices' measured / predicted ratios relative to their other models.
    latency_factor: Mapped[float | None] = mapped_column(Float, nullable=True)
    latency_factor_devices: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    published_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    # The server's word on serving it (`fedzoo.server.fl.zoo_plan`): a compressed variant whose source line has a
    # newer version is retired (lookup skips it; it stays downloadable), and `accuracy` is the server's measurement
    # on the evaluation set `evaluation_sha256` (null: the card's own metrics), so a task's models rank on one set.
    retired_by: Mapped[str | None] = mapped_column(String(128), nullable=True,
                                                   doc="the newer version whose line moved past this variant")
    evaluation_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True,
                                                          doc="the set `accuracy` was measured on by the server")
    revoked_by_list: Mapped[int | None] = mapped_column(Integer, nullable=True,
                                                        doc="the operator's revocation list version that revokes it "
                                                            "(`fedzoo.server.revocations`): lookup skips it")

    __table_args__ = (Index("ix_models_task_accuracy", "task", "accuracy"),
                      Index("ux_models_line_version", "line_id", "version", unique=True))


class RevocationListRecord(Base):
    """One signed revocation list the operator uploaded (`fedzoo.revocation`); the newest version is served."""

    __tablename__ = "revocation_lists"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    key_id: Mapped[str] = mapped_column(String(16))
    document_json: Mapped[str] = mapped_column(Text)
    published_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)


class PrivacyTermsRecord(Base):
    """One version of the privacy terms the operator signed (`fedzoo.privacy_terms`); the newest is served."""

    __tablename__ = "privacy_terms"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    key_id: Mapped[str] = mapped_column(String(16))
    document_json: Mapped[str] = mapped_column(Text)
    published_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)


class ModelClassLatency(Base):
    """A card's own latency for one device class (`card.latency_ms[device_class]`), queryable by class."""

    __tablename__ = "model_class_latency"

    model_id: Mapped[str] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), primary_key=True)
    device_class: Mapped[str] = mapped_column(String(128), primary_key=True)
    median_ms: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(16))

    __table_args__ = (Index("ix_model_class_latency_class_model", "device_class", "model_id"),)


class DeviceRecord(Base):
    """A registered device: its profile, a hash of its token (never the token) and its latency scales."""

    __tablename__ = "devices"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    device_class: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)
    memory_mb: Mapped[int] = mapped_column(BigInteger)
    latency_scales_basis: Mapped[str] = mapped_column(String(200))
    latency_signature: Mapped[str] = mapped_column(String(100))
    scale_0: Mapped[float] = mapped_column(Float)
    scale_1: Mapped[float] = mapped_column(Float)
    scale_2: Mapped[float] = mapped_column(Float)
    scale_3: Mapped[float] = mapped_column(Float)
    scale_4: Mapped[float] = mapped_column(Float)
    scale_5: Mapped[float] = mapped_column(Float)
    scale_6: Mapped[float] = mapped_column(Float)
    scale_7: Mapped[float] = mapped_column(Float)
    profile_json: Mapped[str] = mapped_column(Text)
    registered_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    # token lifecycle (see fedzoo.server.devices): the token stops working at token_expires_at; after a
    # rotation the previous one keeps working until previous_token_valid_until; a revoked device is refused
    token_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    previous_token_hash: Mapped[str | None] = mapped_column(String(64), index=True, unique=True, nullable=True)
    previous_token_valid_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    enrollment_token_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # the device's long-term Ed25519 public key (raw 32 bytes), given at registration and never changed: its
    # signatures in SecAgg+ rounds are checked against it; a device without one takes part in plain rounds only
    signing_public_key: Mapped[bytes | None] = mapped_column(LargeBinary(32), nullable=True)
    # Online recalibration (`fedzoo.server.online_calibration`): the scale columns above follow this device's
    # telemetry; the state (registration scales, covariance of the log scales) is kept as JSON beside them.
    latency_calibration_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    latency_log_sigma: Mapped[float | None] = mapped_column(Float, nullable=True)
    latency_reports: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    latency_calibrated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    last_seen_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), nullable=True, doc="last authenticated request (kept to LAST_SEEN_RESOLUTION_S)")

    __table_args__ = (Index("ix_devices_class_calibrated", "device_class", "latency_calibrated_at"),)


class EnrollmentToken(Base):
    """An admin-issued credential that lets `max_uses` devices register until `expires_at` (hash stored only)."""

    __tablename__ = "enrollment_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    label: Mapped[str | None] = mapped_column(String(200), nullable=True)
    device_class: Mapped[str | None] = mapped_column(String(128), nullable=True)
    max_uses: Mapped[int] = mapped_column(Integer)
    uses: Mapped[int] = mapped_column(Integer, default=0)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class LatencyReport(Base):
    """One latency measurement a device reported for a model (telemetry)."""

    __tablename__ = "latency_reports"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    median_ms: Mapped[float] = mapped_column(Float)
    p90_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    threads: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reported_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)

    __table_args__ = (Index("ix_latency_reports_device_model", "device_id", "model_id"),)


class MeasuredLatency(Base):
    """The lookup's view of telemetry: per (device, model), the median of its recent reports."""

    __tablename__ = "measured_latency"

    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"), primary_key=True)
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), primary_key=True)
    median_ms: Mapped[float] = mapped_column(Float)
    reports: Mapped[int] = mapped_column(Integer)
    # log(first report / the prediction by the device's registration scales), for the model's latency factor
    log_residual: Mapped[float | None] = mapped_column(Float, nullable=True)


class ClassLatencyCalibration(Base):
    """Per device class, the factor per scale slot that telemetry of the class's devices found (their median
    correction); applied to the class's devices that have no telemetry of their own."""

    __tablename__ = "class_latency_calibration"

    device_class: Mapped[str] = mapped_column(String(128), primary_key=True)
    factor_0: Mapped[float] = mapped_column(Float)
    factor_1: Mapped[float] = mapped_column(Float)
    factor_2: Mapped[float] = mapped_column(Float)
    factor_3: Mapped[float] = mapped_column(Float)
    factor_4: Mapped[float] = mapped_column(Float)
    factor_5: Mapped[float] = mapped_column(Float)
    factor_6: Mapped[float] = mapped_column(Float)
    factor_7: Mapped[float] = mapped_column(Float)
    devices: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now, onupdate=utc_now)


LATENCY_SLOTS = 8  # cost_<i>_ms / scale_<i> columns: at most this many latency groups
COST_COLUMNS = tuple(f"cost_{slot}_ms" for slot in range(LATENCY_SLOTS))
SCALE_COLUMNS = tuple(f"scale_{slot}" for slot in range(LATENCY_SLOTS))
FACTOR_COLUMNS = tuple(f"factor_{slot}" for slot in range(LATENCY_SLOTS))


class DeviceCertificateRecord(Base):
    """The operator's certificate of a device's signing key (`fedzoo.device_certificates`), as uploaded by
    `fedzoo devices certify`: the server stores and relays it, and could not have made it."""

    __tablename__ = "device_certificates"

    device_id: Mapped[str] = mapped_column(String(128), ForeignKey("devices.id", ondelete="CASCADE"),
                                           primary_key=True)
    certificate_json: Mapped[str] = mapped_column(Text)
    key_id: Mapped[str] = mapped_column(String(16))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    uploaded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
