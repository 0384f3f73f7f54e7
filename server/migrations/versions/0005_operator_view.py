"""The operator's view: uploads a round refused (late or rejected), each device's last-seen time, the plan a
round belongs to, and a model's parent as a column (so lineage is an indexed walk, not a scan of cards).

Revision ID: 0005_operator_view
Revises: 0003_update_trust
Create Date: 2026-12-05
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0005_operator_view"
down_revision = "0003_update_trust"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN, never batch mode (see 0003: a SQLite batch rebuild would cascade-delete rows).
    op.add_column("devices", sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_devices_device_class", "devices", ["device_class"])
    op.add_column("models", sa.Column("parent_id", sa.String(128), nullable=True))
    op.create_index("ix_models_parent_id", "models", ["parent_id"])
    op.add_column("fl_rounds", sa.Column("plan_id", sa.Integer(), nullable=True))
    op.create_index("ix_fl_rounds_plan_id", "fl_rounds", ["plan_id"])
    op.create_table(
        "fl_refused_uploads",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("upload_bytes", sa.Integer(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["round_id"], ["fl_rounds.id"], name="fk_fl_refused_uploads_round_id_fl_rounds",
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"], name="fk_fl_refused_uploads_device_id_devices",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_fl_refused_uploads"),
    )
    op.create_index("ix_fl_refused_uploads_round_device", "fl_refused_uploads", ["round_id", "device_id"])
    _backfill_parents()
    _backfill_plans()


def _backfill_parents() -> None:
    connection = op.get_bind()
    rows = connection.execute(sa.text("SELECT id, card_json FROM models")).all()
    for model_id, card_json in rows:
        parent_id = json.loads(card_json).get("parent_id")
        if parent_id is not None:
            connection.execute(sa.text("UPDATE models SET parent_id = :parent WHERE id = :id"),
                               {"parent": parent_id, "id": model_id})


def _backfill_plans() -> None:
    """A plan's first round has no previous round; every later one inherits its previous round's plan."""
    connection = op.get_bind()
    connection.execute(sa.text("UPDATE fl_rounds SET plan_id = id WHERE previous_round_id IS NULL"))
    inherited = 1
    while inherited:  # each pass reaches one round further down every plan
        inherited = connection.execute(sa.text(
            "UPDATE fl_rounds SET plan_id = (SELECT earlier.plan_id FROM fl_rounds AS earlier "
            "WHERE earlier.id = fl_rounds.previous_round_id) "
            "WHERE plan_id IS NULL AND previous_round_id IN (SELECT id FROM fl_rounds WHERE plan_id IS NOT NULL)"
        )).rowcount


def downgrade() -> None:  # SQLite >= 3.35 drops columns in place
    op.drop_index("ix_fl_refused_uploads_round_device", table_name="fl_refused_uploads")
    op.drop_table("fl_refused_uploads")
    op.drop_index("ix_fl_rounds_plan_id", table_name="fl_rounds")
    op.drop_column("fl_rounds", "plan_id")
    op.drop_index("ix_models_parent_id", table_name="models")
    op.drop_column("models", "parent_id")
    op.drop_index("ix_devices_device_class", table_name="devices")
    op.drop_column("devices", "last_seen_at")
