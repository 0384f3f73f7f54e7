"""Distributed DP over REST (`privacy.dp.noise: "distributed"`): the devices noise their own ring inputs, the server
adds nothing, charges the ledger and states the mechanism on the card; the setting is refused without SecAgg+; and
devices refuse a server that lies about the survivors the noise is calibrated for, or drops the noise."""

import threading

import httpx
import numpy as np
import pytest

from fedzoo.cloud.simulation import prepare_federation
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN as ADMIN
from fedzoo.clients.errors import BadRequestError
from fedzoo.clients.participation import LocalData, participate_once
from fedzoo.dp.accountant import epsilon_after
from fedzoo.dp.distributed import MECHANISM, DistributedNoise, NoisePolicy
from fedzoo.edge.onnx_initializers import read_float_initializers
from fedzoo.errors import InvalidInputError
from fedzoo.server.fl import secure_rounds
from fedzoo.server.fl.distributed_dp import bits_needed, noise_request
from fedzoo.server.fl.schemas import RoundConfig
from fl_helpers import device_client, round_config

DEVICES = 8  # k = 6, t = 5 as in test_fl_secure_rounds.py
POLL_S = 0.05


@pytest.fixture(scope="module")
def federation():
    return prepare_federation("digits", num_clients=DEVICES, alpha=None, hidden_units=8, pretrain_epochs=1, seed=0)


def distributed_config(noise="distributed", secure=True, noise_multiplier=1.5, **overrides):
    privacy = {"dp": {"max_epsilon": 50, "delta": 1e-5, "clip_norm": 0.5, "noise_multiplier": noise_multiplier,
                      "noise": noise}}
    if secure:
        privacy["secure_aggregation"] = {"neighbour_count": 6, "stage_deadline_s": 5, "levels": 32767}
    settings = {"min_clients": 3, "target_clients": DEVICES, "deadline_s": 60, "poll_interval_s": POLL_S,
                "max_accuracy_drop": 1.0, "privacy": privacy}
    return round_config(**{**settings, **overrides})


