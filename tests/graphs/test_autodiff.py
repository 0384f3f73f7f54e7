"""The reverse sweep on whole exported models: the training-graph contract, agreement with torch autograd,
freezing, and errors that name the problem."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))  # the shared helpers next to this file (importlib mode)
from autodiff_reference import initializers, relative_error, run_training_graph, torch_reference_gradients
from fedzoo.graphs.autodiff import (
    build_training_graph,
    depthwise_parameters,
    head_parameters,
    nameable_parameters,
    parameter_candidates,
)
from fedzoo.edge.optimizers import SGD
from fedzoo.edge.trainer import Trainer
from fedzoo.errors import InvalidInputError
from fedzoo.nas.export import export_onnx
from fedzoo.nas.subnet import build_subnet

torch.set_num_threads(1)


class InvertedResidual(nn.Module):
    def __init__(self, channels: int, expand: int, kernel: int, activation: type[nn.Module]) -> None:
        super().__init__()
        mid = channels * expand
        self.layers = nn.Sequential(
            nn.Conv2d(channels, mid, 1, bias=False), nn.BatchNorm2d(mid), activation(),
            nn.Conv2d(mid, mid, kernel, 1, kernel // 2, groups=mid, bias=False), nn.BatchNorm2d(mid), activation(),
            nn.Conv2d(mid, channels, 1, bias=False), nn.BatchNorm2d(channels),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.layers(x)


def mobilenet_like(num_classes: int = 10) -> nn.Module:
    """Conv, strided depthwise, residual adds, ReLU6 and HardSwish, GAP, flatten, Gemm: our zoo's op set."""
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6(),
        InvertedResidual(8, 2, 3, nn.ReLU6),
        nn.Conv2d(8, 8, 3, 2, 1, groups=8, bias=False), nn.BatchNorm2d(8), nn.Hardswish(),
        nn.Conv2d(8, 12, 1, bias=False), nn.BatchNorm2d(12),
        InvertedResidual(12, 2, 5, nn.Hardswish),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(12, num_classes),
    )  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    for module in model.modules():  # non-trivial BN statistics, so folding changes the weights
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.copy_(torch.rand(module.num_features, generator=generator) - 0.5)
            module.running_var.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
            module.weight.data.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
            module.bias.data.copy_(torch.rand(module.num_features, generator=generator) - 0.5)
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> onnx.ModelProto:
    torch.manual_seed(0)
    return export_onnx(mobilenet_like(), (1, 1, 16, 16), tmp_path_factory.mktemp("model") / "model.onnx")


def batch(size: int = 6, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((size, 1, 16, 16)).astype(np.float32), rng.integers(0, 10, size).astype(np.int64)


def test_training_graph_contract(exported):
    graph = build_training_graph(exported)
    onnx.checker.check_model(graph, full_check=True)
    assert all(node.domain == "" for node in graph.graph.node)
    parameters = parameter_candidates(exported)
    inputs = {value.name: value for value in graph.graph.input}
    assert list(inputs) == ["x", "y", *parameters]
    assert inputs["y"].type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert inputs["x"].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert [value.name for value in graph.graph.output] == ["loss", *(f"grad.{name}" for name in parameters)]
    assert not {init.name for init in graph.graph.initializer} & set(parameters)


def test_whole_model_gradients_match_torch_autograd(exported):
    x, y = batch()
    params = initializers(exported)
    trainable = parameter_candidates(exported)
    loss, grads = run_training_graph(build_training_graph(exported), x, y, params)
    expected_loss, expected = torch_reference_gradients(exported, x, y, "cross_entropy", trainable)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    for name in trainable:
        assert relative_error(grads[name], expected[name]) < 1e-4, name


def test_symbolic_batch_runs_any_batch_size(exported):
    graph = build_training_graph(exported)
    for size in (1, 9):
        x, y = batch(size, seed=size)
        loss, grads = run_training_graph(graph, x, y, initializers(exported))
        assert np.isfinite(loss) and all(np.isfinite(g).all() for g in grads.values())


def test_gradients_match_the_torch_module_itself(tmp_path):
    # Without BN nothing is folded, so the ONNX initializers are the module's own parameters.
    torch.manual_seed(1)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, 2, 1), nn.ReLU(), nn.Conv2d(4, 4, 3, 1, 1, groups=4), nn.Hardswish(),
        nn.Conv2d(4, 6, 1), nn.Hardsigmoid(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 3),
    )  # fmt: skip
    proto = export_onnx(model, (1, 1, 12, 12), tmp_path / "plain.onnx")
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((5, 1, 12, 12)).astype(np.float32), rng.integers(0, 3, 5)
    loss, grads = run_training_graph(build_training_graph(proto), x, y, initializers(proto))
    torch_loss = nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    torch_loss.backward()
    assert loss == pytest.approx(float(torch_loss.detach()), rel=1e-5)
    for name, parameter in model.named_parameters():
        assert relative_error(grads[name], parameter.grad.numpy()) < 1e-4, name


