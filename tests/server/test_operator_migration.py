"""The operator's-view migration: it backfills each model's parent and each round's plan from what was
stored before it, adds the refused-uploads table, and downgrades to the update-trust revision."""

import json
import sqlite3

from alembic import command
from sqlalchemy import inspect

from fedzoo.server import migrations
from fedzoo.server.db import make_engine

ROUND_COLUMNS = ("id, task, family, number, rounds_remaining, previous_round_id, state, base_model_id, base_version, "
                 "config_json, created_at, deadline_at")


def test_the_migration_backfills_parents_and_plans_and_downgrades(tmp_path):
    path = tmp_path / "registry.db"
    url = f"sqlite:///{path}"
    migrations.upgrade(url, "0003_update_trust")
    # plain sqlite3 (foreign keys off): rows as an older server stored them, cards as JSON
    with sqlite3.connect(path) as connection:
        for model_id, parent in (("root", None), ("child", "root")):
            connection.execute(
                "INSERT INTO models (id, family, version, task, precision, accuracy, size_bytes, macs, params, sha256, "
                "memory_mb, reference_latency_ms, latency_cost_basis, latency_signature, cost_0_ms, cost_1_ms, "
                "cost_2_ms, cost_3_ms, cost_4_ms, cost_5_ms, cost_6_ms, cost_7_ms, card_json, published_at) VALUES "
                "(?, 'f', 1, 't', 'fp32', 0.5, 1, 1, 1, 'x', 1, 1, 'b', 's', 0, 0, 0, 0, 0, 0, 0, 0, ?, '2026-01-01')",
                (model_id, json.dumps({"id": model_id, "parent_id": parent})))
        # two plans: 1 -> 2 -> 3 and 4 -> 5
        for round_id, previous in ((1, None), (2, 1), (3, 2), (4, None), (5, 4)):
            connection.execute(f"INSERT INTO fl_rounds ({ROUND_COLUMNS}) VALUES (?, 't', 'f', 1, 1, ?, 'closed', "
                               "'root', 1, '{}', '2026-01-01', '2026-01-02')", (round_id, previous))
    migrations.upgrade(url)
    with sqlite3.connect(path) as connection:
        assert dict(connection.execute("SELECT id, parent_id FROM models")) == {"root": None, "child": "root"}
        assert dict(connection.execute("SELECT id, plan_id FROM fl_rounds")) == {1: 1, 2: 1, 3: 1, 4: 4, 5: 4}
    engine = make_engine(url)
    try:
        assert "fl_refused_uploads" in inspect(engine).get_table_names()
        command.downgrade(migrations.alembic_config(url), "0003_update_trust")
        assert "fl_refused_uploads" not in inspect(engine).get_table_names()
        assert "last_seen_at" not in {column["name"] for column in inspect(engine).get_columns("devices")}
        assert "plan_id" not in {column["name"] for column in inspect(engine).get_columns("fl_rounds")}
    finally:
        engine.dispose()
