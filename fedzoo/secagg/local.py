"""A whole SecAgg+ round with every client in this process: for tests, benches and the simulator.

Messages go through `json`, so the byte counts are real upload sizes as JSON; `rest_bytes` counts what the
REST endpoints take (the masked vector raw, the share replies framed). `dropouts[stage]` names the clients that vanish instead of replying to that stage; a
client that refuses a request (`ProtocolViolation`) drops out too, and its reason is recorded. Each client's
long-term signing key is made here unless `signing_keys` gives it (a test's own `clients` need theirs there).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedzoo.errors import InvalidInputError
from fedzoo.secagg import signatures
from fedzoo.secagg.client import SecAggClient
from fedzoo.secagg.config import SecAggConfig
from fedzoo.secagg.errors import ProtocolViolation
from fedzoo.secagg.framing import rest_reply_bytes
from fedzoo.secagg.messages import STAGES
from fedzoo.secagg.server import SecAggResult, SecAggServer


@dataclass
class LocalRound:
    """The result of a local round and what each client uploaded (JSON bytes per stage)."""

    result: SecAggResult
    upload_bytes: dict[int, dict[str, int]] = field(default_factory=dict)  # client -> stage -> bytes
    rest_bytes: dict[int, dict[str, int]] = field(default_factory=dict)  # the same over REST (framing.rest_reply)
    download_bytes: dict[int, dict[str, int]] = field(default_factory=dict)  # client -> stage -> request JSON bytes
    client_seconds: dict[int, dict[str, float]] = field(default_factory=dict)  # client -> stage -> its CPU time
    refusals: dict[int, str] = field(default_factory=dict)  # client -> ProtocolViolation reason
    unmask_seconds: float = 0.0  # the server's work in the last stage (wall clock)
    unmask_cpu_seconds: float = 0.0  # the same in this process's CPU time (what a loaded machine does not inflate)
    consistency_cpu_seconds: float = 0.0  # the server's CPU time closing the consistency check (verify, relay)


def run_local_round(config: SecAggConfig, ring_vectors: Mapping[int, np.ndarray],
                    dropouts: Mapping[str, set[int]] | None = None,
                    clients: Mapping[int, SecAggClient] | None = None,
                    signing_keys: Mapping[int, Ed25519PrivateKey] | None = None) -> LocalRound:
    """Run the five stages for the clients that have an input (honest `SecAggClient`s unless `clients` gives
    some); raises RoundAborted if unmasking fails."""
    dropouts = dict(dropouts or {})
    unknown = set(dropouts) - set(STAGES)
    if unknown:
        raise InvalidInputError(f"unknown stages {sorted(unknown)} in dropouts; use {list(STAGES)}", field="dropouts")
    keys = {index: (signing_keys or {}).get(index) or signatures.new_signing_key() for index in ring_vectors}
    clients = {index: (clients or {}).get(index) or SecAggClient(config, index, keys[index]) for index in ring_vectors}
    uploads: dict[int, dict[str, int]] = {index: {} for index in clients}
    rest_uploads: dict[int, dict[str, int]] = {index: {} for index in clients}
    downloads: dict[int, dict[str, int]] = {index: {} for index in clients}
    seconds: dict[int, dict[str, float]] = {index: {} for index in clients}
    refusals: dict[int, str] = {}
    server = SecAggServer(config, {index: signatures.public_bytes(key) for index, key in keys.items()})

    def exchange(stage: str, requests: dict[int, dict | None]) -> list[dict]:
        carried = []
        for index, request in requests.items():
            if index in dropouts.get(stage, set()):
                continue
            client = clients[index]
            if request is not None:
                downloads[index][stage] = len(json.dumps(request).encode())
            started = time.process_time()
            try:
                reply = (client.advertise_keys() if stage == "advertise_keys" else
                         client.masked_input(request, ring_vectors[index]) if stage == "masked_input" else
                         getattr(client, stage)(request))
            except ProtocolViolation as violation:
                refusals[index] = violation.reason
                continue
            seconds[index][stage] = time.process_time() - started
            body = json.dumps(reply)
            uploads[index][stage] = len(body.encode())
            rest_uploads[index][stage] = rest_reply_bytes(reply)
            carried.append(json.loads(body))
        return carried

    requests = server.collect_keys(exchange("advertise_keys", dict.fromkeys(clients)))
    requests = server.collect_shares(exchange("share_keys", requests))
    requests = server.collect_masked_inputs(exchange("masked_input", requests))
    replies = exchange("consistency_check", requests)
    started = time.process_time()
    requests = server.collect_consistency(replies)
    consistency_cpu_seconds = time.process_time() - started
    replies = exchange("unmask", requests)
    started, started_cpu = time.perf_counter(), time.process_time()
    result = server.collect_unmask_shares(replies)
    return LocalRound(result, uploads, rest_uploads, downloads, seconds, refusals, time.perf_counter() - started,
                      time.process_time() - started_cpu, consistency_cpu_seconds)
