"""Zoo-wide rounds against the real server on loopback: devices of two tiers train the subnets their lookup
picks (real training graphs in onnxruntime, sklearn digits), the server maps the deltas onto the supernet,
re-extracts every zoo model and publishes new versions that lookup serves. On SQLite, and on a fresh PostgreSQL
database per test when FEDZOO_TEST_POSTGRES_URL is set."""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone

import httpx
import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, func, select, update

from fedzoo.admin.operator_client import OperatorClient
from fedzoo.cards import Latency, ModelCard, is_supernet
from fedzoo.cli import cli
from fl_helpers import OPEN_GATE, TEST_POLL_S
from zoo_helpers import TIERS, TINY_ZOO_GROUP, publish_zoo, supernet_card, zoo_members
from server_helpers import fresh_postgres_database, log_in
from fedzoo.clients.client import FedzooClient
from fedzoo.clients.errors import APIError
from fedzoo.clients.participation import run_task
from fedzoo.datasets import dirichlet_partition, load_dataset, split_dataset
from fedzoo.device import CpuInfo, DeviceProfile, RuntimeInfo
from fedzoo.edge.local_training import LocalData, normalise
from fedzoo.edge.runtime import create_session
from fedzoo.server.fl.tables import FLRound
from fedzoo.server.tables import ModelRecord
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN, LoopbackServer
from fedzoo.zoo import Zoo
from fedzoo.aggregation.per_element import is_statistic
from fedzoo.compress.zoo_extraction import SupernetSpec, subnet_module
from fedzoo.edge.onnx_initializers import read_float_initializers
from fedzoo.nas.space import SearchSpace
from fedzoo.nas.subnet import recalibrate_batchnorm
from fedzoo.server.fl.schemas import ZooSettings
from fedzoo.server.fl.zoo_plan import Supernet, training_card_id
from fedzoo.signing import TrustedKeys, verify_card
from fedzoo.update_codec import decode_update

# one test process runs every module on the session's tiny zoo (`--dist loadgroup`): built once, not once per worker
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(TINY_ZOO_GROUP)]
POSTGRES_URL = os.environ.get("FEDZOO_TEST_POSTGRES_URL")
@pytest.fixture(scope="module")
def compressed_zoo(zoo, tmp_path_factory):
    """The zoo with the compression stage run on it (as `fedzoo zoo build` does by default): a pruned variant of
    every root, fine-tuned by distillation, and INT8 variants; the pruned variants are the fastest of each line.
    A quarter of the channels pruned, so lookup serves some variant over the next smaller root (with a half pruned,
    the zoo's narrow-stage roots are at least as accurate as every variant that fits their budgets)."""
    from fedzoo.compress.finetune import FineTuning
    from fedzoo.compress.pipeline import compress_zoo

    out = tmp_path_factory.mktemp("compressed") / "zoo"
    shutil.copytree(zoo.root, out)
    compress_zoo(out, split_dataset(load_dataset("digits"), seed=0), accuracy_tolerance_points=100.0,
                 pruning_ratios=(0.25,), fine_tuning=FineTuning(epochs=3), int8_recipes=("qdq-u8s8",),
                 timed_runs=2)
    compressed = Zoo(out)
    for card in compressed.cards():
        if card.id not in {known.id for known in zoo.cards()}:
            factor = 2 if card.precision == "int8" else 1  # INT8 measured slower, as in the zoo fixture
            latency = {tier: Latency(median_ms=factor * card.macs / 1e4, source="measured") for tier in TIERS}
            compressed.add_card(card.model_copy(update={"latency_ms": {**card.latency_ms, **latency}}))
    return compressed


@pytest.fixture
def fleet(zoo, tmp_path):
    with _fleet(zoo, tmp_path) as fleet:
        yield fleet


@pytest.fixture
def compressed_fleet(compressed_zoo, tmp_path):
    with _fleet(compressed_zoo, tmp_path) as fleet:
        yield fleet


