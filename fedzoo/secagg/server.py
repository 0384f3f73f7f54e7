"""The server's side of one SecAgg+ round: route messages between clients, then unmask the sum.

Each `collect_*` method closes a stage: it takes the replies that arrived in time (a client whose reply
is missing or malformed has dropped out at that stage) and returns the next stage's request for each
client still in the round. `collect_unmask_shares` returns the exact sum of the survivors' inputs.

Every device's advertised keys and its signature on the survivor set are checked against its registered
long-term key (`signing_keys`) before they are relayed: an honest server never forwards what honest
devices would refuse. The graph is drawn when stage 1 closes, from every accepted advertisement's nonce
(`graph.graph_seed`); the share_keys request relays that list so each device checks its own neighbours. Shares the server receives are checked against the commitments their dealer made
when sharing, so a client that returns a wrong share is caught and its share ignored; a reconstructed secret is checked
against the dealer's public key or seed commitment, so a dealer that shared inconsistent values makes
the round abort (`RoundAborted`) instead of producing a wrong sum.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedzoo.secagg import crypto, signatures
from fedzoo.secagg.client import (
    MASK_KEY, SELF_MASK, SHARE_COMMITMENT_BYTES, pairwise_mask, self_mask, self_mask_commitment, share_commitment,
)
from fedzoo.secagg.config import SecAggConfig
from fedzoo.secagg.errors import ProtocolViolation, RoundAborted
from fedzoo.secagg.graph import advertised_bytes, graph_seed, neighbours
from fedzoo.secagg.messages import from_base64, to_base64, vector_from_base64
from fedzoo.secagg.shamir import PRIME, SHARE_BYTES, ShareError, combine_shares


@dataclass
class SecAggResult:
    """The unmasked sum (ring elements, `encoding.dequantise_sum` reads it) and who took part."""

    ring_sum: np.ndarray
    survivors: list[int]
    dropped: list[int]  # shared their keys, then sent no masked input
    misbehaving: dict[int, str] = field(default_factory=dict)  # client -> what it did wrong


@dataclass
class _Dealt:
    """What one client published when it shared: per-holder ciphertexts and commitments."""

    ciphertexts: dict[int, str]
    commitments: dict[tuple[str, int], str]  # (kind, holder) -> commitment
    seed_commitment: str


class SecAggServer:
    """One round's server state; call the `collect_*` methods in order with the replies that arrived.

    `signing_keys`: each client's registered Ed25519 public key (a client without one cannot take part);
    `vouchers`: each client's device id and the operator's certificate of its key, relayed with the key so that
    neighbours can check the operator vouched for it (`fedzoo.device_certificates`)."""

    def __init__(self, config: SecAggConfig, signing_keys: Mapping[int, bytes],
                 vouchers: Mapping[int, dict[str, Any]] | None = None) -> None:
        self.config = config
        self.signing_keys = dict(signing_keys)
        self.vouchers = dict(vouchers or {})
        self.graph: dict[int, list[int]] = {}  # drawn when stage 1 closes
        self.graph_seed = b""
        self.keys: dict[int, tuple[bytes, bytes]] = {}  # client -> (cipher public key, mask public key)
        self.nonces: dict[int, bytes] = {}  # client -> its stage-1 nonce
        self.key_signatures: dict[int, bytes] = {}
        self.dealt: dict[int, _Dealt] = {}
        self.forwarded: dict[int, list[int]] = {}  # holder -> owners whose shares it was sent
        self.masked: dict[int, np.ndarray] = {}
        self.survivor_signatures: dict[int, bytes] = {}
        self.revealers: set[int] = set()  # clients asked to unmask: t of their neighbours signed the survivor set
        self.misbehaving: dict[int, str] = {}

    def _replies(self, replies: list[dict[str, Any]], stage: str, allowed: set[int]) -> dict[int, dict[str, Any]]:
        by_client = {}
        for reply in replies:
            client = reply.get("client") if isinstance(reply, dict) else None
            if type(client) is not int or client not in allowed or reply.get("stage") != stage:
                continue  # not from a client in this stage: ignored, as if it never came
            if client in by_client:
                self.misbehaving[client] = f"sent two {stage} replies"
                by_client[client] = None
            else:
                by_client[client] = reply
        return {client: reply for client, reply in by_client.items() if reply is not None}

    def collect_keys(self, replies: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """Close stage 1: draw the graph from the advertised nonces; the share_keys request for each client that
        advertised keys (the advertised list, and its neighbours' keys)."""
        for client, reply in self._replies(replies, "advertise_keys", set(range(self.config.num_clients))).items():
            try:
                keys = tuple(from_base64(reply.get(name), name) for name in ("cipher_public_key", "mask_public_key"))
                nonce = from_base64(reply.get("nonce"), "nonce")
            except ProtocolViolation:
                keys, nonce = (), b""
            if (len(keys) != 2 or len(nonce) != signatures.NONCE_BYTES
                    or not all(len(key) == 32 and crypto.is_usable_public_key(key) for key in keys)):
                self.misbehaving[client] = "advertised malformed keys"
                continue
            signature = _signature(reply.get("signature"))
            if not self._signed_by(client, signature, self.advertise_payload(client, *keys, nonce)):
                self.misbehaving[client] = "advertised keys without its valid signature"
                continue
            self.keys[client], self.nonces[client], self.key_signatures[client] = keys, nonce, signature
        self.graph_seed = graph_seed(self.config, self.nonces)
        self.graph = neighbours(self.config, self.graph_seed)
        advertised = to_base64(advertised_bytes(self.nonces))
        return {client: {"stage": "share_keys", "advertised": advertised, "public_keys": [
                    {"client": peer, "cipher_public_key": to_base64(self.keys[peer][0]),
                     "mask_public_key": to_base64(self.keys[peer][1]),
                     "signing_public_key": to_base64(self.signing_keys[peer]),
                     "signature": to_base64(self.key_signatures[peer]), **self.vouchers.get(peer, {})}
                    for peer in self.graph[client] if peer in self.keys]}
                for client in self.keys}

    def collect_shares(self, replies: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """Close stage 2; the masked_input request (ciphertexts addressed to it) for each client that shared."""
        for client, reply in self._replies(replies, "share_keys", set(self.keys)).items():
            dealt = _parse_dealt(reply, expected_holders={peer for peer in self.graph[client] if peer in self.keys})
            if dealt is None:
                self.misbehaving[client] = "sent malformed shares"
            else:
                self.dealt[client] = dealt
        requests = {}
        for holder in self.dealt:
            owners = [owner for owner in self.graph[holder] if owner in self.dealt]
            self.forwarded[holder] = owners
            requests[holder] = {"stage": "masked_input", "encrypted_shares": [
                {"owner": owner, "ciphertext": self.dealt[owner].ciphertexts[holder]} for owner in owners]}
        return requests

    def collect_masked_inputs(self, replies: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """Close stage 3; the consistency_check request, the same survivor set, for each survivor."""
        for client, reply in self._replies(replies, "masked_input", set(self.dealt)).items():
            try:
                self.masked[client] = vector_from_base64(reply.get("masked_vector"), self.config.vector_length + 1,
                                                         self.config.modulus_bits, "masked_vector")
            except ProtocolViolation:
                self.misbehaving[client] = "sent a malformed masked vector"
        survivors = sorted(self.masked)
        if len(survivors) < self.config.minimum_survivors:
            raise RoundAborted(f"only {len(survivors)} masked inputs arrived; the round needs "
                               f"{self.config.minimum_survivors}", clients=survivors)
        return {client: {"stage": "consistency_check", "survivors": survivors} for client in survivors}

    def collect_consistency(self, replies: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """Close stage 4; the unmask request (the survivor set and the neighbours' signatures on it) for each
        survivor that signed it and has t neighbours who did (an honest client refuses with fewer)."""
        survivors = sorted(self.masked)
        payload = {client: self.consistency_payload(client, survivors) for client in survivors}
        for client, reply in self._replies(replies, "consistency_check", set(survivors)).items():
            signature = _signature(reply.get("signature"))
            if self._signed_by(client, signature, payload[client]):
                self.survivor_signatures[client] = signature
            else:
                self.misbehaving[client] = "signed the survivor set with an invalid signature"
        requests = {}
        for client in sorted(self.survivor_signatures):
            signed = [peer for peer in self.graph[client] if peer in self.survivor_signatures]
            if len(signed) >= self.config.threshold:
                requests[client] = {"stage": "unmask", "survivors": survivors, "signatures": [
                    {"client": peer, "signature": to_base64(self.survivor_signatures[peer])} for peer in signed]}
        self.revealers = set(requests)
        return requests

    def collect_unmask_shares(self, replies: list[dict[str, Any]]) -> SecAggResult:
        """Close stage 5: reconstruct the survivors' self-mask seeds and the dropped clients' mask keys, remove
        their masks and return the exact sum; raises RoundAborted if a needed secret cannot be recovered."""
        survivors, dropped = sorted(self.masked), sorted(set(self.dealt) - set(self.masked))
        shares = self._verified_shares(self._replies(replies, "unmask", self.revealers), set(survivors), set(dropped))
        total = np.zeros(self.config.vector_length + 1, dtype=crypto.MASK_DTYPES[self.config.modulus_bits])
        for client in survivors:
            total += self.masked[client]
        failed = []
        for owner in survivors:
            seed = self._recover(owner, SELF_MASK, shares)
            if seed is None or self_mask_commitment(self.config, owner, seed) != self.dealt[owner].seed_commitment:
                failed.append(owner)
                continue
            total -= self_mask(self.config, seed)
        for owner in dropped:
            raw_key = self._recover(owner, MASK_KEY, shares)
            private_key = crypto.load_private_key(raw_key) if raw_key is not None else None
            if private_key is None or crypto.public_bytes(private_key) != self.keys[owner][1]:
                failed.append(owner)
                continue
            for holder in survivors:
                if owner in self.forwarded[holder]:  # the holder added its pairwise mask with this dropped owner
                    mask = pairwise_mask(self.config, private_key, self.keys[holder][1])
                    total = total - mask if holder < owner else total + mask
        if failed:
            raise RoundAborted(f"the secrets of clients {sorted(failed)} cannot be recovered (too few valid shares, "
                               "or inconsistent shares from their dealer): no sum is output", clients=sorted(failed))
        return SecAggResult(total, survivors, dropped, dict(self.misbehaving))

    def _verified_shares(self, replies: dict[int, dict[str, Any]], survivors: set[int], dropped: set[int]
                         ) -> dict[tuple[int, str], list[tuple[int, int]]]:
        """(owner, kind) -> [(x, value)] of shares that match their dealer's commitments."""
        shares: dict[tuple[int, str], list[tuple[int, int]]] = {}
        for holder, reply in replies.items():
            entries = reply.get("shares")
            if not isinstance(entries, list):
                self.misbehaving[holder] = "sent malformed unmask shares"
                continue
            for entry in entries:
                owner, kind = (entry.get("owner"), entry.get("kind")) if isinstance(entry, dict) else (None, None)
                expected_kind = SELF_MASK if owner in survivors else MASK_KEY if owner in dropped else None
                if expected_kind is None or kind != expected_kind or owner not in self.forwarded[holder]:
                    continue
                value = _share_value(entry.get("value"))
                commitment = self.dealt[owner].commitments.get((kind, holder))
                if value is None or share_commitment(self.config, kind, owner, holder, value) != commitment:
                    self.misbehaving[holder] = f"returned a {kind} share of client {owner} that does not match its commitment"
                    continue
                shares.setdefault((owner, kind), []).append((holder + 1, value))
        return shares

    def advertise_payload(self, client: int, cipher_public_key: bytes, mask_public_key: bytes, nonce: bytes) -> bytes:
        """What a client's stage-1 signature must cover."""
        return signatures.advertise_payload(self.config, client, cipher_public_key, mask_public_key, nonce)

    def consistency_payload(self, client: int, survivors: list[int]) -> bytes:
        """What a client's stage-4 signature on `survivors` must cover in this run (after stage 1 closed)."""
        return signatures.consistency_payload(self.config, client, *self.keys[client], self.nonces[client],
                                              self.graph_seed, survivors)

    def _signed_by(self, client: int, signature: bytes | None, payload: bytes) -> bool:
        key = self.signing_keys.get(client)
        return key is not None and signature is not None and signatures.verify(key, signature, payload)

    def _recover(self, owner: int, kind: str, shares: dict[tuple[int, str], list[tuple[int, int]]]) -> bytes | None:
        try:
            return combine_shares(shares.get((owner, kind), []), self.config.threshold)
        except ShareError:
            return None


def _parse_dealt(reply: dict[str, Any], expected_holders: set[int]) -> _Dealt | None:
    entries, seed_commitment = reply.get("shares"), reply.get("self_mask_seed_commitment")
    if not isinstance(entries, list) or not _is_digest(seed_commitment):
        return None
    ciphertexts, commitments = {}, {}
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("holder") not in expected_holders or entry["holder"] in ciphertexts:
            return None
        holder = entry["holder"]
        if not isinstance(entry.get("ciphertext"), str) or not all(
                _is_digest(entry.get(f"{kind}_commitment"), SHARE_COMMITMENT_BYTES) for kind in (SELF_MASK, MASK_KEY)):
            return None
        ciphertexts[holder] = entry["ciphertext"]
        commitments[(SELF_MASK, holder)] = entry[f"{SELF_MASK}_commitment"]
        commitments[(MASK_KEY, holder)] = entry[f"{MASK_KEY}_commitment"]
    if set(ciphertexts) != expected_holders:
        return None
    return _Dealt(ciphertexts, commitments, seed_commitment)


def _signature(text: Any) -> bytes | None:
    try:
        return from_base64(text, "signature")
    except ProtocolViolation:
        return None


def _is_digest(value: Any, size: int = 32) -> bool:
    try:
        return isinstance(value, str) and len(from_base64(value, "commitment")) == size
    except ProtocolViolation:
        return False


def _share_value(text: Any) -> int | None:
    try:
        data = from_base64(text, "share value")
    except ProtocolViolation:
        return None
    value = int.from_bytes(data, "big") if len(data) == SHARE_BYTES else PRIME
    return value if value < PRIME else None
