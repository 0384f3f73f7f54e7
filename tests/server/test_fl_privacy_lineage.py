"""Epsilon follows the weights: re-published and derived weights of a DP model continue its ledger, a plan without
DP on them is refused, delta is bounded, and adaptive clipping runs on the server through fedzoo.dp."""

import hashlib

import httpx
import numpy as np
import pytest

from fedzoo.cards import ModelCard
from fedzoo.cloud.simulation import prepare_federation
from fedzoo.dp.accountant import epsilon_of_events
from fedzoo.edge.onnx_initializers import read_float_initializers
from fedzoo.edge.trainer import write_parameters
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN
from fl_helpers import device_client, honest_delta, round_config, upload

ADMIN = DEFAULT_ADMIN_TOKEN
DP = {"max_epsilon": 8, "delta": 1e-5, "clip_norm": 0.1, "noise_multiplier": 2.0}

LOOPBACK_SERVER_OPTIONS = {"deadline_check_s": 0.2}  # conftest's `server` (under its `simulation`)


@pytest.fixture(scope="module")
def federation():
    return prepare_federation("digits", num_clients=3, alpha=None, hidden_units=8, pretrain_epochs=1, seed=0)


def _plan(model_id, private=True, **dp):
    return round_config(model_id=model_id, min_clients=3, target_clients=3, num_rounds=1, max_accuracy_drop=1.0,
                        privacy={"dp": {**DP, **dp}} if private else {})


def _run_round(simulation, federation, round_id, scale=0.05):
    for index in range(3):
        client = device_client(simulation, index)
        task = client.fl_task(federation.card.task)["task"]
        model = client.download(task["model_url"], task["model_sha256"]).read_bytes()
        upload(client, task, honest_delta(model, scale))
    view = simulation.admin.wait_for_round(round_id, timeout_s=60)
    assert view["state"] == "closed", view["outcome"]
    return view


def _publish(simulation, card: ModelCard, onnx_bytes: bytes) -> None:
    simulation.admin.publish_model(card, {card.sha256: onnx_bytes}, ADMIN)


