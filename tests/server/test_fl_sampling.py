"""Random check-ins on the server (fedzoo.server.fl.sampling): a DP plan with sampling_probability q < 1 seats each
device by a secret coin drawn once a round, the noise is calibrated for q, and a sampled round closes selection
with its window (or once everyone drew) and publishes; real SDK devices over a loopback server."""

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import httpx
import pytest

from fedzoo.cloud.simulation import prepare_federation
from fedzoo.dp.accountant import epsilon_after, noise_multiplier_for
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN
from fl_helpers import device_client, honest_delta, round_config, upload

DP = {"max_epsilon": 8, "delta": 1e-5, "clip_norm": 0.1}
ALMOST_ALWAYS = 0.999999  # sampled (q < 1), yet a device's tails is a one-in-a-million event

LOOPBACK_SERVER_OPTIONS = {"deadline_check_s": 0.2}  # conftest's `server` (under its `simulation`)


@pytest.fixture(scope="module")
def federation():
    return prepare_federation("digits", num_clients=3, alpha=None, hidden_units=8, pretrain_epochs=1, seed=0)


def _post_plan(simulation, plan):
    with httpx.Client(base_url=simulation.admin.http.base_url,
                      headers={"Authorization": f"Bearer {DEFAULT_ADMIN_TOKEN}"}, timeout=60) as http:
        return http.post("/v1/fl/rounds", json={**plan, "evaluation_sha256": simulation.evaluation_sha256})


def _plan(model_id, **overrides):
    dp = {**DP, **overrides.pop("dp", {})}
    return round_config(**{"model_id": model_id, "min_clients": 2, "target_clients": 2, "num_rounds": 1,
                           "privacy": {"dp": dp}, **overrides})


def test_bad_sampling_plans_are_refused_naming_the_field(simulation, federation):
    model_id = federation.card.id
    for probability in (0, -0.1, 1.5):
        refused = _post_plan(simulation, _plan(model_id, dp={"sampling_probability": probability}))
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["field"] == "privacy.dp.sampling_probability"
    with_secagg = _plan(model_id, dp={"sampling_probability": 0.5}, min_clients=3, target_clients=3)
    with_secagg["privacy"]["secure_aggregation"] = {"neighbour_count": 2, "threshold": 2}
    refused = _post_plan(simulation, with_secagg)
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "privacy.dp.sampling_probability"
    assert "secure aggregation" in refused.json()["error"]["message"]
    late_window = _plan(model_id, dp={"sampling_probability": 0.5}, selection_window_s=60, deadline_s=60)
    refused = _post_plan(simulation, late_window)
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "selection_window_s"


def test_sampling_calibrates_less_noise_for_the_same_epsilon(simulation, federation):
    opened = _post_plan(simulation, _plan(federation.card.id, num_rounds=30, dp={"sampling_probability": 0.2}))
    assert opened.status_code == 201, opened.text
    z = opened.json()["config"]["privacy"]["dp"]["noise_multiplier"]
    assert z == pytest.approx(noise_multiplier_for(8, 1e-5, 30, 0.2), rel=1e-6)
    assert z < 0.5 * noise_multiplier_for(8, 1e-5, 30, 1.0)  # amplification by sampling: far less noise


def test_a_device_cannot_reroll_its_coin_and_selection_closes_once_everyone_drew(simulation, federation):
    round_id = simulation.start_plan(_plan(federation.card.id, dp={"sampling_probability": 0.5},
                                           selection_window_s=60, deadline_s=120))
    outcomes = {index: set() for index in range(3)}
    with ThreadPoolExecutor(max_workers=6) as pool:  # first check-ins at once: one coin each all the same
        for index in range(3):
            answers = pool.map(lambda _: device_client(simulation, index).fl_task(federation.card.task), range(6))
            outcomes[index].update(answer["task"] is not None for answer in answers)
    for _ in range(25):  # with a fresh coin each time, a device would see both outcomes (1 - 2^-24)
        for index in range(3):
            answer = device_client(simulation, index).fl_task(federation.card.task)
            outcomes[index].add(answer["task"] is not None)
            if answer["task"] is None:
                assert f"not sampled for round {round_id}" in answer["reason"]
                assert answer["retry_after_s"] > 0
    assert all(len(seen) == 1 for seen in outcomes.values()), outcomes
    # all three registered devices have their coin: selection closed long before its 60 s window
    assert simulation.admin.fl_round(round_id)["state"] == "collecting"


