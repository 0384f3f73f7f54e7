"""One card per model line and version: two plans on one base each publish their own next version, the
registry refuses a second card for a taken line and version, and devices refuse one a lying server serves."""

import pytest
from fl_helpers import round_config
from server_helpers import make_card, tiny_onnx_model

from fedzoo.cloud.simulation import Simulation, prepare_federation
from fedzoo.server.testing import LoopbackServer


@pytest.fixture(scope="module")
def federation():
    return prepare_federation("digits", num_clients=3, alpha=1.0, hidden_units=8, pretrain_epochs=1, seed=0)


def test_two_plans_on_one_base_publish_distinct_versions_of_its_line(federation, tmp_path):
    """Both plans start from version 1; the second's result is version 3 of the line, not a second version 2."""
    with LoopbackServer(tmp_path / "server") as server, \
            Simulation(federation, server.url, cache_root=tmp_path / "devices") as simulation:
        simulation.publish_base_model()
        simulation.register_devices()
        first, second = (simulation.run(round_config(num_rounds=1, min_clients=2, target_clients=3))[0]
                         for _ in range(2))
        cards = [simulation.admin.card(record.result_model_id) for record in (first, second)]
    assert [(card.version, card.line_id, card.parent_id) for card in cards] == [
        (2, federation.card.id, federation.card.id), (3, federation.card.id, federation.card.id)]


def test_the_registry_refuses_a_second_card_for_a_taken_line_and_version(live_server):
    blob = tiny_onnx_model(seed=1)
    assert live_server.publish(make_card(blob, "line-a", 0.9, 1000), blob).status_code == 201
    assert live_server.publish(make_card(blob, "line-a-v2", 0.9, 1000, version=2, line="line-a"),
                               blob).status_code == 201
    refused = live_server.publish(make_card(blob, "line-a-v2-other", 0.95, 1000, version=2, line="line-a"), blob)
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "version_taken" and refused.json()["error"]["field"] == "version"
    assert "publish it as version 3" in refused.json()["error"]["message"]
    with live_server.client() as anyone:
        assert anyone.get("/v1/models/line-a-v2-other").status_code == 404  # nothing stored
        assert anyone.get("/v1/models/line-a-v2").json()["metrics"]["accuracy"] == 0.9
