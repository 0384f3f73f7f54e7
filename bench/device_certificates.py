"""What device certificates and the revocation list cost a SecAgg+ device: bytes, round trips and milliseconds,
at n = 100, k = 60.

The server relays each neighbour's device id and the operator's certificate with its keys (stage 2's request, no
extra round trip); before its first reply the device reads the operator's one signed revocation list (one GET
`/v1/revocations` a round), verifies it and keeps it in its state file when newer (a compare-and-swap under the
file's lock, fsync'd), and checks every neighbour's certificate (one Ed25519 verification and a little JSON each).
Measured with the real classes in this process: the victim's share_keys request built by `SecAggServer` from 100
clients' stage-1 replies, with and without the certificates, `SecAggClient.share_keys` timed on it with and without
the check, and the list's verification and keeping (`fedzoo.clients.held_revocations.hold`), best of `--runs`.

    .venv/bin/python bench/device_certificates.py [--runs 20] [--revoked 100] [--revoked-cards 100]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path

from fedzoo.clients import held_revocations
from fedzoo.device_certificates import CertificatePolicy, issue_certificate, key_fingerprint
from fedzoo.revocation import sign_revocation_list
from fedzoo.secagg import SecAggClient, SecAggConfig, SecAggServer, signatures
from fedzoo.signing import CardSigningKey, TrustedKeys

CONFIG = SecAggConfig("bench-certificates", 100, 60, 33, 10, 1.0)  # t at the devices' floor
VICTIM = 0


def best_ms(runs: int, prepare, clock=time.process_time) -> float:
    """The least time (CPU time by default) of `runs` calls of the function `prepare()` returns (prepared outside
    the timing)."""
    times = []
    for _ in range(runs):
        work = prepare()
        started = clock()
        work()
        times.append((clock() - started) * 1000)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--revoked", type=int, default=100, help="device keys on the revocation list")
    parser.add_argument("--revoked-cards", type=int, default=100, help="cards (by model sha256) on the list")
    options = parser.parse_args()
    operator = CardSigningKey.generate()
    keys = {client: signatures.new_signing_key() for client in range(CONFIG.num_clients)}
    public = {client: signatures.public_bytes(key) for client, key in keys.items()}
    vouchers = {client: {"device_id": f"phone-{client:05d}",
                         "certificate": issue_certificate(f"phone-{client:05d}", public[client], operator)}
                for client in keys}
    others = [SecAggClient(CONFIG, client, key).advertise_keys() for client, key in keys.items() if client != VICTIM]
    policy = CertificatePolicy(TrustedKeys([operator.public_key_raw]))

    def share_keys(certificates):
        """The victim's share_keys request in a round it advertised in (its nonce fixes the graph), and the call."""
        victim = SecAggClient(CONFIG, VICTIM, keys[VICTIM], certificates=certificates)
        server = SecAggServer(CONFIG, public, vouchers if certificates is not None else None)
        request = server.collect_keys([victim.advertise_keys(), *others])[VICTIM]
        return request, lambda: victim.share_keys(request)

    plain, certified = share_keys(None)[0], share_keys(policy)[0]

    revoked = [key_fingerprint(signatures.public_bytes(signatures.new_signing_key())) for _ in range(options.revoked)]
    cards = [hashlib.sha256(str(index).encode()).hexdigest() for index in range(options.revoked_cards)]
    held_list = sign_revocation_list(operator, 1, card_sha256s=cards, device_key_fingerprints=revoked)
    newer_list = sign_revocation_list(operator, 2, card_sha256s=cards, device_key_fingerprints=revoked)
    operator_keys = TrustedKeys([operator.public_key_raw])
    with tempfile.TemporaryDirectory() as folder:
        state = Path(folder) / "state.json"

        def keep_newer():
            """A device holding version 1 is served version 2: verify, compare with the held one, keep it."""
            state.unlink(missing_ok=True)
            held_revocations.hold(state, held_list, operator_keys)
            return lambda: held_revocations.hold(state, newer_list, operator_keys)

        def same_again():
            """The usual round: the server serves the list the device holds (verified, compared, rewritten)."""
            held_revocations.hold(state, newer_list, operator_keys)
            return lambda: held_revocations.hold(state, newer_list, operator_keys)

        keep_newer_ms = best_ms(options.runs, keep_newer, time.perf_counter)
        same_again_ms = best_ms(options.runs, same_again, time.perf_counter)
    without_ms = best_ms(options.runs, lambda: share_keys(None)[1])
    with_ms = best_ms(options.runs, lambda: share_keys(policy)[1])
    plain_bytes, certified_bytes = (len(json.dumps(request).encode()) for request in (plain, certified))
    neighbours = len(certified["public_keys"])
    certificate_bytes = len(json.dumps(vouchers[1]["certificate"]).encode())
    voucher_bytes = len(json.dumps(vouchers[1]).encode())
    list_bytes = len(json.dumps(newer_list).encode())
    print(f"n = {CONFIG.num_clients}, k = {CONFIG.neighbour_count} ({neighbours} neighbours relayed), "
          f"best of {options.runs} runs, CPU time")
    print(f"certificate: {certificate_bytes} bytes as JSON; with its device id {voucher_bytes} bytes a neighbour")
    print(f"share_keys request: {plain_bytes} bytes without certificates, {certified_bytes} with "
          f"(+{certified_bytes - plain_bytes} bytes, {certified_bytes / plain_bytes:.2f}x) per device and round")
    print(f"revocation list with {options.revoked} device keys and {options.revoked_cards} cards: {list_bytes} bytes, "
          f"one extra round trip per device and round (GET /v1/revocations; 404 when none is published)")
    print(f"verified and kept in the state file (wall time, fsync included): {keep_newer_ms:.2f} ms for a newer "
          f"list, {same_again_ms:.2f} ms for the list already held")
    print(f"share_keys on the device: {without_ms:.1f} ms without the check, {with_ms:.1f} ms with it "
          f"(+{with_ms - without_ms:.1f} ms, {(with_ms - without_ms) / neighbours:.3f} ms a certificate)")


if __name__ == "__main__":
    main()
