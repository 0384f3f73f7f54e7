"""What device certificates cost a SecAgg+ device: bytes, round trips and milliseconds, at n = 100, k = 60.

The server relays each neighbour's device id and the operator's certificate with its keys (stage 2's request);
before its first reply the device reads the signed revocation list (one GET) and checks every neighbour's
certificate (one Ed25519 verification and a little JSON each). Measured with the real classes in this process:
the victim's share_keys request built by `SecAggServer` from 100 clients' stage-1 replies, with and without the
certificates, and `SecAggClient.share_keys` timed on it with and without the check (best of `--runs`, CPU time).

    .venv/bin/python bench/device_certificates.py [--runs 20] [--revoked 100]
"""

from __future__ import annotations

import argparse
import json
import time

from fedzoo.device_certificates import CertificatePolicy, issue_certificate, key_fingerprint
from fedzoo.device_revocations import DeviceRevocations, sign_revocations, verify_revocations
from fedzoo.secagg import SecAggClient, SecAggConfig, SecAggServer, signatures
from fedzoo.signing import CardSigningKey, TrustedKeys

CONFIG = SecAggConfig("bench-certificates", 100, 60, 33, 10, 1.0)  # t at the devices' floor
VICTIM = 0


def best_cpu_ms(runs: int, prepare) -> float:
    """The least CPU time of `runs` calls of the function `prepare()` returns (prepared outside the timing)."""
    times = []
    for _ in range(runs):
        work = prepare()
        started = time.process_time()
        work()
        times.append((time.process_time() - started) * 1000)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--revoked", type=int, default=100, help="keys on the revocation list")
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
    revocations = sign_revocations(1, revoked, operator)
    verify_list_ms = best_cpu_ms(options.runs, lambda: lambda: verify_revocations(
        revocations, TrustedKeys([operator.public_key_raw]), DeviceRevocations(0, frozenset())))
    without_ms = best_cpu_ms(options.runs, lambda: share_keys(None)[1])
    with_ms = best_cpu_ms(options.runs, lambda: share_keys(policy)[1])
    plain_bytes, certified_bytes = (len(json.dumps(request).encode()) for request in (plain, certified))
    neighbours = len(certified["public_keys"])
    certificate_bytes = len(json.dumps(vouchers[1]["certificate"]).encode())
    voucher_bytes = len(json.dumps(vouchers[1]).encode())
    list_bytes = len(json.dumps({"revocations": revocations}).encode())
    print(f"n = {CONFIG.num_clients}, k = {CONFIG.neighbour_count} ({neighbours} neighbours relayed), "
          f"best of {options.runs} runs, CPU time")
    print(f"certificate: {certificate_bytes} bytes as JSON; with its device id {voucher_bytes} bytes a neighbour")
    print(f"share_keys request: {plain_bytes} bytes without certificates, {certified_bytes} with "
          f"(+{certified_bytes - plain_bytes} bytes, {certified_bytes / plain_bytes:.2f}x) per device and round")
    print(f"revocation list with {options.revoked} keys: {list_bytes} bytes, one extra GET per device and round "
          f"(GET /v1/device-revocations), verified in {verify_list_ms:.2f} ms")
    print(f"share_keys on the device: {without_ms:.1f} ms without the check, {with_ms:.1f} ms with it "
          f"(+{with_ms - without_ms:.1f} ms, {(with_ms - without_ms) / neighbours:.3f} ms a certificate)")


if __name__ == "__main__":
    main()
