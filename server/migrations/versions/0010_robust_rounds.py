"""Robust rounds: each update's aggregation weight and root-set cosine, and the quarantined devices.

Revision ID: 0010_robust_rounds
Revises: 0009_ledger_lines
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_robust_rounds"
down_revision = "0009_ledger_lines"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("fl_updates", sa.Column("aggregation_weight", sa.Float(), nullable=True))
    op.add_column("fl_updates", sa.Column("root_cosine", sa.Float(), nullable=True))
    op.create_table(
        "fl_quarantine",
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("quarantined_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["device_id"], ["devices.id"], name="fk_fl_quarantine_device_id_devices", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["round_id"], ["fl_rounds.id"], name="fk_fl_quarantine_round_id_fl_rounds", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("device_id", name="pk_fl_quarantine"),
    )


def downgrade() -> None:  # SQLite >= 3.35 drops columns in place
    op.drop_table("fl_quarantine")
    op.drop_column("fl_updates", "root_cosine")
    op.drop_column("fl_updates", "aggregation_weight")
