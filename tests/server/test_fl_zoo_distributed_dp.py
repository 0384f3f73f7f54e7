"""Distributed DP in zoo-wide rounds, against the real server on loopback and real SDK devices (signing keys certified
by the operator, real training in onnxruntime on sklearn digits): each subnet cohort's devices noise their own ring
inputs for z x 3 x their bound (one device can make a cohort of 3 exist), the server adds no noise to any cohort's
sum and adds a cohort of 3's shares to every subnet without one, and every zoo line is charged at z. Lying servers:
one that asks a cohort for the single-model share (z instead of 3z) is refused by devices whose noise floor is the
zoo's, one that claims fewer survivors than a cohort's noise is calibrated under gets no share, and so does one that
drops a device below a survivor floor the plan raised (`survivor_fraction`) after the devices calibrated at it."""

from __future__ import annotations

import json
import math

import pytest

from fedzoo.clients import secure_participation
from fedzoo.dp.accountant import epsilon_after
from fedzoo.dp.distributed import (MECHANISM, DistributedNoise, NoisePolicy, device_sigma_squared,
                                   noise_multiplier_of_sum, norm_bound_squared)
from fedzoo.secagg import SecAggConfig
from fedzoo.secagg.bounds import SecAggBounds
from fedzoo.server.fl import secure_rounds, zoo_privacy
from fedzoo.errors import InvalidInputError
from fedzoo.clients.http import FedzooHTTP
from fedzoo.privacy_terms import sign_privacy_terms
from fedzoo.signing import CardSigningKey
from fedzoo.server.fl.distributed_dp import bits_needed, noise_request
from fedzoo.server.fl.schemas import RoundConfig
from fedzoo.server.fl.tables import FLSecureCohort
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN as ADMIN
from test_fl_zoo_private import _refused, private_fleet, run_devices, secure_plan, stored, stored_lines
from zoo_helpers import TINY_ZOO_GROUP, zoo_members

# one test process runs every module on the session's tiny zoo (`--dist loadgroup`): built once, not once per worker
pytestmark = pytest.mark.xdist_group(TINY_ZOO_GROUP)

Z = 1.5  # the plan's noise multiplier (what the ledger charges); each device is asked for 3 x Z


def distributed_plan(fleet, stage_deadline_s: float = 60, neighbour_count: int = 2,
                     survivor_fraction: float | None = None, **overrides) -> dict:
    privacy = {"secure_aggregation": {"neighbour_count": neighbour_count, "levels": 32767,
                                      "stage_deadline_s": stage_deadline_s, "survivor_fraction": survivor_fraction},
               "dp": {"max_epsilon": 50.0, "clip_norm": 0.5, "noise_multiplier": Z, "noise": "distributed"}}
    return secure_plan(fleet, privacy=privacy, **overrides)


def with_policy(fleet, policy: NoisePolicy) -> None:
    for device in fleet["devices"]:
        device.noise_policy = policy


