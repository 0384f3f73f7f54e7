"""The simulator's engines run one aggregation core: a plan through the `server` engine (the real server on
loopback, every device over HTTP) and through the `inprocess` engine (no HTTP, no database) on the same shards and
seeds publishes the same weights, to float tolerance; the `ray` engine gives what `inprocess` gives."""

import numpy as np
import pytest

from fedzoo.cloud.inprocess import InProcessEngine, make_engine
from fedzoo.cloud.simulation import Simulation
from fedzoo.server.testing import LoopbackServer
from fedzoo.edge.onnx_initializers import read_float_initializers
from fedzoo.errors import InvalidInputError

# four devices, five seats: every device is selected and the fourth upload is refused, as the round has its three
PLAN = {"min_clients": 3, "target_clients": 3, "over_selection": 0.34, "deadline_s": 60, "num_rounds": 3,
        "batch_size": 16, "max_accuracy_drop": 1.0, "poll_interval_s": 0.05}  # devices ask again soon (default 5 s)


def _server_engine(federation, tmp_path, plan):
    """Each round's published trainable parameters and record, through the real server."""
    with LoopbackServer(tmp_path / "server", transport="wsgi") as server:
        with Simulation(federation, server.url, executor="in-process", cache_root=tmp_path / "devices", seed=0,
                        in_process=server.in_process) as simulation:
            simulation.publish_base_model()
            simulation.register_devices()
            records = simulation.run(plan)
            published = [read_float_initializers(simulation.admin.download_model(
                simulation.admin.card(record.result_model_id)).read_bytes()) for record in records]
    return records, published


def _inprocess_engine(engine: InProcessEngine, plan):
    published = []
    records = engine.run(plan, progress=lambda record: published.append(dict(engine.parameters)))
    return records, published


def _assert_same_weights(expected, actual):
    assert len(expected) == len(actual)
    for left, right in zip(expected, actual):
        for name, value in right.items():
            np.testing.assert_allclose(value, left[name], rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [{"name": "fedavg"}, {"name": "fedadam", "server_lr": 0.01}])
def test_the_server_and_inprocess_engines_publish_the_same_weights(federation, tmp_path, strategy):
    plan = {**PLAN, "strategy": strategy}
    server_records, server_weights = _server_engine(federation, tmp_path, plan)
    with InProcessEngine(federation, seed=0) as engine:
        records, weights = _inprocess_engine(engine, plan)
    assert [(r.number, r.state, r.accepted_updates, r.refused) for r in records] == [
        (r.number, r.state, r.accepted_updates, r.refused) for r in server_records] == [
        (number, "closed", 3, 1) for number in (1, 2, 3)]
    for record, server_record in zip(records, server_records):
        assert record.outcome["screening"] == pytest.approx(server_record.outcome["screening"], rel=1e-4)
        assert record.accuracy == pytest.approx(server_record.accuracy, abs=0.02)
    _assert_same_weights(server_weights, weights)
    # the weights moved: an engine that published the base model every round would fail here
    base = read_float_initializers(federation.model)
    assert max(float(np.abs(weights[-1][name] - base[name]).max()) for name in weights[-1]) > 1e-3


def test_the_inprocess_engine_refuses_what_only_the_server_runs(federation):
    with InProcessEngine(federation) as engine:
        with pytest.raises(InvalidInputError) as error:
            engine.run({**PLAN, "privacy": {"dp": {"max_epsilon": 8.0, "clip_norm": 0.5}}})
        assert error.value.field == "privacy"
    with pytest.raises(InvalidInputError) as error:
        make_engine("server", federation)
    assert error.value.field == "engine"


@pytest.fixture
def two_node_ray():
    """A local Ray cluster of two one-CPU nodes (a head and a worker), torn down after the test."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    yield ray
    ray.shutdown()
    cluster.shutdown()


@pytest.mark.slow
def test_the_ray_engine_on_a_two_node_cluster_publishes_what_inprocess_publishes(federation, two_node_ray):
    plan = {**PLAN, "num_rounds": 2}
    with make_engine("inprocess", federation, seed=0) as engine:
        records, weights = _inprocess_engine(engine, plan)
    with make_engine("ray", federation, seed=0) as engine:
        assert engine.executor.workers == 2 and len(two_node_ray.nodes()) == 2
        ray_records, ray_weights = _inprocess_engine(engine, plan)
    assert [(r.state, r.accepted_updates) for r in ray_records] == [(r.state, r.accepted_updates) for r in records]
    _assert_same_weights(weights, ray_weights)


# adaptive clipping under SecAgg+: the count noise (sigma 0.06, which z = 0.1 allows) is too small to move a whole
# number, so both engines must state the same next clip norm; every delta clipped (count 0) or none (count 4)
ADAPTIVE = {"target_unclipped_quantile": 0.5, "clip_learning_rate": 0.5, "clipped_count_stddev": 0.06}


@pytest.mark.slow
@pytest.mark.parametrize("clip_norm, unclipped_fraction", [(1e-4, 0.0), (1e4, 1.0)], ids=["all-clipped", "none"])
def test_both_engines_move_the_clip_norm_alike_under_secure_aggregation(federation, tmp_path, clip_norm,
                                                                        unclipped_fraction):
    from fedzoo.cloud.inprocess import DpOptions, SecureAggregationOptions, run_private_rounds
    from fedzoo.dp.noise import AdaptiveClipping

    expected = clip_norm * np.exp(-0.5 * (unclipped_fraction - 0.5))
    privacy = {"secure_aggregation": {"neighbour_count": 6, "stage_deadline_s": 30},
               "dp": {"max_epsilon": 500, "delta": 1e-5, "clip_norm": clip_norm, "noise_multiplier": 0.1,
                      "adaptive": ADAPTIVE}}
    plan = {**PLAN, "target_clients": 4, "over_selection": 0.0, "num_rounds": 1, "privacy": privacy}
    with LoopbackServer(tmp_path / "server", transport="wsgi",
                        environ={"FEDZOO_DP_LINE_MAX_EPSILON": "1000"}) as server:
        with Simulation(federation, server.url, executor="in-process", cache_root=tmp_path / "devices", seed=0,
                        in_process=server.in_process) as simulation:
            simulation.publish_base_model()
            simulation.register_devices()
            (record,) = simulation.run(plan)
    assert record.state == "closed", record.outcome
    claim = record.outcome["privacy"]["dp"]
    assert claim["noised_unclipped_fraction"] == pytest.approx(unclipped_fraction, abs=1e-9)
    assert claim["next_clip_norm"] == pytest.approx(expected, rel=1e-9)

    dp = DpOptions(max_epsilon=500, clip_norm=clip_norm, noise_multiplier=0.1, adaptive=AdaptiveClipping(**ADAPTIVE))
    records = run_private_rounds(federation, 2, 4, {"optimizer": "sgd", "learning_rate": 0.05, "local_epochs": 1,
                                                    "batch_size": 16},
                                 secure_aggregation=SecureAggregationOptions(neighbour_count=6), dp=dp,
                                 executor="in-process")
    assert [r.survivors for r in records] == [4, 4]
    assert records[1].clip_norm == pytest.approx(claim["next_clip_norm"], rel=1e-9)
