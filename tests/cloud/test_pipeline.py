"""The zoo build end to end on a tiny configuration: cards, blobs, resume, seeds and the later stages."""

import json
import operator
import sys

import numpy as np
import onnxruntime as ort
import pytest
import torch

from fedzoo.cards import is_supernet
from fedzoo.cloud import pipeline
from fedzoo.cloud.executors import InProcessExecutor, ProcessExecutor, make_executor
from fedzoo.cloud.pipeline import BuildConfig, BuildInterrupted, build_zoo
from fedzoo.compress.zoo_extraction import WEIGHTS_ARTIFACT, SupernetSpec, read_weights_npz
from fedzoo.errors import InvalidInputError
from fedzoo.nas.devices import resolve_device
from fedzoo.nas.latency import MacsLatencyModel
from fedzoo.nas.pareto import dominates
from fedzoo.nas.subnet import build_subnet, count_macs, count_params
from fedzoo.nas.subnet_mapping import extract_weights
from fedzoo.nas.training import steps_per_epoch
from fedzoo.zoo import Zoo, sha256_of_file

torch.set_num_threads(1)


# for tests of what the build does around training (search executors, constraints, later stages): one epoch and
# no fine-tune take a tiny build from ~33 s to ~12 s
BRIEF_TRAINING = dict(epochs=1, finetune_epochs=0)


def tiny_config(out, **overrides):
    settings = dict(dataset="digits", out=out, preset="tiny", latency_source="macs", compress=False, training_graphs=False,
                    executor="in-process")
    return BuildConfig(**{**settings, **overrides})


class StageRecorder(pipeline.BuildReporter):
    """Each stage the build started, with its total steps and the steps it reported done."""

    def __init__(self) -> None:
        self.stages: list[list] = []

    def start_stage(self, name: str, total: int | None = None) -> None:
        self.stages.append([name, total, 0])

    def advance(self, completed: int) -> None:
        self.stages[-1][2] = completed


# the tests of the module's one full build run in one test process (`--dist loadgroup`): built once, not per worker
ON_THE_BUILD = pytest.mark.xdist_group("pipeline-build")


@pytest.fixture(scope="module")
def stages():
    return StageRecorder()


@pytest.fixture(scope="module")
def built(tmp_path_factory, stages):
    return build_zoo(tiny_config(tmp_path_factory.mktemp("zoo") / "zoo"), reporter=stages)


@pytest.mark.slow
@ON_THE_BUILD
def test_build_writes_at_least_eight_cards_that_rebuild_and_run(built):
    zoo = Zoo(built.zoo.root)
    cards = [card for card in zoo.cards() if not is_supernet(card)]
    assert len(cards) >= 8
    test = built.normalised["test"]
    for card in cards:
        assert card.id == f"digits-ofa-{card.id.rsplit('-', 1)[1]}" and card.family == "ofa-mbv2"
        assert card.input.shape == ["batch", 1, 8, 8] and card.input.normalisation.mean == built.split.mean
        assert card.precision == "fp32" and card.labels == [str(d) for d in range(10)]
        assert card.metrics.split == "test" and card.metrics.num_examples == len(test.y)
        latency = card.latency_ms["cloud-x86-1t"]
        assert latency.source == "measured" and latency.threads == 1 and latency.median_ms > 0
        assert sha256_of_file(zoo.model_path(card)) == card.sha256
        assert card.size_bytes == zoo.model_path(card).stat().st_size
        # the compression helper's loading recipe
        model = build_subnet(card.arch, len(card.labels), card.input.shape[1])
        model.load_state_dict(torch.load(zoo.blob_path(card.artifacts["torch_state"])))
        model.eval()
        assert count_params(model) == card.params and count_macs(model, (1, 1, 8, 8)) == card.macs
        session = ort.InferenceSession(str(zoo.model_path(card)), providers=["CPUExecutionProvider"])
        (logits,) = session.run(None, {"input": test.x})
        np.testing.assert_allclose(logits, model(torch.from_numpy(test.x)).detach().numpy(), rtol=1e-3, atol=1e-3)
        assert np.mean(logits.argmax(axis=1) == test.y) == pytest.approx(card.metrics.accuracy, abs=1e-9)


