"""SecAgg+ cohorts: a private round runs one SecAgg+ instance per cohort (`fl_secure_cohorts`).

An ordinary private round has one cohort (0); a zoo-wide round one per subnet. Each cohort has its own devices in
client-number order and its own SecAggConfig, which moved here from `fl_private_rounds`; each stored reply names
its cohort (`fl_secure_messages.cohort`, part of the key: client numbers restart in every cohort). Rows of rounds
made before this revision become cohort 0 of their round.

Revision ID: 0017_secure_cohorts
Revises: 0016_one_revocation_list
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017_secure_cohorts"
down_revision = "0016_one_revocation_list"
branch_labels = None
depends_on = None


def _messages_table(name: str, with_cohort: bool) -> None:
    op.create_table(
        name,
        sa.Column("round_id", sa.Integer(), sa.ForeignKey("fl_rounds.id", ondelete="CASCADE"), primary_key=True),
        *([sa.Column("cohort", sa.Integer(), primary_key=True)] if with_cohort else []),
        sa.Column("stage", sa.String(16), primary_key=True),
        sa.Column("client", sa.Integer(), primary_key=True),
        sa.Column("device_id", sa.String(128), sa.ForeignKey("devices.id", ondelete="CASCADE"), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
    )


def _replace_messages(with_cohort: bool) -> None:
    """fl_secure_messages again, with (or without) the cohort in its key: a new table, the rows copied over."""
    columns = "round_id, stage, client, device_id, body, received_at"
    _messages_table("fl_secure_messages_next", with_cohort)
    selected = f"0, {columns}" if with_cohort else columns
    where = "" if with_cohort else " WHERE cohort = 0"
    op.execute(f"INSERT INTO fl_secure_messages_next ({'cohort, ' if with_cohort else ''}{columns}) "
               f"SELECT {selected} FROM fl_secure_messages{where}")
    op.drop_table("fl_secure_messages")
    op.rename_table("fl_secure_messages_next", "fl_secure_messages")


def upgrade() -> None:
    op.create_table(
        "fl_secure_cohorts",
        sa.Column("round_id", sa.Integer(), sa.ForeignKey("fl_rounds.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("cohort", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("participants_json", sa.Text(), nullable=False),
        sa.Column("secagg_config_json", sa.Text(), nullable=False),
    )
    op.execute("INSERT INTO fl_secure_cohorts (round_id, cohort, name, participants_json, secagg_config_json) "
               "SELECT round_id, 0, '', participants_json, secagg_config_json FROM fl_private_rounds "
               "WHERE participants_json IS NOT NULL AND secagg_config_json IS NOT NULL")
    with op.batch_alter_table("fl_private_rounds") as batch:
        batch.drop_column("participants_json")
        batch.drop_column("secagg_config_json")
    _replace_messages(with_cohort=True)


def downgrade() -> None:
    _replace_messages(with_cohort=False)
    with op.batch_alter_table("fl_private_rounds") as batch:
        batch.add_column(sa.Column("participants_json", sa.Text(), nullable=True))
        batch.add_column(sa.Column("secagg_config_json", sa.Text(), nullable=True))
    op.execute("UPDATE fl_private_rounds SET "
               "participants_json = (SELECT participants_json FROM fl_secure_cohorts c WHERE "
               "c.round_id = fl_private_rounds.round_id AND c.cohort = 0), "
               "secagg_config_json = (SELECT secagg_config_json FROM fl_secure_cohorts c WHERE "
               "c.round_id = fl_private_rounds.round_id AND c.cohort = 0)")
    op.drop_table("fl_secure_cohorts")
