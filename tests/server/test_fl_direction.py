"""Robust by default (issue 48): a plan that names no robustness setting leaves out an insider whose update points
away from the round's median delta, says which defences each round ran and which it could not, and still
publishes honest rounds. Real server on loopback, real SQLite, real onnxruntime, real digits data, the real
attack class of the bench."""

from __future__ import annotations

import sqlite3

import numpy as np
from fl_helpers import honest_delta, round_config, selected_tasks, upload

from fedzoo.cloud.attacks import WeightGrabAttack
from fedzoo.edge.local_training import train_locally
from fedzoo.edge.onnx_initializers import read_float_initializers
from fedzoo.server.fl.schemas import RoundConfig
from fedzoo.server.fl.stages.screening import round_defences
from fedzoo.update_codec import split_statistics

SHA = "a" * 64


def _trained_delta(federation, task, index, attack=None):
    """The delta device `index` trains on its shard (or on what `attack` makes of it), as the SDK trains."""
    data = federation.client_data(index)
    if attack is not None:
        data = attack.poison(data)
    delta, _ = train_locally(federation.training_graph, federation.model, federation.card, task["training"], data,
                             seed=index)
    delta = split_statistics(delta)[0]
    return attack(delta) if attack is not None else delta


def _rows(server, round_id):
    with sqlite3.connect(server.data_dir / "registry.db") as connection:
        return connection.execute(
            "SELECT device_id, delta_norm, screening, screening_reason, counted_norm, aggregation_weight "
            "FROM fl_updates WHERE round_id = ? ORDER BY id", (round_id,)).fetchall()


def test_a_flipped_scaled_insider_is_left_out_by_default_and_the_honest_part_published(simulation, federation,
                                                                                       server):
    # no robustness setting at all: what an operator writes without reading docs/federated-rounds.md
    round_id = simulation.start_plan(round_config(min_clients=3, target_clients=4))
    devices, tasks = selected_tasks(simulation, 4)
    honest = [_trained_delta(federation, task, index) for index, task in enumerate(tasks[:3])]
    for index, delta in enumerate(honest):
        upload(devices[index], tasks[index], delta, num_examples=len(federation.shards[index]))
    # issue 48's insider: its shard tiled to the 10,000-example cap, the delta flipped and scaled x 3
    insider = _trained_delta(federation, tasks[3], 3, WeightGrabAttack(claim=10_000, scale=3.0))
    upload(devices[3], tasks[3], insider, num_examples=10_000)

    view = simulation.admin.fl_round(round_id)
    assert view["state"] == "closed", view["outcome"]
    rows = {row[0]: row for row in _rows(server, round_id)}
    left_out = rows.pop("sim-device-3")
    assert left_out[2] == "rejected" and left_out[5] is None
    assert "with the round's median delta" in left_out[3] and "left out" in left_out[3]
    assert all(row[2] in ("counted", "clipped") and row[5] > 0 for row in rows.values())
    # the published model is the base plus the honest updates' recorded mean, nothing of the insider's
    sent = dict(zip((f"sim-device-{index}" for index in range(3)), honest))
    total = sum(row[5] for row in rows.values())
    base = read_float_initializers(federation.model)
    published = read_float_initializers(simulation.admin.download_model(
        simulation.admin.card(view["result_model_id"])).read_bytes())
    for name, value in published.items():
        expected = base[name] + sum(row[5] * row[4] / row[1] * sent[device][name]
                                    for device, row in rows.items()) / total
        np.testing.assert_allclose(value, expected, atol=1e-5)
    outcome = view["outcome"]
    assert outcome["direction_screening"]["left_out"] == 1 and outcome["direction_screening"]["median_cosine"] > 0
    assert {"norm_bound", "weight_bound", "direction_screening", "quarantine", "gate_best"} <= set(
        outcome["defences"]["ran"])
    assert "no root set" in outcome["defences"]["not_run"]["root_trust"]
    assert simulation.admin.card(view["result_model_id"]).details["federated"]["defences"] == outcome["defences"]


def test_honest_rounds_still_publish_with_the_defaults(simulation, federation):
    # the default gate (2 points below the plan's best) and every default defence; real training on every shard
    round_id = simulation.start_plan(round_config(min_clients=4, target_clients=4, max_accuracy_drop=0.02))
    devices, tasks = selected_tasks(simulation, 4)
    for index, (device, task) in enumerate(zip(devices, tasks)):
        upload(device, task, _trained_delta(federation, task, index), num_examples=len(federation.shards[index]))
    view = simulation.admin.fl_round(round_id)
    assert view["state"] == "closed", view["outcome"]
    assert view["outcome"]["direction_screening"]["left_out"] == 0
    assert view["outcome"]["aggregated_updates"] == 4


def test_a_round_too_small_for_a_median_says_the_screening_did_not_run(simulation, federation):
    round_id = simulation.start_plan(round_config(min_clients=2, target_clients=2))
    devices, tasks = selected_tasks(simulation, 2)
    upload(devices[0], tasks[0], honest_delta(federation.model, 0.001))
    upload(devices[1], tasks[1], honest_delta(federation.model, -0.002))  # opposed: the median of two is their mean
    outcome = simulation.admin.fl_round(round_id)["outcome"]
    assert "direction_screening" not in outcome and outcome["aggregated_updates"] == 2
    assert "direction_screening" not in outcome["defences"]["ran"]
    assert "at least 3" in outcome["defences"]["not_run"]["direction_screening"]


def _config(**overrides) -> RoundConfig:
    return RoundConfig(model_id="m", min_clients=3, target_clients=3, deadline_s=60, evaluation_sha256=SHA,
                       **overrides)


def test_the_defences_named_for_private_turned_off_and_configured_rounds():
    private = round_defences(_config(privacy={"secure_aggregation": {}}), None)
    assert private["ran"] == ["sum_envelope", "gate_best"]
    assert "sees only the sum" in private["not_run"]["direction_screening"]
    assert "no root set" in private["not_run"]["aggregate_check"]
    checked = round_defences(_config(privacy={"secure_aggregation": {}}, root_trust={"root_sha256": SHA}), None)
    assert "aggregate_check" in checked["ran"] and "aggregate_check" not in checked["not_run"]
    off = round_defences(_config(direction_screening=None, quarantine=None, gate={"compare_with": "parent"}), 20)
    assert off["ran"] == ["norm_bound", "weight_bound", "gate_parent"]
    assert "direction_screening: null" in off["not_run"]["direction_screening"]
    assert "quarantine: null" in off["not_run"]["quarantine"]
    configured = round_defences(_config(root_trust={"root_sha256": SHA}), 20)
    assert configured == {"ran": ["norm_bound", "weight_bound", "direction_screening", "root_trust", "quarantine",
                                  "gate_best"], "not_run": {}}

