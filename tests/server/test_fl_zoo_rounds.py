"""Zoo-wide rounds against the real server on loopback: devices of two tiers train the subnets their lookup
picks (real training graphs in onnxruntime, sklearn digits), the server maps the deltas onto the supernet,
re-extracts every zoo model and publishes new versions that lookup serves."""

from __future__ import annotations

import io
import json

import httpx
import numpy as np
import pytest
from click.testing import CliRunner

from fedzoo.cards import Latency, ModelCard, is_supernet
from fedzoo.cli import cli
from fl_helpers import OPEN_GATE, wait_for_round_end
from server_helpers import log_in
from fedzoo.clients.client import FedzooClient
from fedzoo.clients.errors import APIError
from fedzoo.clients.participation import run_task
from fedzoo.local_training import LocalData, normalise
from fedzoo.cloud.data import dirichlet_partition, load_dataset, split_dataset
from fedzoo.cloud.simulation import DEFAULT_ADMIN_TOKEN, LoopbackServer
from fedzoo.cloud.zoo_extraction import requantized_blob
from fedzoo.device import CpuInfo, DeviceProfile, RuntimeInfo
from fedzoo.zoo import Zoo

pytestmark = pytest.mark.slow
TIERS = {"tier-small": 2, "tier-large": 2}  # device class -> devices


def _npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """A tiny zoo built from digits, its supernet card included; every card's latency is given for the two
    tiers (proportional to MACs), so the small tier's budget admits only the smallest model."""
    from fedzoo.cloud.pipeline import BuildConfig, build_zoo

    out = tmp_path_factory.mktemp("zoo") / "zoo"
    build_zoo(BuildConfig(dataset="digits", out=out, preset="tiny", latency_source="macs", compress=False,
                          executor="in-process", zoo_min_size=2, zoo_max_size=3))
    zoo = Zoo(out)
    for card in zoo.cards():
        latency = {tier: Latency(median_ms=card.macs / 1e4, source="measured") for tier in TIERS}
        zoo.add_card(card.model_copy(update={"latency_ms": {**card.latency_ms, **latency}}))
    # the smallest model's INT8 variant, as the compression stage makes it (its recipe in details.quantization)
    smallest = _members(zoo)[0]
    recipe = {"format": "qdq", "calibration": "minmax", "per_channel": True, "reduce_range": True,
              "activation_type": "uint8", "weight_scales": "per-channel"}
    calibration = normalise(split_dataset(load_dataset("digits"), seed=0).validation.x, smallest.input.normalisation)
    int8 = requantized_blob(zoo.model_path(smallest).read_bytes(), recipe, calibration)
    zoo.add_card(smallest.model_copy(update={
        "id": f"{smallest.id}-int8", "parent_id": smallest.id, "precision": "int8", "sha256": zoo.add_blob_bytes(int8),
        "size_bytes": len(int8), "artifacts": {}, "details": {"quantization": recipe},
        # measured slower than its parent on both tiers (as INT8 often is): lookup serves the fp32 models here
        "latency_ms": {tier: Latency(median_ms=2 * smallest.macs / 1e4, source="measured") for tier in TIERS}}))
    return zoo