@pytest.mark.slow
def test_a_distributed_dp_zoo_round_noises_every_cohort_on_its_devices_and_charges_every_line(
        zoo, tmp_path, monkeypatch):  # noqa: F811
    """One device of the small tier (its subnet forms no cohort: it sits out) and three of the large: the large
    cohort's devices each noise their input for 3Z at their honest survivor floor, the server adds no noise to that
    cohort's sum (central noise would fail the round) and adds 3 shares to the small subnet's zeros; the ledger
    charges Z on every zoo model's line and each republished card states its line's epsilon."""
    requested: list[tuple[DistributedNoise, int]] = []
    server_noise: list[tuple[bool, int]] = []
    device_input, absent_steps = secure_participation.noised_ring_input, zoo_privacy.AbsentCohortNoise.steps

    def noised_ring_input(clipped, clip_norm, levels, modulus_bits, noise, source=None):
        requested.append((noise, clipped.size))
        return device_input(clipped, clip_norm, levels, modulus_bits, noise, source)

    def steps(self, formed, dimension):
        server_noise.append((formed, dimension))
        return absent_steps(self, formed, dimension)

    def no_central_noise(*_args, **_kwargs):
        raise AssertionError("the server must not add central noise in a distributed-DP round")

    monkeypatch.setattr(secure_participation, "noised_ring_input", noised_ring_input)
    monkeypatch.setattr(zoo_privacy.AbsentCohortNoise, "steps", steps)
    monkeypatch.setattr(zoo_privacy, "CentralNoise", no_central_noise)
    monkeypatch.setattr(secure_rounds, "DpFedAvg", no_central_noise)
    with private_fleet(zoo, tmp_path, {"tier-small": 1, "tier-large": 3}) as fleet:
        admin = fleet["admin"]
        with_policy(fleet, NoisePolicy(require_distributed=True, minimum_noise_multiplier=3 * Z))
        round_id = admin.create_zoo_rounds(distributed_plan(fleet), ADMIN)["id"]
        results = run_devices(fleet)
        view = admin.wait_for_round(round_id, timeout_s=300)
        [cohort] = stored(fleet, FLSecureCohort, round_id)
        lines = {row.line_id: row for row in stored_lines(fleet)}
        supernet = admin.card(view["result_model_id"]) if view["result_model_id"] else None
        republished = [admin.card(model["new_model_id"]) for model in view["outcome"]["zoo"]["models"]
                       if model["published"]]
    assert [result.outcome for result in results] == ["refused: not_in_cohort"] + ["accepted"] * 3
    assert view["state"] == "closed", view["outcome"]
    protocol = json.loads(cohort.secagg_config_json)
    honest = SecAggBounds().honest_survivors(SecAggConfig.from_dict(protocol))  # its floor less the corrupt devices
    # every cohort device noised its own input, for 3Z at the cohort's honest floor
    assert [(noise.noise_multiplier, noise.survivors, size) for noise, size in requested] == [
        (3 * Z, honest, protocol["vector_length"])] * 3
    # the server noised only the subnets without a cohort (every zoo model's subnet but the cohort's)
    assert sorted(formed for formed, _ in server_noise) == [False] * (len(zoo_members(zoo)) - 1) + [True]
    assert protocol["vector_length"] in {dimension for formed, dimension in server_noise if formed}
    claim = supernet.details["federated"]["privacy"]["dp"]
    assert (claim["mechanism"], claim["noise_multiplier"], claim["device_noise_multiplier"]) == (MECHANISM, Z, 3 * Z)
    assert claim["cohort_floor"] == 3 and claim["rounds"] == 1
    assert claim["epsilon"] == pytest.approx(epsilon_after(1, Z, 1.0, claim["delta"], "rdp"))
    assert view["sat_out_devices"] is None and view["selected_devices"] is None  # DP: no membership-dependent count
    for member in zoo_members(zoo):  # every zoo model's line charged once at Z, republished or not
        assert json.loads(lines[member.line_id].events_json) == [[Z, 1.0, 1]]
    assert republished, "at least one zoo model passes the open gate"
    for card in republished:
        stated = card.details["federated"]["privacy"]["dp"]
        assert stated["line"] == card.line_id and stated["mechanism"] == MECHANISM
        assert stated["epsilon"] == pytest.approx(lines[card.line_id].epsilon) == pytest.approx(claim["epsilon"])


def assert_every_device_refuses(fleet, reason: str) -> None:
    """A distributed-DP zoo round on `fleet`'s 3 devices: every device refuses for `reason`, and the round fails with
    no output."""
    round_id = fleet["admin"].create_zoo_rounds(distributed_plan(fleet, deadline_s=30, stage_deadline_s=6),
                                                ADMIN)["id"]
    results = run_devices(fleet)
    view = fleet["admin"].wait_for_round(round_id, timeout_s=120)
    assert [result.outcome for result in results] == [f"refused: {reason}"] * 3
    assert view["state"] == "failed" and view["result_model_id"] is None


