"""Zoo-wide rounds under SecAgg+, one cohort per subnet, against the real server on loopback and real SDK devices
(signing keys certified by the operator, real training in onnxruntime on sklearn digits): each subnet's devices run
their own SecAgg+ instance, the server combines the cohorts' sums per element; a subnet with fewer than 3 devices
forms no cohort; and a lying server that builds a victim a cohort of its own out of other devices' replayed keys
is refused by the victim before its update leaves it."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from datetime import datetime, timezone

import pytest
from sqlalchemy import create_engine, select

from fedzoo.admin.operator_client import OperatorClient
from fedzoo.clients.client import FedzooClient
from fedzoo.clients.errors import APIError
from fedzoo.clients.device_certification import certify_devices
from fedzoo.clients.http import FedzooHTTP
from fedzoo.clients.participation import participate_once
from fedzoo.clients.secure_participation import protocol_config
from fedzoo.datasets import dirichlet_partition, load_dataset, split_dataset
from fedzoo.device import CpuInfo, DeviceProfile, RuntimeInfo
from fedzoo.edge.local_training import LocalData
from fedzoo.secagg.errors import ProtocolViolation
from fedzoo.server.fl import secure_rounds
from fedzoo.server.fl.tables import FLSecureCohort, FLSecureMessage, PrivacyLine
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN, LoopbackServer
from fedzoo.signing import CardSigningKey, TrustedKeys
from fl_helpers import OPEN_GATE
from zoo_helpers import TINY_ZOO_GROUP, publish_zoo, supernet_card, zoo_members

# one test process runs every module on the session's tiny zoo (`--dist loadgroup`): built once, not once per worker
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(TINY_ZOO_GROUP)]
ADMIN = DEFAULT_ADMIN_TOKEN


@contextmanager
def private_fleet(zoo, tmp_path, tiers: dict[str, int]):  # noqa: F811
    """A server with the zoo published and devices per tier, each with a signing key the operator certified and
    the operator's key pinned (what SecAgg+ needs of a device)."""
    split = split_dataset(load_dataset("digits"), seed=0)
    operator = CardSigningKey.generate()
    with LoopbackServer(tmp_path / "server", deadline_check_s=0.2) as server, \
            OperatorClient(server.url, token=ADMIN, cache_dir=tmp_path / "admin") as admin:
        evaluation, calibration = publish_zoo(admin, zoo, split)
        enrollment = admin.create_enrollment_token(ADMIN, max_uses=sum(tiers.values()))["token"]
        devices = []
        for tier, count in tiers.items():
            for index in range(count):
                profile = DeviceProfile(device_id=f"{tier}-{index}", platform="linux-x86_64", device_class=tier,
                                        cpu=CpuInfo(model="virtual", cores=1), memory_mb=2048,
                                        runtime=RuntimeInfo(onnxruntime="simulated", threads=1))
                with FedzooClient(server.url, cache_dir=tmp_path / "register") as client:
                    token = client.register(profile, enrollment)["token"]
                    signing_key = client.signing_key
                folder = tmp_path / profile.device_id
                devices.append(FedzooClient(server.url, token=token, cache_dir=folder, signing_key=signing_key,
                                            operator_keys=TrustedKeys([operator.public_key_raw]),
                                            state_file=folder / "state.json"))
        with FedzooHTTP(server.url, token=ADMIN) as api:
            certify_devices(api, operator)
        shards = dirichlet_partition(split.train.y, num_clients=len(devices), alpha=0.5, seed=0)
        yield {"server": server, "admin": admin, "devices": devices, "split": split, "shards": shards,
               "evaluation": evaluation, "calibration": calibration, "zoo": zoo,
               "database_url": f"sqlite:///{server.data_dir / 'registry.db'}"}
        for device in devices:
            device.close()


