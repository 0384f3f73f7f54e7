"""The k-regular communication graph of SecAgg+ (Bell et al. 2020): a shuffled ring, seeded by every device.

Clients are placed on a ring and each is joined to the k/2 clients on either side (a Harary graph). A client
masks and shares only with its k neighbours, so its work is O(k) instead of O(n). The ring order is not the
server's to choose: it is fixed by the graph seed, SHA-256 of every advertised client's number and the fresh
nonce it signed in stage 1 (`advertised_bytes`). The server relays that list with the share_keys request; each
client finds its own nonce in it, recomputes the seed and its neighbours, and refuses a request naming others.
So the graph is fixed only after every device committed, and the server cannot place chosen devices next to a
victim by picking a round id or a seat order. It can still drop advertisements or pick its own devices' nonces
and so choose among random graphs (grinding): the device's bounds (`bounds.SecAggBounds`) therefore assume the
worst placement and do not rely on this randomness (docs/privacy.md, "Threat model").
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from fedzoo.secagg.config import SecAggConfig
from fedzoo.secagg.errors import ProtocolViolation
from fedzoo.secagg.signatures import NONCE_BYTES, config_digest, signed_message

ENTRY_BYTES = 4 + NONCE_BYTES  # client (u32 big-endian) | nonce


def advertised_bytes(nonces: Mapping[int, bytes]) -> bytes:
    """The advertised clients and their stage-1 nonces, sorted by client: what the seed hashes and the server relays."""
    return b"".join(client.to_bytes(4, "big") + nonces[client] for client in sorted(nonces))


def read_advertised(data: bytes, num_clients: int) -> dict[int, bytes]:
    """The client -> nonce list of `advertised_bytes`, or the message is malformed."""
    if len(data) % ENTRY_BYTES:
        raise ProtocolViolation(f"the advertised list must hold entries of {ENTRY_BYTES} bytes", reason="malformed")
    nonces: dict[int, bytes] = {}
    for start in range(0, len(data), ENTRY_BYTES):
        client = int.from_bytes(data[start : start + 4], "big")
        if client >= num_clients or (nonces and client <= max(nonces)):
            raise ProtocolViolation("the advertised list must name distinct clients in order, each below num_clients",
                                    reason="malformed")
        nonces[client] = data[start + 4 : start + ENTRY_BYTES]
    return nonces


def graph_seed(config: SecAggConfig, nonces: Mapping[int, bytes]) -> bytes:
    """SHA-256 of the round's parameters and every advertised client's nonce."""
    return hashlib.sha256(signed_message("graph_seed", config.context, config_digest(config),
                                         advertised_bytes(nonces))).digest()


def ring_order(config: SecAggConfig, seed: bytes) -> list[int]:
    """The clients in ring order (a permutation of 0 .. n - 1 fixed by the graph seed)."""
    def position(client: int) -> bytes:
        return hashlib.sha256(signed_message("graph_position", seed, client.to_bytes(4, "big"))).digest()

    return sorted(range(config.num_clients), key=position)


def neighbours(config: SecAggConfig, seed: bytes) -> dict[int, list[int]]:
    """Each client's k neighbours, sorted; the relation is symmetric."""
    order = ring_order(config, seed)
    count, half = config.num_clients, config.neighbour_count // 2
    graph = {}
    for position, client in enumerate(order):
        around = [order[(position + step) % count] for step in range(-half, half + 1) if step != 0]
        graph[client] = sorted(around)
    return graph
