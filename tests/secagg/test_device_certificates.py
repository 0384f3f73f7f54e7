"""Device certificates: the shared vectors, and a lying server's Sybils and key substitutions refused in process.

Each attack is first run against a client without certificates, to show it lands (the victim accepts the server's
keys and would share its secrets with them), then against the real client with the operator's key set pinned."""

import base64
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from fedzoo.device_certificates import (
    CertificatePolicy, DeviceCertificateError, issue_certificate, key_fingerprint, verify_certificate,
)
from fedzoo.secagg import ProtocolViolation, SecAggClient, SecAggConfig, SecAggServer, signatures
from fedzoo.signing import CardSigningKey, TrustedKeys

sys.path.insert(0, str(Path(__file__).parents[1] / "vectors"))  # the vector writer (importlib mode)
from device_certificate_vectors import VECTORS_PATH, device_certificate_vectors, vectors_text  # noqa: E402

CONFIG = SecAggConfig("round-certified", 5, 4, 4, 5, 1.0)  # k = n - 1: every client neighbours every other; t at the floor
VICTIM = 0


def test_the_committed_vectors_are_what_the_writer_writes():
    assert VECTORS_PATH.read_text() == vectors_text()


def test_every_certificate_vector_is_decided_as_it_says():
    vectors = device_certificate_vectors()
    keys = TrustedKeys.from_json(vectors["operator_keys"])
    assert len({case["expect"] for case in vectors["certificates"]}) == 9  # ok and every refusal reason
    for case in vectors["certificates"]:
        now = datetime.strptime(case["now"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        try:
            verify_certificate(case["certificate"], keys, case["device_id"],
                               base64.b64decode(case["signing_public_key"]), frozenset(case["revoked_keys"]), now)
            verdict = "ok"
        except DeviceCertificateError as error:
            verdict = error.reason
        assert verdict == case["expect"], case["name"]


class Fleet:
    """CONFIG's clients as enrolled devices: each has a signing key and the operator's certificate of it."""

    def __init__(self):
        self.operator = CardSigningKey.generate()
        self.keys = {client: signatures.new_signing_key() for client in range(CONFIG.num_clients)}
        self.vouchers = {client: self.voucher(f"phone-{client}", key, self.operator)
                         for client, key in self.keys.items()}

    @staticmethod
    def voucher(device_id, key, signer, lifetime=timedelta(days=30), now=None):
        return {"device_id": device_id, "certificate": issue_certificate(
            device_id, signatures.public_bytes(key), signer, lifetime, now)}

    def policy(self, revoked=frozenset()):
        return CertificatePolicy(TrustedKeys([self.operator.public_key_raw]), revoked)

    def refusal(self, keys=None, vouchers=None, policy=None):
        """Stage 1 of a round whose registry holds `keys` (the server's, in place of the devices' own) and relays
        `vouchers`, then the victim's share_keys under `policy`: the reason it refuses, or None when it shares its
        secrets with the neighbours the server named. The victim advertises in the round it then checks, since
        under protocol v3 its own nonce fixes the graph."""
        keys = keys or self.keys
        victim = SecAggClient(CONFIG, VICTIM, self.keys[VICTIM], certificates=policy)
        clients = {client: SecAggClient(CONFIG, client, key) for client, key in keys.items() if client != VICTIM}
        server = SecAggServer(CONFIG, {client: signatures.public_bytes(key) for client, key in keys.items()},
                              self.vouchers if vouchers is None else vouchers)
        advertised = [victim.advertise_keys()] + [client.advertise_keys() for client in clients.values()]
        try:
            victim.share_keys(server.collect_keys(advertised)[VICTIM])
        except ProtocolViolation as violation:
            return violation.reason
        return None


def _refusal(fleet, keys=None, vouchers=None, revoked=frozenset()):
    return fleet.refusal(keys, vouchers, fleet.policy(revoked))


def test_certified_neighbours_are_accepted():
    fleet = Fleet()
    assert _refusal(fleet) is None


def test_sybils_the_server_enrolled_with_keys_it_made_are_refused():
    fleet = Fleet()
    sybil_keys = {client: signatures.new_signing_key() for client in range(1, CONFIG.num_clients)}
    keys, vouchers = {**fleet.keys, **sybil_keys}, {VICTIM: fleet.vouchers[VICTIM]}
    assert fleet.refusal(keys, vouchers) is None  # without certificates the victim shares its secrets with the Sybils
    assert _refusal(fleet, keys, vouchers) == "uncertified_key"


def test_sybils_the_server_certified_with_its_own_key_are_refused():
    fleet, server_key = Fleet(), CardSigningKey.generate()
    sybil_keys = {client: signatures.new_signing_key() for client in range(1, CONFIG.num_clients)}
    forged = {client: Fleet.voucher(f"sybil-{client}", key, server_key) for client, key in sybil_keys.items()}
    keys = {**fleet.keys, **sybil_keys}
    assert fleet.refusal(keys, forged) is None
    assert _refusal(fleet, keys, forged) == "uncertified_key"


def test_a_server_substituting_one_devices_key_is_refused():
    fleet = Fleet()
    substituted = {**fleet.keys, 1: signatures.new_signing_key()}  # the server's key in device 1's place
    assert fleet.refusal(substituted) is None  # device 1's own certificate still relayed
    assert _refusal(fleet, substituted) == "uncertified_key"


@pytest.mark.parametrize("case", ["expired", "another_device", "not_pinned", "card_signature", "missing_device_id"])
def test_a_neighbour_certificate_that_does_not_vouch_for_its_key_is_refused(case):
    fleet = Fleet()
    vouchers = dict(fleet.vouchers)
    if case == "expired":
        vouchers[1] = Fleet.voucher("phone-1", fleet.keys[1], fleet.operator,
                                    now=datetime.now(timezone.utc) - timedelta(days=31))
    elif case == "another_device":
        vouchers[1] = {**vouchers[1], "device_id": "phone-4"}
    elif case == "not_pinned":
        vouchers[1] = Fleet.voucher("phone-1", fleet.keys[1], CardSigningKey.generate())
    elif case == "card_signature":
        from fedzoo.signing import sign_card
        from card_signature_vectors import _card
        block = sign_card(_card(), fleet.operator).signature
        vouchers[1] = {"device_id": "phone-1",
                       "certificate": {"key_id": block.key_id, "payload": block.payload, "signature": block.signature}}
    else:
        vouchers[1] = {"certificate": vouchers[1]["certificate"]}
    assert _refusal(fleet, vouchers=vouchers) == "uncertified_key"


def test_one_device_seated_twice_under_two_certified_keys_is_refused():
    fleet = Fleet()
    second_key = signatures.new_signing_key()  # the operator certified a second key of phone-1 (a re-enrolment)
    keys = {**fleet.keys, 2: second_key}
    vouchers = {**fleet.vouchers, 2: Fleet.voucher("phone-1", second_key, fleet.operator)}
    assert _refusal(fleet, keys, vouchers) == "uncertified_key"


def test_a_revoked_device_is_refused_and_the_others_still_count():
    fleet = Fleet()
    revoked = frozenset({key_fingerprint(signatures.public_bytes(fleet.keys[1]))})
    assert _refusal(fleet, revoked=revoked) == "revoked_key"
    unrelated = frozenset({key_fingerprint(signatures.public_bytes(fleet.keys[VICTIM]))})
    assert _refusal(fleet, revoked=unrelated) is None
