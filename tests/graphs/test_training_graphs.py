"""Attaching training graphs to a zoo: fp32 cards get their own, INT8 cards their fp32 parent's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnxruntime.quantization import quantize_dynamic
from torch import nn

from fedzoo.cards import InputSpec, Metrics, ModelCard
from fedzoo.edge.optimizers import SGD
from fedzoo.edge.trainer import Trainer
from fedzoo.errors import InvalidInputError
from fedzoo.graphs.autodiff import head_parameters, parameter_candidates
from fedzoo.graphs.training_graphs import DETAILS_KEY, attach_training_graphs
from fedzoo.nas.export import export_onnx
from fedzoo.zoo import Zoo

torch.set_num_threads(1)
INT8_POLICY = "train the fp32 parent digits-a (its training graph); the cloud re-quantizes it"


def _card(zoo: Zoo, card_id: str, path, precision="fp32", parent_id=None, details=None) -> ModelCard:
    card = ModelCard(
        id=card_id, family="test", task="digits", parent_id=parent_id, precision=precision,
        input=InputSpec(name="input", shape=["batch", 1, 8, 8]), labels=[str(d) for d in range(10)],
        metrics=Metrics(accuracy=0.5, num_examples=10), macs=1, params=1, size_bytes=path.stat().st_size,
        sha256=zoo.add_blob_file(path), details=details or {},
    )  # fmt: skip
    zoo.add_card(card)
    return card


@pytest.fixture
def zoo(tmp_path) -> Zoo:
    zoo = Zoo.create(tmp_path / "zoo")
    torch.manual_seed(0)
    wide = nn.Sequential(nn.Conv2d(1, 6, 3, 1, 1), nn.BatchNorm2d(6), nn.ReLU6(), nn.Conv2d(6, 6, 3, 2, 1, groups=6),
                         nn.Hardswish(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 10))  # fmt: skip
    narrow = nn.Sequential(nn.Conv2d(1, 3, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 10))
    export_onnx(wide, (1, 1, 8, 8), tmp_path / "a.onnx")
    export_onnx(narrow, (1, 1, 8, 8), tmp_path / "b.onnx")
    quantize_dynamic(str(tmp_path / "a.onnx"), str(tmp_path / "a-int8.onnx"))
    _card(zoo, "digits-a", tmp_path / "a.onnx")
    _card(zoo, "digits-a-pruned", tmp_path / "b.onnx", parent_id="digits-a")
    _card(zoo, "digits-a-int8", tmp_path / "a-int8.onnx", "int8", "digits-a", {"fine_tuning": INT8_POLICY})
    return zoo


def _graph(zoo: Zoo, card: ModelCard) -> onnx.ModelProto:
    return onnx.load_model_from_string(zoo.blob_path(card.training_graph).read_bytes())


def test_every_card_gets_a_training_graph(zoo):
    assert attach_training_graphs(zoo.root) == ["digits-a", "digits-a-int8", "digits-a-pruned"]
    for card_id in ("digits-a", "digits-a-pruned"):
        card = zoo.card(card_id)
        graph = _graph(zoo, card)
        onnx.checker.check_model(graph, full_check=True)
        model = onnx.load(zoo.model_path(card))
        assert [value.name for value in graph.graph.input] == ["x", "y", *parameter_candidates(model)]
        assert card.details[DETAILS_KEY] == {
            "loss": "cross_entropy", "trainable": "all", "parameters": parameter_candidates(model), "trains_card": card_id,
        }  # fmt: skip
    int8 = zoo.card("digits-a-int8")
    assert int8.training_graph == zoo.card("digits-a").training_graph
    assert int8.details[DETAILS_KEY]["trains_card"] == "digits-a"
    assert int8.details["fine_tuning"] == INT8_POLICY


def test_stored_graph_trains_on_the_device_side(zoo):
    attach_training_graphs(zoo.root)
    card = zoo.card("digits-a-int8")  # a device holding the INT8 model trains its fp32 parent
    parent = zoo.card(card.parent_id)
    trainer = Trainer.from_inference_model(zoo.blob_path(card.training_graph), zoo.model_path(parent), SGD(0.05))
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, 16)
    losses = [trainer.step(x, y) for _ in range(5)]
    assert losses[-1] < losses[0]


def test_attaching_again_changes_nothing(zoo):
    attach_training_graphs(zoo.root)
    before = {path.name: path.read_bytes() for path in (zoo.root / "cards").iterdir()}
    assert attach_training_graphs(zoo.root) == []
    assert {path.name: path.read_bytes() for path in (zoo.root / "cards").iterdir()} == before


def test_head_only_graphs_replace_full_ones(zoo):
    attach_training_graphs(zoo.root)
    assert attach_training_graphs(zoo.root, trainable="head") == ["digits-a", "digits-a-int8", "digits-a-pruned"]
    card = zoo.card("digits-a")
    head = head_parameters(onnx.load(zoo.model_path(card)))
    assert [value.name for value in _graph(zoo, card).graph.input] == ["x", "y", *head]
    assert zoo.card("digits-a-int8").details[DETAILS_KEY]["trainable"] == "head"


def test_int8_card_without_an_fp32_parent_is_refused_before_any_write(zoo, tmp_path):
    _card(zoo, "orphan-int8", tmp_path / "a-int8.onnx", "int8", "missing-parent")
    before = {path.name: path.read_bytes() for path in (zoo.root / "cards").iterdir()}
    with pytest.raises(InvalidInputError, match="missing-parent") as error:
        attach_training_graphs(zoo.root)
    assert error.value.field == "parent_id"
    assert {path.name: path.read_bytes() for path in (zoo.root / "cards").iterdir()} == before
