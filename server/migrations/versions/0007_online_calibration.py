"""Online latency recalibration: each device's calibration state beside its scales, and per-class factors.

Revision ID: 0007_online_calibration
Revises: 0006_secure_rounds
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_online_calibration"
down_revision = "0006_secure_rounds"
branch_labels = None
depends_on = None
LATENCY_SLOTS = 8  # as in 0001_registry


def upgrade() -> None:
    # Plain ADD COLUMN (no batch mode): rebuilding `devices` on SQLite would cascade into its telemetry.
    op.add_column("devices", sa.Column("latency_calibration_json", sa.Text(), nullable=True))
    op.add_column("devices", sa.Column("latency_log_sigma", sa.Float(), nullable=True))
    op.add_column("devices", sa.Column("latency_reports", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("devices", sa.Column("latency_calibrated_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_devices_class_calibrated", "devices", ["device_class", "latency_calibrated_at"])
    op.create_table(
        "class_latency_calibration",
        sa.Column("device_class", sa.String(128), nullable=False),
        *(sa.Column(f"factor_{slot}", sa.Float(), nullable=False) for slot in range(LATENCY_SLOTS)),
        sa.Column("devices", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("device_class"),
    )


def downgrade() -> None:  # SQLite >= 3.35 drops columns in place
    op.drop_table("class_latency_calibration")
    op.drop_index("ix_devices_class_calibrated", table_name="devices")
    for column in ("latency_calibrated_at", "latency_reports", "latency_log_sigma", "latency_calibration_json"):
        op.drop_column("devices", column)
