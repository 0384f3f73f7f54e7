"""Zoo-wide rounds: the subnet each selected device trains (`fl_subnet_assignments`).

Revision ID: 0012_zoo_rounds
Revises: 0011_device_signing_keys
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_zoo_rounds"
down_revision = "0011_device_signing_keys"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fl_subnet_assignments",
        sa.Column("round_id", sa.Integer(), sa.ForeignKey("fl_rounds.id", ondelete="CASCADE",
                                                          name="fk_fl_subnet_assignments_round_id_fl_rounds"),
                  primary_key=True),
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("zoo_model_id", sa.String(128), nullable=False),
        sa.Column("training_model_id", sa.String(128), nullable=False),
        sa.Column("arch_json", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("fl_subnet_assignments")
