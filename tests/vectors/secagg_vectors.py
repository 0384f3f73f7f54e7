"""Test vectors for SecAgg+ (fedzoo.secagg), shared by the Python and Java SDKs.

Every value is derived from fixed seeds, so `python tests/vectors/secagg_vectors.py` rewrites
`secagg_vectors.json` identically, and a test checks the committed file is what this script writes.
A second SDK that reproduces every case speaks the same protocol:

- `hkdf`, `x25519`: key derivation and agreement (purpose and round context in HKDF's info);
- `mask`: the AES-256-CTR generator's first values and the SHA-256 of its whole output;
- `share_decryption`: a share ciphertext (nonce || ChaCha20-Poly1305) that opens to a known plaintext;
- `shamir`: shares over GF(2^256 + 297) and the secret any `threshold` of them give;
- `commitments`: the share and seed commitments the server checks;
- `graph`: every client's stage-1 nonce, the advertised list the server relays (`advertised`, hex of
  `graph.advertised_bytes`), the graph seed it gives and each client's neighbours;
- `quantise`: inputs on exact levels (so rounding is deterministic) and the ring values they become;
- `unclipped_bit`: adaptive clipping under SecAgg+, a device's delta (one value shorter than the config's vector
  length) with its "not clipped" bit appended (`with_unclipped_bit`: clip_range if within, else 0) and the ring
  values the whole vector becomes, for a device within the clip norm and one that was clipped;
- `signing`: the configuration digest, and the stage 1 (advertised keys and nonce) and stage 4 (survivor set,
  with the signer's keys, nonce and the graph seed) payloads with their Ed25519 signatures under a fixed key
  (Ed25519 signatures are deterministic);
- `refusals`: consistency_check and unmask requests an honest client must refuse, with the
  `ProtocolViolation.reason` (`signed_survivors`: the set client 0 signed first, or null when the request
  is the consistency_check itself); a signature entry's `client` of "neighbour" or "stranger" stands for one
  of client 0's neighbours or a client that is not (the graph of a live run is drawn from fresh nonces);
- `bounds_refusals`: configurations outside the default `SecAggBounds` (corruption budget 5%, at least two);
- `staged_refusals`: the server's lies about relayed keys and signatures, as client 0 sees them in a round of
  its own `config` (k = n - 1, so every other client is its neighbour whatever the nonces): its neighbours'
  fixed stage-1 `neighbours` (nonce, keys, long-term key), and `cases` whose `steps` client 0 answers in order
  after advertising (`masked_input` with an all-zero ring input), refusing the last with `reason`. Client 0's
  nonce is fresh in each run, so the reader completes each step for its run: a share_keys step gets
  `advertised` (the neighbours' nonces and client 0's), and an unmask step's entry `{"client", "signed_by"}`
  gets the signature `signed_by` makes on the step's survivor set in that run (its graph seed). The cases:
  keys relayed under a signature over other keys, one signing key relayed for two neighbours, and one
  altered signature (another neighbour's) among t or more good ones on the survivor set;
- `framing`: a share_keys and an unmask reply and their binary framing (`fedzoo.secagg.framing`), as the
  REST endpoints take them; the consistency_check reply is JSON `{"signature": <base64 of 64 bytes>}`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from fedzoo.aggregation.private import with_unclipped_bit
from fedzoo.secagg import crypto, signatures
from fedzoo.secagg.client import (
    MASK_KEY,
    SELF_MASK,
    share_associated_data,
    share_commitment,
    share_plaintext,
    self_mask_commitment,
)
from fedzoo.secagg.config import SecAggConfig
from fedzoo.secagg.encoding import quantise
from fedzoo.secagg.framing import encode_share_keys, encode_unmask
from fedzoo.secagg.messages import to_base64
from fedzoo.secagg.graph import advertised_bytes, graph_seed, neighbours
from fedzoo.secagg.shamir import PRIME

VECTORS_PATH = Path(__file__).with_name("secagg_vectors.json")
CONFIG = SecAggConfig("vector-round-1", num_clients=8, neighbour_count=4, threshold=4, vector_length=6,
                      clip_range=0.5, minimum_survivors=4)


def seed(label: str) -> bytes:
    return hashlib.sha256(b"fedzoo secagg test vector " + label.encode()).digest()


def _hex(data: bytes) -> str:
    return data.hex()


def _shamir_case() -> dict[str, Any]:
    secret = seed("shamir secret")
    coefficients = [int.from_bytes(secret, "big")] + [int.from_bytes(seed(f"coefficient {i}") * 2, "big") % PRIME
                                                      for i in range(2)]
    shares = [[x, format(sum(c * x**power for power, c in enumerate(coefficients)) % PRIME, "x")] for x in (2, 5, 7, 8)]
    return {"prime": format(PRIME, "x"), "threshold": 3, "shares": shares, "secret": _hex(secret)}


def _framing_case() -> dict[str, Any]:
    share_keys = {"self_mask_seed_commitment": to_base64(seed("seed commitment")), "shares": [
        {"holder": holder, "ciphertext": to_base64((seed(f"ciphertext {holder}") * 4)[:102]),
         "self_mask_commitment": to_base64(seed(f"self mask commitment {holder}")[:16]),
         "mask_key_commitment": to_base64(seed(f"mask key commitment {holder}")[:16])} for holder in (2, 300)]}
    unmask = {"shares": [{"owner": 2, "kind": SELF_MASK, "value": to_base64(b"\x01" + seed("share 2"))},
                         {"owner": 300, "kind": MASK_KEY, "value": to_base64(b"\x00" + seed("share 300"))}],
              "undecryptable": [7]}
    return {"share_keys": {"reply": share_keys, "framed": _hex(encode_share_keys(share_keys))},
            "unmask": {"reply": unmask, "framed": _hex(encode_unmask(unmask))}}


NONCES = {client: seed(f"stage-1 nonce {client}") for client in range(CONFIG.num_clients) if client != 6}
GRAPH_SEED = graph_seed(CONFIG, NONCES)


def _graph_case() -> dict[str, Any]:
    return {"nonces": {str(client): _hex(nonce) for client, nonce in NONCES.items()},
            "advertised": _hex(advertised_bytes(NONCES)), "seed": _hex(GRAPH_SEED),
            "neighbours": {str(client): peers for client, peers in neighbours(CONFIG, GRAPH_SEED).items()}}


def _signing_case() -> dict[str, Any]:
    key = signatures.load_signing_key(seed("device signing key"))
    cipher_public = crypto.public_bytes(crypto.load_private_key(seed("cipher key")))
    mask_public = crypto.public_bytes(crypto.load_private_key(seed("mask key")))
    advertise = signatures.advertise_payload(CONFIG, 1, cipher_public, mask_public, NONCES[1])
    survivors = [0, 1, 2, 4, 5, 7]
    consistency = signatures.consistency_payload(CONFIG, 1, cipher_public, mask_public, NONCES[1], GRAPH_SEED,
                                                 survivors)
    return {
        "private_key": _hex(seed("device signing key")), "public_key": _hex(signatures.public_bytes(key)),
        "config_digest": _hex(signatures.config_digest(CONFIG)),
        "advertise": {"client": 1, "cipher_public_key": _hex(cipher_public), "mask_public_key": _hex(mask_public),
                      "nonce": _hex(NONCES[1]), "payload": _hex(advertise), "signature": _hex(key.sign(advertise))},
        "consistency": {"client": 1, "graph_seed": _hex(GRAPH_SEED), "survivors": survivors,
                        "payload": _hex(consistency), "signature": _hex(key.sign(consistency))},
    }


def _refusal_cases() -> list[dict[str, Any]]:
    everyone = list(range(CONFIG.num_clients))
    neighbour, stranger = "neighbour", "stranger"  # resolved against client 0's graph in the run (see above)
    zero_signature = to_base64(bytes(64))

    def unmask(survivors: list[int], signed: list[dict[str, Any]]) -> dict[str, Any]:
        return {"stage": "unmask", "survivors": survivors, "signatures": signed}

    consistency = [
        ({"stage": "consistency_check", "survivors": [1, 2, 3, 4]}, "not_a_survivor"),
        ({"stage": "consistency_check", "survivors": [0, 1]}, "too_few_survivors"),
        ({"stage": "consistency_check", "survivors": [0, 1, 1, 2]}, "malformed"),
        ({"stage": "consistency_check", "survivors": [0, 1, 2, CONFIG.num_clients]}, "malformed"),
        ({"stage": "unmask", "survivors": everyone, "signatures": []}, "wrong_stage"),
    ]
    after_signing = [
        (unmask(everyone[:-1], []), "inconsistent_survivors"),
        (unmask(everyone, []), "too_few_signatures"),
        (unmask(everyone, [{"client": neighbour, "signature": zero_signature}]), "bad_signature"),
        (unmask(everyone, [{"client": stranger, "signature": zero_signature}]), "malformed"),
    ]
    return ([{"client": 0, "signed_survivors": None, "request": request, "reason": reason}
             for request, reason in consistency]
            + [{"client": 0, "signed_survivors": everyone, "request": request, "reason": reason}
               for request, reason in after_signing])


# client 0's round in `staged_refusals`: k = n - 1, and t + 1 <= k so that t good signatures leave room for a bad one
STAGED_CONFIG = SecAggConfig("vector-round-staged", num_clients=7, neighbour_count=6, threshold=5, vector_length=6,
                             clip_range=0.5, minimum_survivors=5)


def _staged_neighbour(peer: int) -> dict[str, Any]:
    """One of client 0's neighbours as it advertised: fixed nonce, round keys and long-term key (private, so the
    reader can sign the survivor set in its own run)."""
    return {"client": peer, "nonce": _hex(seed(f"staged nonce {peer}")),
            "cipher_public_key": _hex(crypto.public_bytes(crypto.load_private_key(seed(f"neighbour {peer} cipher key")))),
            "mask_public_key": _hex(crypto.public_bytes(crypto.load_private_key(seed(f"neighbour {peer} mask key")))),
            "signing_private_key": _hex(seed(f"neighbour {peer} signing key"))}


def _relayed_keys(neighbour: dict[str, Any], signer: dict[str, Any] | None = None) -> dict[str, Any]:
    """The neighbour's share_keys entry, its stage-1 payload signed by the long-term key of `signer` (the neighbour
    itself unless the server relays another's)."""
    signing_key = signatures.load_signing_key(bytes.fromhex((signer or neighbour)["signing_private_key"]))
    cipher_public, mask_public = (bytes.fromhex(neighbour[name]) for name in ("cipher_public_key", "mask_public_key"))
    payload = signatures.advertise_payload(STAGED_CONFIG, neighbour["client"], cipher_public, mask_public,
                                           bytes.fromhex(neighbour["nonce"]))
    return {"client": neighbour["client"], "cipher_public_key": to_base64(cipher_public),
            "mask_public_key": to_base64(mask_public),
            "signing_public_key": to_base64(signatures.public_bytes(signing_key)),
            "signature": to_base64(signing_key.sign(payload))}