@contextmanager
def _database(tmp_path):
    """The server's database URL: the data directory's SQLite file, or a fresh PostgreSQL database."""
    if not POSTGRES_URL:
        yield f"sqlite:///{tmp_path / 'server' / 'registry.db'}"
        return
    with fresh_postgres_database(POSTGRES_URL, "fedzoo_zoo") as url:
        yield url


@contextmanager
def _fleet(zoo, tmp_path):
    """A server with the zoo published, the evaluation and calibration sets uploaded and a device per shard."""
    split = split_dataset(load_dataset("digits"), seed=0)
    with _database(tmp_path) as database_url, LoopbackServer(tmp_path / "server", environ={
            "FEDZOO_DATABASE_URL": database_url}) as server, \
            OperatorClient(server.url, token=DEFAULT_ADMIN_TOKEN, cache_dir=tmp_path / "admin") as admin:
        evaluation, calibration = publish_zoo(admin, zoo, split)
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
               "evaluation": evaluation, "calibration": calibration, "zoo": zoo, "database_url": database_url}
        for device in devices:
            device.close()


def _plan(fleet, **overrides) -> dict:
    zoo = fleet["zoo"]
    smallest = zoo_members(zoo)[0]
    config = {"model_id": supernet_card(zoo).id, "evaluation_sha256": fleet["evaluation"], "min_clients": 4,
              "target_clients": 4, "over_selection": 0.0, "deadline_s": 120, "local_epochs": 1, "batch_size": 16,
              "learning_rate": 0.05, "max_accuracy_drop": OPEN_GATE, "poll_interval_s": TEST_POLL_S,
              "zoo": {"latency_budget_ms": 1e5, "calibration_sha256": fleet["calibration"],
                      "latency_budget_ms_by_class": {"tier-small": smallest.macs / 1e4 * 1.01}}}
    config.update(overrides)
    return config


def test_a_zoo_wide_round_improves_the_supernet_and_republishes_every_zoo_model(fleet):
    zoo, admin, split = fleet["zoo"], fleet["admin"], fleet["split"]
    members = zoo_members(zoo)
    round_id = admin.create_zoo_rounds(_plan(fleet), DEFAULT_ADMIN_TOKEN)["id"]
    for device, shard in zip(fleet["devices"], fleet["shards"]):
        work = device.fl_task(supernet_card(zoo).details["supernet"]["task"])["task"]
        assert work is not None and work["round_id"] == round_id
        training_card = device.card(work["model_id"])
        # the device trains its tier's subnet: a training card never served by lookup
        assert training_card.task.endswith(".subnet") and training_card.parent_id == supernet_card(zoo).id
        result = run_task(device, work, LocalData(split.train.x[shard], split.train.y[shard]))
        assert result.outcome == "accepted"
    view = admin.wait_for_round(round_id, timeout_s=300)
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
    assert is_supernet(supernet) and supernet.version == 2 and supernet.parent_id == supernet_card(zoo).id
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


def _fleet_loss(admin: FedzooClient, card: ModelCard, x: np.ndarray, y: np.ndarray) -> float:
    """Mean cross-entropy of a served model on the given examples (onnxruntime, as a device runs it)."""
    session = create_session(admin.download_model(card).read_bytes())
    feed = {session.get_inputs()[0].name: normalise(x, card.input.normalisation)}
    logits = session.run(None, feed)[0].astype(np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    log_probabilities = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-log_probabilities[np.arange(len(y)), y].mean())