def test_mse_loss_on_logits(exported):
    x, _ = batch()
    targets = np.random.default_rng(4).standard_normal((6, 10)).astype(np.float32)
    graph = build_training_graph(exported, loss="mse")
    y_input = next(value for value in graph.graph.input if value.name == "y")
    assert y_input.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    loss, grads = run_training_graph(graph, x, targets, initializers(exported))
    expected_loss, expected = torch_reference_gradients(exported, x, targets, "mse", parameter_candidates(exported))
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    for name, grad in grads.items():
        assert relative_error(grad, expected[name]) < 1e-4, name


def test_freezing_trains_only_the_head(exported):
    head = head_parameters(exported)
    assert head == ["12.weight", "12.bias"]
    graph = build_training_graph(exported, trainable="head")
    assert [value.name for value in graph.graph.input] == ["x", "y", *head]
    frozen = {init.name for init in graph.graph.initializer}
    assert set(parameter_candidates(exported)) - set(head) <= frozen
    x, y = batch()
    _, head_grads = run_training_graph(graph, x, y, initializers(exported))
    _, all_grads = run_training_graph(build_training_graph(exported), x, y, initializers(exported))
    assert sorted(head_grads) == sorted(head)
    for name in head:
        np.testing.assert_allclose(head_grads[name], all_grads[name], rtol=1e-5, atol=1e-7)
    # Freezing the backbone leaves no ConvTranspose (no input gradients flow into frozen convs).
    assert not any(node.op_type == "ConvTranspose" for node in graph.graph.node)


def test_any_subset_can_be_trainable(exported):
    subset = parameter_candidates(exported)[2:5]
    graph = build_training_graph(exported, trainable=subset)
    x, y = batch()
    _, grads = run_training_graph(graph, x, y, initializers(exported))
    _, expected = torch_reference_gradients(exported, x, y, "cross_entropy", subset)
    assert sorted(grads) == sorted(subset)
    for name in subset:
        assert relative_error(grads[name], expected[name]) < 1e-4, name


def test_depthwise_convolutions_can_be_frozen(exported):
    frozen = depthwise_parameters(exported)
    assert len(frozen) == 6  # weight and folded-BN bias of each of the three depthwise convs
    graph = build_training_graph(exported, trainable="all_but_depthwise")
    trainable = [value.name for value in graph.graph.input][2:]
    assert trainable == [name for name in parameter_candidates(exported) if name not in frozen]
    assert set(frozen) <= {init.name for init in graph.graph.initializer}
    x, y = batch()
    _, grads = run_training_graph(graph, x, y, initializers(exported))
    _, expected = torch_reference_gradients(exported, x, y, "cross_entropy", trainable)
    for name in trainable:
        assert relative_error(grads[name], expected[name]) < 1e-4, name


