"""The operator's signed privacy terms (`fedzoo.privacy_terms`): every version uploaded, the newest served.

Revision ID: 0018_privacy_terms
Revises: 0017_secure_cohorts
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018_privacy_terms"
down_revision = "0017_secure_cohorts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "privacy_terms",
        sa.Column("version", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("key_id", sa.String(16), nullable=False),
        sa.Column("document_json", sa.Text(), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("privacy_terms")
