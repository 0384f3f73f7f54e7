"""Schemathesis against the OpenAPI document: generated requests (valid and invalid) for every
operation must get a documented status, a documented body, and never a 5xx."""

from __future__ import annotations

import tempfile

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from server_helpers import (  # noqa: E402
    config_for_tests, device_profile, make_card, running_live_server, tiny_onnx_model,
)

from fedzoo.server.app import create_app  # noqa: E402
from fedzoo.server.config import ServerConfig  # noqa: E402
from fedzoo.server.latency import CalibrationScalingEstimator  # noqa: E402
from fedzoo.server.openapi import openapi_document  # noqa: E402

pytestmark = pytest.mark.slow
MAX_EXAMPLES = 15

# The document is the one the app serves (a test in test_openapi.py checks that); building it needs an
# app, not a server, so it can be made at collection time.
_document_app = create_app(ServerConfig.from_env({}, data_dir=tempfile.mkdtemp(prefix="fedzoo-openapi-")),
                           estimator=CalibrationScalingEstimator(), migrate=False)
schema = schemathesis.openapi.from_dict(openapi_document(_document_app))

@pytest.fixture(scope="module")
def fuzzed_server(tmp_path_factory):
    with running_live_server(config_for_tests(tmp_path_factory.mktemp("schemathesis"))) as server:
        blob = tiny_onnx_model(seed=11)
        assert server.publish(make_card(blob, "m1", 0.9, 1000), blob).status_code == 201
        server.token = server.register(device_profile("fuzz-device"))
        yield server


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_operation_conforms_to_the_document(case, fuzzed_server):
    case.call_and_validate(base_url=fuzzed_server.base_url,
                           headers={"Authorization": f"Bearer {fuzzed_server.token}"})
