"""The model server devices talk to (REST v1, see docs/design.md).

Layout, web layer to storage:
    cli.py          `fedzoo serve`: migrate, import a zoo, run gunicorn (graceful SIGTERM/SIGINT)
    app.py          `create_app(config)`: blueprints from one list, JSON errors, size limits
    routes/         thin blueprints: parse (routes/common.py), call a service, serialise
    openapi.py      `@documented` routes -> /v1/openapi.json (the FL blueprint uses it too)
    schemas.py      pydantic request/response bodies
    registry.py     publish / list / get models, import a zoo directory, refresh estimates
    devices.py      register devices (tokens stored hashed, expiring, rotated), authenticate, revoke, telemetry
    enrollment.py   enrollment tokens: create, list, revoke, take one use per registration
    ratelimit.py    per-address, per-device and per-token-prefix rate limits in a store the workers share
    revocations.py  the operator's signed card revocation lists: checked, stored, the newest served
    privacy_terms.py  the operator's signed privacy terms: checked, stored, the newest served
    lookup.py       the best model under latency and memory budgets, one SQL query
    latency.py      measured -> card device class -> predictor; `LatencyEstimator`
    blobstore.py    `BlobStore` by sha256 (`FileBlobStore`; S3 could implement it)
    db.py, tables.py, migrations/   SQLAlchemy 2.0 tables and their Alembic history
    fl/             federated-learning rounds (its own blueprint, tables and revision); fl/stages/ the stages of a round
"""