def test_real_nas_subnet(tmp_path):
    arch = {
        "family": "ofa-mbv2", "resolution": 16, "stem_channels": 8, "stem_stride": 1, "stem_activation": "relu6",
        "head_channels": 16, "head_activation": "hswish",
        "stages": [
            {"out_channels": 8, "stride": 1, "activation": "relu6", "kernels": [3, 5], "expand_ratios": [2, 3]},
            {"out_channels": 12, "stride": 2, "activation": "hswish", "kernels": [5], "expand_ratios": [2]},
        ],
    }  # fmt: skip
    torch.manual_seed(2)
    model = build_subnet(arch, num_classes=10, in_channels=1)
    model.train()
    with torch.no_grad():  # give BN real statistics before folding
        model(torch.randn(32, 1, 16, 16))
    proto = export_onnx(model, (1, 1, 16, 16), tmp_path / "subnet.onnx")
    x, y = batch(4, seed=5)
    trainable = parameter_candidates(proto)
    _, grads = run_training_graph(build_training_graph(proto), x, y, initializers(proto))
    _, expected = torch_reference_gradients(proto, x, y, "cross_entropy", trainable)
    for name in trainable:
        assert relative_error(grads[name], expected[name]) < 1e-4, name


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"trainable": ["no-such-weight"]}, "no-such-weight"),
        ({"trainable": []}, "no parameter selected"),
        ({"trainable": "everything"}, "'all', 'all_but_depthwise', 'head'"),
        ({"loss": "hinge"}, "unknown loss 'hinge'"),
    ],
)
def test_bad_arguments_are_named(exported, kwargs, message):
    with pytest.raises(InvalidInputError, match=message):
        build_training_graph(exported, **kwargs)


def test_cross_entropy_needs_two_dimensional_logits(tmp_path):
    proto = export_onnx(nn.Sequential(nn.Conv2d(1, 2, 3)), (1, 1, 6, 6), tmp_path / "conv.onnx")
    with pytest.raises(InvalidInputError, match="cross-entropy needs logits"):
        build_training_graph(proto)


def test_reserved_names_in_the_model_are_refused(exported):
    renamed = onnx.ModelProto()
    renamed.CopyFrom(exported)
    old = renamed.graph.node[0].output[0]
    for node in renamed.graph.node:
        node.input[:] = ["y" if name == old else name for name in node.input]
        node.output[:] = ["y" if name == old else name for name in node.output]
    with pytest.raises(InvalidInputError, match="already uses the name 'y'"):
        build_training_graph(renamed)


# what a user's own export brings -----------------------------------------------------------------


