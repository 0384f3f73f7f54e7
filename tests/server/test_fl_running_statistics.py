"""BatchNorm running statistics travel through federated rounds: devices update them, their updates carry
them, the server screens and averages them and publishes them. Real server on loopback, real SQLite, real
onnxruntime, sklearn digits."""

import dataclasses
import hashlib

import numpy as np
import onnx
import pytest
import torch
from fl_helpers import device_client, honest_delta, round_config, upload
from torch import nn

from fedzoo.aggregation.running_statistics import aggregate_statistics
from fedzoo.aggregation.strategies import ClientUpdate
from fedzoo.clients.errors import BadRequestError
from fedzoo.edge.local_training import normalise
from fedzoo.update_codec import decode_update, encode_update, split_statistics, statistics_delta
from fedzoo.graphs.autodiff import build_training_graph
from fedzoo.cloud.simulation import Simulation, prepare_federation
from fedzoo.server.testing import LoopbackServer
from fedzoo.edge.onnx_initializers import read_float_initializers
from fedzoo.edge.local_training import normalise
from fedzoo.server.fl.schemas import NormBound
from fedzoo.update_codec import decode_update, encode_update, split_statistics, statistics_delta

STATISTICS = ("1.running_mean", "1.running_var")


def _batchnorm_model(tmp_path) -> tuple[bytes, bytes]:
    """Conv → BatchNorm → Relu → pool → Linear on 1x8x8 digits, exported unfolded, with running statistics far
    from any data's (mean 3, variance 9), and its training graph with BatchNorm in training mode."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(4, 10))
    model[1].running_mean.fill_(3.0)
    model[1].running_var.fill_(9.0)
    path = tmp_path / "bn.onnx"
    torch.onnx.export(model.eval(), (torch.randn(1, 1, 8, 8),), str(path), input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, do_constant_folding=False, dynamo=False)  # fmt: skip
    proto = onnx.load(str(path))
    return proto.SerializeToString(), build_training_graph(proto, batch_norm="training").SerializeToString()


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """The digits federation of the round tests, its model swapped for the BatchNorm model."""
    digits = prepare_federation("digits", num_clients=3, alpha=None, hidden_units=8, pretrain_epochs=1, seed=0)
    model, graph = _batchnorm_model(tmp_path_factory.mktemp("bn"))
    card = digits.card.model_copy(update={
        "id": "digits-bn-v1", "family": "digits-bn", "sha256": hashlib.sha256(model).hexdigest(),
        "training_graph": hashlib.sha256(graph).hexdigest(), "size_bytes": len(model)})
    return dataclasses.replace(digits, card=card, blobs={card.sha256: model, card.training_graph: graph})


@pytest.fixture
def simulation(federation, tmp_path):
    with LoopbackServer(tmp_path / "server") as server, \
            Simulation(federation, server.url, cache_root=tmp_path / "devices") as sim:
        sim.publish_base_model()
        sim.register_devices()
        yield sim


def _conv_output_statistics(model: bytes, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The per-channel mean and variance of the convolution's output on `features` (what BatchNorm normalises)."""
    weights = read_float_initializers(model)
    conv = nn.functional.conv2d(torch.from_numpy(features), torch.from_numpy(weights["0.weight"]),
                                torch.from_numpy(weights["0.bias"]), padding=1)
    return conv.mean(dim=(0, 2, 3)).numpy(), conv.var(dim=(0, 2, 3)).numpy()


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["fp32", "int8"])
def test_two_rounds_publish_running_statistics_that_moved_towards_the_devices_data(simulation, federation, encoding):
    simulation.encoding = encoding
    records = simulation.run(round_config(num_rounds=2, min_clients=3, target_clients=3))
    assert [(r.state, r.accepted_updates) for r in records] == [("closed", 3), ("closed", 3)]
    first, second = (simulation.admin.card(r.result_model_id) for r in records)
    published = read_float_initializers(simulation.admin.download_model(second).read_bytes())
    base = read_float_initializers(federation.model)
    data = normalise(federation.pool.x, federation.card.input.normalisation)
    data_mean, data_variance = _conv_output_statistics(simulation.admin.download_model(second).read_bytes(), data)
    for name, target in (("1.running_mean", data_mean), ("1.running_var", data_variance)):
        before, after = np.abs(base[name] - target), np.abs(published[name] - target)
        assert np.all(after < 0.25 * before), (name, base[name], published[name], target)
    # each round published its own statistics: the second started from the first's
    first_statistics = read_float_initializers(simulation.admin.download_model(first).read_bytes())
    assert not np.allclose(first_statistics["1.running_mean"], base["1.running_mean"])
    outcome = simulation.admin.fl_round(records[1].round_id)["outcome"]
    assert outcome["running_statistics"] == {"counted": 3, "clipped": 0, "rejected": 0}