@pytest.mark.slow
def test_a_server_asking_a_zoo_cohort_for_the_single_model_share_is_refused_by_devices_with_the_zoos_floor(
        zoo, tmp_path, monkeypatch):  # noqa: F811
    """The lying server forgets the cohort floor's factor and asks each device for Z (the noise a round of one model
    needs), which would leave a sum worth Z / 3 against the sensitivity a zoo-wide round has. Z is the server's word
    (no signed object carries it), so the device's defence is its own floor: every device refuses, no masked input
    exists and the round fails with no output."""
    lying = lambda config, protocol: DistributedNoise(config.privacy.dp.noise_multiplier,  # noqa: E731
                                                      SecAggBounds().honest_survivors(protocol))
    monkeypatch.setattr(secure_rounds, "noise_request", lying)
    with private_fleet(zoo, tmp_path, {"tier-large": 3}) as fleet:
        with_policy(fleet, NoisePolicy(minimum_noise_multiplier=3 * Z))
        assert_every_device_refuses(fleet, "noise_below_floor")


@pytest.mark.slow
def test_a_server_claiming_a_cohort_smaller_than_its_calibrated_floor_gets_no_share(zoo, tmp_path,  # noqa: F811
                                                                                    monkeypatch):
    """A cohort of 3 is calibrated for its floor of 3 survivors (1 honest); the lying server tells each device that
    only it and one other survived, to unmask a sum of two noise shares' worth: every device checks the survivors
    against its signed config's floor before it reveals a share, and the round fails with no output."""

    class FewerSurvivors(secure_rounds.SecAggServer):
        def collect_masked_inputs(self, replies):
            requests = super().collect_masked_inputs(replies)
            return {client: dict(request, survivors=sorted({client, sorted(requests)[0]}))
                    for client, request in requests.items()}

    monkeypatch.setattr(secure_rounds, "SecAggServer", FewerSurvivors)
    with private_fleet(zoo, tmp_path, {"tier-large": 3}) as fleet:
        assert_every_device_refuses(fleet, "too_few_survivors")


@pytest.mark.slow
def test_a_server_unmasking_below_a_raised_survivor_floor_gets_no_share(zoo, tmp_path, monkeypatch):  # noqa: F811
    """A cohort of 5 whose plan raises the survivor floor to all 5 (`survivor_fraction` 1): each device is asked for
    noise calibrated at 5 less its 2 tolerated corrupt devices (3 honest survivors, where the default floor of 4
    gives 2), so the lying server drops one device's input and tells the other 4 they are the survivors, a sum the
    default floor would unmask with less noise than charged: each of the 4 checks its signed floor of 5 and
    refuses, the dropped one is not a survivor, and the round fails with no output."""
    requested: list[DistributedNoise] = []
    device_input = secure_participation.noised_ring_input

    def noised_ring_input(clipped, clip_norm, levels, modulus_bits, noise, source=None):
        requested.append(noise)
        return device_input(clipped, clip_norm, levels, modulus_bits, noise, source)

    class OneDropped(secure_rounds.SecAggServer):
        def collect_masked_inputs(self, replies):
            requests = super().collect_masked_inputs(replies)
            survivors = sorted(requests)[:-1]
            return {client: dict(request, survivors=survivors) for client, request in requests.items()}

    monkeypatch.setattr(secure_participation, "noised_ring_input", noised_ring_input)
    monkeypatch.setattr(secure_rounds, "SecAggServer", OneDropped)
    with private_fleet(zoo, tmp_path, {"tier-large": 5}) as fleet:
        round_id = fleet["admin"].create_zoo_rounds(
            distributed_plan(fleet, deadline_s=60, stage_deadline_s=6, neighbour_count=4, survivor_fraction=1.0),
            ADMIN)["id"]
        results = run_devices(fleet)
        view = fleet["admin"].wait_for_round(round_id, timeout_s=120)
        [cohort] = stored(fleet, FLSecureCohort, round_id)
    protocol = SecAggConfig.from_dict(json.loads(cohort.secagg_config_json))
    assert (protocol.num_clients, protocol.minimum_survivors, SecAggBounds().honest_survivors(protocol)) == (5, 5, 3)
    assert [(noise.noise_multiplier, noise.survivors) for noise in requested] == [(3 * Z, 3)] * 5
    assert sorted(result.outcome for result in results) == (["refused: not_a_survivor"]
                                                            + ["refused: too_few_survivors"] * 4)
    assert view["state"] == "failed" and view["result_model_id"] is None


