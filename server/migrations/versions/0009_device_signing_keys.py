"""Each device's long-term Ed25519 public key, which SecAgg+ rounds check its signatures against.

Revision ID: 0009_device_signing_keys
Revises: 0008_model_latency_factor
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_device_signing_keys"
down_revision = "0008_model_latency_factor"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (no batch mode), nullable: devices registered before have no key and join plain rounds only.
    op.add_column("devices", sa.Column("signing_public_key", sa.LargeBinary(length=32), nullable=True))


def downgrade() -> None:  # SQLite >= 3.35 drops columns in place
    op.drop_column("devices", "signing_public_key")
