"""Registry tables: published models, registered devices and the latencies devices report.

A model row keeps the whole card as JSON (the contract) plus the columns a lookup filters and sorts
on, and two figures precomputed at publish time so that a lookup is one indexed query and a little
arithmetic: `memory_mb` (see `fedzoo.server.lookup.estimate_memory_mb`) and `reference_latency_ms`
(the latency on the cloud reference device, which a device's `speed_factor` scales).
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import DateTime, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from fedzoo.server.db import Base


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class ModelRecord(Base):
    """One published model card and its lookup columns."""

    __tablename__ = "models"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    family: Mapped[str] = mapped_column(String(200))
    version: Mapped[int] = mapped_column(Integer)
    task: Mapped[str] = mapped_column(String(128))
    precision: Mapped[str] = mapped_column(String(16))
    accuracy: Mapped[float] = mapped_column(Float)
    size_bytes: Mapped[int] = mapped_column(Integer)
    macs: Mapped[int] = mapped_column(Integer)
    params: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    memory_mb: Mapped[float] = mapped_column(Float)
    reference_latency_ms: Mapped[float] = mapped_column(Float)
    card_json: Mapped[str] = mapped_column(Text)
    published_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)

    __table_args__ = (Index("ix_models_task_accuracy", "task", "accuracy"),)


class ModelClassLatency(Base):
    """A card's own latency for one device class (`card.latency_ms[device_class]`), queryable by class."""

    __tablename__ = "model_class_latency"

    model_id: Mapped[str] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), primary_key=True)
    device_class: Mapped[str] = mapped_column(String(128), primary_key=True)
    median_ms: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(16))

    __table_args__ = (Index("ix_model_class_latency_class_model", "device_class", "model_id"),)


class DeviceRecord(Base):
    """A registered device: its profile, a hash of its token (never the token) and its speed factor."""

    __tablename__ = "devices"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    device_class: Mapped[str | None] = mapped_column(String(128), nullable=True)
    memory_mb: Mapped[int] = mapped_column(Integer)
    speed_factor: Mapped[float] = mapped_column(Float)
    speed_factor_basis: Mapped[str] = mapped_column(String(200))
    profile_json: Mapped[str] = mapped_column(Text)
    registered_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)


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
