"""Server time of every dashboard page (and the read endpoints behind them) on a large registry.

1,000 models (4 tasks, lineage chains base -> pruned -> int8 -> federated versions, 70 % with latencies for
3 device classes), 10,000 devices (5 classes, half of them seen recently, 2,000 with telemetry) and 500
federated rounds (100 plans of 5 rounds, 10 participants each: accepted, clipped, rejected and late) are
written straight into a fresh SQLite registry (rows, not the publish path: publishing 1,000 real ONNX models
would take minutes and measure something else). A Flask test client logged in as the viewer then asks for
each page `--repeats` times; the table gives the median and p90 server time per page against the goal.

    .venv/bin/python bench/dashboard_pages.py [--repeats 20]

The machine is shared: read the figures as an upper bound of the server's own time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import statistics
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import insert

from fedzoo.cards import ModelCard
from fedzoo.server import migrations
from fedzoo.server.app import create_app
from fedzoo.server.config import ServerConfig
from fedzoo.server.db import Database
from fedzoo.server.fl.tables import FLParticipant, FLRefusedUpload, FLRound, FLUpdate
from fedzoo.server.latency import default_estimator
from fedzoo.server.tables import (
    COST_COLUMNS, SCALE_COLUMNS, DeviceRecord, MeasuredLatency, ModelClassLatency, ModelRecord,
)

MODELS = 1_000
DEVICES = 10_000
ROUNDS = 500
ROUNDS_PER_PLAN = 5
PARTICIPANTS_PER_ROUND = 10
DEVICES_WITH_TELEMETRY = 2_000
TASKS = ("digits", "mnist", "cifar10", "keywords")
DEVICE_CLASSES = ("pi4", "pixel6", "jetson-nano", "laptop-x86", "phone-low")
LATENCY_CLASSES = DEVICE_CLASSES[:3]
GOAL_MS = 200.0
VIEWER_TOKEN = "bench-viewer-token-0123456789abcdefgh"


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def model_rows(rng: random.Random, signature: str) -> tuple[list[dict], list[dict]]:
    """Models in chains of four (base, pruned, int8, federated) per family, and their per-class latencies."""
    models, latencies = [], []
    for index in range(MODELS):
        stage = index % 4
        family, task = f"family-{index // 4}", TASKS[(index // 4) % len(TASKS)]
        model_id = f"{family}-{('base', 'pruned', 'int8', 'fl-v2')[stage]}"
        parent_id = None if stage == 0 else f"{family}-{('base', 'pruned', 'int8')[stage - 1]}"
        accuracy = round(rng.uniform(0.6, 0.99), 4)
        class_latency = {cls: {"median_ms": round(rng.uniform(1, 80), 3), "source": "measured"}
                         for cls in LATENCY_CLASSES} if rng.random() < 0.7 else {}
        card = ModelCard.from_dict({
            "id": model_id, "family": family, "version": 2 if stage == 3 else 1, "parent_id": parent_id, "task": task,
            "input": {"name": "input", "shape": ["batch", 1, 28, 28]}, "labels": [str(d) for d in range(10)],
            "precision": "int8" if stage == 2 else "fp32",
            "pruning": {"ratio": 0.5, "method": "l1-global"} if stage in (1, 2) else None,
            "metrics": {"accuracy": accuracy, "num_examples": 1000}, "macs": rng.randrange(10**5, 10**8),
            "params": rng.randrange(10**4, 10**6), "size_bytes": rng.randrange(10**4, 10**7),
            "sha256": digest(model_id), "latency_ms": class_latency,
            "details": {"federated": {"round_id": 1}} if stage == 3 else {},
        })
        models.append({
            "id": model_id, "family": family, "parent_id": parent_id, "version": card.version, "task": task,
            "precision": card.precision, "accuracy": accuracy, "size_bytes": card.size_bytes, "macs": card.macs,
            "params": card.params, "sha256": card.sha256, "memory_mb": 20.0, "reference_latency_ms": 10.0,
            "latency_cost_basis": "bench", "latency_signature": signature, "card_json": card.model_dump_json(),
            "published_at": datetime.now(timezone.utc), **{column: rng.uniform(0, 5) for column in COST_COLUMNS},
        })
        latencies += [{"model_id": model_id, "device_class": cls, "median_ms": value["median_ms"], "source": "measured"}
                      for cls, value in class_latency.items()]
    return models, latencies


def device_rows(rng: random.Random, signature: str, now: datetime) -> list[dict]:
    rows = []
    for index in range(DEVICES):
        device_id = f"device-{index:05d}"
        device_class = DEVICE_CLASSES[index % len(DEVICE_CLASSES)]
        profile = {"device_id": device_id, "platform": "android-arm64", "device_class": device_class,
                   "cpu": {"model": "bench", "cores": 4}, "memory_mb": 4096,
                   "runtime": {"onnxruntime": "1.32.0", "threads": 2}, "benchmarks": []}
        rows.append({
            "id": device_id, "token_hash": digest(f"token-{index}"), "device_class": device_class, "memory_mb": 4096,
            "latency_scales_basis": "bench", "latency_signature": signature, "profile_json": json.dumps(profile),
            "registered_at": now - timedelta(days=30),
            "last_seen_at": now - timedelta(minutes=rng.randrange(1, 600)) if index % 2 else None,
            **{column: rng.uniform(0.5, 3) for column in SCALE_COLUMNS},
        })
    return rows


def round_rows(rng: random.Random, models: list[dict], now: datetime) -> dict[type, list[dict]]:
    """Plans of five rounds each on a base model; the newest round is still open."""
    rounds, participants, updates, refusals = [], [], [], []
    bases = [model for model in models if model["parent_id"] is None]
    for round_id in range(1, ROUNDS + 1):
        plan_id = round_id - (round_id - 1) % ROUNDS_PER_PLAN
        base = bases[(plan_id // ROUNDS_PER_PLAN) % len(bases)]
        created = now - timedelta(minutes=(ROUNDS - round_id) * 3)
        is_open = round_id == ROUNDS
        accuracy = round(rng.uniform(0.7, 0.95), 4)
        state = "open" if is_open else ("failed" if round_id % 17 == 0 else "closed")
        outcome = None if is_open else (json.dumps({"failure": "only 1 of the minimum 2 updates arrived"})
                                        if state == "failed" else
                                        json.dumps({"metrics": {"accuracy": accuracy}, "evaluation": {"accuracy": accuracy}}))
        rounds.append({
            "id": round_id, "plan_id": plan_id, "task": base["task"], "family": base["family"],
            "number": round_id - plan_id + 1, "rounds_remaining": ROUNDS_PER_PLAN - (round_id - plan_id),
            "previous_round_id": None if round_id == plan_id else round_id - 1, "state": state,
            "base_model_id": base["id"], "base_version": 1,
            "config_json": json.dumps({"model_id": base["id"], "evaluation_sha256": "0" * 64, "min_clients": 2,
                                       "target_clients": 8, "deadline_s": 600}),
            "created_at": created, "deadline_at": created + timedelta(days=1 if is_open else 0, minutes=10),
            "finished_at": None if is_open else created + timedelta(minutes=2), "outcome_json": outcome,
            "result_model_id": None,
        })
        chosen = rng.sample(range(DEVICES), PARTICIPANTS_PER_ROUND)
        for slot, device_index in enumerate(chosen):
            device_id = f"device-{device_index:05d}"
            participants.append({"round_id": round_id, "device_id": device_id, "selected_at": created})
            if slot < 8:
                updates.append({
                    "round_id": round_id, "device_id": device_id, "blob_sha256": digest(f"{round_id}-{slot}"),
                    "encoding": "fp32", "upload_bytes": 40_000, "num_examples": 100, "counted_examples": 100,
                    "delta_norm": rng.uniform(0.1, 2), "metrics_json": "{}", "received_at": created,
                    "screening": ("counted", "clipped")[slot % 2], "screening_reason": None,
                })
            else:
                refusals.append({"round_id": round_id, "device_id": device_id, "kind": ("late", "rejected")[slot % 2],
                                 "reason": "bench", "upload_bytes": 40_000, "received_at": created})
    return {FLRound: rounds, FLParticipant: participants, FLUpdate: updates, FLRefusedUpload: refusals}


def seed(database_url: str) -> None:
    rng = random.Random(0)
    signature = default_estimator().signature
    now = datetime.now(timezone.utc)
    migrations.upgrade(database_url)
    models, latencies = model_rows(rng, signature)
    devices = device_rows(rng, signature, now)
    measured = [{"device_id": f"device-{index:05d}", "model_id": models[index % MODELS]["id"],
                 "median_ms": rng.uniform(1, 80), "reports": 3} for index in range(DEVICES_WITH_TELEMETRY)]
    database = Database(database_url)
    with database.session() as session:
        for table, rows in ((ModelRecord, models), (ModelClassLatency, latencies), (DeviceRecord, devices),
                            (MeasuredLatency, measured), *round_rows(rng, models, now).items()):
            session.execute(insert(table), rows)
    database.dispose()


def log_in(client) -> None:
    form = client.get("/ui/login").get_data(as_text=True)
    form_token = re.search(r'name="form_token" value="([^"]+)"', form).group(1)
    response = client.post("/ui/login", data={"form_token": form_token, "token": VIEWER_TOKEN})
    assert response.status_code == 302, response.status_code


def time_pages(client, paths: list[str], repeats: int) -> list[tuple[str, float, float]]:
    results = []
    for path in paths:
        client.get(path)  # warm: templates compiled, caches filled
        times_ms = []
        for _ in range(repeats):
            started = time.perf_counter()
            response = client.get(path, headers={"Authorization": f"Bearer {VIEWER_TOKEN}"})
            times_ms.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (path, response.status_code, response.get_data(as_text=True)[-300:])
        times_ms.sort()
        results.append((path, statistics.median(times_ms), times_ms[int(0.9 * (len(times_ms) - 1))]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fedzoo-bench-ui-") as folder:
        config = ServerConfig.from_env({}, data_dir=Path(folder), viewer_token=VIEWER_TOKEN)
        started = time.perf_counter()
        seed(config.database_url)
        print(f"seeded {MODELS} models, {DEVICES} devices, {ROUNDS} rounds in {time.perf_counter() - started:.1f} s")
        app = create_app(config)
        client = app.test_client()
        log_in(client)
        mid_chain = "family-40-pruned"
        paths = ["/ui/", "/ui/models", "/ui/models?task=mnist&offset=100", f"/ui/models/{mid_chain}",
                 "/ui/zoo?task=digits&device_class=pi4&budget_ms=30", "/ui/rounds", "/ui/rounds?offset=400",
                 "/ui/rounds/250", f"/ui/rounds/{ROUNDS}/state", "/ui/fleet", "/ui/fleet?device_class=pi4&offset=1000",
                 "/v1/fl/rounds", "/v1/fl/rounds/250/participants", "/v1/devices", "/v1/devices/classes",
                 f"/v1/models/{mid_chain}/lineage", f"/v1/models/{mid_chain}/latency"]
        results = time_pages(client, paths, args.repeats)
        app.extensions["fedzoo"].db.dispose()
    print(f"\n{'page':<48} {'median ms':>10} {'p90 ms':>8}  goal <= {GOAL_MS:.0f} ms")
    for path, median_ms, p90_ms in results:
        print(f"{path:<48} {median_ms:>10.1f} {p90_ms:>8.1f}  {'ok' if p90_ms <= GOAL_MS else 'OVER'}")
    worst = max(results, key=lambda row: row[2])
    print(f"\nslowest p90: {worst[0]} {worst[2]:.1f} ms ({worst[2] / GOAL_MS:.2f} x the goal); "
          f"timed on a shared 2-core machine")


if __name__ == "__main__":
    main()