def test_an_update_with_only_some_statistics_or_bad_ones_is_refused_naming_the_statistic(simulation, federation):
    simulation.start_plan(round_config(target_clients=2, min_clients=1))
    client = device_client(simulation, 0)
    task = client.fl_task("digits")["task"]
    statistics = {name: np.full(value.shape, 0.5, np.float32)
                  for name, value in read_float_initializers(federation.model).items() if name in STATISTICS}
    parameters = {name: value for name, value in honest_delta(federation.model).items() if name not in STATISTICS}
    partial = {**parameters, "running.1.running_mean": statistics["1.running_mean"]}
    with pytest.raises(BadRequestError) as refused:
        upload(client, task, partial)
    assert refused.value.field == "running.1.running_var"
    wrong_shape = {**parameters, "running.1.running_mean": np.zeros(3, np.float32),
                   "running.1.running_var": statistics["1.running_var"]}
    with pytest.raises(BadRequestError) as refused:
        upload(client, task, wrong_shape)
    assert refused.value.field == "running.1.running_mean"
    infinite = {**parameters, **{f"running.{name}": value.copy() for name, value in statistics.items()}}
    infinite["running.1.running_var"][0] = np.inf
    with pytest.raises(BadRequestError) as refused:
        upload(client, task, infinite)
    assert refused.value.field == "running.1.running_var"
    # the statistics are not parameters: sent as plain deltas they are unexpected
    with pytest.raises(BadRequestError) as refused:
        upload(client, task, {**parameters, **statistics})
    assert refused.value.field == "1.running_mean"
    # without statistics (an SDK that sends none) the update counts, and so does one with all of them
    assert upload(client, task, parameters)["accepted_updates"] == 1
    other = device_client(simulation, 1)
    other_task = other.fl_task("digits")["task"]
    complete = {**parameters, **{f"running.{name}": value for name, value in statistics.items()}}
    assert upload(other, other_task, complete, encoding="int8")["accepted_updates"] == 2


def test_statistics_average_by_the_servers_example_count_screened_apart_from_the_weights():
    base = {"mean": np.zeros(2, np.float32), "var": np.ones(2, np.float32)}
    sent = {
        "a": (100, {"mean": np.array([1.0, 1.0], np.float32), "var": np.array([0.5, 0.5], np.float32)}),
        "b": (300, {"mean": np.array([2.0, 2.0], np.float32), "var": np.array([-0.5, -0.5], np.float32)}),
        "c": (100, {"mean": np.array([1.5, 1.5], np.float32), "var": np.array([0.0, 0.0], np.float32)}),
        "attacker": (100, {"mean": np.array([1e4, 1e4], np.float32), "var": np.array([-1e4, -1e4], np.float32)}),
        "silent": (100, {}),
    }
    kept = [ClientUpdate(device, examples, lambda: {}, 1.0) for device, (examples, _) in sent.items()]
    statistics, outcomes = aggregate_statistics(base, kept, lambda update: sent[update.device_id][1],
                                                NormBound(action="reject", max_norm=1e-9), {"var"})
    # the attacker's statistics are rejected by the median rule; max_norm (weights' units) does not apply
    assert outcomes == {"counted": 3, "clipped": 0, "rejected": 1}
    np.testing.assert_allclose(statistics["mean"], [(100 * 1 + 300 * 2 + 100 * 1.5) / 500] * 2, rtol=1e-6)
    np.testing.assert_allclose(statistics["var"], [1 + (50 - 150) / 500] * 2, rtol=1e-6)
    # a variance never goes below zero
    low, _ = aggregate_statistics(base, kept[1:2], lambda update: {"mean": base["mean"], "var": np.full(2, -3, np.float32)},
                                  NormBound(), {"var"})
    assert np.all(low["var"] == 0.0)


def test_statistics_ride_the_update_archive_in_both_encodings():
    trained = {"bn.running_mean": np.array([0.5, -1.0], np.float32)}
    initial = {"bn.running_mean": np.array([0.25, 0.0], np.float32)}
    entries = statistics_delta(trained, initial)
    assert list(entries) == ["running.bn.running_mean"]
    for encoding in ("fp32", "int8"):
        decoded, used = decode_update(encode_update({"w": np.ones(3, np.float32), **entries}, encoding))
        parameters, statistics = split_statistics(decoded)
        assert used == encoding and list(parameters) == ["w"]
        np.testing.assert_allclose(statistics["bn.running_mean"], [0.25, -1.0], atol=1.0 / 127)