@pytest.fixture
def fleet(zoo, tmp_path):
    """A server with the zoo published, the evaluation and calibration sets uploaded and a device per shard."""
    split = split_dataset(load_dataset("digits"), seed=0)
    with LoopbackServer(tmp_path / "server") as server, FedzooClient(server.url, cache_dir=tmp_path / "admin") as admin:
        for card in zoo.cards():
            digests = [card.sha256, *card.artifacts.values(), *([card.training_graph] if card.training_graph else [])]
            admin.publish_model(card, {digest: zoo.blob_path(digest).read_bytes() for digest in digests},
                                DEFAULT_ADMIN_TOKEN)
        evaluation = admin.publish_blob(_npz(x=split.test.x, y=split.test.y), DEFAULT_ADMIN_TOKEN)
        calibration = admin.publish_blob(_npz(x=split.validation.x), DEFAULT_ADMIN_TOKEN)
        enrollment = admin.create_enrollment_token(DEFAULT_ADMIN_TOKEN, max_uses=sum(TIERS.values()))["token"]
        devices = []
        for tier, count in TIERS.items():
            for index in range(count):
                profile = DeviceProfile(device_id=f"{tier}-{index}", platform="linux-x86_64", device_class=tier,
                                        cpu=CpuInfo(model="virtual", cores=1), memory_mb=2048,
                                        runtime=RuntimeInfo(onnxruntime="simulated", threads=1))
                with FedzooClient(server.url, cache_dir=tmp_path / "register") as client:
                    token = client.register(profile, enrollment)["token"]
                devices.append(FedzooClient(server.url, token=token, cache_dir=tmp_path / profile.device_id))
        shards = dirichlet_partition(split.train.y, num_clients=len(devices), alpha=0.5, seed=0)
        yield {"server": server, "admin": admin, "devices": devices, "split": split, "shards": shards,
               "evaluation": evaluation, "calibration": calibration, "zoo": zoo}
        for device in devices:
            device.close()


def _supernet(zoo) -> ModelCard:
    return next(card for card in zoo.cards() if is_supernet(card))


def _members(zoo) -> list[ModelCard]:
    """The zoo's fp32 models, smallest first."""
    return sorted((card for card in zoo.cards() if not is_supernet(card) and card.precision == "fp32"),
                  key=lambda card: card.macs)


def _plan(fleet, **overrides) -> dict:
    zoo = fleet["zoo"]
    smallest = _members(zoo)[0]
    config = {"model_id": _supernet(zoo).id, "evaluation_sha256": fleet["evaluation"], "min_clients": 4,
              "target_clients": 4, "over_selection": 0.0, "deadline_s": 120, "local_epochs": 1, "batch_size": 16,
              "learning_rate": 0.05, "max_accuracy_drop": OPEN_GATE,
              "zoo": {"latency_budget_ms": 1e5, "calibration_sha256": fleet["calibration"],
                      "latency_budget_ms_by_class": {"tier-small": smallest.macs / 1e4 * 1.01}}}
    config.update(overrides)
    return config