def test_zoo_wide_rounds_lower_every_zoo_models_loss_on_the_fleets_data(fleet):
    """What a zoo-wide round optimises, checked on what it publishes: after two rounds, every re-published zoo
    model (the tier that never trained it included) fits the devices' pooled data better than its version 1.
    Held-out accuracy is the benchmark's claim (bench/fl_zoo.py), not this test's."""
    zoo, admin, split = fleet["zoo"], fleet["admin"], fleet["split"]
    members = zoo_members(zoo)
    pooled = np.concatenate(fleet["shards"])
    x, y = split.train.x[pooled], split.train.y[pooled]
    plan = _plan(fleet, num_rounds=2, local_epochs=2)
    round_id = admin.create_zoo_rounds(plan, DEFAULT_ADMIN_TOKEN)["id"]
    next_version: dict[str, str] = {}  # each round's model id -> the version it published
    for _ in range(plan["num_rounds"]):
        for device, shard in zip(fleet["devices"], fleet["shards"]):
            work = device.fl_task(supernet_card(zoo).details["supernet"]["task"])["task"]
            assert work is not None and work["round_id"] == round_id
            assert run_task(device, work, LocalData(split.train.x[shard], split.train.y[shard])).outcome == "accepted"
        view = admin.wait_for_round(round_id, timeout_s=300)
        assert view["state"] == "closed", view["outcome"]
        next_version |= {model["model_id"]: model["new_model_id"] for model in view["outcome"]["zoo"]["models"]
                         if "new_model_id" in model}  # an INT8 variant behind its gate may not publish
        round_id = view["next_round_id"]
    assert round_id is None
    for card in members:
        version_3 = admin.card(next_version[next_version[card.id]])
        assert version_3.version == 3 and version_3.line_id == card.line_id
        before, after = _fleet_loss(admin, card, x, y), _fleet_loss(admin, version_3, x, y)
        assert after < before, (card.id, before, after)


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
        work = device.fl_task(supernet_card(zoo).details["supernet"]["task"])["task"]
        run_task(device, work, LocalData(split.train.x[shard], split.train.y[shard]))
    view = admin.wait_for_round(round_id, timeout_s=300)
    assert view["state"] == "closed", view["outcome"]
    coverage = view["outcome"]["zoo"]["coverage"]
    # two devices per tier: elements only the large tier holds are covered twice, below 3: never released
    assert coverage["released"] < coverage["parameters"] - coverage["uncovered"]
    assert all(layer["released"] <= layer["elements"] for layer in coverage["by_layer"].values())


def test_a_device_whose_budget_fits_no_zoo_model_sits_the_round_out_and_hears_why(fleet):
    admin, zoo = fleet["admin"], fleet["zoo"]
    smallest = zoo_members(zoo)[0]
    plan = _plan(fleet, min_clients=2, target_clients=2)
    plan["zoo"]["latency_budget_ms_by_class"] = {"tier-small": smallest.macs / 1e4 / 2}  # below every model
    round_id = admin.create_zoo_rounds(plan, DEFAULT_ADMIN_TOKEN)["id"]
    small, large = fleet["devices"][0], fleet["devices"][-1]
    answer = small.fl_task(supernet_card(zoo).details["supernet"]["task"])
    assert answer["task"] is None and "no zoo model fits" in answer["reason"]
    assert large.fl_task(supernet_card(zoo).details["supernet"]["task"])["task"]["round_id"] == round_id
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
        # SecAgg+ needs a cohort of 3 (zoo-wide: per subnet, docs/privacy.md); DP needs SecAgg+'s cohorts, central
        # noise and a fixed clip norm
        ("privacy.secure_aggregation", {**plan, "target_clients": 2, "min_clients": 2,
                                        "privacy": {"secure_aggregation": {"neighbour_count": 2}}}),
        ("privacy.dp", {**plan, "privacy": {"dp": {"max_epsilon": 8.0, "clip_norm": 1.0}}}),
        ("privacy.dp.adaptive", {**plan, "privacy": {"secure_aggregation": {},
                                                     "dp": {"max_epsilon": 8.0, "clip_norm": 1.0, "adaptive": {}}}}),
        ("strategy.name", {**plan, "strategy": {"name": "median"}}),
        ("model_id", {**plan, "model_id": zoo_members(fleet["zoo"])[0].id}),
        ("zoo.calibration_sha256", {**plan, "zoo": {**plan["zoo"], "calibration_sha256": "0" * 64}}),
        ("zoo.calibration_sha256", {**plan, "zoo": {**plan["zoo"], "calibration_sha256": fleet["evaluation"][:63]}}),
        ("zoo.latency_budget_ms_by_class", {**plan, "zoo": {**plan["zoo"], "latency_budget_ms_by_class":
                                                                      {"tier-small": -1.0}}}),
        ("zoo", {key: value for key, value in plan.items() if key != "zoo"}),
        ("zoo.coverage_step_exponent", {**plan, "zoo": {**plan["zoo"], "coverage_step_exponent": 1.5}}),
        ("zoo.coverage_step_exponent", {**plan, "zoo": {**plan["zoo"], "coverage_step_exponent": -0.5}}),
        ("zoo.device_batch_norm", {**plan, "zoo": {**plan["zoo"], "device_batch_norm": "frozen"}}),
        # each zoo model is gated against its own line: one anchor model cannot be every line's reference
        ("gate.compare_with", {**plan, "gate": {"compare_with": "anchor",
                                                "anchor_model_id": zoo_members(fleet["zoo"])[0].id}}),
    ]
    for field, config in cases:
        error = _refused(lambda: admin.create_zoo_rounds(config, DEFAULT_ADMIN_TOKEN))
        assert (error.status, error.field) == (422, field), (field, str(error))
    error = _refused(lambda: admin.create_rounds(plan, DEFAULT_ADMIN_TOKEN))  # the single-model endpoint
    assert (error.status, error.field) == (422, "zoo")
    # a refused plan creates nothing: no round, no training card
    engine = create_engine(fleet["database_url"])
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(FLRound)).scalar_one() == 0
        assert connection.execute(select(func.count()).select_from(ModelRecord).where(
            ModelRecord.task.endswith(".subnet"))).scalar_one() == 0
    engine.dispose()


