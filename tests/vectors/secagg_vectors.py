"""Test vectors for SecAgg+ (fedzoo.secagg), shared by the Python and Java SDKs.

Every value is derived from fixed seeds, so `python tests/vectors/secagg_vectors.py` rewrites
`secagg_vectors.json` identically, and a test checks the committed file is what this script writes.
A second SDK that reproduces every case speaks the same protocol:

- `hkdf`, `x25519`: key derivation and agreement (purpose and round context in HKDF's info);
- `mask`: the AES-256-CTR generator's first values and the SHA-256 of its whole output;
- `share_decryption`: a share ciphertext (nonce || ChaCha20-Poly1305) that opens to a known plaintext;
- `shamir`: shares over GF(2^256 + 297) and the secret any `threshold` of them give;
- `commitments`: the share and seed commitments the server checks;
- `graph`: each client's neighbours for a round configuration;
- `quantise`: inputs on exact levels (so rounding is deterministic) and the ring values they become;
- `signing`: the configuration digest, and the stage 1 (advertised keys) and stage 4 (survivor set) payloads
  with their Ed25519 signatures under a fixed key (Ed25519 signatures are deterministic);
- `refusals`: consistency_check and unmask requests an honest client must refuse, with the
  `ProtocolViolation.reason` (`signed_survivors`: the set client 0 signed first, or null when the request
  is the consistency_check itself), and configurations outside the default `SecAggBounds`;
- `staged_refusals`: the server's lies about relayed keys and signatures, as a client 0 sees them: each case's
  `steps` are requests it answers in order (`masked_input` with an all-zero ring input), the last of which it
  must refuse with `reason`, every earlier one accepted. Its neighbours' keys are fixed (`seed("neighbour ..")`):
  keys relayed under a signature over other keys, one signing key relayed for two neighbours, and one altered
  signature among t or more good ones on the survivor set;
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
from fedzoo.secagg.graph import neighbours
from fedzoo.secagg.shamir import PRIME

VECTORS_PATH = Path(__file__).with_name("secagg_vectors.json")
CONFIG = SecAggConfig("vector-round-1", num_clients=8, neighbour_count=4, threshold=3, vector_length=6,
                      clip_range=0.5, minimum_survivors=3)


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


def _signing_case() -> dict[str, Any]:
    key = signatures.load_signing_key(seed("device signing key"))
    cipher_public = crypto.public_bytes(crypto.load_private_key(seed("cipher key")))
    mask_public = crypto.public_bytes(crypto.load_private_key(seed("mask key")))
    advertise = signatures.advertise_payload(CONFIG, 1, cipher_public, mask_public)
    survivors = [0, 1, 2, 4, 5, 7]
    consistency = signatures.consistency_payload(CONFIG, 1, survivors)
    return {
        "private_key": _hex(seed("device signing key")), "public_key": _hex(signatures.public_bytes(key)),
        "config_digest": _hex(signatures.config_digest(CONFIG)),
        "advertise": {"client": 1, "cipher_public_key": _hex(cipher_public), "mask_public_key": _hex(mask_public),
                      "payload": _hex(advertise), "signature": _hex(key.sign(advertise))},
        "consistency": {"client": 1, "survivors": survivors, "payload": _hex(consistency),
                        "signature": _hex(key.sign(consistency))},
    }


def _refusal_cases() -> list[dict[str, Any]]:
    everyone = list(range(CONFIG.num_clients))
    neighbour, stranger = neighbours(CONFIG)[0][0], next(c for c in everyone if c not in neighbours(CONFIG)[0] and c)
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


def _signing_key_of(peer: int) -> Any:
    return signatures.load_signing_key(seed(f"neighbour {peer} signing key"))


def _neighbour_keys(peer: int, signer: int | None = None) -> dict[str, Any]:
    """Fixed round keys for one of client 0's neighbours, signed by the fixed long-term key of `signer` (the
    neighbour itself unless the server relays another's)."""
    signing_key = _signing_key_of(peer if signer is None else signer)
    cipher_public = crypto.public_bytes(crypto.load_private_key(seed(f"neighbour {peer} cipher key")))
    mask_public = crypto.public_bytes(crypto.load_private_key(seed(f"neighbour {peer} mask key")))
    return {"client": peer, "cipher_public_key": to_base64(cipher_public), "mask_public_key": to_base64(mask_public),
            "signing_public_key": to_base64(signatures.public_bytes(signing_key)),
            "signature": to_base64(signing_key.sign(signatures.advertise_payload(CONFIG, peer, cipher_public,
                                                                                  mask_public)))}


def _staged_refusal_cases() -> list[dict[str, Any]]:
    peers = neighbours(CONFIG)[0]
    honest = [_neighbour_keys(peer) for peer in peers]
    forged_cipher = crypto.public_bytes(crypto.load_private_key(seed("server's own cipher key")))
    forged = [dict(honest[0], cipher_public_key=to_base64(forged_cipher)), *honest[1:]]
    one_key_for_two = [honest[0], _neighbour_keys(peers[1], signer=peers[0]), *honest[2:]]
    survivors = list(range(CONFIG.num_clients))
    signed = [{"client": peer, "signature": to_base64(_signing_key_of(peer).sign(
        signatures.consistency_payload(CONFIG, peer, survivors)))} for peer in peers]
    assert len(signed) - 1 >= CONFIG.threshold
    one_altered = [dict(signed[0], signature=signed[1]["signature"]), *signed[1:]]
    through_consistency = [
        {"stage": "share_keys", "public_keys": honest},
        {"stage": "masked_input", "encrypted_shares": [  # shares no key opens: listed as undecryptable
            {"owner": peer, "ciphertext": to_base64(seed(f"ciphertext {peer}") * 2)} for peer in peers]},
        {"stage": "consistency_check", "survivors": survivors}]
    return [
        {"name": "relayed keys under a signature over other keys", "client": 0, "reason": "bad_signature",
         "steps": [{"stage": "share_keys", "public_keys": forged}]},
        {"name": "one signing key relayed for two neighbours", "client": 0, "reason": "bad_signature",
         "steps": [{"stage": "share_keys", "public_keys": one_key_for_two}]},
        {"name": "one altered signature among t good ones", "client": 0, "reason": "bad_signature",
         "steps": [*through_consistency, {"stage": "unmask", "survivors": survivors, "signatures": one_altered}]},
    ]


def _bounds_cases() -> list[dict[str, Any]]:
    """Valid configurations an honest client with the default SecAggBounds refuses (`config_out_of_bounds`)."""
    base = CONFIG.to_dict()
    return [dict(base, num_clients=12, neighbour_count=2, threshold=2, minimum_survivors=3),  # k below 4
            dict(base, num_clients=70_000, neighbour_count=4, threshold=3, minimum_survivors=3, levels=1),  # n > 65,536
            dict(base, num_clients=500, neighbour_count=202, threshold=102, minimum_survivors=102)]  # k above 200


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
        "graph": {str(client): peers for client, peers in neighbours(CONFIG).items()},
        "quantise": {"vector": on_levels.tolist(), "weight": 1.0,
                     "ring": quantise(on_levels, CONFIG, 1.0, np.random.default_rng(0)).tolist()},
        "signing": _signing_case(),
        "refusals": _refusal_cases(),
        "staged_refusals": _staged_refusal_cases(),
        "bounds_refusals": _bounds_cases(),
    }


def vectors_text() -> str:
    return json.dumps(secagg_vectors(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    VECTORS_PATH.write_text(vectors_text())
    print(f"wrote {VECTORS_PATH}")