def secure_plan(fleet, stage_deadline_s: float = 60.0, **overrides) -> dict:
    smallest = zoo_members(fleet["zoo"])[0]
    devices = len(fleet["devices"])
    config = {"model_id": supernet_card(fleet["zoo"]).id, "evaluation_sha256": fleet["evaluation"], "min_clients": 3,
              "target_clients": devices, "over_selection": 0.0, "deadline_s": 240, "local_epochs": 1,
              "batch_size": 16, "learning_rate": 0.05, "max_accuracy_drop": OPEN_GATE, "poll_interval_s": 0.05,
              "privacy": {"secure_aggregation": {"neighbour_count": 2, "clip_range": 0.5,
                                                 "stage_deadline_s": stage_deadline_s}},
              "zoo": {"latency_budget_ms": 1e5, "calibration_sha256": fleet["calibration"],
                      "latency_budget_ms_by_class": {"tier-small": smallest.macs / 1e4 * 1.01}}}
    config.update(overrides)
    return config


def run_devices(fleet) -> list:
    """Every device checks in and does its part (train, quantise, the SecAgg+ stages), concurrently."""
    task, split = supernet_card(fleet["zoo"]).details["supernet"]["task"], fleet["split"]
    results = [None] * len(fleet["devices"])

    def device(index):
        shard = fleet["shards"][index]
        results[index] = participate_once(fleet["devices"][index], task,
                                          LocalData(split.train.x[shard], split.train.y[shard]), seed=index)

    threads = [threading.Thread(target=device, args=(index,), daemon=True) for index in range(len(results))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    return results


def stored(fleet, table, round_id: int) -> list:
    engine = create_engine(fleet["database_url"])
    try:
        with engine.connect() as connection:
            return connection.execute(select(table).where(table.round_id == round_id)).all()
    finally:
        engine.dispose()


def test_each_subnet_runs_its_own_secagg_cohort_and_the_zoo_is_republished(zoo, tmp_path):  # noqa: F811
    with private_fleet(zoo, tmp_path, {"tier-small": 3, "tier-large": 3}) as fleet:
        round_id = fleet["admin"].create_zoo_rounds(secure_plan(fleet), ADMIN)["id"]
        results = run_devices(fleet)
        view = fleet["admin"].wait_for_round(round_id, timeout_s=300)
        cohorts = stored(fleet, FLSecureCohort, round_id)
        messages = stored(fleet, FLSecureMessage, round_id)
    assert [result.outcome for result in results] == ["accepted"] * 6
    assert view["state"] == "closed", view["outcome"]
    # one SecAgg+ instance per subnet: own devices, own numbering, own id (what signatures are bound to), own length
    configs = [json.loads(row.secagg_config_json) for row in cohorts]
    assert sorted(config["round_id"] for config in configs) == [f"fl-round-{round_id}/subnet-0",
                                                               f"fl-round-{round_id}/subnet-1"]
    assert [config["num_clients"] for config in configs] == [3, 3]
    assert configs[0]["vector_length"] != configs[1]["vector_length"]
    members = [set(json.loads(row.participants_json)) for row in cohorts]
    assert members[0].isdisjoint(members[1]) and {len(group) for group in members} == {3}
    assert {(row.cohort, row.client) for row in messages if row.stage == "masked_input"} == {
        (cohort, client) for cohort in (0, 1) for client in range(3)}
    secure = view["outcome"]["secure_aggregation"]
    assert secure["survivors"] == 6 and [cohort["survivors"] for cohort in secure["cohorts"]] == [3, 3]
    zoo_outcome = view["outcome"]["zoo"]
    assert sorted(zoo_outcome["devices_per_zoo_model"].values()) == [3, 3]
    assert zoo_outcome["coverage"]["single_device"] == 0  # no element depends on fewer than 3 devices
    assert zoo_outcome["new_versions"] >= 1


def test_a_subnet_with_fewer_than_three_devices_forms_no_cohort_and_its_device_sits_out(zoo, tmp_path):  # noqa: F811
    with private_fleet(zoo, tmp_path, {"tier-small": 1, "tier-large": 4}) as fleet:
        # min_clients counts the updates of every cohort; a cohort's own floor is SecAgg+'s least, 3, not min_clients
        round_id = fleet["admin"].create_zoo_rounds(secure_plan(fleet, min_clients=4), ADMIN)["id"]
        results = run_devices(fleet)
        view = fleet["admin"].wait_for_round(round_id, timeout_s=300)
        cohorts = stored(fleet, FLSecureCohort, round_id)
        messages = stored(fleet, FLSecureMessage, round_id)
        sat_out_card = fleet["admin"].card(next(iter(view["sat_out_devices"])))
        participants = fleet["admin"].http.get_json(f"/v1/fl/rounds/{round_id}/participants",
                                                    headers={"Authorization": f"Bearer {ADMIN}"})["participants"]
    victim = "tier-small-0"
    assert results[0].outcome == "refused: not_in_cohort"
    assert [result.outcome for result in results[1:]] == ["accepted"] * 4
    assert [len(json.loads(row.participants_json)) for row in cohorts] == [4]
    assert json.loads(cohorts[0].secagg_config_json)["minimum_survivors"] == 3  # one of the 4 may drop out
    assert victim not in json.loads(cohorts[0].participants_json)
    assert not [row for row in messages if row.device_id == victim]  # nothing of the victim ever reached the server
    assert view["state"] == "closed", view["outcome"]
    assert list(view["outcome"]["zoo"]["devices_per_zoo_model"].values()) == [4]
    # the operator sees who was told to sit out: one device, on the smallest model's subnet
    [(training_id, sat_out)] = view["sat_out_devices"].items()
    assert sat_out == 1 and training_id != cohorts[0].name
    [told] = [entry for entry in participants if entry["device_id"] == victim]
    assert (told["status"], told["reason"], told["upload_bytes"]) == ("sat_out", secure_rounds.SIT_OUT, 0)
    assert told["uploaded_at"] is not None  # when it was told to sit out
    assert sat_out_card.arch == zoo_members(zoo)[0].arch


def test_devices_refuse_a_cohort_below_the_protocols_minimum_whatever_the_server_sends():
    """The device's own check, independent of the server's: a config of fewer than 3 devices is no SecAgg+ round."""
    lying = {"round_id": "fl-round-9/subnet-0", "num_clients": 1, "neighbour_count": 2, "threshold": 2,
             "vector_length": 10, "clip_range": 0.5, "levels": 127, "minimum_survivors": 1}
    for num_clients in (1, 2):
        with pytest.raises(ProtocolViolation) as refused:
            protocol_config({**lying, "num_clients": num_clients})
        assert refused.value.reason == "malformed"


def test_a_lying_server_building_a_victim_a_cohort_of_replayed_keys_never_gets_its_update(zoo, tmp_path,  # noqa: F811
                                                                                            monkeypatch):
    """The victim (the only device of its subnet) is given a cohort of its own, padded with two devices of the other
    cohort whose signed stage-1 keys the server replays there under the same client numbers: those signatures are
    bound to the other cohort's config (its id `.../subnet-0`), so the victim refuses before its masked input
    exists, and the round fails."""
    victim = "tier-small-0"
    original_start, original_replies = secure_rounds.PrivateRounds.start_stages, secure_rounds.PrivateRounds._replies

    class LyingServer(secure_rounds.SecAggServer):
        def _signed_by(self, client, signature, payload):  # relays whatever it holds
            return True

    def start_stages(self, session, round_row, config, group_of):
        original_start(self, session, round_row, config, group_of)
        [honest] = self._cohorts(session, round_row.id)
        padding = json.loads(honest.participants_json)[1:]  # clients 1 and 2 there, and here
        protocol = secure_rounds.secagg_config(config.privacy.secure_aggregation, round_row.id, 3,
                                               group_of(victim).vector_length, 0.5, 3, subnet=1)
        session.add(FLSecureCohort(round_id=round_row.id, cohort=1, name=group_of(victim).name,
                                   participants_json=json.dumps([victim, *padding]),
                                   secagg_config_json=json.dumps(protocol.to_dict())))

    def replies(session, round_id, cohort, stage):
        answered = original_replies(session, round_id, cohort, stage)
        if cohort != 1 or stage != "advertise_keys":
            return answered
        # the padding's own signed replies, under their own client numbers: only the cohort's config differs
        replayed = [reply for reply in original_replies(session, round_id, 0, stage) if reply["client"] in (1, 2)]
        return [reply for reply in answered if reply["client"] == 0] + replayed

    monkeypatch.setattr(secure_rounds, "SecAggServer", LyingServer)
    monkeypatch.setattr(secure_rounds.PrivateRounds, "start_stages", start_stages)
    monkeypatch.setattr(secure_rounds.PrivateRounds, "_replies", staticmethod(replies))
    with private_fleet(zoo, tmp_path, {"tier-small": 1, "tier-large": 3}) as fleet:
        round_id = fleet["admin"].create_zoo_rounds(secure_plan(fleet, stage_deadline_s=6, deadline_s=60),
                                                    ADMIN)["id"]
        results = run_devices(fleet)
        view = fleet["admin"].wait_for_round(round_id, timeout_s=200)
        messages = stored(fleet, FLSecureMessage, round_id)
    assert results[0].outcome == "refused: bad_signature"
    assert {row.stage for row in messages if row.device_id == victim} == {"advertise_keys"}
    assert view["state"] == "failed" and view["result_model_id"] is None


def test_a_dp_zoo_wide_round_charges_every_republished_line_and_states_no_counts(zoo, tmp_path):  # noqa: F811
    with private_fleet(zoo, tmp_path, {"tier-small": 3, "tier-large": 3}) as fleet:
        admin = fleet["admin"]
        dp = {"max_epsilon": 8.0, "clip_norm": 0.5}
        plan = secure_plan(fleet, privacy={"secure_aggregation": {"neighbour_count": 2, "levels": 4095,
                                                                  "stage_deadline_s": 60}, "dp": dp})
        without_secagg = {**plan, "privacy": {"dp": dp}}
        refused = _refused(lambda: admin.create_zoo_rounds(without_secagg, ADMIN))
        assert (refused.status, refused.field) == (422, "privacy.dp")
        round_id = admin.create_zoo_rounds(plan, ADMIN)["id"]
        results = run_devices(fleet)
        view = admin.wait_for_round(round_id, timeout_s=300)
        assert [result.outcome for result in results] == ["accepted"] * 6
        assert view["state"] == "closed", view["outcome"]
        supernet = admin.card(view["result_model_id"])
        republished = [admin.card(model["new_model_id"]) for model in view["outcome"]["zoo"]["models"]
                       if model["published"]]
        lines = {row.line_id: row for row in stored_lines(fleet)}
        # the round's read and outcome state no count of devices (selected, accepted, per zoo model, coverage)
        assert view["selected_devices"] is None and view["accepted_updates"] is None
        assert not {"devices_per_zoo_model", "coverage", "bytes"} & set(view["outcome"]["zoo"])
        assert "cohorts" not in view["outcome"]["secure_aggregation"]
        # a non-DP plan on the DP supernet (or on its zoo models) is refused, as on any DP line
        plain = _refused(lambda: admin.create_zoo_rounds(
            {**secure_plan(fleet), "model_id": supernet.id, "privacy": {}}, ADMIN))
        assert (plain.status, plain.field) == (422, "privacy.dp")
    claim = supernet.details["federated"]["privacy"]["dp"]
    assert claim["line"] in lines and claim["epsilon"] == pytest.approx(lines[claim["line"]].epsilon)
    assert 0 < claim["epsilon"] <= 8.0 and claim["cohort_floor"] == 3
    assert republished, "at least one zoo model passes the open gate"
    for member in zoo_members(zoo):  # every zoo model's line is charged, republished or not (later versions derive)
        assert json.loads(lines[member.line_id].events_json) == [[claim["noise_multiplier"], 1.0, 1]]
    for card in republished:  # each republished zoo model: its own line, charged one round, its epsilon stated
        stated = card.details["federated"]["privacy"]["dp"]
        assert stated["line"] == card.line_id != claim["line"]
        assert stated["line_events"] == [[claim["noise_multiplier"], 1.0, 1]]
        assert stated["epsilon"] == pytest.approx(lines[card.line_id].epsilon) == pytest.approx(claim["epsilon"])


def _refused(call):
    with pytest.raises(APIError) as error:
        call()
    return error.value


def stored_lines(fleet) -> list:
    engine = create_engine(fleet["database_url"])
    try:
        with engine.connect() as connection:
            return connection.execute(select(PrivacyLine)).all()
    finally:
        engine.dispose()


def test_a_dp_zoo_plan_past_a_zoo_models_lines_lifetime_budget_is_refused(zoo, tmp_path):  # noqa: F811
    """The supernet's line is new, but one zoo model's line already spent most of the operator's budget (10 by
    default): the plan charges every zoo model's line each round, so it does not open."""
    with private_fleet(zoo, tmp_path, {"tier-large": 3}) as fleet:
        smallest = zoo_members(zoo)[0]
        engine = create_engine(fleet["database_url"])
        with engine.begin() as connection:
            connection.execute(PrivacyLine.__table__.insert().values(
                line_id=smallest.line_id, delta=1e-5, mechanism="rdp", events_json=json.dumps([[0.8, 1.0, 30]]),
                epsilon=9.5, revision=0, updated_at=datetime.now(timezone.utc)))
        engine.dispose()
        plan = secure_plan(fleet, privacy={"secure_aggregation": {"neighbour_count": 2},
                                           "dp": {"max_epsilon": 8.0, "clip_norm": 0.5}})
        refused = _refused(lambda: fleet["admin"].create_zoo_rounds(plan, ADMIN))
    assert (refused.status, refused.field) == (422, "privacy.dp.max_epsilon")
    assert smallest.line_id in str(refused)


def test_a_zoo_models_line_takes_one_dp_plan_at_a_time_whether_zoo_wide_or_its_own(zoo, tmp_path):  # noqa: F811
    """A DP zoo plan charges every zoo model's line, not only the supernet's line its plan row names: while it runs, a
    DP plan on one zoo model does not open; while that plan runs, a DP zoo plan does not open (each checks the lines'
    lifetime budget when it opens, so two at once could pass it together)."""
    dp = {"max_epsilon": 8.0, "clip_norm": 0.5}
    with private_fleet(zoo, tmp_path, {"tier-large": 3}) as fleet:
        smallest = zoo_members(zoo)[0]
        own_plan = {"model_id": smallest.id, "evaluation_sha256": fleet["evaluation"], "min_clients": 3,
                    "target_clients": 3, "deadline_s": 240, "max_accuracy_drop": OPEN_GATE, "privacy": {"dp": dp}}
        zoo_plan = secure_plan(fleet, deadline_s=1, privacy={"secure_aggregation": {"neighbour_count": 2}, "dp": dp})
        zoo_round = fleet["admin"].create_zoo_rounds(zoo_plan, ADMIN)["id"]
        refused = _refused(lambda: fleet["admin"].create_rounds(own_plan, ADMIN))
        assert (refused.status, refused.field, refused.code) == (409, "model_id", "line_busy")
        assert f"round {zoo_round}" in str(refused)
        assert fleet["admin"].wait_for_round(zoo_round, timeout_s=60)["state"] == "failed"  # no device came

        own_round = fleet["admin"].create_rounds(own_plan, ADMIN)["id"]
        refused = _refused(lambda: fleet["admin"].create_zoo_rounds({**zoo_plan, "deadline_s": 240}, ADMIN))
        assert (refused.status, refused.field, refused.code) == (409, "model_id", "line_busy")
        assert f"round {own_round}" in str(refused)