@pytest.mark.slow
@ON_THE_BUILD
def test_the_build_report_and_the_cards_say_where_the_supernet_trained(built):
    report = json.loads((built.zoo.root / pipeline.BUILD_REPORT).read_text())
    device = str(resolve_device("auto"))
    assert report["training"]["device"] == device and report["training"]["training_workers"] == 1
    assert report["training"]["mixed_precision"] is False and report["settings"]["device"] == "auto"
    assert set(report["stage_seconds"]) == {"data", "train", "search", "finetune", "cards"}
    assert report["train_examples"] == len(built.normalised["train"].y)
    assert all(card.details["build"]["device"] == device for card in built.cards)
    assert all(card.details["build"]["zoo_finetune_epochs"] == 2 for card in built.cards)  # the tiny preset's
    # what `fedzoo fl simulate` keeps out of the devices' data: the capped preset's first training examples
    assert all(card.details["build"]["train_examples"] == pipeline.PRESETS["tiny"].max_train_examples for card in built.cards)


@pytest.mark.slow
def test_a_build_on_two_training_workers_trains_there_and_writes_the_zoo_here(tmp_path):
    result = build_zoo(tiny_config(tmp_path / "zoo", training_workers=2, epochs=1, finetune_epochs=0, evaluations=4,
                                   population_size=2, device="cpu"))
    report = json.loads((tmp_path / "zoo" / pipeline.BUILD_REPORT).read_text())
    assert report["training"] == {"device": "cpu", "training_workers": 2, "mixed_precision": False, "sync_batchnorm": False}
    checkpoint = torch.load(tmp_path / "zoo" / pipeline.CHECKPOINT_FOLDER / "supernet.pt", weights_only=False)
    assert checkpoint["epoch"] == 1
    # the zoo's cards come from the weights the workers trained (no fine-tune after the search here)
    trained = result.supernet.state_dict()
    assert all(torch.equal(trained[name], checkpoint["model"][name]) for name in trained)
    assert len(result.cards) >= 1 and all(card.details["build"]["training_workers"] == 2 for card in result.cards)


def test_workers_that_do_not_split_the_batch_evenly_are_refused_before_any_work(tmp_path):
    with pytest.raises(InvalidInputError) as error:
        build_zoo(tiny_config(tmp_path / "zoo", training_workers=3))  # the tiny preset's batch is 16
    assert error.value.field == "workers" and "16" in str(error.value)
    assert not (tmp_path / "zoo").exists()


@ON_THE_BUILD
def test_the_zoo_finetune_spends_the_supernets_steps_per_epoch_on_the_zoos_subnets(built, stages):
    training = tiny_config("-").training
    steps = steps_per_epoch(len(built.normalised["train"].y), training.batch_size)
    supernet = [stage for stage in stages.stages if stage[0].startswith("train supernet")]
    finetune = [stage for stage in stages.stages if stage[0].startswith("fine-tune the zoo")]
    assert [stage[1:] for stage in supernet] == [[steps, steps]] * training.epochs
    assert [stage[1:] for stage in finetune] == [[steps, steps]] * training.zoo_finetune_epochs  # the same examples
    assert all(f"the zoo's {len(built.cards)} subnets" in stage[0] for stage in finetune)
    assert training.zoo_finetune_epochs == 2


@pytest.mark.slow
@ON_THE_BUILD
def test_the_zoo_finetune_raises_the_zoos_accuracy(built, tmp_path):
    untuned = build_zoo(tiny_config(tmp_path / "zoo", finetune_epochs=0))
    assert [card.arch for card in untuned.cards] == [card.arch for card in built.cards]  # the same search
    assert "finetune" not in json.loads((untuned.zoo.root / pipeline.BUILD_REPORT).read_text())["stage_seconds"]
    before = np.mean([card.metrics.accuracy for card in untuned.cards])
    after = np.mean([card.metrics.accuracy for card in built.cards])
    assert after > before + 0.05, (before, after)