def test_a_zoo_wide_round_improves_the_supernet_and_republishes_every_zoo_model(fleet):
    zoo, admin, split = fleet["zoo"], fleet["admin"], fleet["split"]
    members = _members(zoo)
    round_id = admin.create_zoo_rounds(_plan(fleet), DEFAULT_ADMIN_TOKEN)["id"]
    for device, shard in zip(fleet["devices"], fleet["shards"]):
        work = device.fl_task(_supernet(zoo).details["supernet"]["task"])["task"]
        assert work is not None and work["round_id"] == round_id
        training_card = device.card(work["model_id"])
        # the device trains its tier's subnet: a training card never served by lookup
        assert training_card.task.endswith(".subnet") and training_card.parent_id == _supernet(zoo).id
        result = run_task(device, work, LocalData(split.train.x[shard], split.train.y[shard]))
        assert result.outcome == "accepted"
    view = wait_for_round_end(admin, round_id, timeout_s=300)
    assert view["state"] == "closed", view["outcome"]
    outcome = view["outcome"]["zoo"]
    # both tiers took part with different subnets: the smallest model's and a larger one's
    assert len(outcome["devices_per_zoo_model"]) == 2 and members[0].id in outcome["devices_per_zoo_model"]
    # the default step: shared elements scaled by the cohorts covering them (2 subnets of 2 devices each)
    assert outcome["coverage_step_exponent"] == 1.0 and outcome["devices_per_subnet"] == 2
    coverage = outcome["coverage"]
    assert 0 < coverage["released"] <= coverage["parameters"]
    assert coverage["released"] + coverage["uncovered"] <= coverage["parameters"]
    assert coverage["by_layer"]["classifier"]["min_count"] == 4  # every subnet has the classifier
    # every zoo model was re-extracted, measured before and after, and published as its next version
    int8_id = f"{members[0].id}-int8"
    assert {model["model_id"] for model in outcome["models"]} == {card.id for card in members} | {int8_id}
    fp32_models = [model for model in outcome["models"] if model["model_id"] != int8_id]
    for model in fp32_models:
        new = admin.card(model["new_model_id"])
        assert new.parent_id == model["model_id"] and new.version == 2
        assert new.metrics.accuracy == pytest.approx(model["accuracy_after"])
        assert new.training_graph is not None  # today's single-model plans can fine-tune it
    # the INT8 variant was re-quantized from the new smallest model with its recipe, behind the compression gate
    (int8,) = [model for model in outcome["models"] if model["model_id"] == int8_id]
    smallest_after = next(model for model in fp32_models if model["model_id"] == members[0].id)
    assert int8["published"] == (int8["accuracy_after"] + 1e-12 >= smallest_after["accuracy_after"] - 0.01)
    assert outcome["new_versions"] == len(members) + int8["published"]
    if int8["published"]:
        new_int8 = admin.card(int8["new_model_id"])
        assert (new_int8.precision, new_int8.parent_id, new_int8.version) == ("int8", int8_id, 2)
        assert new_int8.details["zoo_federated"]["fp32_id"] == smallest_after["new_model_id"]
        assert new_int8.training_graph == admin.card(smallest_after["new_model_id"]).training_graph
    else:
        assert "against the new fp32 model" in int8["reason"]
    supernet = admin.card(view["result_model_id"])
    assert is_supernet(supernet) and supernet.version == 2 and supernet.parent_id == _supernet(zoo).id
    # lookup serves the new versions at once: for the small tier, the more accurate of the smallest model's two
    # versions (the new one inherits the card's latencies, so it fits the same budget)
    small = fleet["devices"][0]
    chosen = small.lookup(split.dataset.name, _plan(fleet)["zoo"]["latency_budget_ms_by_class"]["tier-small"])
    smallest = next(model for model in outcome["models"] if model["model_id"] == members[0].id)
    versions = {members[0].id: members[0].metrics.accuracy, smallest["new_model_id"]: smallest["accuracy_after"]}
    assert chosen["model"]["id"] == max(versions, key=versions.get)
    assert admin.card(smallest["new_model_id"]).latency_ms["tier-small"] == members[0].latency_ms["tier-small"]
    assert view["next_round_id"] is None
    # the operator's view: coverage per layer, accuracy before and after, bytes
    url = fleet["server"].url
    shown = _cli("fl", "zoo", "show", str(round_id), "--server", url, "--token", DEFAULT_ADMIN_TOKEN, "--format", "json")
    report = json.loads(shown.stdout)
    assert report["coverage"]["by_layer"] == coverage["by_layer"] and report["new_versions"] == outcome["new_versions"]
    assert {model["model_id"]: (model["accuracy_before"], model["accuracy_after"]) for model in report["models"]} == {
        model["model_id"]: (model["accuracy_before"], model["accuracy_after"]) for model in outcome["models"]}
    assert report["bytes"]["upload"] == view["upload_bytes"] and report["bytes"]["download_per_device"] > 0
    table = _cli("fl", "zoo", "show", str(round_id), "--server", url, "--token", DEFAULT_ADMIN_TOKEN)
    assert "coverage per layer" in table.stdout and members[0].id in table.stdout
    with httpx.Client(base_url=url) as browser:  # and the dashboard's round page
        log_in(browser, DEFAULT_ADMIN_TOKEN)
        html = browser.get(f"/ui/rounds/{round_id}").text
    assert 'id="zoo-coverage-table"' in html and 'data-layer="classifier"' in html
    assert all(f'data-model-id="{card.id}"' in html for card in members)


