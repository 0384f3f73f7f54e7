"""Federated rounds: rounds, the devices selected for them, and their accepted updates.

Revision ID: 0002_federated_rounds
Revises: 0001_registry
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_federated_rounds"
down_revision = "0001_registry"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fl_rounds",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("task", sa.String(128), nullable=False),
        sa.Column("family", sa.String(200), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("rounds_remaining", sa.Integer(), nullable=False),
        sa.Column("previous_round_id", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("base_model_id", sa.String(128), nullable=False),
        sa.Column("base_version", sa.Integer(), nullable=False),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("aggregation_lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("result_model_id", sa.String(128), nullable=True),
        sa.Column("strategy_state_sha256", sa.String(64), nullable=True),
        sa.Column("outcome_json", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["previous_round_id"], ["fl_rounds.id"], name="fk_fl_rounds_previous_round_id_fl_rounds"
        ),
        sa.ForeignKeyConstraint(["base_model_id"], ["models.id"], name="fk_fl_rounds_base_model_id_models"),
        sa.PrimaryKeyConstraint("id", name="pk_fl_rounds"),
    )
    op.create_index("ix_fl_rounds_task_state", "fl_rounds", ["task", "state"])

    op.create_table(
        "fl_participants",
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("selected_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["round_id"], ["fl_rounds.id"], name="fk_fl_participants_round_id_fl_rounds", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["device_id"], ["devices.id"], name="fk_fl_participants_device_id_devices", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("round_id", "device_id", name="pk_fl_participants"),
    )

    op.create_table(
        "fl_updates",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("blob_sha256", sa.String(64), nullable=False),
        sa.Column("encoding", sa.String(8), nullable=False),
        sa.Column("upload_bytes", sa.Integer(), nullable=False),
        sa.Column("num_examples", sa.Integer(), nullable=False),
        sa.Column("delta_norm", sa.Float(), nullable=False),
        sa.Column("metrics_json", sa.Text(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["round_id"], ["fl_rounds.id"], name="fk_fl_updates_round_id_fl_rounds", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["device_id"], ["devices.id"], name="fk_fl_updates_device_id_devices", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_fl_updates"),
        sa.UniqueConstraint("round_id", "device_id", name="uq_fl_updates_round_device"),
    )


def downgrade() -> None:
    op.drop_table("fl_updates")
    op.drop_table("fl_participants")
    op.drop_index("ix_fl_rounds_task_state", table_name="fl_rounds")
    op.drop_table("fl_rounds")