def _staged_refusals() -> dict[str, Any]:
    peers = [_staged_neighbour(peer) for peer in range(1, STAGED_CONFIG.num_clients)]
    honest = [_relayed_keys(peer) for peer in peers]
    forged_cipher = crypto.public_bytes(crypto.load_private_key(seed("server's own cipher key")))
    forged = [dict(honest[0], cipher_public_key=to_base64(forged_cipher)), *honest[1:]]
    one_key_for_two = [honest[0], _relayed_keys(peers[1], signer=peers[0]), *honest[2:]]
    survivors = list(range(STAGED_CONFIG.num_clients))
    signed = [{"client": peer["client"], "signed_by": peer["client"]} for peer in peers]
    assert len(signed) - 1 >= STAGED_CONFIG.threshold
    one_altered = [dict(signed[0], signed_by=signed[1]["client"]), *signed[1:]]
    through_consistency = [
        {"stage": "share_keys", "public_keys": honest},
        {"stage": "masked_input", "encrypted_shares": [  # shares no key opens: listed as undecryptable
            {"owner": peer["client"], "ciphertext": to_base64(seed(f"ciphertext {peer['client']}") * 2)}
            for peer in peers]},
        {"stage": "consistency_check", "survivors": survivors}]
    return {"config": STAGED_CONFIG.to_dict(), "neighbours": peers, "cases": [
        {"name": "relayed keys under a signature over other keys", "client": 0, "reason": "bad_signature",
         "steps": [{"stage": "share_keys", "public_keys": forged}]},
        {"name": "one signing key relayed for two neighbours", "client": 0, "reason": "bad_signature",
         "steps": [{"stage": "share_keys", "public_keys": one_key_for_two}]},
        {"name": "one altered signature among t good ones", "client": 0, "reason": "bad_signature",
         "steps": [*through_consistency, {"stage": "unmask", "survivors": survivors, "signatures": one_altered}]},
    ]}


