"""Alembic revisions of the registry schema, applied in order at start-up."""
