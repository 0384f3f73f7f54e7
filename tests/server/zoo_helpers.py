"""The tiny zoo the zoo-wide round tests share (built once per test process: the `zoo` fixture in conftest.py) and
what they do with it: publish it, pick its supernet and its models."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from fedzoo.admin.operator_client import OperatorClient
from fedzoo.cards import Latency, ModelCard, is_supernet
from fedzoo.compress.zoo_extraction import requantized_blob
from fedzoo.datasets import load_dataset, split_dataset
from fedzoo.edge.local_training import normalise
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN
from fedzoo.zoo import Zoo

TINY_ZOO_GROUP = "tiny-zoo"  # the xdist group of the modules that use the session's tiny zoo (conftest `zoo`)
TIERS = {"tier-small": 2, "tier-large": 2}  # device class -> devices


def npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def build_tiny_zoo(out: Path) -> Zoo:
    """A tiny zoo built from digits, its supernet card included; every card's latency is given for the two
    tiers (proportional to MACs), so the small tier's budget admits only the smallest model."""
    from fedzoo.cloud.pipeline import BuildConfig, build_zoo

    build_zoo(BuildConfig(dataset="digits", out=out, preset="tiny", latency_source="macs", compress=False,
                          executor="in-process", zoo_min_size=2, zoo_max_size=3))
    zoo = Zoo(out)
    for card in zoo.cards():
        latency = {tier: Latency(median_ms=card.macs / 1e4, source="measured") for tier in TIERS}
        zoo.add_card(card.model_copy(update={"latency_ms": {**card.latency_ms, **latency}}))
    # the smallest model's INT8 variant, as the compression stage makes it (its recipe in details.quantization)
    smallest = zoo_members(zoo)[0]
    recipe = {"format": "qdq", "calibration": "minmax", "per_channel": True, "reduce_range": True,
              "activation_type": "uint8", "weight_scales": "per-channel"}
    calibration = normalise(split_dataset(load_dataset("digits"), seed=0).validation.x, smallest.input.normalisation)
    int8 = requantized_blob(zoo.model_path(smallest).read_bytes(), recipe, calibration)
    zoo.add_card(smallest.model_copy(update={
        "id": f"{smallest.id}-int8", "parent_id": smallest.id, "precision": "int8", "sha256": zoo.add_blob_bytes(int8),
        "size_bytes": len(int8), "artifacts": {}, "details": {"quantization": recipe},
        # measured slower than its parent on both tiers (as INT8 often is): lookup serves the fp32 models here
        "latency_ms": {tier: Latency(median_ms=2 * smallest.macs / 1e4, source="measured") for tier in TIERS}}))
    return zoo


def publish_zoo(admin: OperatorClient, zoo: Zoo, split) -> tuple[str, str]:
    """Every card of the zoo published with its blobs, then the evaluation (test split) and calibration (validation
    images) sets uploaded; returns their sha256s."""
    for card in zoo.cards():
        digests = [card.sha256, *card.artifacts.values(), *([card.training_graph] if card.training_graph else [])]
        admin.publish_model(card, {digest: zoo.blob_path(digest).read_bytes() for digest in digests},
                            DEFAULT_ADMIN_TOKEN)
    return (admin.publish_blob(npz(x=split.test.x, y=split.test.y), DEFAULT_ADMIN_TOKEN),
            admin.publish_blob(npz(x=split.validation.x), DEFAULT_ADMIN_TOKEN))


def supernet_card(zoo: Zoo) -> ModelCard:
    return next(card for card in zoo.cards() if is_supernet(card))


def zoo_members(zoo: Zoo) -> list[ModelCard]:
    """The zoo's models (fp32, unpruned), smallest first."""
    return sorted((card for card in zoo.cards()
                   if not is_supernet(card) and card.precision == "fp32" and card.pruning is None),
                  key=lambda card: card.macs)
