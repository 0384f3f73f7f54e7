"""What a signed card costs a device per download: ed25519 verification of the card, the second sha256 of
the blob (the SDK re-hashes the cached file right before onnxruntime may load it), and the whole download
with and without pinned keys, side by side in one run.

The real server (`LoopbackServer`: the app on a werkzeug thread, SQLite) serves operator-signed cards of
real ONNX models (an MLP whose size is set by its hidden width, from a digits-sized to a several-MB zoo
model). Each download starts from an empty cache, so every byte crosses loopback; rounds alternate the
unsigned and the signed client so both see the same machine load.

    .venv/bin/python bench/card_verification.py [--sizes-kb 100 1000 5000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from fedzoo.admin.operator_client import OperatorClient
from fedzoo.cards import ModelCard
from fedzoo.clients.client import FedzooClient
from fedzoo.clients.download import sha256_of_file
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN, LoopbackServer
from fedzoo.signing import CardSigningKey, TrustedKeys, sign_card, verify_card

INPUTS = 784


def mlp_onnx(size_kb: int, seed: int) -> bytes:
    """A real ONNX classifier 784 -> hidden -> 10 of about `size_kb` KB of float32 weights."""
    from onnx import TensorProto, helper, numpy_helper

    hidden = max(1, size_kb * 1024 // 4 // (INPUTS + 10))
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)
               for name, shape in (("w1", (INPUTS, hidden)), ("b1", (hidden,)), ("w2", (hidden, 10)), ("b2", (10,)))]
    nodes = [helper.make_node("Flatten", ["input"], ["flat"]), helper.make_node("Gemm", ["flat", "w1", "b1"], ["h"]),
             helper.make_node("Relu", ["h"], ["a"]), helper.make_node("Gemm", ["a", "w2", "b2"], ["logits"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 28, 28])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def card_for(model: bytes, size_kb: int) -> ModelCard:
    return ModelCard.from_dict({
        "id": f"bench-mlp-{size_kb}kb", "family": f"bench-mlp-{size_kb}kb", "task": "mnist",
        "input": {"name": "input", "shape": ["batch", 1, 28, 28]}, "labels": [str(i) for i in range(10)],
        "metrics": {"accuracy": 0.9, "num_examples": 1000}, "macs": len(model) // 4, "params": len(model) // 4,
        "size_bytes": len(model), "sha256": hashlib.sha256(model).hexdigest(),
        "latency_ms": {"cloud-x86-1t": {"median_ms": 1.0, "source": "measured"}}})


def timed_download(url: str, card: ModelCard, trusted: TrustedKeys | None) -> float:
    """Seconds for one download of the card's model into an empty cache (through verification if pinned)."""
    with tempfile.TemporaryDirectory() as cache:
        state_file = Path(cache) / "state" / "client.json"  # a fresh device: nothing accepted yet
        with FedzooClient(url, cache_dir=Path(cache) / "blobs", trusted_keys=trusted, state_file=state_file) as device:
            started = time.perf_counter()
            device.download_model(card)
            return time.perf_counter() - started


def per_call_us(function, repeats: int) -> float:
    """Median microseconds of one call, over `repeats` batches of calls lasting at least ~20 ms each."""
    calls = 1
    while True:
        started = time.perf_counter()
        for _ in range(calls):
            function()
        if time.perf_counter() - started >= 0.02:
            break
        calls *= 2
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            function()
        samples.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-kb", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    operator = CardSigningKey.generate()
    pinned = TrustedKeys([operator.public_key_raw])
    with tempfile.TemporaryDirectory() as root:
        keys_file = Path(root) / "operator-keys.json"
        keys_file.write_text(json.dumps(pinned.to_json()))
        with LoopbackServer(Path(root) / "server", trusted_keys=keys_file) as server:
            pinned = TrustedKeys.from_json(httpx.get(f"{server.url}/v1/keys").json())  # as a device pins them
            print(f"{'model':>10} {'download ms':>12} {'verify µs':>10} {'sha256 µs':>10} {'signed dl ms':>13} "
                  f"{'(verify+sha)/dl':>16} {'signed/plain':>13}")
            for size_kb in args.sizes_kb:
                model = mlp_onnx(size_kb, seed=size_kb)
                card = sign_card(card_for(model, size_kb), operator)
                with OperatorClient(server.url, cache_dir=Path(root) / "admin") as admin:
                    admin.publish_model(card, {card.sha256: model}, DEFAULT_ADMIN_TOKEN)
                blob = Path(root) / "blob.onnx"
                blob.write_bytes(model)
                plain, signed = [], []
                timed_download(server.url, card, None)  # warm the server's connection and file cache
                for _ in range(args.repeats):  # alternating, so both see the same load
                    plain.append(timed_download(server.url, card, None))
                    signed.append(timed_download(server.url, card, pinned))
                verify_us = per_call_us(lambda: verify_card(card, pinned), args.repeats)
                sha_us = per_call_us(lambda: sha256_of_file(blob), args.repeats)
                plain_ms, signed_ms = statistics.median(plain) * 1e3, statistics.median(signed) * 1e3
                print(f"{len(model) / 1024:>8.0f}KB {plain_ms:>12.2f} {verify_us:>10.1f} {sha_us:>10.1f} "
                      f"{signed_ms:>13.2f} {(verify_us + sha_us) / 1e3 / plain_ms:>16.3f} {signed_ms / plain_ms:>13.3f}")
    print("medians; download = GET of the blob over loopback into an empty cache (the SDK hashes it once); "
          "signed = the same with pinned keys (card verified first, cached file re-hashed before use)")


if __name__ == "__main__":
    main()