def _train_every_device(fleet, round_id: int, labels=None) -> None:
    """Every device trains the task the round gives it on its shard (with `labels` instead of its own, if given)."""
    split, task = fleet["split"], supernet_card(fleet["zoo"]).details["supernet"]["task"]
    for device, shard in zip(fleet["devices"], fleet["shards"]):
        work = device.fl_task(task)["task"]
        assert work is not None and work["round_id"] == round_id
        targets = split.train.y[shard] if labels is None else labels[shard]
        assert run_task(device, work, LocalData(split.train.x[shard], targets)).outcome == "accepted"


def _tier_budgets(fleet) -> dict[str, float]:
    plan = _plan(fleet)["zoo"]
    return {"tier-small": plan["latency_budget_ms_by_class"]["tier-small"], "tier-large": plan["latency_budget_ms"]}


def test_a_zoo_wide_round_retires_stale_compressed_variants_and_publishes_in_the_background(compressed_fleet):
    fleet = compressed_fleet
    zoo, admin, devices = fleet["zoo"], fleet["admin"], fleet["devices"]
    compressed = {card.id: card for card in zoo.cards() if card.pruning is not None or card.precision == "int8"}
    pruned = {model_id for model_id, card in compressed.items() if card.pruning is not None}
    # a round trained on shuffled labels, behind an open parent-only gate: every line moves to a worse version, so
    # only retirement keeps lookup from serving the stale variants, now more accurate than their lines' new versions
    plan = _plan(fleet, learning_rate=0.5, gate={"compare_with": "parent"})
    round_id = admin.create_zoo_rounds(plan, DEFAULT_ADMIN_TOKEN)["id"]
    # the plan measured every model of the task on its evaluation set: lookup ranks build cards on the server's set
    served = {card.id: admin.card(card.id).unsigned["server_evaluation"] for card in zoo.cards() if not is_supernet(card)}
    assert {evaluation["evaluation_sha256"] for evaluation in served.values()} == {fleet["evaluation"]}
    # the budgets (the small tier's latencies, from the smallest zoo model's up) at which lookup serves a variant
    task, smallest_ms = fleet["split"].dataset.name, zoo_members(zoo)[0].latency_ms["tier-small"].median_ms
    budgets = sorted({card.latency_ms["tier-small"].median_ms for card in zoo.cards() if not is_supernet(card)
                      and card.latency_ms["tier-small"].median_ms >= smallest_ms})
    before = {budget: devices[0].lookup(task, budget)["model"]["id"] for budget in budgets}
    assert set(before.values()) & set(compressed), before
    _train_every_device(fleet, round_id, labels=np.random.default_rng(0).permutation(fleet["split"].train.y))
    # the upload that completed the round returned before the publication ended: the round view shows it going on
    view = admin.fl_round(round_id)
    assert view["state"] == "aggregating" and view["publication"]["stage"] != "published", view["publication"]
    stages = {view["publication"]["stage"]}
    give_up = time.monotonic() + 300
    while view["state"] == "aggregating" and time.monotonic() < give_up:
        time.sleep(0.1)
        view = admin.fl_round(round_id)
        stages.add((view["publication"] or {}).get("stage"))
    assert view["state"] == "closed", view["outcome"]
    publication = view["publication"]
    assert publication["stage"] == "published" and publication["zoo_models_done"] == publication["zoo_models_total"]
    assert publication["finished_at"] >= publication["started_at"] and publication["seconds"] >= 0
    assert stages <= {"queued", "aggregating", "re-extracting", "publishing", "published"}
    outcome = view["outcome"]["zoo"]
    moved = {model["model_id"]: model["new_model_id"] for model in outcome["models"] if model["published"]}
    refreshed = set(moved.values())
    # every compressed variant made from a version this round superseded is retired from lookup (an INT8 one the
    # round re-quantized has its new version, made from the new fp32 model)
    stale = {model_id for model_id, card in compressed.items()
             if card.parent_id in moved or compressed.get(card.parent_id, card).parent_id in moved}
    assert pruned & stale and set(outcome["retired_from_lookup"]) == stale
    for model_id in stale:  # retired, still downloadable by id
        card = admin.card(model_id)
        assert card.unsigned["retired_by"] in refreshed
        assert admin.download_model(card).read_bytes()
    # at every budget and tier, lookup serves a version of a zoo model, never a stale variant
    for budget in [*budgets, *_tier_budgets(fleet).values()]:
        for device in (devices[0], devices[-1]):
            chosen = device.lookup(task, budget)["model"]
            assert chosen["id"] not in stale, (budget, chosen["id"])
            ranked_by = admin.card(chosen["id"]).unsigned["server_evaluation"]  # the plan's set, as every model's
            assert ranked_by["evaluation_sha256"] == fleet["evaluation"]


