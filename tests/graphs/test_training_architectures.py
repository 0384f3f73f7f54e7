"""Whole-model training graphs of the architectures users bring (tests/graphs/architectures.py), exported
with torch.onnx.export like a user would: loss and every gradient against float64 torch autograd on the
same ONNX graph, at batch 1 and 32."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))  # the shared helpers next to this file (importlib mode)
from architectures import ARCHITECTURES, with_batchnorm_statistics
from autodiff_reference import initializers, relative_error, run_training_graph, torch_reference_gradients
from fedzoo.edge.optimizers import SGD
from fedzoo.edge.trainer import Trainer
from fedzoo.graphs.autodiff import build_training_graph, parameter_candidates
from fedzoo.nas.export import export_onnx

torch.set_num_threads(1)
CLASSES = 10


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, onnx.ModelProto]:
    folder = tmp_path_factory.mktemp("architectures")
    models = {}
    for name, architecture in ARCHITECTURES.items():
        torch.manual_seed(0)
        module = with_batchnorm_statistics(architecture.build())
        models[name] = export_onnx(module, (1, *architecture.input_shape), folder / f"{name}.onnx")
    return models


def _batch(name: str, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    architecture = ARCHITECTURES[name]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((size, *architecture.input_shape)).astype(np.float32)
    if architecture.loss == "mse":
        return x, rng.standard_normal((size, 2)).astype(np.float32)
    return x, rng.integers(0, CLASSES, size).astype(np.int64)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_whole_model_gradients_match_torch_at_batch_1_and_32(exported, name):
    model = exported[name]
    loss_name = ARCHITECTURES[name].loss
    graph = build_training_graph(model, loss=loss_name)
    trainable = parameter_candidates(model)
    assert [value.name for value in graph.graph.input][2:] == trainable
    for size in (1, 32):
        x, y = _batch(name, size, seed=size)
        loss, grads = run_training_graph(graph, x, y, initializers(model))
        expected_loss, expected = torch_reference_gradients(model, x, y, loss_name, trainable)
        assert loss == pytest.approx(expected_loss, rel=1e-5), size
        for parameter in trainable:
            assert relative_error(grads[parameter], expected[parameter]) < 1e-4, (size, parameter)


@pytest.mark.parametrize("name", ["lenet5", "mlp_regressor_mse"])
def test_on_device_sgd_lands_on_torchs_weights(tmp_path, name):
    """Without BatchNorm the ONNX initializers are the module's own parameters: 30 on-device SGD steps
    (Trainer, numpy momentum) and 30 torch.optim steps on the same batches end on the same weights."""
    architecture = ARCHITECTURES[name]
    torch.manual_seed(1)
    module = architecture.build().eval()
    proto = export_onnx(module, (1, *architecture.input_shape), tmp_path / "model.onnx")
    trainer = Trainer(build_training_graph(proto, loss=architecture.loss).SerializeToString(), initializers(proto),
                      SGD(0.05, momentum=0.9))  # fmt: skip
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    loss_function = nn.functional.mse_loss if architecture.loss == "mse" else nn.functional.cross_entropy
    start = {parameter_name: value.copy() for parameter_name, value in trainer.parameters.items()}
    for step in range(30):
        x, y = _batch(name, 8, seed=100 + step)
        trainer.step(x, y)
        optimizer.zero_grad()
        loss_function(module(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        optimizer.step()
    for parameter_name, parameter in module.named_parameters():
        assert np.abs(trainer.parameters[parameter_name] - start[parameter_name]).max() > 1e-3, parameter_name
        np.testing.assert_allclose(trainer.parameters[parameter_name], parameter.detach().numpy(), rtol=1e-3, atol=1e-5)