def test_a_sampled_round_closes_its_window_aggregates_and_states_q(simulation, federation):
    round_id = simulation.start_plan(_plan(federation.card.id, dp={"sampling_probability": ALMOST_ALWAYS},
                                           selection_window_s=1.5, deadline_s=60))
    for index in range(2):  # the third device does not check in: the window, not the fleet, closes selection
        client = device_client(simulation, index)
        task = client.fl_task(federation.card.task)["task"]
        assert task is not None and task["round_id"] == round_id
        model = client.download(task["model_url"], task["model_sha256"]).read_bytes()
        upload(client, task, honest_delta(model, 0.05))
    view = simulation.admin.wait_for_round(round_id, timeout_s=30)
    assert view["state"] == "closed", view["outcome"]
    # both seated devices uploaded, but a sampled cohort is complete only once its selection window ended
    assert (datetime.fromisoformat(view["finished_at"]) - datetime.fromisoformat(view["created_at"])
            ).total_seconds() >= 1.5
    claim = view["outcome"]["privacy"]["dp"]
    assert claim["sampling_probability"] == ALMOST_ALWAYS
    expected = epsilon_after(1, claim["noise_multiplier"], ALMOST_ALWAYS, 1e-5)
    assert claim["plan_epsilon"] == pytest.approx(expected, rel=1e-6)


def test_a_sampled_round_aggregates_once_every_seated_device_uploaded_or_declined(simulation, federation):
    round_id = simulation.start_plan(_plan(federation.card.id, dp={"sampling_probability": ALMOST_ALWAYS},
                                           selection_window_s=50, deadline_s=100))
    clients = [device_client(simulation, index) for index in range(3)]
    tasks = [client.fl_task(federation.card.task)["task"] for client in clients]
    assert all(task is not None for task in tasks)
    assert simulation.admin.fl_round(round_id)["state"] == "collecting"  # the whole fleet drew: no need to wait
    clients[2].decline_task(round_id, "unsupported_dp_clipping", "cannot clip")
    for client, task in zip(clients[:2], tasks):
        model = client.download(task["model_url"], task["model_sha256"]).read_bytes()
        upload(client, task, honest_delta(model, 0.05))
    view = simulation.admin.wait_for_round(round_id, timeout_s=30)  # long before the 50 s window's end
    assert view["state"] == "closed", view["outcome"]


def test_a_quarantined_device_does_not_hold_selection_open(simulation, federation):
    """Found by the 1,000-device bench: 32 quarantined devices never drew, so every round waited out its window."""
    plain = simulation.start_plan(round_config(model_id=federation.card.id, min_clients=2, target_clients=3,
                                               num_rounds=1, norm_bound={"action": "reject"},
                                               quarantine={"max_exclusions": 1, "window_updates": 1}))
    for index, scale in ((0, 0.001), (1, 0.002), (2, 50.0)):  # device 2's outlier is left out: quarantined
        client = device_client(simulation, index)
        upload(client, client.fl_task(federation.card.task)["task"], honest_delta(federation.model, scale))
    assert simulation.admin.wait_for_round(plain, timeout_s=60)["state"] == "closed"
    round_id = simulation.start_plan(_plan(federation.card.id, dp={"sampling_probability": ALMOST_ALWAYS},
                                           selection_window_s=50, deadline_s=100))
    for index in range(2):
        assert device_client(simulation, index).fl_task(federation.card.task)["task"] is not None
    assert simulation.admin.fl_round(round_id)["state"] == "collecting"  # no one else can be seated
