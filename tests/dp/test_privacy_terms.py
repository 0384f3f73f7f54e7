"""The operator's signed privacy terms (`fedzoo.privacy_terms`): the shared vectors' verdicts (the Java SDK's
`PrivacyTermsTest` reads the same file), the policy a device applies per line and the task check before training
(`fedzoo.dp.distributed.policy_for`, `check_task_privacy`)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vectors"))
import privacy_terms_vectors  # noqa: E402

from fedzoo.dp.distributed import NoisePolicy, check_task_privacy, policy_for  # noqa: E402
from fedzoo.privacy_terms import verify_privacy_terms  # noqa: E402
from fedzoo.errors import CardSignatureError  # noqa: E402
from fedzoo.secagg.errors import ProtocolViolation  # noqa: E402
from fedzoo.signing import TrustedKeys  # noqa: E402

VECTORS = privacy_terms_vectors.privacy_terms_vectors()
TRUSTED = TrustedKeys.from_json(VECTORS["trusted_keys"])


def test_the_committed_privacy_terms_vectors_are_what_the_writer_writes():
    assert privacy_terms_vectors.VECTORS_PATH.read_text() == privacy_terms_vectors.vectors_text()


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda case: case["name"])
def test_each_privacy_terms_vector_gets_its_expected_verdict(case):
    held = None if case["held"] is None else verify_privacy_terms(case["held"], TRUSTED)
    if case["expect"] != "ok":
        with pytest.raises(CardSignatureError) as caught:
            verify_privacy_terms(case["document"], TRUSTED, held=held)
        assert caught.value.reason == case["expect"]
        return
    terms = verify_privacy_terms(case["document"], TRUSTED, held=held)
    assert terms.version == case["version"]
    for line, expected in case["policies"].items():
        policy = policy_for(terms, line, NoisePolicy())
        assert policy == (NoisePolicy() if expected is None else NoisePolicy(**expected)), line


def test_the_vectors_cover_every_reason():
    assert {case["expect"] for case in VECTORS["cases"]} == {"ok", "unknown_key", "bad_signature", "field_mismatch",
                                                             "rollback", "version_reused"}


def test_the_owners_policy_and_the_terms_combine_to_the_stricter_of_both():
    terms = verify_privacy_terms(VECTORS["cases"][0]["document"], TRUSTED)  # digits-mlp 1.5, every other line 1.0
    assert policy_for(terms, "digits-mlp", NoisePolicy(False, 2.0)) == NoisePolicy(True, 2.0)
    assert policy_for(terms, "digits-mlp", NoisePolicy(False, 1.0)) == NoisePolicy(True, 1.5)
    assert policy_for(None, "digits-mlp", NoisePolicy(True, None)) == NoisePolicy(True, None)


@pytest.mark.parametrize("privacy", [
    None,  # no DP, no SecAgg+: the plain delta would be uploaded
    {"clip_norm": None, "secure_aggregation": {"stage": "selection"}},  # SecAgg+ without DP
    {"clip_norm": 0.5, "secure_aggregation": None},  # DP-FedAvg with the server's noise on plain uploads
])
def test_a_task_that_cannot_carry_the_devices_noise_is_refused_before_training_where_it_is_required(privacy):
    with pytest.raises(ProtocolViolation) as refused:
        check_task_privacy(privacy, NoisePolicy(require_distributed=True, minimum_noise_multiplier=1.0))
    assert refused.value.reason == "noise_not_distributed"
    check_task_privacy(privacy, NoisePolicy())  # not required: the device follows the server
    check_task_privacy({"clip_norm": 0.5, "secure_aggregation": {"stage": "selection"}}, NoisePolicy(True, 1.0))
