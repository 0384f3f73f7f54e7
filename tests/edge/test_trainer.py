"""On-device training with onnxruntime + numpy: the trainer, parameter files, writing parameters back
into the inference model, and fine-tuning a small MobileNetV2-style model on a skewed digits shard."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import helper, numpy_helper
from torch import nn

from fedzoo.datasets import dirichlet_partition, load_dataset, split_dataset
from fedzoo.edge.onnx_initializers import read_float_initializers, replace_initializers
from fedzoo.edge.optimizers import SGD
from fedzoo.edge.trainer import Trainer, load_parameters, save_parameters, write_parameters
from fedzoo.errors import InvalidInputError
from fedzoo.graphs.autodiff import build_training_graph
from fedzoo.nas.export import export_onnx

torch.set_num_threads(1)


class InvertedResidual(nn.Module):
    def __init__(self, channels: int, expand: int, activation: type[nn.Module]) -> None:
        super().__init__()
        mid = channels * expand
        self.layers = nn.Sequential(
            nn.Conv2d(channels, mid, 1, bias=False), nn.BatchNorm2d(mid), activation(),
            nn.Conv2d(mid, mid, 3, 1, 1, groups=mid, bias=False), nn.BatchNorm2d(mid), activation(),
            nn.Conv2d(mid, channels, 1, bias=False), nn.BatchNorm2d(channels),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.layers(x)


def small_mobilenet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 12, 3, 1, 1, bias=False), nn.BatchNorm2d(12), nn.ReLU6(),
        InvertedResidual(12, 2, nn.ReLU6),
        nn.Conv2d(12, 12, 3, 2, 1, groups=12, bias=False), nn.BatchNorm2d(12), nn.Hardswish(),
        nn.Conv2d(12, 16, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish(),
        InvertedResidual(16, 2, nn.Hardswish),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )  # fmt: skip


@pytest.fixture(scope="module")
def digits():
    split = split_dataset(load_dataset("digits"), seed=0)
    mean, std = split.train.x.mean(), split.train.x.std()
    normalise = lambda x: ((x - mean) / std).astype(np.float32)  # noqa: E731
    return normalise(split.train.x), split.train.y, normalise(split.test.x), split.test.y


@pytest.fixture(scope="module")
def pretrained(digits, tmp_path_factory):
    """A model trained for two epochs on balanced digits: good (about 90%), with room to improve."""
    train_x, train_y, _, _ = digits
    torch.manual_seed(0)
    model = small_mobilenet()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    images, labels = torch.from_numpy(train_x), torch.from_numpy(train_y)
    model.train()
    for _ in range(2):
        for start in range(0, len(images), 32):
            loss = nn.functional.cross_entropy(model(images[start : start + 32]), labels[start : start + 32])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    folder = tmp_path_factory.mktemp("pretrained")
    proto = export_onnx(model, (1, 1, 8, 8), folder / "model.onnx")
    graph = build_training_graph(proto)
    onnx.save(graph, folder / "train.onnx")
    return folder / "model.onnx", folder / "train.onnx"


def predict(model_bytes: bytes, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def with_parameters_as_inputs(model_bytes: bytes, names: list[str]) -> bytes:
    """The same inference model with the named initializers turned into graph inputs (fed at run time)."""
    model = onnx.load_model_from_string(model_bytes)
    by_name = {init.name: init for init in model.graph.initializer}
    for name in names:
        model.graph.input.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(by_name[name].dims)))
        model.graph.initializer.remove(by_name[name])
    return model.SerializeToString()


def test_device_modules_import_without_torch_or_onnx():
    code = (
        "import sys, fedzoo.edge.trainer, fedzoo.edge.optimizers, fedzoo.edge.onnx_initializers\n"
        "loaded = sorted(m for m in ('torch', 'onnx') if m in sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_read_float_initializers_matches_onnx(pretrained):
    model_path, _ = pretrained
    proto = onnx.load(model_path)
    ours = read_float_initializers(model_path.read_bytes())
    expected = {init.name: numpy_helper.to_array(init) for init in proto.graph.initializer if init.data_type == 1}
    assert sorted(ours) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(ours[name], value)


def test_written_back_model_equals_feeding_the_parameters(pretrained, digits):
    model_path, _ = pretrained
    original = model_path.read_bytes()
    rng = np.random.default_rng(1)
    new = {name: value + rng.standard_normal(value.shape).astype(np.float32) * 0.1
           for name, value in read_float_initializers(original).items()}  # fmt: skip
    rewritten = write_parameters(original, new)
    parsed = onnx.load_model_from_string(rewritten)
    onnx.checker.check_model(parsed, full_check=True)
    before = onnx.load_model_from_string(original)
    assert [n.SerializeToString() for n in parsed.graph.node] == [n.SerializeToString() for n in before.graph.node]
    assert parsed.opset_import == before.opset_import
    x = digits[2][:16]
    fed_session = ort.InferenceSession(with_parameters_as_inputs(original, list(new)), providers=["CPUExecutionProvider"])
    fed = fed_session.run(None, {"input": x, **new})[0]
    np.testing.assert_allclose(predict(rewritten, x), fed, rtol=1e-5, atol=1e-5)
    assert not np.allclose(predict(original, x), fed, atol=1e-3)


def test_replace_initializers_refuses_unknown_names_and_shapes(pretrained):
    original = pretrained[0].read_bytes()
    name, value = next(iter(read_float_initializers(original).items()))
    with pytest.raises(InvalidInputError, match="not-a-weight"):
        replace_initializers(original, {"not-a-weight": value})
    with pytest.raises(InvalidInputError, match="has shape"):
        replace_initializers(original, {name: np.zeros(value.size + 1, np.float32)})


def test_parameters_round_trip_through_npz(tmp_path):
    params = {"onnx::Conv_47": np.arange(6, dtype=np.float32).reshape(2, 3), "file": np.ones(2, np.float32), "7.bias": np.zeros(1, np.float32)}
    save_parameters(tmp_path / "params.npz", params)
    loaded = load_parameters(tmp_path / "params.npz")
    assert sorted(loaded) == sorted(params)
    for name, value in params.items():
        np.testing.assert_array_equal(loaded[name], value)
    (tmp_path / "broken.npz").write_bytes(b"not a zip")
    with pytest.raises(InvalidInputError, match="broken.npz"):
        load_parameters(tmp_path / "broken.npz")


def test_step_applies_the_optimizer_to_the_graph_gradients(pretrained, digits):
    model_path, graph_path = pretrained
    trainer = Trainer.from_inference_model(graph_path, model_path, SGD(0.1))
    x, y = digits[0][:8], digits[1][:8]
    before = {name: value.copy() for name, value in trainer.parameters.items()}
    loss, gradients = trainer.loss_and_gradients(x, y.astype(np.int32))  # targets are cast to the graph's int64
    assert trainer.step(x, y) == pytest.approx(loss, rel=1e-6)
    for name, gradient in gradients.items():
        np.testing.assert_allclose(trainer.parameters[name], before[name] - 0.1 * gradient, rtol=1e-5, atol=1e-7)


def test_trainer_errors_name_the_problem(pretrained, digits):
    model_path, graph_path = pretrained
    params = read_float_initializers(model_path.read_bytes())
    missing = next(iter(params))
    with pytest.raises(InvalidInputError, match="no value given"):
        Trainer(graph_path, {k: v for k, v in params.items() if k != missing}, SGD(0.1))
    with pytest.raises(InvalidInputError, match="has shape"):
        Trainer(graph_path, {**params, missing: np.zeros(3, np.float32)}, SGD(0.1))
    trainer = Trainer(graph_path, params, SGD(0.1))
    with pytest.raises(InvalidInputError, match="as many targets"):
        trainer.step(digits[0][:4], digits[1][:3])
    with pytest.raises(InvalidInputError, match="rejected the training batch"):
        trainer.step(digits[0][:4], np.array([0, 1, 2, 10]))
    with pytest.raises(InvalidInputError, match="rejected the training batch"):
        trainer.step(digits[0][:4, :, :4], digits[1][:4])
    with pytest.raises(InvalidInputError, match="not a training graph"):
        Trainer(model_path, params, SGD(0.1))
    with pytest.raises(InvalidInputError, match="cannot load the training graph"):
        Trainer(b"not an onnx model", params, SGD(0.1))


def shard_accuracy(model_bytes: bytes, x: np.ndarray, y: np.ndarray, label_weights: np.ndarray) -> float:
    """Accuracy on the shard's label distribution: per-class test accuracy weighted by the shard's label mix."""
    correct = predict(model_bytes, x).argmax(axis=1) == y
    per_class = np.array([correct[y == label].mean() for label in range(10)])
    return float(np.sum(per_class * label_weights))


@pytest.mark.slow
def test_fine_tuning_on_a_skewed_shard_raises_its_accuracy(pretrained, digits, tmp_path):
    model_path, graph_path = pretrained
    train_x, train_y, test_x, test_y = digits
    shards = dirichlet_partition(train_y, num_clients=4, alpha=0.3, seed=3)
    shard = max(shards, key=len)
    label_weights = np.bincount(train_y[shard], minlength=10) / len(shard)
    assert (label_weights < 0.05).sum() >= 3  # really skewed: several classes (almost) absent
    original = model_path.read_bytes()
    before = shard_accuracy(original, test_x, test_y, label_weights)

    trainer = Trainer.from_inference_model(graph_path, original, SGD(0.01, momentum=0.9, weight_decay=1e-4))
    losses = trainer.fit(train_x[shard], train_y[shard], epochs=3, batch_size=32, seed=0)
    save_parameters(tmp_path / "update.npz", trainer.parameters)
    updated = write_parameters(original, load_parameters(tmp_path / "update.npz"), tmp_path / "updated.onnx")
    after = shard_accuracy(updated, test_x, test_y, label_weights)

    assert losses[-1] < losses[0]
    assert after > before + 0.02, (before, after)
    fed_session = ort.InferenceSession(with_parameters_as_inputs(original, list(trainer.parameters)), providers=["CPUExecutionProvider"])
    fed = fed_session.run(None, {"input": test_x[:32], **trainer.parameters})[0]
    np.testing.assert_allclose(predict((tmp_path / "updated.onnx").read_bytes(), test_x[:32]), fed, rtol=1e-5, atol=1e-5)
    assert updated == (tmp_path / "updated.onnx").read_bytes()
