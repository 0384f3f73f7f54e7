"""Give every model of a zoo its training graph, so devices can fine-tune it with the stock onnxruntime.

fp32 cards get a graph built from their own ONNX blob. INT8 cards are never trained on the device
(quantized graphs have no useful gradients): their `training_graph` is that of their fp32 parent,
the device fine-tunes the parent's fp32 parameters, the cloud re-quantizes the updated parent and
devices receive the new quantized version (the policy the compression stage writes into the INT8
card's `details["fine_tuning"]`). Cards are rewritten atomically through `Zoo.add_card`; what was
made trainable is recorded in `details["training"]`.

`trainable` is one of `fedzoo.graphs.autodiff.SELECTIONS` ("all", "head", "all_but_depthwise") or a list
of names and glob patterns (docs/training-graphs.md); "all_but_depthwise" trains about 2x faster on onnxruntime's CPU kernels (bench/train_benchmark.py).
"""

from __future__ import annotations

from pathlib import Path

import onnx

from fedzoo.cards import ModelCard, is_supernet
from fedzoo.errors import InvalidInputError
from fedzoo.graphs.autodiff import Trainable, build_training_graph, resolve_trainable
from fedzoo.zoo import Zoo

DETAILS_KEY = "training"


def _describe(trainable: Trainable, parameters: list[str], loss: str, trains_card: str) -> dict:
    selection = trainable if isinstance(trainable, str) else "explicit"
    return {"loss": loss, "trainable": selection, "parameters": parameters, "trains_card": trains_card}


def attach_training_graphs(zoo_dir: str | Path, trainable: Trainable = "all", loss: str = "cross_entropy") -> list[str]:
    """Build and store a training graph for every card that lacks an up-to-date one; returns the updated card ids."""
    zoo = Zoo(zoo_dir)
    cards = {card.id: card for card in zoo.cards() if not is_supernet(card)}  # the supernet is data, not trained
    fp32_ids = {card.id for card in cards.values() if card.precision == "fp32"}
    for card in cards.values():
        if card.precision != "fp32" and card.parent_id not in fp32_ids:
            raise InvalidInputError(
                f"card {card.id!r} is {card.precision} but its parent {card.parent_id!r} is not an fp32 card of the "
                "zoo: quantized models are fine-tuned through their fp32 parent",
                field="parent_id",
            )
    updated: list[str] = []
    fp32_graphs: dict[str, tuple[str, dict]] = {}
    for card in cards.values():
        if card.precision != "fp32":
            continue
        model = onnx.load_model_from_string(zoo.model_path(card).read_bytes())
        parameters = resolve_trainable(model, trainable)
        graph = build_training_graph(model, parameters, loss)
        digest = zoo.add_blob_bytes(graph.SerializeToString())
        description = _describe(trainable, parameters, loss, card.id)
        fp32_graphs[card.id] = (digest, description)
        if _store(zoo, card, digest, description):
            updated.append(card.id)
    for card in cards.values():
        if card.precision == "fp32":
            continue
        digest, description = fp32_graphs[card.parent_id]
        if _store(zoo, card, digest, description):
            updated.append(card.id)
    return sorted(updated)


def _store(zoo: Zoo, card: ModelCard, digest: str, description: dict) -> bool:
    """Write the card with this training graph; False when it already had exactly that."""
    if card.training_graph == digest and card.details.get(DETAILS_KEY) == description:
        return False
    details = {**card.details, DETAILS_KEY: description}
    zoo.add_card(card.model_copy(update={"training_graph": digest, "details": details}))
    return True
