"""The server's own data sets (a robust round's root training set, a round's evaluation set) are the operator's:
GET /v1/blobs/<sha256> serves them only to the viewer or admin token. With the root set, an outsider recomputed
the server's FLTrust reference update exactly and could shape a poisoned update to pass it."""

import io

import httpx
import numpy as np
import pytest

from fedzoo.cloud.simulation import prepare_federation
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN, LoopbackServer
from fl_helpers import ready_simulation, round_config

VIEWER = "operator-data-viewer-token-0123456789"


@pytest.fixture(scope="module")
def federation():
    return prepare_federation("digits", num_clients=3, alpha=None, hidden_units=8, pretrain_epochs=1, seed=0)


@pytest.fixture
def simulation(federation, tmp_path):
    with LoopbackServer(tmp_path / "server", deadline_check_s=0.2, viewer_token=VIEWER) as server:
        with ready_simulation(federation, server.url, tmp_path / "devices") as sim:
            yield sim


def test_a_robust_rounds_root_set_downloads_only_with_an_operator_token(simulation, federation):
    buffer = io.BytesIO()
    np.savez(buffer, x=federation.split.validation.x[:50], y=federation.split.validation.y[:50])
    root_sha = simulation.admin.publish_blob(buffer.getvalue(), DEFAULT_ADMIN_TOKEN)
    simulation.start_plan(round_config(min_clients=3, target_clients=3, root_trust={"root_sha256": root_sha}))
    card = simulation.admin.card(federation.card.id)
    with httpx.Client(base_url=simulation.admin.http.base_url) as http:
        def get(sha256, token=None):
            return http.get(f"/v1/blobs/{sha256}", headers={"Authorization": f"Bearer {token}"} if token else {})

        for sha256 in (root_sha, simulation.evaluation_sha256):
            anonymous, device = get(sha256), get(sha256, simulation.tokens[0])
            assert anonymous.status_code == 401 and anonymous.json()["error"]["field"] == "Authorization"
            assert device.status_code == 401 and device.content != buffer.getvalue()
            assert get(sha256, VIEWER).status_code == 200 and get(sha256, DEFAULT_ADMIN_TOKEN).status_code == 200
        assert get(root_sha, VIEWER).content == buffer.getvalue()
        assert get(card.training_graph).status_code == 200  # what devices need stays public
        assert get("0" * 64).status_code == 404 and get("not-a-digest").status_code == 422
