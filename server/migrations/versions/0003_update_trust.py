"""Update trust: the weight the server grants each update, how aggregation screened it, and who holds a
round's aggregation lease (so a crashed aggregation is taken over within seconds).

Revision ID: 0003_update_trust
Revises: 0002_federated_rounds
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_update_trust"
down_revision = "0002_federated_rounds"
branch_labels = None
depends_on = None

UPDATE_COLUMNS = ("counted_examples", "screening", "screening_reason", "counted_norm")


def upgrade() -> None:
    # Plain ALTER TABLE ADD/DROP COLUMN, never batch mode: on SQLite, batch mode rebuilds a table and drops
    # the old one, and dropping fl_rounds with foreign keys on would cascade-delete every stored update.
    op.add_column("fl_updates", sa.Column("counted_examples", sa.Integer(), nullable=True))
    op.add_column("fl_updates", sa.Column("screening", sa.String(16), nullable=True))
    op.add_column("fl_updates", sa.Column("screening_reason", sa.Text(), nullable=True))
    op.add_column("fl_updates", sa.Column("counted_norm", sa.Float(), nullable=True))
    # updates stored before this revision were weighted by their own claim; say so rather than guess a cap
    op.execute("UPDATE fl_updates SET counted_examples = num_examples")
    op.add_column("fl_rounds", sa.Column("aggregation_owner", sa.String(64), nullable=True))


def downgrade() -> None:  # SQLite >= 3.35 drops columns in place
    op.drop_column("fl_rounds", "aggregation_owner")
    for column in reversed(UPDATE_COLUMNS):
        op.drop_column("fl_updates", column)