@ON_THE_BUILD
def test_the_zoo_carries_its_supernet_and_every_model_is_a_subnet_of_it(built):
    zoo = Zoo(built.zoo.root)
    (supernet,) = [card for card in zoo.cards() if is_supernet(card)]
    assert supernet.task == "digits.supernet" and supernet.arch == built.supernet.space.max_arch()
    spec = SupernetSpec.from_card(supernet)
    assert spec.space == built.supernet.space and (spec.task, spec.zoo_family) == ("digits", "ofa-mbv2")
    weights = read_weights_npz(zoo.blob_path(supernet.artifacts[WEIGHTS_ARTIFACT]).read_bytes())
    assert sha256_of_file(zoo.model_path(supernet)) == supernet.sha256
    # each model's weights are its arch's slice of the supernet the zoo carries, the fine-tuned one (BN statistics
    # recalibrated)
    for card in built.cards:
        state = torch.load(zoo.blob_path(card.artifacts["torch_state"]))
        for name, value in extract_weights(spec.space, card.arch, weights).items():
            if not name.endswith(("running_mean", "running_var")):
                np.testing.assert_allclose(state[name].numpy(), value, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.slow
@ON_THE_BUILD
def test_zoo_learned_something_and_is_a_spread_of_the_tradeoff(built):
    accuracies = [card.metrics.accuracy for card in built.cards]
    assert max(accuracies) > 0.3  # chance is 0.1 on ten digits, after two tiny epochs
    search_points = [(card.details["search"]["validation_accuracy"], card.details["search"]["latency_ms"]) for card in built.cards]
    front_size = sum(not any(dominates(other, point) for other in search_points) for point in search_points)
    assert front_size >= 2
    assert len({card.macs for card in built.cards}) >= 4


@pytest.mark.slow
@ON_THE_BUILD
def test_same_seed_builds_the_same_zoo_and_an_interrupted_build_resumes_to_it(built, tmp_path):
    out = tmp_path / "resumed"
    with pytest.raises(BuildInterrupted, match="after epoch 1"):
        build_zoo(tiny_config(out, stop_after_epoch=1))
    assert (out / ".checkpoint" / "supernet.pt").is_file() and not (out / "cards").exists()
    with pytest.raises(BuildInterrupted, match="generation 1"):
        build_zoo(tiny_config(out, stop_after_generation=1))
    resumed = build_zoo(tiny_config(out))
    assert [c.id for c in resumed.cards] == [c.id for c in built.cards]
    assert [c.artifacts["torch_state"] for c in resumed.cards] == [c.artifacts["torch_state"] for c in built.cards]
    assert [c.metrics.accuracy for c in resumed.cards] == [c.metrics.accuracy for c in built.cards]


@pytest.mark.slow
def test_a_checkpoint_from_other_settings_is_refused(tmp_path):
    out = tmp_path / "zoo"
    with pytest.raises(BuildInterrupted):
        build_zoo(tiny_config(out, stop_after_epoch=1))
    with pytest.raises(InvalidInputError, match="other settings"):
        build_zoo(tiny_config(out, seed=1))


@pytest.mark.slow
def test_constraints_are_met_by_every_card(tmp_path):
    estimator = MacsLatencyModel()
    budget_ms = 0.05 + 0.05 * 0.12  # the tiny space's subnets span about 0.09 to 0.35 MMACs
    result = build_zoo(tiny_config(tmp_path / "zoo", latency_budget_ms=budget_ms, max_params=12000, **BRIEF_TRAINING),
                       latency_estimator=estimator)
    assert result.cards
    for card in result.cards:
        assert card.params <= 12000
        assert card.details["search"]["latency_ms"] <= budget_ms


@pytest.mark.slow
def test_a_zoo_for_the_fleets_budgets_holds_the_best_searched_subnet_within_each(tmp_path):
    budgets = (150_000, 250_000)  # the tiny space's subnets span about 0.09 to 0.35 MMACs on 8x8 digits
    result = build_zoo(tiny_config(tmp_path / "zoo", zoo_budgets_macs=budgets, **BRIEF_TRAINING))
    assert 1 <= len(result.cards) <= len(budgets)
    for budget in budgets:
        best = max((c for c in result.search.evaluated if c.macs <= budget), key=lambda c: c.point[0])
        assert any(card.arch == best.arch and card.macs <= budget for card in result.cards)


def test_unreachable_budget_fails_before_training(tmp_path):
    with pytest.raises(InvalidInputError, match="no subnet fits --latency-budget-ms"):
        build_zoo(tiny_config(tmp_path / "zoo", latency_budget_ms=0.01))
    with pytest.raises(InvalidInputError, match="no subnet fits --max-params 10"):
        build_zoo(tiny_config(tmp_path / "zoo", max_params=10))
    assert not (tmp_path / "zoo" / ".checkpoint").exists()


def test_largest_only_epochs_replace_the_presets_and_cannot_exceed_the_supernets_epochs(tmp_path):
    assert tiny_config(tmp_path / "zoo").training.largest_only_epochs == 0  # the tiny preset's
    assert tiny_config(tmp_path / "zoo", epochs=4, largest_only_epochs=3).training.largest_only_epochs == 3
    with pytest.raises(InvalidInputError, match="--largest-only-epochs 3 exceeds the supernet's --epochs 2") as refused:
        build_zoo(tiny_config(tmp_path / "zoo", epochs=2, largest_only_epochs=3))
    assert refused.value.field == "largest_only_epochs"
    assert not (tmp_path / "zoo").exists()  # refused before any work
    # only the user's own value is refused: a shortened --epochs under a preset's larger one still builds
    assert tiny_config(tmp_path / "zoo", preset="default", epochs=1).training.largest_only_epochs == 2


def test_bad_output_folder_and_dataset(tmp_path):
    a_file = tmp_path / "file.txt"
    a_file.write_text("keep me")
    with pytest.raises(InvalidInputError, match="is a file"):
        build_zoo(tiny_config(a_file))
    assert a_file.read_text() == "keep me"
    with pytest.raises(InvalidInputError, match="unknown data set 'cifar'"):
        build_zoo(tiny_config(tmp_path / "zoo", dataset="cifar"))


@pytest.mark.slow
def test_compress_and_training_graph_stages_run_after_the_cards(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(pipeline, "compress_zoo",
                        lambda zoo_dir, split, workers, device: calls.append(("compress", zoo_dir, len(split.test), torch.get_num_threads(), workers)))
    monkeypatch.setattr(pipeline, "attach_training_graphs", lambda zoo_dir: calls.append(("graphs", zoo_dir)))
    out = tmp_path / "zoo"
    torch.set_num_threads(2)
    try:
        result = build_zoo(tiny_config(out, compress=True, training_graphs=True, evaluations=10, torch_threads=1, num_workers=3,
                                       **BRIEF_TRAINING))
        assert torch.get_num_threads() == 2  # the caller's setting is restored
    finally:
        torch.set_num_threads(1)
    # the compress stage fine-tunes with the build's thread count, not torch's default, in the build's workers
    assert calls == [("compress", out, len(result.split.test), 1, 3), ("graphs", out)]
    assert {"compress", "training graphs"} <= set(result.stage_seconds)


def test_unknown_executor_is_refused_and_in_process_maps_in_order():
    with pytest.raises(InvalidInputError, match="unknown executor 'dask'"):
        make_executor("dask")
    done = []
    assert InProcessExecutor().map(lambda offset, item: item * item + offset, 1, [3, 1, 2], on_result=done.append) == [10, 2, 5]
    assert done == [1, 2, 3]


def test_process_executor_maps_in_item_order_in_its_workers_and_raises_their_errors():
    executor = make_executor("processes", num_workers=2)
    assert isinstance(executor, ProcessExecutor) and executor.num_workers == 2
    done = []
    try:
        assert executor.map(operator.add, 10, [3, 1, 2], on_result=done.append) == [13, 11, 12]
        assert done == [1, 2, 3]
        with pytest.raises(ZeroDivisionError):
            executor.map(operator.truediv, 1, [1, 0])
    finally:
        executor.close()
    # one worker runs inline: no process to start, and a function the workers could not import still runs
    assert ProcessExecutor(1).map(lambda offset, item: item + offset, 1, [1, 2]) == [2, 3]


@pytest.mark.slow
def test_build_on_worker_processes_matches_the_in_process_build(tmp_path):
    settings = dict(evaluations=10, population_size=5, **BRIEF_TRAINING)
    local = build_zoo(tiny_config(tmp_path / "local", **settings))
    spread = build_zoo(tiny_config(tmp_path / "processes", executor="processes", num_workers=2, **settings))
    assert [(c.arch, c.accuracy, c.loss, c.latency_ms) for c in spread.search.evaluated] == [
        (c.arch, c.accuracy, c.loss, c.latency_ms) for c in local.search.evaluated
    ]
    assert [c.id for c in spread.cards] == [c.id for c in local.cards]


def test_measured_latency_search_times_candidates_one_at_a_time(tmp_path, monkeypatch):
    asked = []

    def recording_executor(name, num_workers=None):
        asked.append((name, num_workers))
        return InProcessExecutor()

    monkeypatch.setattr(pipeline, "make_executor", recording_executor)
    build_zoo(tiny_config(tmp_path / "zoo", executor="processes", num_workers=2, latency_source="measured", evaluations=4, population_size=2,
                          **BRIEF_TRAINING))
    assert asked == [("processes", 1)]


def test_ray_executor_without_ray_names_the_extra(monkeypatch):
    from fedzoo.cloud.executors import ExecutorUnavailableError

    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` fail as if it were not installed
    with pytest.raises(ExecutorUnavailableError, match=r"pip install 'fedzoo\[ray\]'"):
        make_executor("ray")
