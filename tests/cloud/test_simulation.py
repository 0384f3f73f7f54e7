"""The federated simulation harness: federations from Dirichlet shards, a centralized baseline, and
virtual devices (honest and poisoning) against a real loopback server, in-process and on Ray."""

import hashlib
import importlib.util

import numpy as np
import pytest

from fedzoo.cloud.simulation import ScaledUpdateAttack, Simulation, centralized_baseline, prepare_federation
from fedzoo.edge.onnx_initializers import read_float_initializers
from fedzoo.errors import InvalidInputError
from fedzoo.server.testing import LoopbackServer


@pytest.fixture(scope="module")
def federation():
    return prepare_federation("digits", num_clients=4, alpha=0.5, hidden_units=16, pretrain_epochs=10, seed=3)


def test_federation_spreads_every_pooled_example_to_exactly_one_device(federation):
    combined = np.concatenate(federation.shards)
    assert len(combined) == len(federation.pool) == len(np.unique(combined))
    assert all(len(shard) > 0 for shard in federation.shards)
    # Dirichlet(0.5) skews labels: the devices' label histograms differ
    histograms = [np.bincount(federation.pool.y[shard], minlength=10) / len(shard) for shard in federation.shards]
    assert max(np.abs(a - b).sum() for a in histograms for b in histograms) > 0.3
    card = federation.card
    assert hashlib.sha256(federation.model).hexdigest() == card.sha256
    assert hashlib.sha256(federation.training_graph).hexdigest() == card.training_graph
    assert card.metrics.accuracy > 0.2  # pre-trained on the cloud's share: better than chance


def test_centralized_baseline_improves_the_pretrained_model(federation):
    accuracies = centralized_baseline(federation, epochs=3, batch_size=16, learning_rate=0.05)
    assert len(accuracies) == 3 and max(accuracies) > federation.card.metrics.accuracy


def test_scaled_update_attack_scales_every_tensor():
    delta = {"w": np.array([1.0, -2.0], np.float32)}
    assert ScaledUpdateAttack(-10.0)(delta)["w"].tolist() == [-10.0, 20.0]


def _run(federation, tmp_path, executor, strategy, attackers=frozenset(), transport="tcp", workers=None,
         published=None, **config):
    """Two rounds; with a `published` list, the published models' trainable parameters are added to it."""
    with LoopbackServer(tmp_path / "server", transport=transport) as server:
        with Simulation(federation, server.url, executor=executor, cache_root=tmp_path / "devices",
                        attackers=attackers, seed=0, workers=workers, in_process=server.in_process) as sim:
            sim.publish_base_model()
            sim.register_devices()
            records = sim.run({"min_clients": 3, "target_clients": 3, "over_selection": 0.34, "deadline_s": 60,
                               "num_rounds": 2, "batch_size": 16, "poll_interval_s": 0.05, "strategy": strategy, **config})
            for record in records if published is not None else []:
                card = sim.admin.card(record.result_model_id)
                published.append(read_float_initializers(sim.admin.download_model(card).read_bytes()))
            return records


@pytest.mark.slow
def test_in_process_simulation_reports_accuracy_per_round(federation, tmp_path):
    # about the harness, not the publication gate: open it (a round's accuracy depends on the CPU's numerics)
    records = _run(federation, tmp_path, "in-process", {"name": "fedavg"}, max_accuracy_drop=1.0)
    assert [(r.number, r.state, r.accepted_updates) for r in records] == [(1, "closed", 3), (2, "closed", 3)]
    assert all(0 < r.accuracy <= 1 and r.upload_bytes > 0 for r in records)
    assert sum(r.refused for r in records) == 2  # the over-selected fourth device is refused each round


@pytest.mark.slow
def test_a_poisoning_device_is_clipped_and_a_worse_aggregate_is_never_published(federation, tmp_path):
    attackers = frozenset({0})
    fedavg = _run(federation, tmp_path / "fedavg", "in-process", {"name": "fedavg"}, attackers)
    median = _run(federation, tmp_path / "median", "in-process", {"name": "median"}, attackers)
    for record in fedavg + median:
        screening, parent = record.outcome["screening"], record.outcome["parent_evaluation"]["accuracy"]
        # the flipped, scaled update, and only it: clipped by the norm bound, or left out by the direction
        # screening (in a round of 3 the median leans towards an extreme update: which one is the CPU's numerics)
        assert screening["clipped"] + screening["rejected"] == 1 and screening["counted"] == 2
        if record.state == "closed":
            assert record.accuracy >= parent - 0.02
        else:  # refused by the gate, and only because the aggregate was worse than the tolerance allows
            assert record.outcome["publication"]["published"] is False and record.accuracy is None
            assert record.outcome["evaluation"]["accuracy"] < parent - 0.02
    # whether FedAvg with the (clipped) attacker lands below the tolerance, or the median above its parent,
    # depends on the CPU's numerics: the contract is the invariant above, over both strategies' rounds


def _distance(parameters, other):
    return float(np.sqrt(sum(np.sum((parameters[name] - other[name]) ** 2.0) for name in parameters)))