def test_a_zoo_plan_gating_on_the_best_version_refuses_one_worse_than_its_lines_best(fleet):
    admin, split = fleet["admin"], fleet["split"]
    # a plan gated against the parent alone, with an open tolerance, publishes a round trained on shuffled labels
    worse = admin.create_zoo_rounds(_plan(fleet, learning_rate=0.5, gate={"compare_with": "parent"}),
                                    DEFAULT_ADMIN_TOKEN)["id"]
    _train_every_device(fleet, worse, labels=np.random.default_rng(0).permutation(split.train.y))
    worse_view = admin.wait_for_round(worse, timeout_s=300)
    assert worse_view["state"] == "closed", worse_view["outcome"]
    dropped = {model["new_model_id"]: model for model in worse_view["outcome"]["zoo"]["models"]
               if model["published"] and model["accuracy_after"] < model["accuracy_before"]}
    assert dropped  # the shuffled labels cost accuracy, and the parent-only gate let it through
    # the next plan gates on the best version of each line: the build's, measured on the same evaluation set
    best = admin.create_zoo_rounds(_plan(fleet, model_id=worse_view["result_model_id"], max_accuracy_drop=0.0),
                                   DEFAULT_ADMIN_TOKEN)["id"]
    _train_every_device(fleet, best)
    view = admin.wait_for_round(best, timeout_s=300)
    models = view["outcome"]["zoo"]["models"]
    for model in models:
        gate = model["gate"]
        assert gate["accuracy"] >= model["accuracy_before"]
        if model["accuracy_after"] + 1e-12 < gate["accuracy"]:
            assert not model["published"], model
        elif "against the new fp32 model" not in model["reason"]:  # an fp32 model: this gate alone
            assert model["published"], model
        if model["model_id"] in dropped:  # the line's best is the version before the drop, not the parent
            assert gate["compare_with"] == "best" and gate["model_id"] == dropped[model["model_id"]]["model_id"]
    # a version better than its parent but worse than its line's best is refused: the parent-only gate took it
    assert any(not model["published"] and model["accuracy_after"] >= model["accuracy_before"]
               and model["model_id"] in dropped for model in models), models