class WithBuffer(nn.Module):
    """A float buffer (register_buffer) used by an elementwise op: a constant, not a weight."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.register_buffer("offset", torch.full((1, 3, 1, 1), 0.25))
        self.head = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(nn.functional.adaptive_avg_pool2d(self.conv(x) + self.offset, 1).flatten(1))


def test_buffers_stay_constants_unless_named(tmp_path):
    proto = export_onnx(WithBuffer(), (1, 1, 6, 6), tmp_path / "buffer.onnx")
    graph = build_training_graph(proto)
    trainable = [value.name for value in graph.graph.input][2:]
    assert trainable == ["conv.weight", "conv.bias", "head.weight", "head.bias"]
    assert "offset" in {init.name for init in graph.graph.initializer}
    assert sorted(nameable_parameters(proto)) == ["conv.bias", "conv.weight", "head.bias", "head.weight", "offset"]
    named = build_training_graph(proto, ["offset", "head.*"])  # names and glob patterns
    assert [value.name for value in named.graph.input][2:] == ["offset", "head.weight", "head.bias"]
    x, y = batch(3)
    x = x[:, :, :6, :6].copy()
    y = y % 4
    _, grads = run_training_graph(named, x, y, initializers(proto))
    _, expected = torch_reference_gradients(proto, x, y, "cross_entropy", ["offset", "head.weight", "head.bias"])
    for name in expected:
        assert relative_error(grads[name], expected[name]) < 1e-4, name
    with pytest.raises(InvalidInputError, match=r"\['classifier\.\*'\] match no float parameter"):
        build_training_graph(proto, ["classifier.*"])


@pytest.mark.parametrize("final", [nn.Softmax(dim=1), nn.LogSoftmax(dim=1)])
def test_a_trailing_softmax_is_refused_or_stripped(tmp_path, final):
    torch.manual_seed(3)
    classifier = nn.Sequential(nn.Flatten(), nn.Linear(16, 5))
    proto = export_onnx(nn.Sequential(classifier, final), (1, 1, 4, 4), tmp_path / "softmax.onnx")
    with pytest.raises(InvalidInputError, match=f"ends in {type(final).__name__}.*the cross_entropy loss expects logits"):
        build_training_graph(proto)
    graph = build_training_graph(proto, strip_output_activation=True)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 1, 4, 4)).astype(np.float32), rng.integers(0, 5, 4)
    loss, grads = run_training_graph(graph, x, y, initializers(proto))
    torch_loss = nn.functional.cross_entropy(classifier(torch.from_numpy(x)), torch.from_numpy(y))
    torch_loss.backward()
    assert loss == pytest.approx(float(torch_loss), rel=1e-5)
    assert relative_error(grads["0.1.weight"], classifier[1].weight.grad.numpy()) < 1e-4


def test_a_static_batch_export_is_made_batch_dynamic(tmp_path):
    torch.manual_seed(4)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, 2, 1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 3)).eval()
    path = tmp_path / "static.onnx"
    torch.onnx.export(model, (torch.randn(1, 1, 16, 16),), str(path), input_names=["input"], dynamo=False)
    graph = build_training_graph(onnx.load(str(path)))
    assert graph.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((5, 1, 16, 16)).astype(np.float32), rng.integers(0, 3, 5)
    loss, grads = run_training_graph(graph, x, y, initializers(onnx.load(str(path))))
    torch_loss = nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    torch_loss.backward()
    assert loss == pytest.approx(float(torch_loss), rel=1e-5)
    assert relative_error(grads["0.weight"], model[0].weight.grad.numpy()) < 1e-4


class HardCodedBatch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.head = nn.Conv2d(1, 2, 3, padding=1), nn.Linear(2 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).reshape(1, -1))


def test_a_static_batch_baked_into_a_reshape_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "baked.onnx"
    torch.onnx.export(HardCodedBatch().eval(), (torch.randn(1, 1, 4, 4),), str(path), dynamo=False)
    with pytest.raises(InvalidInputError, match="static batch of 1.*Reshape.*dynamic_axes"):
        build_training_graph(onnx.load(str(path)))


@pytest.mark.parametrize("padding", [nn.ReflectionPad2d(1), nn.ReplicationPad2d((1, 2, 0, 1)), nn.ZeroPad2d((2, 0, 1, 1))])
def test_padding_layers_train(tmp_path, padding):
    torch.manual_seed(5)
    model = nn.Sequential(nn.Conv2d(1, 3, 1), padding, nn.Conv2d(3, 2, 3), nn.Flatten(), nn.LazyLinear(4))
    model(torch.randn(1, 1, 6, 6))
    proto = export_onnx(model.eval(), (1, 1, 6, 6), tmp_path / "pad.onnx")
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((3, 1, 6, 6)).astype(np.float32), rng.integers(0, 4, 3)
    loss, grads = run_training_graph(build_training_graph(proto), x, y, initializers(proto))
    torch_loss = nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    torch_loss.backward()
    assert loss == pytest.approx(float(torch_loss), rel=1e-5)
    for name, parameter in model.named_parameters():
        assert relative_error(grads[name], parameter.grad.numpy()) < 1e-4, name


def test_binary_cross_entropy_for_multi_label_targets(exported):
    x, _ = batch()
    targets = (np.random.default_rng(6).random((6, 10)) < 0.3).astype(np.float32)
    graph = build_training_graph(exported, loss="bce")
    y_input = next(value for value in graph.graph.input if value.name == "y")
    assert y_input.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert {prop.key: prop.value for prop in graph.metadata_props}["fedzoo.loss"] == "bce"
    loss, grads = run_training_graph(graph, x, targets, initializers(exported))
    expected_loss, expected = torch_reference_gradients(exported, x, targets, "bce", parameter_candidates(exported))
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    for name, grad in grads.items():
        assert relative_error(grad, expected[name]) < 1e-4, name


def test_label_smoothing_matches_torch(exported):
    x, y = batch()
    graph = build_training_graph(exported, label_smoothing=0.1)
    assert {prop.key: prop.value for prop in graph.metadata_props}["fedzoo.label_smoothing"] == "0.1"
    loss, grads = run_training_graph(graph, x, y, initializers(exported))
    expected_loss, expected = torch_reference_gradients(
        exported, x, y, "cross_entropy", parameter_candidates(exported), label_smoothing=0.1
    )
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    for name, grad in grads.items():
        assert relative_error(grad, expected[name]) < 1e-4, name


@pytest.mark.parametrize("kwargs", [{"label_smoothing": 0.1, "loss": "mse"}, {"label_smoothing": 1.0}])
def test_label_smoothing_is_checked(exported, kwargs):
    with pytest.raises(InvalidInputError, match="label_smoothing must be in"):
        build_training_graph(exported, **kwargs)


class CeilPoolThenView(nn.Module):
    """A ceil-mode pooling whose output size feeds a view (onnx shape inference alone gets that size wrong)."""

    def __init__(self) -> None:
        super().__init__()
        # 7x7 -> 4x4: the fifth window would start in the end padding, so torch drops it (onnx infers 5x5).
        self.conv, self.pool, self.head = nn.Conv2d(1, 2, 1), nn.MaxPool2d(2, 2, 1, ceil_mode=True), nn.Linear(2 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.pool(self.conv(x))
        return self.head(pooled.view(pooled.size(0), pooled.size(1) * pooled.size(2) * pooled.size(3)))


def test_ceil_mode_pooling_sizes_are_right_before_shapes_are_folded(tmp_path):
    torch.manual_seed(6)
    model = CeilPoolThenView().eval()
    proto = export_onnx(model, (1, 1, 7, 7), tmp_path / "ceil.onnx")
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((3, 1, 7, 7)).astype(np.float32), rng.integers(0, 3, 3)
    loss, grads = run_training_graph(build_training_graph(proto), x, y, initializers(proto))
    torch_loss = nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    torch_loss.backward()
    assert loss == pytest.approx(float(torch_loss), rel=1e-5)
    for name, parameter in model.named_parameters():
        assert relative_error(grads[name], parameter.grad.numpy()) < 1e-4, name


def _unfolded_batchnorm_model(tmp_path) -> tuple[nn.Module, onnx.ModelProto]:
    """A model with BatchNorm exported unfolded (do_constant_folding=False keeps BatchNormalization nodes)."""
    torch.manual_seed(8)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4, momentum=0.2), nn.ReLU(),
        nn.Conv2d(4, 6, 3, 2, 1), nn.BatchNorm2d(6), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 3),
    )  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.copy_(torch.rand(module.num_features, generator=generator) - 0.5)
            module.running_var.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
    path = tmp_path / "unfolded.onnx"
    torch.onnx.export(model.eval(), (torch.randn(1, 1, 8, 8),), str(path), input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, do_constant_folding=False, dynamo=False)  # fmt: skip
    return model, onnx.load(str(path))


def test_unfolded_batchnorm_trains_in_inference_mode_by_default(tmp_path):
    model, proto = _unfolded_batchnorm_model(tmp_path)
    graph = build_training_graph(proto)
    assert [value.name for value in graph.graph.input][2:] == parameter_candidates(proto)
    assert "1.weight" in parameter_candidates(proto) and "1.running_mean" not in parameter_candidates(proto)
    rng = np.random.default_rng(9)
    x, y = rng.standard_normal((5, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, 5)
    loss, grads = run_training_graph(graph, x, y, initializers(proto))
    torch_loss = nn.functional.cross_entropy(model.eval()(torch.from_numpy(x)), torch.from_numpy(y))
    torch_loss.backward()
    assert loss == pytest.approx(float(torch_loss), rel=1e-5)
    for name, parameter in model.named_parameters():
        assert relative_error(grads[name], parameter.grad.numpy()) < 1e-4, name


def test_batchnorm_training_mode_matches_torch_train_mode(tmp_path):
    model, proto = _unfolded_batchnorm_model(tmp_path)
    graph = build_training_graph(proto, batch_norm="training")
    statistics = ["1.running_mean", "1.running_var", "4.running_mean", "4.running_var"]
    assert [value.name for value in graph.graph.input][2:] == [*parameter_candidates(proto), *statistics]
    assert [value.name for value in graph.graph.output][-4:] == [f"running.{name}" for name in statistics]
    trainer = Trainer(graph.SerializeToString(), initializers(proto), SGD(0.1, momentum=0.9))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.train()
    rng = np.random.default_rng(10)
    for _ in range(3):
        x, y = rng.standard_normal((6, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, 6)
        loss = trainer.step(x, y)
        torch_loss = nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        optimizer.zero_grad()
        torch_loss.backward()
        optimizer.step()
        assert loss == pytest.approx(float(torch_loss), rel=1e-5)
    state = model.state_dict()
    for name, value in {**trainer.parameters, **trainer.statistics}.items():
        np.testing.assert_allclose(value, state[name].numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def test_batchnorm_training_mode_needs_unfolded_batchnorm(exported):
    with pytest.raises(InvalidInputError, match="no BatchNormalization node.*do_constant_folding=False"):
        build_training_graph(exported, batch_norm="training")


def _dropout_model(tmp_path) -> tuple[nn.Module, onnx.ModelProto]:
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    path = tmp_path / "dropout.onnx"
    torch.onnx.export(model, (torch.randn(1, 4),), str(path), input_names=["input"], dynamic_axes={"input": {0: "batch"}},
                      training=torch.onnx.TrainingMode.TRAINING, dynamo=False)  # fmt: skip
    return model, onnx.load(str(path))


def test_dropout_is_the_identity_by_default_even_in_a_training_mode_export(tmp_path):
    model, proto = _dropout_model(tmp_path)
    rng = np.random.default_rng(12)
    x, y = rng.standard_normal((7, 4)).astype(np.float32), rng.integers(0, 3, 7)
    loss, grads = run_training_graph(build_training_graph(proto), x, y, initializers(proto))
    torch_loss = nn.functional.cross_entropy(model.eval()(torch.from_numpy(x)), torch.from_numpy(y))
    torch_loss.backward()
    assert loss == pytest.approx(float(torch_loss), rel=1e-5)
    for name, parameter in model.named_parameters():
        assert relative_error(grads[name], parameter.grad.numpy()) < 1e-4, name


def test_dropout_training_mode_drops_and_scales_like_torch(tmp_path):
    model, proto = _dropout_model(tmp_path)
    graph = build_training_graph(proto, dropout="training")
    mask_name = next(node.output[1] for node in graph.graph.node if node.op_type == "Dropout")
    graph.graph.output.append(onnx.helper.make_tensor_value_info(mask_name, onnx.TensorProto.BOOL, None))  # to read it
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [spec.name for spec in session.get_inputs()][2:]
    rng = np.random.default_rng(13)
    x, y = rng.standard_normal((64, 4)).astype(np.float32), rng.integers(0, 3, 64)
    params = initializers(proto)
    loss, *grads, mask = session.run(
        ["loss", *(f"grad.{name}" for name in names), mask_name], {"x": x, "y": y, **{name: params[name] for name in names}}
    )
    assert 0.5 < mask.mean() < 0.9  # about 70% kept
    hidden = model[1](model[0](torch.from_numpy(x))) * torch.from_numpy(mask) / 0.7
    torch_loss = nn.functional.cross_entropy(model[3](hidden), torch.from_numpy(y))
    torch_loss.backward()
    assert loss == pytest.approx(float(torch_loss), rel=1e-5)
    for name, grad in zip(names, grads):
        assert relative_error(grad, dict(model.named_parameters())[name].grad.numpy()) < 1e-4, name


def test_dropout_training_mode_needs_dropout_nodes(exported):
    with pytest.raises(InvalidInputError, match="no Dropout node.*TrainingMode.TRAINING"):
        build_training_graph(exported, dropout="training")