def _cli(*args: str):
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "300"}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_min_coverage_keeps_single_device_elements_out_of_the_release(fleet):
    admin, split, zoo = fleet["admin"], fleet["split"], fleet["zoo"]
    plan_file = fleet["server"].data_dir.parent / "plan.json"
    plan_file.write_text(json.dumps(_plan(fleet, zoo={**_plan(fleet)["zoo"], "min_coverage": 3})))
    started = _cli("fl", "zoo", "start", str(plan_file), "--server", fleet["server"].url, "--admin-token",
                   DEFAULT_ADMIN_TOKEN, "--format", "json")
    round_id = json.loads(started.stdout)["id"]
    for device, shard in zip(fleet["devices"], fleet["shards"]):
        work = device.fl_task(_supernet(zoo).details["supernet"]["task"])["task"]
        run_task(device, work, LocalData(split.train.x[shard], split.train.y[shard]))
    view = wait_for_round_end(admin, round_id, timeout_s=300)
    assert view["state"] == "closed", view["outcome"]
    coverage = view["outcome"]["zoo"]["coverage"]
    # two devices per tier: elements only the large tier holds are covered twice, below 3: never released
    assert coverage["released"] < coverage["parameters"] - coverage["uncovered"]
    assert all(layer["released"] <= layer["elements"] for layer in coverage["by_layer"].values())


def test_a_device_whose_budget_fits_no_zoo_model_sits_the_round_out_and_hears_why(fleet):
    admin, zoo = fleet["admin"], fleet["zoo"]
    smallest = _members(zoo)[0]
    plan = _plan(fleet, min_clients=2, target_clients=2)
    plan["zoo"]["latency_budget_ms_by_class"] = {"tier-small": smallest.macs / 1e4 / 2}  # below every model
    round_id = admin.create_zoo_rounds(plan, DEFAULT_ADMIN_TOKEN)["id"]
    small, large = fleet["devices"][0], fleet["devices"][-1]
    answer = small.fl_task(_supernet(zoo).details["supernet"]["task"])
    assert answer["task"] is None and "no zoo model fits" in answer["reason"]
    assert large.fl_task(_supernet(zoo).details["supernet"]["task"])["task"]["round_id"] == round_id
    assert admin.fl_round(round_id)["selected_devices"] == 1


def _refused(client_call) -> dict:
    with pytest.raises(APIError) as error:
        client_call()
    return error.value


def test_zoo_plans_need_the_admin_token_and_name_bad_fields(fleet):
    admin = fleet["admin"]
    plan = _plan(fleet)
    assert _refused(lambda: admin.create_zoo_rounds(plan, "wrong-token")).status == 401
    cases = [
        ("privacy", {**plan, "privacy": {"secure_aggregation": {"neighbour_count": 2}}}),
        ("privacy", {**plan, "privacy": {"dp": {"max_epsilon": 8.0, "clip_norm": 1.0}}}),
        ("strategy.name", {**plan, "strategy": {"name": "median"}}),
        ("model_id", {**plan, "model_id": _members(fleet["zoo"])[0].id}),
        ("zoo.calibration_sha256", {**plan, "zoo": {**plan["zoo"], "calibration_sha256": "0" * 64}}),
        ("zoo.calibration_sha256", {**plan, "zoo": {**plan["zoo"], "calibration_sha256": fleet["evaluation"][:63]}}),
        ("zoo.latency_budget_ms_by_class", {**plan, "zoo": {**plan["zoo"], "latency_budget_ms_by_class":
                                                                      {"tier-small": -1.0}}}),
        ("zoo", {key: value for key, value in plan.items() if key != "zoo"}),
        ("zoo.coverage_step_exponent", {**plan, "zoo": {**plan["zoo"], "coverage_step_exponent": 1.5}}),
        ("zoo.coverage_step_exponent", {**plan, "zoo": {**plan["zoo"], "coverage_step_exponent": -0.5}}),
    ]
    for field, config in cases:
        error = _refused(lambda: admin.create_zoo_rounds(config, DEFAULT_ADMIN_TOKEN))
        assert (error.status, error.field) == (422, field), (field, str(error))
    error = _refused(lambda: admin.create_rounds(plan, DEFAULT_ADMIN_TOKEN))  # the single-model endpoint
    assert (error.status, error.field) == (422, "zoo")
