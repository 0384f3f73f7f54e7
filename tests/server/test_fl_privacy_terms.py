"""The operator's signed privacy terms against a lying server, with the SDK's default devices (no NoisePolicy of
their owner's; only the operator keys every SecAgg+ device pins): on a line the terms cover, a round whose task
drops the noise request or lowers z below the floor is refused by every device and fails with no output; so is a
round whose server relays terms signed by its own key, or replays an older version that did not cover the line."""

import httpx
import pytest

from fedzoo.cloud.simulation import prepare_federation
from fedzoo.dp.distributed import DistributedNoise
from fedzoo.privacy_terms import sign_privacy_terms
from fedzoo.server.fl import lifecycle, secure_rounds
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN as ADMIN
from fedzoo.signing import CardSigningKey
from fl_helpers import device_client
from test_fl_distributed_dp import DEVICES, distributed_config, sdk_round

FLOOR = 1.0  # the terms' least noise multiplier; the plans below ask for 1.5


@pytest.fixture(scope="module")
def federation():
    return prepare_federation("digits", num_clients=DEVICES, alpha=None, hidden_units=8, pretrain_epochs=1, seed=0)


def covering(simulation, version: int = 1, line: str | None = None, key: CardSigningKey | None = None):
    """Terms signed by the operator (or `key`) that cover the federation's line (or `line`)."""
    return sign_privacy_terms(key or simulation.operator_key, version,
                              {line or simulation.federation.card.line_id: {"mode": "distributed",
                                                                            "minimum_noise_multiplier": FLOOR}})


def publish(simulation, document) -> None:
    """The admin uploads terms (this loopback server has no operator keys configured: it checks only their shape,
    as a lying server would accept anything)."""
    answer = httpx.post(f"{simulation.server_url}/v1/privacy-terms", json=document,
                        headers={"Authorization": f"Bearer {ADMIN}"})
    assert answer.status_code == 201, answer.text


def held_by_every_device(simulation, document) -> None:
    """Every device already holds `document` (fetched in an earlier round, or shipped with the app)."""
    for index in range(DEVICES):
        with device_client(simulation, index) as client:
            client.hold_privacy_terms(document)


def drop_the_noise_request(monkeypatch) -> None:
    """The lying server leaves `distributed_noise` out of every task: devices that follow it add no noise, and the
    server still charges the plan's z and publishes the accountant's epsilon."""
    honest = secure_rounds.PrivateRounds.task_privacy

    def lying(self, *args, **kwargs):
        privacy = honest(self, *args, **kwargs)
        return None if privacy is None else privacy.model_copy(update={"distributed_noise": None})

    monkeypatch.setattr(secure_rounds.PrivateRounds, "task_privacy", lying)


def skip_the_servers_own_check(monkeypatch) -> None:
    """The lying server opens plans that break the terms it holds (an honest one refuses them with 422
    `breaks_privacy_terms`: tests/server/test_fl_terms_gate.py); the devices are the defence."""
    monkeypatch.setattr(lifecycle, "check_plan_terms", lambda *_args: None)


def refused_by_all(simulation, federation, reason: str, **config) -> None:
    round_id, results, view = sdk_round(simulation, federation, distributed_config(deadline_s=15, **config))
    assert [result.outcome for result in results] == [f"refused: {reason}"] * DEVICES
    assert view["state"] == "failed" and view["result_model_id"] is None
    participants = httpx.get(f"{simulation.server_url}/v1/fl/rounds/{round_id}/participants",
                             headers={"Authorization": f"Bearer {ADMIN}"}).json()["participants"]
    assert {entry["reason"].split(":")[0] for entry in participants} == {reason}


def test_terms_on_the_line_let_an_honest_distributed_round_close(simulation, federation):
    """The control: the same devices under the same terms take part in an honest round, and it publishes."""
    publish(simulation, covering(simulation))
    _, results, view = sdk_round(simulation, federation, distributed_config())
    assert [result.outcome for result in results] == ["accepted"] * DEVICES
    assert view["state"] == "closed", view["outcome"]


def test_default_devices_refuse_a_round_on_a_covered_line_whose_server_drops_the_noise(simulation, federation,
                                                                                        monkeypatch):
    publish(simulation, covering(simulation))
    drop_the_noise_request(monkeypatch)
    refused_by_all(simulation, federation, "noise_not_distributed")


def test_default_devices_refuse_a_round_on_a_covered_line_without_dp_or_with_central_noise(simulation, federation,
                                                                                          monkeypatch):
    """The terms require the devices' own noise: central noise (the server would see the noiseless sum) is refused
    before training, and so is a round with no DP at all, which a lying server opens against the terms."""
    publish(simulation, covering(simulation))
    skip_the_servers_own_check(monkeypatch)
    refused_by_all(simulation, federation, "noise_not_distributed", noise="central")
    no_dp = distributed_config(deadline_s=15)
    del no_dp["privacy"]["dp"]
    _, results, view = sdk_round(simulation, federation, no_dp)
    assert [result.outcome for result in results] == ["refused: noise_not_distributed"] * DEVICES
    assert view["state"] == "failed" and view["result_model_id"] is None


def test_default_devices_refuse_a_server_lowering_z_below_the_terms_floor(simulation, federation, monkeypatch):
    """The plan says z = 1.5 (what the ledger charges); the lying server asks the devices for 0.5."""
    publish(simulation, covering(simulation))
    honest = secure_rounds.noise_request
    monkeypatch.setattr(secure_rounds, "noise_request",
                        lambda config, protocol: DistributedNoise(0.5, honest(config, protocol).survivors))
    refused_by_all(simulation, federation, "noise_below_floor")


def test_terms_the_server_signed_with_its_own_key_are_refused(simulation, federation, monkeypatch):
    """The devices hold the operator's terms; the server relays newer terms of its own key that cover another
    line only, and drops the noise. No device takes them, nor the round."""
    held_by_every_device(simulation, covering(simulation))
    publish(simulation, covering(simulation, version=2, line="another-line", key=CardSigningKey.generate()))
    drop_the_noise_request(monkeypatch)
    refused_by_all(simulation, federation, "bad_privacy_terms")


def test_an_older_version_of_the_terms_that_lacked_the_line_is_refused(simulation, federation, monkeypatch):
    """The operator's version 2 covers the line, and the devices hold it; the server replays version 1 (another
    line only) and drops the noise: a rollback, refused."""
    held_by_every_device(simulation, covering(simulation, version=2))
    publish(simulation, covering(simulation, version=1, line="another-line"))
    drop_the_noise_request(monkeypatch)
    refused_by_all(simulation, federation, "bad_privacy_terms")


def test_a_server_withholding_the_terms_does_not_lift_the_ones_a_device_holds(simulation, federation, monkeypatch):
    """The server serves no terms at all (404) and drops the noise: the devices apply the terms they hold."""
    held_by_every_device(simulation, covering(simulation))
    drop_the_noise_request(monkeypatch)
    refused_by_all(simulation, federation, "noise_not_distributed")
