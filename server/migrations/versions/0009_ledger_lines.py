"""One privacy ledger per model line: `privacy_lines`, and the line each private round's plan continues.

Revision ID: 0009_ledger_lines
Revises: 0008_model_latency_factor
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_ledger_lines"
down_revision = "0008_model_latency_factor"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "privacy_lines",
        sa.Column("line_id", sa.String(length=128), primary_key=True),
        sa.Column("delta", sa.Float(), nullable=False),
        sa.Column("mechanism", sa.String(length=8), nullable=False),
        sa.Column("events_json", sa.Text(), nullable=False),
        sa.Column("epsilon", sa.Float(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.add_column("fl_private_rounds", sa.Column("line_id", sa.String(length=128), nullable=True))
    op.create_index("ix_fl_private_rounds_line_id", "fl_private_rounds", ["line_id"])


def downgrade() -> None:  # SQLite >= 3.35 drops columns in place
    op.drop_index("ix_fl_private_rounds_line_id", table_name="fl_private_rounds")
    op.drop_column("fl_private_rounds", "line_id")
    op.drop_table("privacy_lines")
