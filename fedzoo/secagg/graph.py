"""The k-regular communication graph of SecAgg+ (Bell et al. 2020): a shuffled ring.

Clients are placed on a ring in an order shuffled by the round id, and each is joined to the k/2
clients on either side (a Harary graph). A client masks and shares only with its k neighbours, so its
work is O(k) instead of O(n). The shuffle is public and only has to be fixed before anyone learns
who drops out: clients are sorted by SHA-256 of the round's context and their number, which every
party (in any language) recomputes the same way.
"""

from __future__ import annotations

import hashlib

from fedzoo.secagg.config import SecAggConfig


def ring_order(config: SecAggConfig) -> list[int]:
    """The clients in ring order (a permutation of 0 .. n - 1 fixed by the round's parameters)."""
    def position(client: int) -> bytes:
        return hashlib.sha256(b"fedzoo-secagg/v1/graph/" + config.context + client.to_bytes(4, "big")).digest()

    return sorted(range(config.num_clients), key=position)


def neighbours(config: SecAggConfig) -> dict[int, list[int]]:
    """Each client's k neighbours, sorted; the relation is symmetric."""
    order = ring_order(config)
    count, half = config.num_clients, config.neighbour_count // 2
    graph = {}
    for position, client in enumerate(order):
        around = [order[(position + step) % count] for step in range(-half, half + 1) if step != 0]
        graph[client] = sorted(around)
    return graph
