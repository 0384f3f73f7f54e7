"""The fleet's latency factor per model, and the residual of each device's first report it is made of.

Revision ID: 0008_model_latency_factor
Revises: 0007_online_calibration
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_model_latency_factor"
down_revision = "0007_online_calibration"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (no batch mode): rebuilding `models` on SQLite would cascade into its telemetry.
    op.add_column("models", sa.Column("latency_factor", sa.Float(), nullable=True))
    op.add_column("models", sa.Column("latency_factor_devices", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("measured_latency", sa.Column("log_residual", sa.Float(), nullable=True))


def downgrade() -> None:  # SQLite >= 3.35 drops columns in place
    op.drop_column("measured_latency", "log_residual")
    op.drop_column("models", "latency_factor_devices")
    op.drop_column("models", "latency_factor")