def sdk_round(simulation, federation, config, policy=NoisePolicy()):
    """Every device runs the SDK's own participation (train, clip, noise, the five stages), concurrently."""
    round_id = simulation.start_plan(config)
    results = [None] * DEVICES

    def device(index):
        shard = federation.shards[index]
        client = device_client(simulation, index)
        client.noise_policy = policy
        results[index] = participate_once(client, federation.card.task,
                                          LocalData(federation.pool.x[shard], federation.pool.y[shard]), seed=index)

    threads = [threading.Thread(target=device, args=(index,), daemon=True) for index in range(DEVICES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return round_id, results, simulation.admin.wait_for_round(round_id, timeout_s=60)


def test_a_distributed_dp_round_publishes_a_card_with_the_accountants_epsilon(simulation, federation, monkeypatch):
    """The round closes with no server noise at all (the server's noise mechanism would fail the round if used) and
    the card states the accountant's epsilon for the charged z, the mechanism and what it is calibrated for."""

    def no_server_noise(*_args, **_kwargs):
        raise AssertionError("the server must not add noise in a distributed-DP round")

    monkeypatch.setattr(secure_rounds, "DpFedAvg", no_server_noise)
    _, results, view = sdk_round(simulation, federation, distributed_config())
    assert [result.outcome for result in results] == ["accepted"] * DEVICES
    assert view["state"] == "closed", view["outcome"]
    card = simulation.admin.card(view["result_model_id"])
    dp = card.details["federated"]["privacy"]["dp"]
    assert (dp["rounds"], dp["noise_multiplier"], dp["mechanism"]) == (1, 1.5, MECHANISM)
    assert dp["epsilon"] == pytest.approx(epsilon_after(1, 1.5, 1.0, 1e-5, "rdp"))
    assert dp["equivalent_noise_multiplier"] >= 1.5  # the devices' summed noise is worth at least what was charged
    assert dp["equivalent_noise_multiplier"] == pytest.approx(1.5, rel=0.01)
    assert dp["calibrated_survivors"] == 3  # the floor of 5 survivors (t) less the 2 corrupt devices withstood
    assert dp["bits_needed"] <= dp["ring_bits"] == 32
    assert dp["sensitivity"] == pytest.approx(0.5, rel=0.01)  # levels 32767: rounding adds almost nothing
    # the devices did add the noise the card claims: a mean of deltas clipped to 0.5 moves the weights at most 0.5
    # (and a hair of rounding); the noise summed over 8 devices (sigma at least 1.5 x 0.5 per coordinate on the sum, of
    # 610 weights) moves them several times that. A server that left the noise request out of the task (the devices
    # then add none) published noiseless weights under this card
    base = read_float_initializers(federation.model)
    published = read_float_initializers(simulation.admin.download_model(card).read_bytes())
    step = np.sqrt(sum(float(np.sum((published[name] - base[name]) ** 2)) for name in base))
    assert step > 2 * 0.5, step
    # the model line counts the round released: a plan on the published weights whose one round would pass the
    # line's lifetime budget (10 on this server) is refused stating what the line has already spent
    with pytest.raises(BadRequestError) as refused:
        simulation.start_plan(distributed_config(noise_multiplier=0.3, model_id=card.id))
    assert refused.value.field == "privacy.dp.max_epsilon"
    assert f"the line has spent {epsilon_after(1, 1.5, 1.0, 1e-5, 'rdp'):.3f}" in str(refused.value)


def test_distributed_noise_without_secure_aggregation_or_in_too_small_a_ring_is_refused_naming_the_field(simulation):
    """No SecAgg+: no ring to noise in. A 16-bit ring (levels 127, 8 devices) whose noised sums need more bits at a
    large noise multiplier. Both 422 naming the field; an unknown noise mode too; and without the admin token, 401."""
    base = {"model_id": simulation.federation.card.id, "evaluation_sha256": simulation.evaluation_sha256}
    small_ring = distributed_config(noise_multiplier=900, max_accuracy_drop=1.0)
    small_ring["privacy"]["secure_aggregation"]["levels"] = 127
    small_ring["privacy"]["dp"]["max_epsilon"] = 1000
    unknown = distributed_config()
    unknown["privacy"]["dp"]["noise"] = "local"
    with httpx.Client(base_url=simulation.server_url, headers={"Authorization": f"Bearer {ADMIN}"}) as admin:
        for config, field in ((distributed_config(secure=False), "privacy.dp.noise"),
                              (small_ring, "privacy.secure_aggregation.levels"), (unknown, "privacy.dp.noise")):
            answer = admin.post("/v1/fl/rounds", json={**base, **config})
            assert answer.status_code == 422, answer.text
            assert answer.json()["error"]["field"] == field
    anonymous = httpx.post(f"{simulation.server_url}/v1/fl/rounds", json={**base, **distributed_config()})
    assert anonymous.status_code == 401


def test_a_server_calibrating_for_more_survivors_than_it_unmasks_is_refused_by_every_device(simulation, federation,
                                                                                           monkeypatch):
    """The lying server asks each device for the share of the whole cohort (8) while a sum at the signed config's
    floor (5) may hold only 3 honest inputs (2 may be the server's, adding no noise): it would carry 3/8 of the
    accounted variance. Every device refuses."""
    lying = lambda config, protocol: DistributedNoise(config.privacy.dp.noise_multiplier,  # noqa: E731
                                                      protocol.num_clients)
    monkeypatch.setattr(secure_rounds, "noise_request", lying)
    round_id, results, view = sdk_round(simulation, federation, distributed_config(deadline_s=15))
    assert [result.outcome for result in results] == ["refused: noise_survivors_above_floor"] * DEVICES
    assert view["state"] == "failed" and view["result_model_id"] is None
    participants = httpx.get(f"{simulation.server_url}/v1/fl/rounds/{round_id}/participants",
                             headers={"Authorization": f"Bearer {ADMIN}"}).json()["participants"]
    assert {entry["reason"].split(":")[0] for entry in participants} == {"noise_survivors_above_floor"}


def test_devices_that_require_their_own_noise_refuse_a_round_where_the_server_adds_it(simulation, federation):
    _, results, view = sdk_round(simulation, federation, distributed_config(noise="central", deadline_s=15),
                                 NoisePolicy(require_distributed=True))
    assert [result.outcome for result in results] == ["refused: noise_not_distributed"] * DEVICES
    assert view["state"] == "failed" and view["result_model_id"] is None


def test_a_server_claiming_fewer_survivors_than_the_noise_is_calibrated_for_gets_no_share(simulation, federation,
                                                                                         monkeypatch):
    """The lying server tells each device that only floor - 1 devices survived, so that it could unmask a sum with
    less than the accounted noise: every device checks the count against its signed config's floor before it reveals
    a share (`too_few_survivors`), and the round fails with no output."""

    class FewerSurvivors(secure_rounds.SecAggServer):
        def collect_masked_inputs(self, replies):
            requests = super().collect_masked_inputs(replies)
            floor = self.config.minimum_survivors
            return {client: dict(request, survivors=sorted({client, *sorted(requests)[:floor - 2]}))
                    for client, request in requests.items()}

    monkeypatch.setattr(secure_rounds, "SecAggServer", FewerSurvivors)
    _, results, view = sdk_round(simulation, federation, distributed_config(deadline_s=15))
    assert [result.outcome for result in results] == ["refused: too_few_survivors"] * DEVICES
    assert view["state"] == "failed" and view["result_model_id"] is None


def test_the_planned_ring_holds_the_whole_selection_goal_over_selection_included():
    """`check_planned_ring` sizes the ring for the selection goal, ceil(target x (1 + over_selection)) devices: at
    levels where the target's noised sums fit the 16-bit ring but the goal's could wrap, the plan is refused."""
    vector_length = 1000
    plan = {**distributed_config(target_clients=20, over_selection=0.5, noise_multiplier=0.05), "model_id": "m",
            "evaluation_sha256": "0" * 64}
    plan["privacy"]["secure_aggregation"]["levels"] = 1040
    config = RoundConfig.model_validate(plan)

    def fits(cohort: int) -> bool:
        protocol = secure_rounds.secagg_config(config.privacy.secure_aggregation, 0, cohort, vector_length,
                                               config.privacy.dp.clip_norm, config.min_clients)
        return bits_needed(protocol, noise_request(config, protocol)) <= protocol.modulus_bits

    assert fits(10) and fits(20) and not fits(30)  # the plan sits on the boundary this test is about
    with pytest.raises(InvalidInputError) as refused:
        secure_rounds.check_planned_ring(config, vector_length)
    assert refused.value.field == "privacy.secure_aggregation.levels"
    secure_rounds.check_planned_ring(config.model_copy(update={"over_selection": 0.0}), vector_length)
