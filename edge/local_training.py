"""Training on local data, the step every participant takes in a round: a device on its private examples, and
the server on its root set (`fedzoo.server.fl.root_trust`), with the same trainer, optimizer and settings, so
the server's update is comparable with the devices'. Core code: the client SDK and the server share it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedzoo.cards import ModelCard, Normalisation
from fedzoo.edge.onnx_initializers import read_float_initializers, replace_initializers
from fedzoo.edge.optimizers import SGD, Adam, Optimizer
from fedzoo.edge.runtime import create_session
from fedzoo.edge.trainer import Trainer
from fedzoo.errors import InvalidInputError
from fedzoo.update_codec import statistics_delta

Parameters = dict[str, np.ndarray]

OPTIMIZERS: dict[str, Callable[[dict[str, Any]], Optimizer]] = {
    "sgd": lambda training: SGD(training["learning_rate"], momentum=training.get("momentum", 0.0)),
    "adam": lambda training: Adam(training["learning_rate"]),
}


@dataclass(frozen=True)
class LocalData:
    """A device's private examples: images in [0, 1] (N, C, H, W) and integer labels."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)


def normalise(x: np.ndarray, normalisation: Normalisation | None) -> np.ndarray:
    """A card's `(x - mean) / std` per channel, which the model was trained and is served with."""
    if normalisation is None:
        return x.astype(np.float32)
    mean = np.asarray(normalisation.mean, np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(normalisation.std, np.float32).reshape(1, -1, 1, 1)
    return ((x - mean) / std).astype(np.float32)


def train_locally(
    training_graph: bytes, model: bytes, card: ModelCard, training: dict[str, Any], data: LocalData, seed: int = 0
) -> tuple[Parameters, dict[str, float]]:
    """Fine-tune the model's trainable parameters (and running statistics) on local data; returns the delta
    and local metrics."""
    if training["optimizer"] not in OPTIMIZERS:
        raise InvalidInputError(f"unknown optimizer {training['optimizer']!r}; this client knows {sorted(OPTIMIZERS)}",
                                field="optimizer")
    initial = read_float_initializers(model)
    trainer = Trainer(training_graph, initial, OPTIMIZERS[training["optimizer"]](training))
    global_parameters = {name: trainer.parameters[name].copy() for name in trainer.parameter_names}
    proximal_mu = float(training.get("proximal_mu", 0.0))
    features, targets = normalise(data.x, card.input.normalisation), data.y
    rng = np.random.default_rng(seed)
    losses: list[float] = []
    for _epoch in range(training["local_epochs"]):
        order = rng.permutation(len(targets))
        for start in range(0, len(order), training["batch_size"]):
            batch = order[start : start + training["batch_size"]]
            loss, gradients, statistics = trainer.run_batch(features[batch], targets[batch])
            if proximal_mu:
                for name, gradient in gradients.items():
                    gradient += proximal_mu * (trainer.parameters[name] - global_parameters[name])
            trainer.apply(gradients, statistics)
            losses.append(loss * len(batch))
    delta = {name: trainer.parameters[name] - global_parameters[name] for name in trainer.parameter_names}
    delta.update(statistics_delta(trainer.statistics, initial))
    trained_model = replace_initializers(model, {**trainer.parameters, **trainer.statistics})
    session = create_session(trained_model)
    logits = session.run(None, {session.get_inputs()[0].name: features})[0]
    accuracy = float((logits.argmax(axis=1) == targets).mean())
    epoch_examples = len(targets) * training["local_epochs"]
    return delta, {"loss": float(sum(losses) / epoch_examples), "accuracy": accuracy}
