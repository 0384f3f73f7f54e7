"""A client's side of one SecAgg+ round (Bonawitz et al. 2017 §6, with Bell et al. 2020's sparse graph).

Five stages, each a reply to the server's message for it:

1. `advertise_keys()`: two fresh X25519 public keys (cipher, mask) and a fresh nonce, signed with the
   device's long-term Ed25519 key (`signatures.advertise_payload`), once the device has claimed the round id
   (`signed_rounds.SignedRounds`: it never signs under one twice).
2. `share_keys(request)`: given every advertised client's nonce, it checks its own is there and derives the
   graph (`graph.graph_seed`); given its neighbours' keys, each signature checked against the neighbour's
   long-term key, Shamir-share a fresh self-mask seed b and the mask private key among them, each share
   pair encrypted to its holder, with commitments to each share.
3. `masked_input(request, vector)`: given the ciphertexts its neighbours sent it, the input masked by
   PRG(b) and by one pairwise mask per neighbour that shared (+ towards larger ids, - towards smaller).
4. `consistency_check(request)`: sign the survivor set the server shows it (it must include this client
   and hold at least `minimum_survivors`), together with its own stage-1 keys, nonce and the graph seed.
5. `unmask(request)`: only if at least t neighbours signed that very set: for each neighbour that shared,
   the share of b (it survived) or of its mask key (it did not), never both.

Why stage 4: a server that tells different devices different stories about who dropped out can collect
b of a victim from its neighbours and the mask keys of those neighbours from theirs, and so read the
victim's input. With t neighbours' signatures required on one identical set, two devices that share more than
2(k - t) neighbours never reveal under different sets (docs/privacy.md, "Threat model").
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedzoo.device_certificates import CertificatePolicy, DeviceCertificateError
from fedzoo.secagg import crypto, signatures
from fedzoo.secagg.bounds import SecAggBounds
from fedzoo.secagg.config import SecAggConfig
from fedzoo.secagg.errors import ProtocolViolation
from fedzoo.secagg.graph import graph_seed, neighbours, read_advertised
from fedzoo.secagg.messages import (
    client_ids,
    expect_stage,
    from_base64,
    listed_entries,
    to_base64,
    vector_to_base64,
)
from fedzoo.secagg.shamir import SHARE_BYTES, share_value_bytes, split_secret
from fedzoo.secagg.signed_rounds import SignedRounds

SELF_MASK, MASK_KEY = "self_mask", "mask_key"
# A share commitment only has to stop a holder from returning another value that matches it (a second
# preimage: 2^128 work at 16 bytes); a dealer's consistency is checked against its full-size public key and
# seed commitment. Half a SHA-256 saves 32 bytes a neighbour, 2 KB of a client's upload at k = 60.
SHARE_COMMITMENT_BYTES = 16


def share_plaintext(owner: int, holder: int, self_mask_share: int, mask_key_share: int) -> bytes:
    """What one encrypted share carries: owner, holder (4 bytes each, big-endian), then the two share values."""
    return (owner.to_bytes(4, "big") + holder.to_bytes(4, "big")
            + share_value_bytes(self_mask_share) + share_value_bytes(mask_key_share))


def share_associated_data(config: SecAggConfig, owner: int, holder: int) -> bytes:
    return config.context + f";share;{owner}->{holder}".encode()


def share_commitment(config: SecAggConfig, kind: str, owner: int, holder: int, value: int) -> str:
    return crypto.commitment(config.context, kind.encode(), owner.to_bytes(4, "big"), holder.to_bytes(4, "big"),
                             share_value_bytes(value), size=SHARE_COMMITMENT_BYTES)


def self_mask_commitment(config: SecAggConfig, owner: int, seed: bytes) -> str:
    return crypto.commitment(config.context, b"self_mask_seed", owner.to_bytes(4, "big"), seed)


def self_mask(config: SecAggConfig, seed: bytes) -> np.ndarray:
    return crypto.mask(crypto.derive_key(seed, "self-mask", config.context), config.vector_length + 1,
                       config.modulus_bits)


def pairwise_mask(config: SecAggConfig, private_key: crypto.X25519PrivateKey, peer_public_key: bytes) -> np.ndarray:
    key = crypto.agree(private_key, peer_public_key, "pairwise-mask", config.context)
    return crypto.mask(key, config.vector_length + 1, config.modulus_bits)


class SecAggClient:
    """One client in one round: call the five stages in order; it keeps its secrets only until `unmask`.

    `signing_key` is the device's long-term Ed25519 key (its public half registered with the server);
    `bounds` are the device's own limits on the configuration; `trusted_signing_keys`, when the operator
    pins the enrolled devices' public keys on the device, are the only neighbour keys it accepts;
    `signed_rounds` is the device's memory of the round ids it took part in (the SDK's loop keeps it in the
    state file; without one, this object's own memory only); `certificates`, when given, makes it accept a
    neighbour's key only with the operator's certificate for the device the server names, one seat per device
    (`fedzoo.device_certificates`)."""

    def __init__(self, config: SecAggConfig, client: int, signing_key: Ed25519PrivateKey,
                 bounds: SecAggBounds = SecAggBounds(), trusted_signing_keys: frozenset[bytes] | None = None,
                 signed_rounds: SignedRounds | None = None, certificates: CertificatePolicy | None = None) -> None:
        if not 0 <= client < config.num_clients:
            raise ProtocolViolation(f"client number {client} is outside [0, {config.num_clients})", reason="malformed")
        bounds.check(config)
        self.config, self.client = config, client
        self.neighbours: set[int] = set()  # fixed by the graph seed, in share_keys
        self._signing_key, self._trusted_signing_keys = signing_key, trusted_signing_keys
        self._signed_rounds = signed_rounds if signed_rounds is not None else SignedRounds()
        self._certificates, self._neighbour_devices = certificates, dict[str, int]()
        self._stage = "advertise_keys"
        self._cipher_private = self._mask_private = self._seed = None
        self._cipher_public = self._mask_public = self._nonce = self._graph_seed = b""
        self._nonces: dict[int, bytes] = {}  # every advertised client's stage-1 nonce
        self._mask_public_keys: dict[int, bytes] = {}
        self._cipher_public_keys: dict[int, bytes] = {}
        self._signing_public_keys: dict[int, bytes] = {}
        self._received: dict[int, bytes] = {}
        self._survivors: frozenset[int] | None = None

    def _enter(self, stage: str) -> None:
        if self._stage != stage:
            raise ProtocolViolation(f"the server asked for {stage!r} while this client expects {self._stage!r}",
                                    reason="wrong_stage")

    def advertise_keys(self) -> dict[str, Any]:
        """Stage 1: fresh public keys and nonce for this round, signed with the device's long-term key, once the
        round id is claimed (a round id this device took part in before is refused: `round_replayed`)."""
        self._enter("advertise_keys")
        self._signed_rounds.claim(self.config.round_id)
        self._cipher_private, self._cipher_public = crypto.new_key_pair()
        self._mask_private, self._mask_public = crypto.new_key_pair()
        self._nonce = os.urandom(signatures.NONCE_BYTES)
        signature = self._signing_key.sign(signatures.advertise_payload(
            self.config, self.client, self._cipher_public, self._mask_public, self._nonce))
        self._stage = "share_keys"
        return {"stage": "advertise_keys", "client": self.client, "cipher_public_key": to_base64(self._cipher_public),
                "mask_public_key": to_base64(self._mask_public), "nonce": to_base64(self._nonce),
                "signature": to_base64(signature)}

    def share_keys(self, request: dict[str, Any]) -> dict[str, Any]:
        """Stage 2: shares of the self-mask seed and the mask key, one encrypted pair per neighbour with keys,
        once the graph is the one every advertised nonce (this client's included) fixes and every neighbour's
        keys carry its long-term signature."""
        self._enter("share_keys")
        request = expect_stage(request, "share_keys")
        self._join_graph(request)
        peers, entries = listed_entries(request, "public_keys", "client", self.config.num_clients)
        if set(peers) != self.neighbours & set(self._nonces):
            raise ProtocolViolation(f"the server sent keys of clients {sorted(peers)}, but this client's advertised "
                                    f"neighbours are {sorted(self.neighbours & set(self._nonces))}", reason="malformed")
        for peer, entry in zip(peers, entries):
            self._cipher_public_keys[peer] = _key(entry.get("cipher_public_key"), "cipher_public_key")
            self._mask_public_keys[peer] = _key(entry.get("mask_public_key"), "mask_public_key")
            self._signing_public_keys[peer] = self._neighbour_signing_key(peer, entry)
        if len(set(self._signing_public_keys.values())) != len(self._signing_public_keys):
            raise ProtocolViolation("the server relayed one signing key for two neighbours", reason="bad_signature")
        if len(peers) < self.config.threshold:
            raise ProtocolViolation(f"only {len(peers)} neighbours have keys; sharing needs {self.config.threshold}",
                                    reason="too_few_neighbours")
        self._seed = os.urandom(32)
        holders = sorted(peers)
        seed_shares = split_secret(self._seed, self.config.threshold, [peer + 1 for peer in holders])
        key_shares = split_secret(crypto.private_bytes(self._mask_private), self.config.threshold, [peer + 1 for peer in holders])
        shares = []
        for holder, (_, seed_value), (_, key_value) in zip(holders, seed_shares, key_shares):
            key = crypto.agree(self._cipher_private, self._cipher_public_keys[holder], "share-encryption",
                               self.config.context)
            ciphertext = crypto.encrypt(key, share_plaintext(self.client, holder, seed_value, key_value),
                                        share_associated_data(self.config, self.client, holder))
            shares.append({
                "holder": holder, "ciphertext": to_base64(ciphertext),
                "self_mask_commitment": share_commitment(self.config, SELF_MASK, self.client, holder, seed_value),
                "mask_key_commitment": share_commitment(self.config, MASK_KEY, self.client, holder, key_value),
            })
        self._stage = "masked_input"
        return {"stage": "share_keys", "client": self.client, "shares": shares,
                "self_mask_seed_commitment": self_mask_commitment(self.config, self.client, self._seed)}

    def masked_input(self, request: dict[str, Any], ring_vector: np.ndarray) -> dict[str, Any]:
        """Stage 3: the quantised input (see `encoding.quantise`) plus the self-mask and pairwise masks."""
        self._enter("masked_input")
        request = expect_stage(request, "masked_input")
        senders, entries = listed_entries(request, "encrypted_shares", "owner", self.config.num_clients)
        if not set(senders) <= set(self._mask_public_keys):
            raise ProtocolViolation("the server forwarded shares from clients whose keys this client never got",
                                    reason="malformed")
        if len(senders) < self.config.threshold:
            raise ProtocolViolation(f"only {len(senders)} neighbours shared their keys; masking needs "
                                    f"{self.config.threshold}", reason="too_few_neighbours")
        ring_vector = np.asarray(ring_vector)
        if ring_vector.shape != (self.config.vector_length + 1,):
            raise ProtocolViolation(f"the input must have {self.config.vector_length + 1} ring values (see "
                                    f"encoding.quantise), got shape {ring_vector.shape}", reason="malformed")
        self._received = {owner: from_base64(entry.get("ciphertext"), "ciphertext")
                          for owner, entry in zip(senders, entries)}
        masked = ring_vector.astype(crypto.MASK_DTYPES[self.config.modulus_bits]) + self_mask(self.config, self._seed)
        for peer in senders:
            mask = pairwise_mask(self.config, self._mask_private, self._mask_public_keys[peer])
            masked = masked + mask if self.client < peer else masked - mask  # wraps modulo 2^bits
        self._stage = "consistency_check"
        return {"stage": "masked_input", "client": self.client,
                "masked_vector": vector_to_base64(masked, self.config.modulus_bits)}

    def consistency_check(self, request: dict[str, Any]) -> dict[str, Any]:
        """Stage 4: sign the survivor set the server shows this client (it must be in it, and it must be large
        enough); the set is kept, and unmasking later happens only for this very set."""
        self._enter("consistency_check")
        request = expect_stage(request, "consistency_check")
        survivors = frozenset(client_ids(request.get("survivors"), self.config.num_clients, "survivors"))
        self._check_survivors(survivors)
        self._survivors = survivors
        signature = self._signing_key.sign(signatures.consistency_payload(
            self.config, self.client, self._cipher_public, self._mask_public, self._nonce, self._graph_seed, survivors))
        self._stage = "unmask"
        return {"stage": "consistency_check", "client": self.client, "signature": to_base64(signature)}

    def unmask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Stage 5: given at least t neighbours' signatures on the survivor set this client signed, for each
        neighbour that shared its self-mask share if it survived, else its mask-key share."""
        self._enter("unmask")
        request = expect_stage(request, "unmask")
        survivors = frozenset(client_ids(request.get("survivors"), self.config.num_clients, "survivors"))
        if survivors != self._survivors:
            raise ProtocolViolation("the server asks this client to unmask for another survivor set than the one it "
                                    "signed", reason="inconsistent_survivors")
        self._check_survivors(survivors)
        signers = self._consistency_signers(request, survivors)
        if len(signers) < self.config.threshold:
            raise ProtocolViolation(f"only {len(signers)} neighbours signed this survivor set; this client reveals "
                                    f"shares under {self.config.threshold}", reason="too_few_signatures")
        shares, undecryptable = [], []
        for owner, ciphertext in sorted(self._received.items()):
            try:
                key = crypto.agree(self._cipher_private, self._cipher_public_keys[owner], "share-encryption",
                                   self.config.context)
                plaintext = crypto.decrypt(key, ciphertext, share_associated_data(self.config, owner, self.client))
            except crypto.DecryptionError:
                undecryptable.append(owner)
                continue
            if len(plaintext) != 8 + 2 * SHARE_BYTES or plaintext[:8] != share_plaintext(owner, self.client, 0, 0)[:8]:
                undecryptable.append(owner)
                continue
            kind, value = ((SELF_MASK, plaintext[8 : 8 + SHARE_BYTES]) if owner in survivors
                           else (MASK_KEY, plaintext[8 + SHARE_BYTES :]))
            shares.append({"owner": owner, "kind": kind, "value": to_base64(value)})
        self._stage = "done"
        self._cipher_private = self._mask_private = self._seed = None  # this round's secrets are no longer needed
        self._received = {}
        return {"stage": "unmask", "client": self.client, "shares": shares, "undecryptable": undecryptable}

    def _check_survivors(self, survivors: frozenset[int]) -> None:
        if self.client not in survivors:
            raise ProtocolViolation("the server lists this client as not survived", reason="not_a_survivor")
        if len(survivors) < self.config.minimum_survivors:
            raise ProtocolViolation(f"only {len(survivors)} survivors; this client unmasks sums of at least "
                                    f"{self.config.minimum_survivors}", reason="too_few_survivors")

    def _join_graph(self, request: dict[str, Any]) -> None:
        """Read every advertised client's nonce; this client's must be there as it drew it; its neighbours follow."""
        self._nonces = read_advertised(from_base64(request.get("advertised"), "advertised"), self.config.num_clients)
        if self._nonces.get(self.client) != self._nonce:
            raise ProtocolViolation("the advertised list the graph is drawn from does not hold this client's nonce",
                                    reason="malformed")
        self._graph_seed = graph_seed(self.config, self._nonces)
        self.neighbours = set(neighbours(self.config, self._graph_seed)[self.client])

    def _neighbour_signing_key(self, peer: int, entry: dict[str, Any]) -> bytes:
        """The neighbour's long-term key, once its signature on the keys the server relayed checks out."""
        signing_key = from_base64(entry.get("signing_public_key"), "signing_public_key")
        signature = from_base64(entry.get("signature"), "signature")
        payload = signatures.advertise_payload(self.config, peer, self._cipher_public_keys[peer],
                                               self._mask_public_keys[peer], self._nonces[peer])
        if self._trusted_signing_keys is not None and signing_key not in self._trusted_signing_keys:
            raise ProtocolViolation(f"client {peer}'s signing key is not one of the keys pinned on this device",
                                    reason="bad_signature")
        if not signatures.verify(signing_key, signature, payload):
            raise ProtocolViolation(f"client {peer}'s keys do not carry its signature: the server may have replaced "
                                    "them", reason="bad_signature")
        if self._certificates is not None:
            self._check_certificate(peer, entry, signing_key)
        return signing_key

    def _check_certificate(self, peer: int, entry: dict[str, Any], signing_key: bytes) -> None:
        """Only a key the operator certified for the device the server names, and one seat per device."""
        try:
            device = self._certificates.verify(entry.get("certificate"), entry.get("device_id"), signing_key)
        except DeviceCertificateError as error:
            raise ProtocolViolation(f"client {peer}'s signing key is not vouched for by the operator ({error.reason}): "
                                    f"{error}", reason="revoked_key" if error.reason == "revoked" else
                                    "uncertified_key") from None
        if self._neighbour_devices.setdefault(device.device_id, peer) != peer:
            raise ProtocolViolation(f"the server seated device {device.device_id!r} twice, as clients "
                                    f"{self._neighbour_devices[device.device_id]} and {peer}", reason="uncertified_key")

    def _consistency_signers(self, request: dict[str, Any], survivors: frozenset[int]) -> set[int]:
        """The neighbours whose signature on `survivors` the request carries; any signature that does not verify
        is refused, since only the server could have altered it."""
        signers, entries = listed_entries(request, "signatures", "client", self.config.num_clients)
        if not set(signers) <= self.neighbours:
            raise ProtocolViolation(f"the server sent signatures of clients {sorted(set(signers) - self.neighbours)} "
                                    "that are not this client's neighbours", reason="malformed")
        for signer, entry in zip(signers, entries):
            signing_key = self._signing_public_keys.get(signer)
            signature = from_base64(entry.get("signature"), "signature")
            payload = (signatures.consistency_payload(
                self.config, signer, self._cipher_public_keys[signer], self._mask_public_keys[signer],
                self._nonces[signer], self._graph_seed, survivors) if signing_key is not None else b"")
            if signing_key is None or not signatures.verify(signing_key, signature, payload):
                raise ProtocolViolation(f"client {signer}'s signature on the survivor set does not verify",
                                        reason="bad_signature")
        return set(signers)


def _key(value: Any, what: str) -> bytes:
    key = from_base64(value, what)
    if len(key) != 32 or not crypto.is_usable_public_key(key):
        raise ProtocolViolation(f"{what} must be a usable 32-byte X25519 public key", reason="malformed")
    return key

