"""Enrollment and token lifecycle: admin-issued enrollment tokens, device token expiry and rotation,
device revocation.

Devices registered before this revision get a token that expires 30 days after the upgrade (the default
lifetime), so an upgraded fleet keeps working and then rotates like any other.

Revision ID: 0004_enrollment
Revises: 0003_update_trust
Create Date: 2026-12-05
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import sqlalchemy as sa
from alembic import op

revision = "0004_enrollment"
down_revision = "0003_update_trust"
branch_labels = None
depends_on = None

UPGRADED_TOKEN_LIFETIME = timedelta(days=30)
DEVICE_COLUMNS = ("token_expires_at", "previous_token_hash", "previous_token_valid_until", "revoked_at",
                  "enrollment_token_id")


def upgrade() -> None:
    op.create_table(
        "enrollment_tokens",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("label", sa.String(200), nullable=True),
        sa.Column("device_class", sa.String(128), nullable=True),
        sa.Column("max_uses", sa.Integer(), nullable=False),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_enrollment_tokens"),
        sa.UniqueConstraint("token_hash", name="uq_enrollment_tokens_token_hash"),
    )
    # Plain ADD COLUMN, never batch mode: rebuilding `devices` on SQLite would cascade-delete its telemetry.
    op.add_column("devices", sa.Column("token_expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("devices", sa.Column("previous_token_hash", sa.String(64), nullable=True))
    op.add_column("devices", sa.Column("previous_token_valid_until", sa.DateTime(timezone=True), nullable=True))
    op.add_column("devices", sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("devices", sa.Column("enrollment_token_id", sa.String(32), nullable=True))
    op.create_index("ix_devices_previous_token_hash", "devices", ["previous_token_hash"], unique=True)
    devices = sa.table("devices", sa.column("token_expires_at", sa.DateTime(timezone=True)))
    op.execute(devices.update().values(token_expires_at=datetime.now(timezone.utc) + UPGRADED_TOKEN_LIFETIME))


def downgrade() -> None:  # SQLite >= 3.35 drops columns in place
    op.drop_index("ix_devices_previous_token_hash", table_name="devices")
    for column in reversed(DEVICE_COLUMNS):
        op.drop_column("devices", column)
    op.drop_table("enrollment_tokens")
