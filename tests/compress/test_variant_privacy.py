"""A pruned or INT8 child of a DP model carries its parent's privacy claim: its weights derive from the parent's."""

from fedzoo.cloud.simulation import prepare_federation
from fedzoo.compress.measure import Measurement
from fedzoo.compress.pipeline import _variant_card


def test_a_variant_of_a_dp_model_keeps_the_privacy_claim_its_ledger_continues_from(tmp_path):
    federation = prepare_federation("digits", num_clients=1, alpha=None, hidden_units=4, pretrain_epochs=1, seed=0)
    claim = {"epsilon": 4.4, "delta": 1e-5, "accountant": "rdp", "line": "digits-mlp",
             "line_events": [[1.5, 1.0, 2]]}
    parent = federation.card.model_copy(update={"details": {"federated": {"privacy": {"secure_aggregation": False,
                                                                                       "dp": claim}}}})
    path = tmp_path / "child.onnx"
    path.write_bytes(federation.model)
    measurement = Measurement(accuracy=0.5, loss=1.0, num_examples=10, latency_median_ms=1.0, latency_p90_ms=1.0,
                              size_bytes=path.stat().st_size)
    child = _variant_card(parent, "child-int8", path, measurement, precision="int8",
                          details={"quantization": {"recipe": "default"}})
    assert child.details["federated"]["privacy"]["dp"] == claim
    assert child.details["federated"]["privacy_inherited_from"] == parent.id
    assert child.details["quantization"] == {"recipe": "default"} and child.parent_id == parent.id
    plain = _variant_card(federation.card, "plain-int8", path, measurement, details={"quantization": {}})
    assert "federated" not in plain.details
