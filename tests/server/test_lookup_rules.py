"""The lookup's one SQL query against the rules written out in Python: for random registries,
devices, telemetry and budgets, both choose the same model and runner-up with the same latency."""

from __future__ import annotations

import random
from statistics import median

import pytest
from sqlalchemy import select
from server_helpers import REFERENCE_CALIBRATION_MS, device_profile, make_card, tiny_onnx_model

from fedzoo.device import DeviceProfile
from fedzoo.server import devices, migrations, registry
from fedzoo.server.blobstore import FileBlobStore
from fedzoo.server.db import Database
from fedzoo.server.errors import NoModelFits, NotFound
from fedzoo.server.latency import CalibrationScalingEstimator
from fedzoo.server.lookup import LookupQuery, estimate_memory_mb, lookup
from fedzoo.server.tables import ClassLatencyCalibration, DeviceRecord, ModelRecord

CLASSES = ["pi4", "phone", None]


def effective_scale(session, device_id):
    """The device's scale as telemetry left it, times its class's factor while it has no telemetry."""
    record = session.get(DeviceRecord, device_id)
    by_class = session.get(ClassLatencyCalibration, record.device_class or "")
    if record.latency_reports == 0 and by_class is not None:
        return record.scale_0 * by_class.factor_0
    return record.scale_0


def model_factors(session):
    """Each model's fleet latency factor as telemetry left it (1 where there is none)."""
    return {model_id: factor or 1.0 for model_id, factor in session.execute(
        select(ModelRecord.id, ModelRecord.latency_factor))}


def expected_choice(cards, scale, factors, profile, measured, query):
    """The rules of fedzoo.server.latency and lookup, evaluated directly."""
    estimator = CalibrationScalingEstimator(REFERENCE_CALIBRATION_MS)
    rows = []
    for card in cards:
        if card.task != query.task or (query.precision and card.precision != query.precision):
            continue
        if card.id in measured:
            latency = median(measured[card.id])
        elif profile.device_class in card.latency_ms:
            latency = card.latency_ms[profile.device_class].median_ms
        else:
            latency = factors[card.id] * estimator.model_costs(card, b"").reference_ms * scale
        rows.append((card, latency))
    if not rows:
        return "404"
    budget_mb = query.memory_budget_mb if query.memory_budget_mb is not None else profile.memory_mb
    fitting = [(card, latency) for card, latency in rows
               if latency <= query.latency_budget_ms and estimate_memory_mb(card) <= budget_mb
               and (query.min_accuracy is None or card.metrics.accuracy >= query.min_accuracy)]
    if not fitting:
        return "409"
    fitting.sort(key=lambda item: (-item[0].metrics.accuracy, item[1], item[0].id))
    return [(card.id, pytest.approx(latency)) for card, latency in fitting[:2]]


def test_the_query_applies_the_documented_rules(tmp_path):
    rng = random.Random(7)
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    migrations.upgrade(url)
    database = Database(url)
    store = FileBlobStore(tmp_path / "blobs")
    estimator = CalibrationScalingEstimator(REFERENCE_CALIBRATION_MS)
    blobs = [tiny_onnx_model(seed=seed, hidden=4 + 200 * seed) for seed in range(3)]  # different sizes
    for blob in blobs:
        store.put(blob)
    cards = []
    with database.session() as session:
        for index in range(40):
            blob = rng.choice(blobs)
            latency_ms = {cls: {"median_ms": rng.uniform(0.5, 30), "source": "measured"}
                          for cls in ("pi4", "phone") if rng.random() < 0.3}
            card = make_card(blob, f"m{index}", round(rng.uniform(0.5, 0.99), 2), rng.randint(10_000, 40_000_000),
                             task=rng.choice(["digits", "mnist"]), precision=rng.choice(["fp32", "int8"]),
                             latency_ms=latency_ms)
            registry.publish(session, store, estimator, card)
            cards.append(card)
        profiles, tokens, measured = [], [], []
        for index in range(6):
            profile = DeviceProfile.model_validate(device_profile(
                f"d{index}", slowdown=rng.uniform(0.3, 4), device_class=rng.choice(CLASSES),
                memory_mb=rng.choice([17, 18, 64, 4096]),
            ))
            tokens.append(devices.register(session, estimator, profile).token)
            profiles.append(profile)
            reports: dict[str, list[float]] = {}
            for card in rng.sample(cards, 8):
                for _ in range(rng.randint(1, 3)):
                    value = rng.uniform(0.5, 40)
                    devices.report_latency(session, profile.device_id, card.id, value, None, None, groups=1)
                    reports.setdefault(card.id, []).append(value)
            measured.append(reports)

    outcomes = set()
    with database.session() as session:
        for _ in range(300):
            index = rng.randrange(len(profiles))
            query = LookupQuery(
                task=rng.choice(["digits", "mnist", "speech"]), latency_budget_ms=rng.uniform(0.5, 50),
                memory_budget_mb=rng.choice([None, 17.0, 64.0]), min_accuracy=rng.choice([None, 0.7, 0.9]),
                precision=rng.choice([None, "fp32", "int8"]),
            )
            scale = effective_scale(session, profiles[index].device_id)
            expected = expected_choice(cards, scale, model_factors(session), profiles[index], measured[index], query)
            device = devices.authenticate(session, tokens[index])
            try:
                result = lookup(session, device, query)
            except NotFound:
                actual = "404"
            except NoModelFits:
                actual = "409"
            else:
                actual = [(candidate.model_id, candidate.latency_ms)
                          for candidate in (result.chosen, result.runner_up) if candidate is not None]
            assert actual == expected, query
            outcomes.add(actual if isinstance(actual, str) else len(actual))
    database.dispose()
    assert outcomes == {"404", "409", 1, 2}  # every kind of answer was exercised
