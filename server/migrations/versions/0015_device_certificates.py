"""The operator's certificates of device signing keys, and its signed lists of revoked device keys.

Revision ID: 0015_device_certificates
Revises: 0014_zoo_serving
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_device_certificates"
down_revision = "0014_zoo_serving"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "device_certificates",
        sa.Column("device_id", sa.String(128), sa.ForeignKey("devices.id", ondelete="CASCADE",
                                                             name="fk_device_certificates_device_id_devices"),
                  primary_key=True),
        sa.Column("certificate_json", sa.Text(), nullable=False),
        sa.Column("key_id", sa.String(16), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("uploaded_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "device_revocation_lists",
        sa.Column("version", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("document_json", sa.Text(), nullable=False),
        sa.Column("uploaded_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("device_revocation_lists")
    op.drop_table("device_certificates")
