"""Zoo serving: compressed variants retired from lookup, accuracies on one evaluation set, publication progress.

`models.retired_by`: the newer version of the line a compressed variant was made from (lookup skips it; it stays
downloadable by id). `models.evaluation_sha256`: the evaluation set `models.accuracy` was measured on by the server
(null: the card's own metrics). `fl_rounds.publication_json`: a zoo round's background publication, as it goes.

Revision ID: 0014_zoo_serving
Revises: 0013_line_versions
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_zoo_serving"
down_revision = "0013_line_versions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("models", sa.Column("retired_by", sa.String(128), nullable=True))
    op.add_column("models", sa.Column("evaluation_sha256", sa.String(64), nullable=True))
    op.add_column("fl_rounds", sa.Column("publication_json", sa.Text(), nullable=True))


def downgrade() -> None:  # SQLite >= 3.35 drops columns in place
    op.drop_column("fl_rounds", "publication_json")
    op.drop_column("models", "evaluation_sha256")
    op.drop_column("models", "retired_by")
