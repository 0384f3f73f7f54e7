"""The registry: models, their per-device-class latencies, devices, latency reports and their medians.

Revision ID: 0001_registry
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_registry"
down_revision = None
branch_labels = None
depends_on = None
LATENCY_SLOTS = 8  # fixed here: a later change to fedzoo.server.tables must come with its own revision


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("family", sa.String(200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("task", sa.String(128), nullable=False),
        sa.Column("precision", sa.String(16), nullable=False),
        sa.Column("accuracy", sa.Float(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("macs", sa.BigInteger(), nullable=False),
        sa.Column("params", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("memory_mb", sa.Float(), nullable=False),
        sa.Column("reference_latency_ms", sa.Float(), nullable=False),
        sa.Column("latency_cost_basis", sa.String(200), nullable=False),
        sa.Column("latency_signature", sa.String(100), nullable=False),
        *(sa.Column(f"cost_{slot}_ms", sa.Float(), nullable=False) for slot in range(LATENCY_SLOTS)),
        sa.Column("card_json", sa.Text(), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_models"),
    )
    op.create_index("ix_models_sha256", "models", ["sha256"])
    op.create_index("ix_models_task_accuracy", "models", ["task", "accuracy"])

    op.create_table(
        "model_class_latency",
        sa.Column("model_id", sa.String(128), nullable=False),
        sa.Column("device_class", sa.String(128), nullable=False),
        sa.Column("median_ms", sa.Float(), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name="fk_model_class_latency_model_id_models", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("model_id", "device_class", name="pk_model_class_latency"),
    )
    op.create_index("ix_model_class_latency_class_model", "model_class_latency", ["device_class", "model_id"])

    op.create_table(
        "devices",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("device_class", sa.String(128), nullable=True),
        sa.Column("memory_mb", sa.BigInteger(), nullable=False),
        sa.Column("latency_scales_basis", sa.String(200), nullable=False),
        sa.Column("latency_signature", sa.String(100), nullable=False),
        *(sa.Column(f"scale_{slot}", sa.Float(), nullable=False) for slot in range(LATENCY_SLOTS)),
        sa.Column("profile_json", sa.Text(), nullable=False),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_devices"),
        sa.UniqueConstraint("token_hash", name="uq_devices_token_hash"),
    )

    op.create_table(
        "latency_reports",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("model_id", sa.String(128), nullable=False),
        sa.Column("median_ms", sa.Float(), nullable=False),
        sa.Column("p90_ms", sa.Float(), nullable=True),
        sa.Column("threads", sa.Integer(), nullable=True),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["device_id"], ["devices.id"], name="fk_latency_reports_device_id_devices", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name="fk_latency_reports_model_id_models", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_latency_reports"),
    )
    op.create_index("ix_latency_reports_device_model", "latency_reports", ["device_id", "model_id"])

    op.create_table(
        "measured_latency",
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("model_id", sa.String(128), nullable=False),
        sa.Column("median_ms", sa.Float(), nullable=False),
        sa.Column("reports", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["device_id"], ["devices.id"], name="fk_measured_latency_device_id_devices", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name="fk_measured_latency_model_id_models", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("device_id", "model_id", name="pk_measured_latency"),
    )


def downgrade() -> None:
    op.drop_table("measured_latency")
    op.drop_table("latency_reports")
    op.drop_table("devices")
    op.drop_table("model_class_latency")
    op.drop_table("models")