@pytest.mark.parametrize("cohort", [20, 50, 120])
def test_a_raised_survivor_floor_brings_a_full_cohorts_noise_near_the_charged_noise(cohort):
    """With every device surviving, a cohort's summed noise is (cohort / honest floor) times the charged variance: the
    default floor (t from k = 60) leaves 2.2 to 4.3 times it at cohorts of 20 to 120; `survivor_fraction` 1 leaves
    only the tolerated corrupt devices' share (c = 5% of the cohort, at least 2): at most 1.12 times."""
    config, dimension = zoo_config(), 2000
    default = config.privacy.secure_aggregation.model_copy(update={"neighbour_count": 60})
    raised = default.model_copy(update={"survivor_fraction": 1.0})

    def excess(settings) -> float:
        protocol = secure_rounds.secagg_config(settings, 1, cohort, dimension, 0.5, 3, 0)
        return cohort / noise_request(config, protocol).survivors

    assert excess(default) > 2.0 and excess(raised) <= 1.12
    assert excess(raised) == pytest.approx(cohort / (cohort - max(2, math.ceil(0.05 * cohort))))


@pytest.mark.slow
def test_a_zoo_plan_whose_ring_cannot_hold_its_noised_sums_is_refused_naming_the_field(zoo, tmp_path):  # noqa: F811
    """Levels 127 (a 16-bit ring for 3 devices) at z = 5: the devices' shares at z would fit (20 standard deviations
    of 3 shares of 5 x the bound), at the zoo's 3z they do not."""
    with private_fleet(zoo, tmp_path, {"tier-large": 3}) as fleet:
        plan = distributed_plan(fleet)
        plan["privacy"]["secure_aggregation"]["levels"] = 127
        plan["privacy"]["dp"]["noise_multiplier"] = 5.0
        refused = _refused(lambda: fleet["admin"].create_zoo_rounds(plan, ADMIN))
    assert (refused.status, refused.field) == (422, "privacy.secure_aggregation.levels")


@pytest.mark.slow
def test_a_zoo_plan_breaking_the_operators_terms_on_one_zoo_models_line_is_refused(zoo, tmp_path):  # noqa: F811
    """Terms that name one zoo model's line only (not "*"), floor 5: every zoo line a round republishes is covered.
    The floor applies to the z devices are asked for, 3z in a zoo-wide plan (`test_a_server_asking_a_zoo_cohort_...`):
    at Z = 1.5 (4.5 asked) the plan is refused naming the field and the line, as is a plan without DP; at Z = 2 (6
    asked) it opens."""
    line = zoo_members(zoo)[-1].line_id
    terms = sign_privacy_terms(CardSigningKey.generate(), 1,
                               {line: {"mode": "distributed", "minimum_noise_multiplier": 5.0}})
    with private_fleet(zoo, tmp_path, {"tier-large": 3}) as fleet:
        admin = fleet["admin"]
        with FedzooHTTP(fleet["server"].url, token=ADMIN) as api:
            api.post_json("/v1/privacy-terms", terms)
        below = _refused(lambda: admin.create_zoo_rounds(distributed_plan(fleet), ADMIN))
        without_dp = _refused(lambda: admin.create_zoo_rounds(secure_plan(fleet), ADMIN))
        meeting = distributed_plan(fleet)
        meeting["privacy"]["dp"]["noise_multiplier"] = 2.0
        round_id = admin.create_zoo_rounds(meeting, ADMIN)["id"]
    assert (below.status, below.code, below.field) == (422, "breaks_privacy_terms", "privacy.dp.noise_multiplier")
    assert f"model line {line!r}" in below.message and "z = 4.5" in below.message, below.message
    assert (without_dp.status, without_dp.code, without_dp.field) == (422, "breaks_privacy_terms", "privacy.dp")
    assert round_id >= 1


