"""The Ray executor: candidate evaluation on a local Ray instance gives what the in-process executor gives."""

import pytest

from fedzoo.cloud.executors import make_executor
from fedzoo.cloud.pipeline import BuildConfig, build_zoo

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module; executors find it running and leave it up."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _square_plus(context, item):
    return item * item + context["offset"]


def test_ray_executor_maps_in_item_order_and_reports_progress(local_ray):
    executor = make_executor("ray", num_workers=2)
    done = []
    assert executor.map(_square_plus, {"offset": 1}, [3, 1, 2], on_result=done.append) == [10, 2, 5]
    assert done == [1, 2, 3]
    executor.close()
    assert ray.is_initialized()  # it did not start this instance, so it leaves it running


def test_ray_executor_stores_a_context_once_however_many_maps_and_items_read_it(local_ray, monkeypatch):
    stored = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value, **options: stored.append(value) or real_put(value, **options))
    executor = make_executor("ray", num_workers=2)
    context = {"offset": 1}
    assert executor.map(_square_plus, context, [1, 2, 3]) == [2, 5, 10]
    assert executor.map(_square_plus, context, [4]) == [17]  # a simulation's next round: the same context
    assert stored == [context]
    assert executor.map(_square_plus, {"offset": 2}, [1]) == [3]  # another context is stored on its own
    assert len(stored) == 2
    executor.close()


def test_build_on_ray_matches_the_in_process_build(tmp_path, local_ray):
    # one epoch, no fine-tune: the search is what runs on Ray
    settings = dict(dataset="digits", preset="tiny", latency_source="macs", compress=False, training_graphs=False,
                    evaluations=10, population_size=5, epochs=1, finetune_epochs=0)
    local = build_zoo(BuildConfig(out=tmp_path / "local", executor="in-process", **settings))
    remote = build_zoo(BuildConfig(out=tmp_path / "ray", executor="ray", num_workers=2, **settings))
    assert [(c.arch, c.accuracy, c.latency_ms) for c in remote.search.evaluated] == [
        (c.arch, c.accuracy, c.latency_ms) for c in local.search.evaluated
    ]
    assert [c.id for c in remote.cards] == [c.id for c in local.cards]