def _bounds_cases() -> list[dict[str, Any]]:
    """Valid configurations an honest client with the default SecAggBounds refuses (`config_out_of_bounds`)."""
    base = CONFIG.to_dict()
    return [dict(base, num_clients=12, neighbour_count=2, threshold=2, minimum_survivors=4),  # k below 4
            dict(base, num_clients=70_000, neighbour_count=4, threshold=4, minimum_survivors=4, levels=1),  # n > 65,536
            dict(base, num_clients=500, neighbour_count=202, threshold=120, minimum_survivors=120),  # k above 200
            dict(base, num_clients=30, neighbour_count=8, threshold=5, minimum_survivors=5),  # t = k/2 + 1 < 6
            dict(base, num_clients=100, neighbour_count=60, threshold=31, minimum_survivors=31),  # t < 33 (c = 5)
            dict(base, num_clients=200, neighbour_count=8, threshold=8, minimum_survivors=8),  # k <= c = 10
            dict(base, num_clients=60, neighbour_count=4, threshold=4, minimum_survivors=4)]  # survivors < c + 2 = 5


def secagg_vectors() -> dict[str, Any]:
    context = CONFIG.context
    alice = crypto.load_private_key(seed("alice"))
    bob = crypto.load_private_key(seed("bob"))
    mask_key = crypto.derive_key(seed("mask secret"), "pairwise-mask", context)
    mask_16 = crypto.mask(mask_key, 1000, 16)
    mask_32 = crypto.mask(mask_key, 1000, 32)
    share_key = crypto.agree(alice, crypto.public_bytes(bob), "share-encryption", context)
    plaintext = share_plaintext(1, 2, 12345, 67890)
    nonce = seed("nonce")[:12]
    ciphertext = nonce + ChaCha20Poly1305(share_key).encrypt(nonce, plaintext, share_associated_data(CONFIG, 1, 2))
    # values exactly on quantisation levels (k / 254 with clip_range 0.5), so rounding is deterministic
    on_levels = np.array([-127, -64, -1, 0, 1, 63], dtype=np.float64) / 254
    assert np.array_equal(on_levels * 254.0, np.round(on_levels * 254.0))
    return {
        "config": CONFIG.to_dict(),
        "context": context.decode(),
        "modulus_bits": CONFIG.modulus_bits,
        "hkdf": {"secret": _hex(seed("mask secret")), "purpose": "pairwise-mask", "key": _hex(mask_key)},
        "x25519": {"alice_private": _hex(seed("alice")), "alice_public": _hex(crypto.public_bytes(alice)),
                   "bob_private": _hex(seed("bob")), "bob_public": _hex(crypto.public_bytes(bob)),
                   "purpose": "share-encryption", "key": _hex(share_key)},
        "mask": {"key": _hex(mask_key), "length": 1000,
                 "first_16bit": mask_16[:8].tolist(), "sha256_16bit": hashlib.sha256(mask_16.tobytes()).hexdigest(),
                 "first_32bit": mask_32[:8].tolist(), "sha256_32bit": hashlib.sha256(mask_32.tobytes()).hexdigest()},
        "share_decryption": {"key": _hex(share_key), "owner": 1, "holder": 2,
                             "associated_data": _hex(share_associated_data(CONFIG, 1, 2)),
                             "ciphertext": _hex(ciphertext), "plaintext": _hex(plaintext)},
        "shamir": _shamir_case(),
        "commitments": {
            "self_mask_share": {"owner": 1, "holder": 2, "value": "3039",
                                "commitment": share_commitment(CONFIG, SELF_MASK, 1, 2, 12345)},
            "mask_key_share": {"owner": 1, "holder": 2, "value": "10932",
                               "commitment": share_commitment(CONFIG, MASK_KEY, 1, 2, 67890)},
            "self_mask_seed": {"owner": 1, "seed": _hex(seed("self mask seed")),
                               "commitment": self_mask_commitment(CONFIG, 1, seed("self mask seed"))},
        },
        "framing": _framing_case(),
        "graph": _graph_case(),
        "quantise": {"vector": on_levels.tolist(), "weight": 1.0,
                     "ring": quantise(on_levels, CONFIG, 1.0, np.random.default_rng(0)).tolist()},
        "unclipped_bit": [{"vector": on_levels[:-1].tolist(), "within": within, "weight": 1.0,
                           "ring": quantise(with_unclipped_bit(on_levels[:-1], within, CONFIG.clip_range), CONFIG, 1.0,
                                            np.random.default_rng(0)).tolist()} for within in (True, False)],
        "signing": _signing_case(),
        "refusals": _refusal_cases(),
        "staged_refusals": _staged_refusals(),
        "bounds_refusals": _bounds_cases(),
    }


def vectors_text() -> str:
    return json.dumps(secagg_vectors(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    VECTORS_PATH.write_text(vectors_text())
    print(f"wrote {VECTORS_PATH}")
