import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn
from zoo_factory import add_trained_model, digits_arch, digits_split, make_arch, snapshot

from fedzoo.datasets import DatasetSplit, Subset
from fedzoo.compress.cli import compress
from fedzoo.compress.errors import CalibrationDataError, UnsupportedOperationError
from fedzoo.nas.export import export_onnx
from fedzoo.compress.finetune import FineTuning
from fedzoo.compress.pipeline import REPORT_NAME, compress_zoo, default_model_builder
from fedzoo.compress.quantize import DEFAULT_INT8_RECIPES, INT8_RECIPES
from fedzoo.zoo import Zoo, sha256_of_file
from fedzoo.errors import InvalidInputError

pytestmark = pytest.mark.slow
FINE_TUNING = FineTuning(epochs=4, learning_rate=3e-3)
TOLERANCE_POINTS = 3.0  # digits' test split has 359 images: one point is under four of them


@pytest.fixture(scope="module")
def split() -> DatasetSplit:
    return digits_split()


@pytest.fixture(scope="module")
def built_zoo(split, tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("built") / "zoo"
    add_trained_model(Zoo.create(root), split, "digits-a", digits_arch(), epochs=4, workdir=root.parent)
    return root


@pytest.fixture
def zoo_dir(built_zoo, tmp_path):
    target = tmp_path / "zoo"
    shutil.copytree(built_zoo, target)
    return target


def test_compress_adds_gated_variants_with_lineage_and_records_rejections(zoo_dir, split):
    report = compress_zoo(zoo_dir, split, TOLERANCE_POINTS, pruning_ratios=(0.9, 0.25), fine_tuning=FINE_TUNING, timed_runs=20)
    zoo = Zoo(zoo_dir)
    cards = {card.id: card for card in zoo.cards()}
    assert {outcome.variant_id for outcome in report.accepted} == {"digits-a-int8", "digits-a-p25", "digits-a-p25-int8"}
    assert set(cards) == {"digits-a", "digits-a-int8", "digits-a-p25", "digits-a-p25-int8"}
    assert [outcome.variant_id for outcome in report.rejected] == ["digits-a-p90"]
    assert "points below the parent's" in report.rejected[0].reasons[0]

    root, pruned, root_int8, pruned_int8 = (cards[i] for i in ("digits-a", "digits-a-p25", "digits-a-int8", "digits-a-p25-int8"))
    assert (pruned.parent_id, root_int8.parent_id, pruned_int8.parent_id) == ("digits-a", "digits-a", "digits-a-p25")
    assert (pruned.precision, root_int8.precision, pruned_int8.precision) == ("fp32", "int8", "int8")
    assert pruned.pruning.method == "l1-layer" and 0.2 < pruned.pruning.ratio < 0.3 and pruned_int8.pruning == pruned.pruning
    assert root_int8.pruning is None
    assert pruned.macs < 0.7 * root.macs and pruned.params < root.params
    for card in (pruned, root_int8, pruned_int8):
        assert card.sha256 == sha256_of_file(zoo.model_path(card)) and card.size_bytes == zoo.model_path(card).stat().st_size
        assert card.size_bytes < cards[card.parent_id].size_bytes
        assert card.metrics.split == "test" and card.metrics.num_examples == len(split.test)
        assert card.metrics.accuracy >= report_parent_accuracy(report, card.id) - TOLERANCE_POINTS / 100
        latency = card.latency_ms["cloud-x86-1t"]
        assert latency.source == "measured" and latency.threads == 1 and latency.median_ms > 0
        assert card.input == root.input and card.labels == root.labels and card.arch == root.arch
    for card in (root_int8, pruned_int8):
        quantization = card.details["quantization"]
        assert quantization["per_channel"] and quantization["calibration"] == "minmax"
        assert (quantization["format"], quantization["activation_type"], quantization["weight_scales"]) == INT8_RECIPES[quantization["recipe"]]
        assert [tried.split(":")[0] for tried in quantization["recipes_tried"]] == list(DEFAULT_INT8_RECIPES)
        assert quantization["calibration_images"] == 256 and quantization["calibration_split"] == "train"
        assert f"train the fp32 parent {card.parent_id}" in card.details["fine_tuning"]
    assert pruned.details["compression"]["fine_tuning"]["distilled_from"] == "digits-a"

    # the pruned card's torch_state rebuilds from the arch and computes what its ONNX blob computes
    model = default_model_builder(zoo)(pruned)
    x = np.random.default_rng(0).normal(size=(4, 1, 8, 8)).astype(np.float32)
    import onnxruntime as ort

    session = ort.InferenceSession(str(zoo.model_path(pruned)), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        np.testing.assert_allclose(model(torch.from_numpy(x)).numpy(), session.run(None, {"input": x})[0], atol=1e-4)

    recorded = json.loads((zoo_dir / REPORT_NAME).read_text())
    assert [entry["variant_id"] for entry in recorded["rejected"]] == ["digits-a-p90"]
    assert recorded["rejected"][0]["reasons"] == report.rejected[0].reasons

    # a second run adds nothing and says why
    before = {path: data for path, data in snapshot(zoo_dir).items() if path != REPORT_NAME}
    again = compress_zoo(zoo_dir, split, TOLERANCE_POINTS, pruning_ratios=(0.25,), fine_tuning=FINE_TUNING, timed_runs=5)
    assert again.accepted == [] and set(again.skipped) == {"digits-a-int8", "digits-a-p25"}
    assert {path: data for path, data in snapshot(zoo_dir).items() if path != REPORT_NAME} == before


def report_parent_accuracy(report, variant_id: str) -> float:
    outcome = next(outcome for outcome in report.accepted if outcome.variant_id == variant_id)
    return outcome.parent_measurement["accuracy"]


def test_fine_tuning_in_worker_processes_publishes_the_same_variants(split, tmp_path):
    torch.set_num_threads(1)
    zoo = Zoo.create(tmp_path / "sequential")
    add_trained_model(zoo, split, "digits-a", digits_arch(), epochs=2, workdir=tmp_path)
    smaller = make_arch(16, 64, [(16, 1, "relu6", [3], [2]), (24, 2, "relu6", [3, 3], [4, 2])])
    add_trained_model(zoo, split, "digits-b", smaller, epochs=2, workdir=tmp_path)
    shutil.copytree(zoo.root, tmp_path / "parallel")
    settings = dict(pruning_ratios=(0.25,), fine_tuning=FineTuning(epochs=2), int8_recipes=DEFAULT_INT8_RECIPES[:1], timed_runs=5)
    sequential = compress_zoo(zoo.root, split, TOLERANCE_POINTS, workers=1, **settings)
    parallel = compress_zoo(tmp_path / "parallel", split, TOLERANCE_POINTS, workers=2, **settings)

    pruned = {"digits-a-p25", "digits-b-p25"}
    assert pruned <= {outcome.variant_id for outcome in sequential.accepted}
    assert [outcome.variant_id for outcome in parallel.accepted] == [outcome.variant_id for outcome in sequential.accepted]
    for variant_id in pruned:  # the same fine-tuned weights, byte for byte, and each root's own
        assert Zoo(tmp_path / "parallel").card(variant_id).sha256 == zoo.card(variant_id).sha256
    assert zoo.card("digits-a-p25").macs != zoo.card("digits-b-p25").macs


def test_workers_below_one_is_a_clear_error(zoo_dir, split):
    with pytest.raises(InvalidInputError, match="workers must be at least 1"):
        compress_zoo(zoo_dir, split, workers=0)


def test_cli_compresses_with_the_cards_task_as_data_set(zoo_dir):
    result = CliRunner().invoke(compress, [str(zoo_dir), "--ratio", "0.25", "--tolerance", "3", "--epochs", "4", "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert "3 accepted, 0 rejected" in result.output
    assert len(Zoo(zoo_dir)) == 4 and (zoo_dir / REPORT_NAME).is_file()


def test_a_corrupt_parent_blob_is_a_clear_error_and_the_zoo_is_unchanged(zoo_dir, split):
    zoo = Zoo(zoo_dir)
    blob = zoo.model_path(zoo.card("digits-a"))
    blob.write_bytes(blob.read_bytes()[:100])
    before = snapshot(zoo_dir)
    with pytest.raises(InvalidInputError, match="digits-a is corrupt"):
        compress_zoo(zoo_dir, split, fine_tuning=FINE_TUNING)
    assert snapshot(zoo_dir) == before


def test_empty_calibration_data_is_a_clear_error_and_the_zoo_is_unchanged(zoo_dir, split):
    empty_train = DatasetSplit(split.dataset, Subset(split.train.x[:0], split.train.y[:0]), split.validation, split.test)
    before = snapshot(zoo_dir)
    with pytest.raises(CalibrationDataError, match="calibration data is empty"):
        compress_zoo(zoo_dir, empty_train, fine_tuning=FINE_TUNING)
    assert snapshot(zoo_dir) == before


class WithGroupNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm, self.fc = nn.Conv2d(1, 8, 3), nn.GroupNorm(2, 8), nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(self.norm(self.conv(x)).mean((2, 3)))


def test_an_op_we_cannot_handle_is_a_clear_error_and_the_zoo_is_unchanged(zoo_dir, split):
    zoo = Zoo(zoo_dir)
    export_onnx(WithGroupNorm(), (1, 1, 8, 8), zoo_dir / "groupnorm.onnx")
    parent = zoo.card("digits-a")
    path = zoo_dir / "groupnorm.onnx"
    zoo.add_card(parent.model_copy(update={"id": "digits-g", "sha256": zoo.add_blob_file(path), "size_bytes": path.stat().st_size}))
    path.unlink()
    before = snapshot(zoo_dir)
    with pytest.raises(UnsupportedOperationError, match="InstanceNormalization"):
        compress_zoo(zoo_dir, split, fine_tuning=FINE_TUNING, build_model=lambda card: WithGroupNorm())
    assert snapshot(zoo_dir) == before