def test_a_publication_whose_worker_died_is_re_run_by_the_next_advance_and_published_once(fleet):
    admin, zoo = fleet["admin"], fleet["zoo"]
    round_id = admin.create_zoo_rounds(_plan(fleet, min_clients=3, target_clients=4), DEFAULT_ADMIN_TOKEN)["id"]
    split, task = fleet["split"], supernet_card(zoo).details["supernet"]["task"]
    for device, shard in list(zip(fleet["devices"], fleet["shards"]))[:3]:  # below the target: nobody claims it
        run_task(device, device.fl_task(task)["task"], LocalData(split.train.x[shard], split.train.y[shard]))
    # what a worker killed mid-publication leaves: the round claimed by it, its lease lapsed, its progress half-way
    engine = create_engine(fleet["database_url"])
    with engine.begin() as connection:
        connection.execute(update(FLRound).where(FLRound.id == round_id).values(
            state="aggregating", aggregation_owner="killed-worker",
            aggregation_lease_until=datetime.now(timezone.utc) - timedelta(seconds=60),
            publication_json=json.dumps({"stage": "re-extracting", "zoo_models_done": 1})))
    engine.dispose()
    # each read advances: the lapsed lease is claimed and the job re-run here
    view = admin.wait_for_round(round_id, timeout_s=300)
    assert view["state"] == "closed", view["outcome"]
    assert view["publication"]["stage"] == "published" and view["outcome"]["aggregated_updates"] == 3
    supernets = [card for card in admin.list_models(task=supernet_card(zoo).task)["models"]
                 if card["parent_id"] == supernet_card(zoo).id]
    assert [card["id"] for card in supernets] == [view["result_model_id"]]  # published exactly once
    for model in view["outcome"]["zoo"]["models"]:
        if model["published"]:
            versions = [card for card in admin.list_models(task=split.dataset.name)["models"]
                        if card["parent_id"] == model["model_id"] and card["version"] == 2]
            assert [card["id"] for card in versions] == [model["new_model_id"]]


def _statistics(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: value for name, value in weights.items() if is_statistic(name)}


