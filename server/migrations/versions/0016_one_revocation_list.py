"""One operator revocation list: cards and device keys under one version (`fedzoo.revocation`).

The separate list of revoked device keys (`device_revocation_lists`, `/v1/device-revocations`) is gone: device
keys are a section of the one list in `revocation_lists`. Its documents cannot move over (they were signed under
another purpose label and the server cannot re-sign them); an operator who published one publishes its keys
again with `fedzoo devices revoke-keys` (docs/operations-security.md). `models.revoked_by_list`: the version of
the list that revokes the card (lookup skips it), filled here from the newest list held.

Revision ID: 0016_one_revocation_list
Revises: 0015_device_certificates
Create Date: 2026-12-07
"""

from __future__ import annotations

import base64
import json

import sqlalchemy as sa
from alembic import op

revision = "0016_one_revocation_list"
down_revision = "0015_device_certificates"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("models", sa.Column("revoked_by_list", sa.Integer(), nullable=True))
    op.drop_table("device_revocation_lists")
    connection = op.get_bind()
    newest = connection.execute(sa.text("SELECT version, document_json FROM revocation_lists "
                                        "ORDER BY version DESC LIMIT 1")).first()
    if newest is not None:
        cards = json.loads(base64.b64decode(json.loads(newest.document_json)["payload"]))["revoked_cards"]
        models = sa.table("models", sa.column("id"), sa.column("sha256"), sa.column("revoked_by_list"))
        connection.execute(models.update().where(sa.or_(models.c.id.in_(cards["ids"]),
                                                        models.c.sha256.in_(cards["sha256s"])))
                           .values(revoked_by_list=newest.version))


def downgrade() -> None:  # SQLite >= 3.35 drops columns in place
    op.create_table(
        "device_revocation_lists",
        sa.Column("version", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("document_json", sa.Text(), nullable=False),
        sa.Column("uploaded_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.drop_column("models", "revoked_by_list")