@pytest.mark.slow
def test_the_median_publishes_weights_nearer_the_attack_free_round_than_fedavg_on_the_same_shards(federation, tmp_path):
    """One round on the same shards and seeds, gate open: FedAvg without the attacker is the reference; with it,
    the (clipped) scaled update pulls FedAvg's mean, while the coordinate-wise median stays between the honest
    updates (with 1 attacker of 3, the honest value nearest the attacker's). Distances of published weights,
    with margins no CPU's rounding closes."""
    attackers, one_round = frozenset({0}), {"num_rounds": 1, "max_accuracy_drop": 1.0}
    clean, fedavg, median = [], [], []
    _run(federation, tmp_path / "clean", "in-process", {"name": "fedavg"}, published=clean, **one_round)
    _run(federation, tmp_path / "fedavg", "in-process", {"name": "fedavg"}, attackers, published=fedavg, **one_round)
    _run(federation, tmp_path / "median", "in-process", {"name": "median"}, attackers, published=median, **one_round)
    step = _distance(clean[0], read_float_initializers(federation.model))  # how far the honest round moved
    pulled, resisted = _distance(fedavg[0], clean[0]), _distance(median[0], clean[0])
    assert pulled > 1.5 * step, (pulled, step)  # the attack matters: FedAvg lands further off than a round moves
    assert resisted < 0.75 * pulled, (resisted, pulled)  # about half on this machine; equal were it FedAvg


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install 'fedzoo[ray]')")
def test_ray_executor_runs_devices_as_parallel_tasks(federation, tmp_path):
    # about the executor, not the publication gate: open it (parallel uploads change the aggregate)
    records = _run(federation, tmp_path, "ray", {"name": "fedavg"}, max_accuracy_drop=1.0)
    assert [r.state for r in records] == ["closed", "closed"]
    # parallel uploads may land a fourth update before aggregation starts; every accepted one is aggregated
    assert all(r.outcome["accepted_updates"] == r.accepted_updates >= 3 for r in records)


@pytest.mark.slow
def test_a_zoo_subnet_fine_tunes_on_data_the_build_never_saw(tmp_path):
    from fedzoo.cloud.pipeline import PRESETS, BuildConfig, build_zoo
    from fedzoo.cloud.simulation import federation_from_zoo
    from fedzoo.datasets import load_dataset, split_dataset

    build = build_zoo(BuildConfig(dataset="digits", out=tmp_path / "zoo", preset="tiny", latency_source="macs",
                                  compress=False, executor="in-process"))
    base = min(build.cards, key=lambda card: card.macs)
    split = split_dataset(load_dataset("digits"), seed=0)
    held = PRESETS["tiny"].max_train_examples
    federation = federation_from_zoo(tmp_path / "zoo", base.id, split, num_clients=4, cloud_examples=held)
    assert len(federation.pool) == len(split.train) - held
    np.testing.assert_array_equal(federation.pool.x, split.train.x[held:])
    # the card names its torch state as an artifact: the federation carries that blob too, so a fresh server
    # (one that never imported the zoo) accepts the card
    assert set(base.artifacts.values()) <= set(federation.blobs)
    # the tiny preset's subnet may lose accuracy on these shards; this test is about the plumbing, so the
    # publication gate is opened wide (test_a_poisoning_device_... covers the gate). At the plans' default rate
    # (0.05) one device's SGD on the fine-tuned zoo's folded network diverged (loss 4e13) and the open gate
    # published it; 0.02 keeps the devices' training finite.
    records = _run(federation, tmp_path / "run", "in-process", {"name": "fedavg"}, max_accuracy_drop=1.0,
                   learning_rate=0.02)
    assert [r.state for r in records] == ["closed", "closed"] and all(0 < r.accuracy <= 1 for r in records)
    assert records[-1].outcome["num_examples"] > 0


@pytest.mark.slow
def test_the_wsgi_transport_publishes_the_models_tcp_does(federation, tmp_path):
    """Without TCP the same devices, selected in the same order, send the same updates: the same models."""
    over_tcp, over_wsgi = [], []
    tcp = _run(federation, tmp_path / "tcp", "in-process", {"name": "fedavg"}, max_accuracy_drop=1.0, published=over_tcp)
    wsgi = _run(federation, tmp_path / "wsgi", "in-process", {"name": "fedavg"}, transport="wsgi",
                max_accuracy_drop=1.0, published=over_wsgi)
    assert [(r.state, r.accepted_updates, r.refused) for r in wsgi] == [(r.state, r.accepted_updates, r.refused)
                                                                        for r in tcp] == [("closed", 3, 1)] * 2
    for tcp_model, wsgi_model in zip(over_tcp, over_wsgi, strict=True):
        assert tcp_model.keys() == wsgi_model.keys()
        for name, value in tcp_model.items():
            np.testing.assert_allclose(wsgi_model[name], value, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_device_processes_reach_the_server_through_their_own_server_workers(federation, tmp_path):
    # check-ins and work in 2 spawned processes, each with an app on the server's data directory
    records = _run(federation, tmp_path, "processes", {"name": "fedavg"}, transport="wsgi", workers=2,
                   max_accuracy_drop=1.0)
    assert [r.state for r in records] == ["closed", "closed"]
    # the goal's 4 seats (3 x 1.34) in each round, whichever process's server worker seated them
    assert all(r.participants == 4 and r.outcome["accepted_updates"] == r.accepted_updates >= 3 for r in records)
    assert all(r.check_in_seconds > 0 and r.work_seconds > 0 for r in records)


def test_an_unknown_transport_is_refused_by_name(tmp_path):
    with pytest.raises(InvalidInputError, match="udp"):
        LoopbackServer(tmp_path / "server", transport="udp")