def _post_plan(simulation, plan):
    with httpx.Client(base_url=simulation.admin.http.base_url, headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        return http.post("/v1/fl/rounds", json={**plan, "evaluation_sha256": simulation.evaluation_sha256})


def test_reissued_and_derived_weights_continue_the_dp_ledger_and_refuse_plain_plans(simulation, federation):
    first_view = _run_round(simulation, federation, simulation.start_plan(_plan(federation.card.id)))
    first = simulation.admin.card(first_view["result_model_id"])
    onnx_bytes = simulation.admin.download(f"/v1/models/{first.id}/blob", first.sha256).read_bytes()
    spent = first.details["federated"]["privacy"]["dp"]["line_events"]
    # the same weights under a new card, without the claim (a re-publication, or a re-import of the blob)
    reissued = first.model_copy(update={"id": "reissued-weights", "version": 1, "parent_id": None, "line": None,
                                        "details": {}, "signature": None})
    _publish(simulation, reissued, onnx_bytes)
    # weights derived from the DP model (a fine-tuned, pruned or INT8 child names it as its parent)
    parameters = {name: value * np.float32(0.99) for name, value in read_float_initializers(onnx_bytes).items()}
    derived_bytes = write_parameters(onnx_bytes, parameters)
    derived = first.model_copy(update={"id": "derived-weights", "version": 1, "parent_id": first.id, "line": None,
                                       "details": {}, "signature": None, "size_bytes": len(derived_bytes),
                                       "sha256": hashlib.sha256(derived_bytes).hexdigest()})
    _publish(simulation, derived, derived_bytes)

    for card in (first, reissued, derived):  # noiseless rounds on DP weights would sit under a finite epsilon
        refused = _post_plan(simulation, _plan(card.id, private=False))
        assert refused.status_code == 422 and refused.json()["error"]["field"] == "privacy.dp", refused.text
        assert federation.card.id in refused.json()["error"]["message"]

    events = list(spent)
    for card in (reissued, derived):
        view = _run_round(simulation, federation, simulation.start_plan(_plan(card.id)))
        claim = simulation.admin.card(view["result_model_id"]).details["federated"]["privacy"]["dp"]
        events = [*events, [2.0, 1.0, 1]]
        assert claim["line"] == federation.card.id and claim["line_events"] == events
        assert claim["epsilon"] == pytest.approx(epsilon_of_events(events, 1e-5))


def test_delta_defaults_below_one_over_the_fleet_squared_and_is_refused_above_the_limit(simulation, federation):
    too_large = _post_plan(simulation, _plan(federation.card.id, delta=1e-3))
    assert too_large.status_code == 422 and too_large.json()["error"]["field"] == "privacy.dp.delta"
    plan = _plan(federation.card.id)
    del plan["privacy"]["dp"]["delta"]
    opened = _post_plan(simulation, plan)
    assert opened.status_code == 201, opened.text
    assert opened.json()["config"]["privacy"]["dp"]["delta"] == pytest.approx(min(1e-5, 1 / 3**2))


def test_adaptive_clipping_on_the_server_moves_the_norm_and_charges_the_count(simulation, federation):
    adaptive = {"target_unclipped_quantile": 0.5, "clip_learning_rate": 0.5, "clipped_count_stddev": 2.0}
    distributed = _plan(federation.card.id, adaptive=adaptive, noise="distributed")
    distributed["privacy"]["secure_aggregation"] = {"neighbour_count": 2, "threshold": 2}
    refused = _post_plan(simulation, distributed)  # the devices' noise would leave the count un-noised
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "privacy.dp.adaptive"
    assert "distributed" in refused.json()["error"]["message"]
    too_little = _post_plan(simulation, _plan(federation.card.id, adaptive={**adaptive, "clipped_count_stddev": 0.5}))
    assert too_little.status_code == 422
    assert too_little.json()["error"]["field"] == "privacy.dp.adaptive.clipped_count_stddev"

    plan = _plan(federation.card.id, adaptive=adaptive) | {"num_rounds": 2}
    round_id = simulation.start_plan(plan)
    view = _run_round(simulation, federation, round_id, scale=0.05)  # every delta is longer than 0.1: all clipped
    claim = view["outcome"]["privacy"]["dp"]
    # nobody was within the bound: the centred sum is 0 - 3/2, doubled -3, plus integer noise, over 2 x 3 devices
    fraction = claim["noised_unclipped_fraction"]
    assert (fraction - 0.5) * 2 * 3 + 3 == pytest.approx(round((fraction - 0.5) * 2 * 3 + 3), abs=1e-9)
    assert claim["next_clip_norm"] == pytest.approx(0.1 * np.exp(-0.5 * (fraction - 0.5)))
    assert claim["delta_noise_multiplier"] == pytest.approx((2.0**-2 - 4.0**-2) ** -0.5)
    assert claim["clipped_count_stddev"] == 2.0  # the count's noise the card says was charged: the plan's
    following = simulation.admin.fl_round(view["next_round_id"])
    assert following["config"]["privacy"]["dp"]["clip_norm"] == pytest.approx(claim["next_clip_norm"])
    task = device_client(simulation, 0).fl_task(federation.card.task)["task"]
    assert task["privacy"]["clip_norm"] == pytest.approx(claim["next_clip_norm"])


def test_a_dp_model_imported_from_another_server_continues_its_lines_spent_epsilon(simulation, federation):
    """The attack: carry a DP model to a server that never saw its line, hoping for a fresh budget there. The
    card's claim (14 rounds at z=2 spent elsewhere, epsilon 9.89 of the line's lifetime 10) seeds the new line, so
    one more round is refused; and the claim's delta binds a plan on it."""
    onnx_bytes = simulation.admin.download(f"/v1/models/{federation.card.id}/blob",
                                           federation.card.sha256).read_bytes()
    parameters = {name: value * np.float32(0.99) for name, value in read_float_initializers(onnx_bytes).items()}
    imported_bytes = write_parameters(onnx_bytes, parameters)
    events = [[2.0, 1.0, 14]]
    claim = {"line": "line-of-another-server", "line_events": events, "delta": 1e-5, "accountant": "rdp",
             "epsilon": epsilon_of_events(events, 1e-5)}
    assert 9.8 < claim["epsilon"] < 10.0
    imported = federation.card.model_copy(update={
        "id": "imported-dp-model", "version": 1, "parent_id": None, "line": None, "signature": None,
        "details": {"federated": {"privacy": {"dp": claim}}}, "size_bytes": len(imported_bytes),
        "sha256": hashlib.sha256(imported_bytes).hexdigest()})
    _publish(simulation, imported, imported_bytes)

    refused = _post_plan(simulation, _plan(imported.id))
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "privacy.dp.max_epsilon", refused.text
    assert "lifetime budget" in refused.json()["error"]["message"]
    other_delta = _post_plan(simulation, _plan(imported.id, delta=1e-6))
    assert other_delta.status_code == 422, other_delta.text
    assert other_delta.json()["error"]["field"] == "privacy.dp.delta"
    with httpx.Client(base_url=simulation.admin.http.base_url, headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        assert http.get("/v1/fl/rounds").json()["rounds"] == []  # nothing opened


def test_a_large_fleets_default_delta_is_below_one_over_its_size_squared(simulation, federation):
    """Above 316 devices 1/n^2 is below 1e-5: the default follows the fleet, so delta stays far below one over n."""
    enrollment = simulation.admin.create_enrollment_token(ADMIN, max_uses=400)["token"]
    with httpx.Client(base_url=simulation.admin.http.base_url) as http:
        for index in range(400):
            profile = {"device_id": f"fleet-{index}", "platform": "linux-x86_64", "memory_mb": 2048,
                       "cpu": {"model": "virtual", "cores": 1}, "runtime": {"onnxruntime": "simulated", "threads": 1}}
            assert http.post("/v1/devices", json=profile, headers={"Authorization": f"Bearer {enrollment}"}
                             ).status_code == 201
    plan = _plan(federation.card.id)
    del plan["privacy"]["dp"]["delta"]
    opened = _post_plan(simulation, plan)
    assert opened.status_code == 201, opened.text
    assert opened.json()["config"]["privacy"]["dp"]["delta"] == pytest.approx(403 ** -2.0)
