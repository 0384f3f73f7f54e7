"""Versions unique per model line (`models.line_id`), and the operator's signed card revocation lists.

Revision ID: 0013_line_versions
Revises: 0012_zoo_rounds
Create Date: 2026-12-07

A database written before this revision may already hold two cards of one line at one version (two plans on
one base both published "version 2"): the first published keeps the line, the later ones are left with no
`line_id` (so the unique index can be built) and are still served; devices refuse the second card they see.
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0013_line_versions"
down_revision = "0012_zoo_rounds"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("models", sa.Column("line_id", sa.String(length=128), nullable=True))
    connection = op.get_bind()
    taken: set[tuple[str, int]] = set()
    rows = connection.execute(sa.text("SELECT id, version, card_json FROM models ORDER BY published_at, id"))
    for model_id, version, card_json in rows.fetchall():
        line_id = json.loads(card_json).get("line") or model_id
        if (line_id, version) in taken:
            continue
        taken.add((line_id, version))
        connection.execute(sa.text("UPDATE models SET line_id = :line_id WHERE id = :id"),
                           {"line_id": line_id, "id": model_id})
    op.create_index("ux_models_line_version", "models", ["line_id", "version"], unique=True)
    op.create_table(
        "revocation_lists",
        sa.Column("version", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("key_id", sa.String(length=16), nullable=False),
        sa.Column("document_json", sa.Text(), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:  # SQLite >= 3.35 drops columns in place
    op.drop_table("revocation_lists")
    op.drop_index("ux_models_line_version", table_name="models")
    op.drop_column("models", "line_id")
