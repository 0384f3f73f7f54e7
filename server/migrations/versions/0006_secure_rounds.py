"""Private rounds: SecAgg+ stages and the DP ledger of a plan (`fl_private_rounds`), and each device's reply
to each SecAgg+ stage (`fl_secure_messages`).

Revision ID: 0006_secure_rounds
Revises: 0005_operator_view
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_secure_rounds"
down_revision = "0005_operator_view"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fl_private_rounds",
        sa.Column("round_id", sa.Integer(), sa.ForeignKey("fl_rounds.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("stage", sa.String(16), nullable=True),
        sa.Column("stage_deadline_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("participants_json", sa.Text(), nullable=True),
        sa.Column("secagg_config_json", sa.Text(), nullable=True),
        sa.Column("ledger_json", sa.Text(), nullable=True),
        sa.Column("ledger_after_json", sa.Text(), nullable=True),
    )
    op.create_table(
        "fl_secure_messages",
        sa.Column("round_id", sa.Integer(), sa.ForeignKey("fl_rounds.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("stage", sa.String(16), primary_key=True),
        sa.Column("client", sa.Integer(), primary_key=True),
        sa.Column("device_id", sa.String(128), sa.ForeignKey("devices.id", ondelete="CASCADE"), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("fl_secure_messages")
    op.drop_table("fl_private_rounds")