def zoo_config(levels: int = 32767) -> RoundConfig:
    return RoundConfig.model_validate({
        "model_id": "supernet", "evaluation_sha256": "0" * 64, "target_clients": 12, "min_clients": 3, "deadline_s": 60,
        "privacy": {"secure_aggregation": {"neighbour_count": 2, "levels": levels},
                    "dp": {"max_epsilon": 50.0, "delta": 1e-5, "clip_norm": 0.5, "noise_multiplier": Z,
                           "noise": "distributed"}},
        "zoo": {"latency_budget_ms": 10.0, "calibration_sha256": "1" * 64}})


@pytest.mark.parametrize("cohort", [3, 4, 7, 12])
def test_every_zoo_cohorts_honest_floor_carries_z_against_three_devices_bound(cohort):
    """Whatever the cohort's size, the noise of its honest survivor floor alone is worth at least Z (and within 1% of
    it) against the zoo's sensitivity, 3 devices' rounded vectors (KLS's bound on a sum of discrete Gaussians); the
    single-model request would be worth Z / 3 there."""
    config, dimension = zoo_config(), 2000
    protocol = secure_rounds.secagg_config(config.privacy.secure_aggregation, 1, cohort, dimension, 0.5, 3, 0)
    request = noise_request(config, protocol)
    assert request.noise_multiplier == 3 * Z
    sigma_squared = float(device_sigma_squared(request, protocol.levels, dimension))
    three_devices = 9 * norm_bound_squared(protocol.levels, dimension)
    worth = noise_multiplier_of_sum(sigma_squared, request.survivors, three_devices, dimension)
    assert Z <= worth <= 1.01 * Z
    single = DistributedNoise(Z, request.survivors)
    assert noise_multiplier_of_sum(float(device_sigma_squared(single, protocol.levels, dimension)), single.survivors,
                                   three_devices, dimension) < 0.34 * Z


def test_a_subnet_without_a_cohort_gets_a_cohort_of_threes_noise_and_a_cohorts_sum_gets_none():
    """The server's noise on a subnet with no cohort is the sum of 3 shares at a cohort of 3's calibration (the world
    where one more device made that cohort exist carries the same noise); on a cohort's sum it adds nothing."""
    config, dimension = zoo_config(levels=127), 3000
    least = secure_rounds.secagg_config(config.privacy.secure_aggregation, 1, 3, dimension, 0.5, 3, 0)
    noise = zoo_privacy.AbsentCohortNoise(0.5 / 127, 127, noise_request(config, least))
    assert not noise.steps(True, dimension).any()
    drawn = noise.steps(False, dimension)
    expected_variance = 3 * float(device_sigma_squared(noise.request, 127, dimension))
    assert drawn.dtype == "int64" and abs(drawn.mean()) < 5 * math.sqrt(expected_variance / dimension)
    assert drawn.var() == pytest.approx(expected_variance, rel=0.1)  # 3000 draws: the variance's sd is ~2.6%
    # against 3 devices' bound that noise is worth at least Z (3 shares at the floor of 1 honest survivor)
    worth = noise_multiplier_of_sum(expected_variance / 3, 3, 9 * norm_bound_squared(127, dimension), dimension)
    assert worth >= Z


def test_a_zoo_plan_is_refused_when_a_cohort_smaller_than_the_goal_would_wrap_its_ring():
    """A goal of 300 devices gets a 32-bit ring (300 x 127 x 2 > 2^16) that holds their noised sums; a subnet's cohort
    of 120 gets a 16-bit ring, which its sums (3Z per device at its honest floor of a sixth or so of the cohort) would
    wrap. The plan is refused, naming the field: every cohort size up to the goal must fit."""
    config = zoo_config(levels=127).model_copy(update={"target_clients": 300})
    dimension, settings = 8000, config.privacy.secure_aggregation

    def fits(cohort: int) -> bool:
        protocol = secure_rounds.secagg_config(settings, 0, cohort, dimension, 0.5, 3)
        return bits_needed(protocol, noise_request(config, protocol)) <= protocol.modulus_bits

    assert fits(300) and fits(3) and not fits(120)
    with pytest.raises(InvalidInputError) as refused:
        secure_rounds.check_planned_ring(config, dimension)
    assert refused.value.field == "privacy.secure_aggregation.levels"
    secure_rounds.check_planned_ring(zoo_config(), dimension)  # levels 32767: every cohort's ring is 32 bits