def _npz_arrays(path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


@contextmanager
def _recording_uploads(device: FedzooClient, sent: list[bytes]):
    """The device uploads as ever, and every update archive it sends is appended to `sent`."""
    upload = device.upload_update

    def recorded(upload_url: str, metadata: dict, delta_npz: bytes) -> dict:
        sent.append(delta_npz)
        return upload(upload_url, metadata, delta_npz)

    device.upload_update = recorded
    try:
        yield
    finally:
        del device.upload_update


def test_an_inference_batchnorm_zoo_round_trains_recalibrated_statistics_and_uploads_none(fleet):
    """`zoo.device_batch_norm: "inference"`: each device trains a training card whose statistics are recalibrated on
    the plan's calibration images and fixed (its graph has no statistic inputs), uploads no `running.*` entries, and
    the round republishes the zoo, the supernet's statistics as they were."""
    zoo, admin, split = fleet["zoo"], fleet["admin"], fleet["split"]
    members, supernet = zoo_members(zoo), supernet_card(zoo)
    plan = _plan(fleet)
    plan["zoo"]["device_batch_norm"] = "inference"
    round_id = admin.create_zoo_rounds(plan, DEFAULT_ADMIN_TOKEN)["id"]
    spec = SupernetSpec.from_card(supernet)
    supernet_weights = _npz_arrays(zoo.blob_path(supernet.artifacts["supernet_weights"]))
    calibration = normalise(split.validation.x, supernet.input.normalisation)
    uploads: list[bytes] = []
    for device, shard in zip(fleet["devices"], fleet["shards"]):
        work = device.fl_task(supernet.details["supernet"]["task"])["task"]
        assert work is not None and work["round_id"] == round_id
        card = device.card(work["model_id"])
        assert card.details["zoo_training"]["batch_norm"] == "inference"
        assert card.details["zoo_training"]["calibration_sha256"] == fleet["calibration"]
        # the graph normalises with fixed statistics: none is an input or an output
        graph = onnx.load(device.download_training_graph(card))
        assert {prop.key: prop.value for prop in graph.metadata_props}["fedzoo.batch_norm"] == "inference"
        assert not [value.name for value in graph.graph.input if is_statistic(value.name)]
        assert not [value.name for value in graph.graph.output if value.name.startswith("running.")]
        # its statistics are the subnet's recalibrated on the calibration images, not the supernet's
        served = read_float_initializers(device.download_model(card).read_bytes())
        recalibrated = subnet_module(spec, card.arch, supernet_weights)
        recalibrate_batchnorm(recalibrated, calibration)
        expected = {name: value.numpy() for name, value in recalibrated.state_dict().items() if is_statistic(name)}
        assert expected and set(expected) <= set(served)
        for name, value in expected.items():
            np.testing.assert_allclose(served[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
        stale = subnet_module(spec, card.arch, supernet_weights).state_dict()
        assert any(not np.allclose(served[name], stale[name].numpy()) for name in expected)
        sent = len(uploads)
        with _recording_uploads(device, uploads):
            assert run_task(device, work, LocalData(split.train.x[shard], split.train.y[shard])).outcome == "accepted"
        assert len(uploads) == sent + 1
    for delta in uploads:  # the Python SDK sends what the graph trains: parameters, no running statistics
        entries = decode_update(delta)[0]
        assert entries and not [name for name in entries if name.startswith("running.")]
    view = admin.wait_for_round(round_id, timeout_s=300)
    assert view["state"] == "closed", view["outcome"]
    outcome = view["outcome"]["zoo"]
    assert outcome["new_versions"] >= len(members)
    # the server took updates without statistics: the supernet's weights moved, its statistics did not
    new_supernet = admin.card(view["result_model_id"])
    new_weights = _npz_arrays(admin.download_blob(new_supernet.artifacts["supernet_weights"]))
    old_statistics, new_statistics = _statistics(supernet_weights), _statistics(new_weights)
    assert old_statistics and set(new_statistics) == set(old_statistics)
    for name, value in old_statistics.items():
        np.testing.assert_array_equal(new_statistics[name], value, err_msg=name)
    assert any(not np.array_equal(new_weights[name], value) for name, value in supernet_weights.items()
               if not is_statistic(name))
    # every published card verifies against the server's keys, and its blob against its card
    keys = TrustedKeys.from_json(httpx.get(f"{fleet['server'].url}/v1/keys").json())
    published = [model["new_model_id"] for model in outcome["models"] if model["published"]]
    assert {model["model_id"] for model in outcome["models"] if model["published"]} >= {card.id for card in members}
    for model_id in [view["result_model_id"], *published]:
        card = admin.card(model_id)
        verify_card(card, keys)
        assert create_session(admin.download_model(card).read_bytes()) is not None


def test_training_cards_of_the_two_batchnorm_modes_never_share_an_id(zoo):
    """A plan in one mode never trains the card another mode published (cached per arch and supernet version), nor
    an inference-mode card whose statistics come from other calibration images."""
    card = supernet_card(zoo)
    supernet = Supernet(card, SearchSpace.from_dict(card.details["supernet"]["space"]), {}, 10, 1)
    arch = zoo_members(zoo)[0].arch
    settings = {"latency_budget_ms": 1.0, "calibration_sha256": "a" * 64}
    ids = {training_card_id(supernet, arch, ZooSettings(**settings)),
           training_card_id(supernet, arch, ZooSettings(**settings, device_batch_norm="training")),
           training_card_id(supernet, arch, ZooSettings(**settings, device_batch_norm="inference")),
           training_card_id(supernet, arch, ZooSettings(**{**settings, "calibration_sha256": "b" * 64},
                                                        device_batch_norm="inference"))}
    assert len(ids) == 3 and all(len(card_id) <= 128 for card_id in ids)
