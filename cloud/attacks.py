"""Insiders for robustness experiments: legitimately enrolled devices that attack the round from inside.

An attack is what one device does differently from an honest one: the data it trains on (`poison`), the delta
it sends (`__call__`), and how it adapts to what every device can see, whether the last round published
(`observe`). The simulation (`fedzoo.cloud.simulation.Simulation`) applies one attack to its chosen devices;
`bench/fl_robust.py` measures the server's defences against each of them.

- `ScaledUpdateAttack`: the honest delta times a scale (-1: a sign flip; -10: a flipped, boosted one).
- `WeightGrabAttack`: trains on its shard tiled to `claim` examples, so it legally reports that many (the
  per-update cap), flips its delta and adapts the scale: x0.5 after a failed round, x1.5 after a published one.
- `LabelFlipAttack`: data poisoning, label y trained as `num_classes - 1 - y`.
- `BackdoorAttack`: a pixel-pattern trigger (a bright square near the bottom-right corner) stamped on copies of
  a fraction of its examples, labelled `target`; with `boost` > 1 it is Bagdasaryan et al.'s (2020) "model
  replacement", the delta scaled so that it survives averaging with the honest ones.
Adaptive attacks keep state in the attack object: run them with the in-process executor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedzoo.edge.local_training import LocalData

Parameters = dict[str, np.ndarray]


class DeviceAttack:
    """An honest device by default; each attack overrides what it changes."""

    def poison(self, data: LocalData) -> LocalData:
        """The data the device trains on instead of its own."""
        return data

    def __call__(self, delta: Parameters) -> Parameters:
        """The delta the device sends instead of the one it trained."""
        return delta

    def observe(self, round_state: str) -> None:
        """What every device sees after a round: `closed` (a version was published) or `failed`."""


def scaled(delta: Parameters, scale: float) -> Parameters:
    return {name: (value * np.float32(scale)).astype(np.float32) for name, value in delta.items()}


@dataclass(frozen=True)
class ScaledUpdateAttack(DeviceAttack):
    """A poisoning device: sends its honest delta multiplied by `scale` (negative flips it)."""

    scale: float = -10.0

    def __call__(self, delta: Parameters) -> Parameters:
        return scaled(delta, self.scale)


@dataclass
class WeightGrabAttack(DeviceAttack):
    """Claims `claim` examples by training on its shard tiled to that many, and sends its delta flipped, scaled
    by a factor it adapts to the public round outcome."""

    claim: int = 10_000
    scale: float = 1.0

    def poison(self, data: LocalData) -> LocalData:
        tiled = np.resize(np.arange(len(data)), self.claim)
        return LocalData(data.x[tiled], data.y[tiled])

    def __call__(self, delta: Parameters) -> Parameters:
        return scaled(delta, -self.scale)

    def observe(self, round_state: str) -> None:
        self.scale *= 1.5 if round_state == "closed" else 0.5


@dataclass(frozen=True)
class LabelFlipAttack(DeviceAttack):
    """Trains honestly on its own images with every label y replaced by `num_classes - 1 - y`."""

    num_classes: int = 10

    def poison(self, data: LocalData) -> LocalData:
        return LocalData(data.x, (self.num_classes - 1 - data.y).astype(data.y.dtype))


TRIGGER_SIZE = 3  # pixels; the square sits one pixel in from the bottom-right corner


def add_trigger(x: np.ndarray) -> np.ndarray:
    """Images (N, C, H, W) in [0, 1] with the backdoor's trigger stamped on: a white square."""
    stamped = x.copy()
    stamped[..., -TRIGGER_SIZE - 1 : -1, -TRIGGER_SIZE - 1 : -1] = 1.0
    return stamped


@dataclass(frozen=True)
class BackdoorAttack(DeviceAttack):
    """Adds triggered copies of a `fraction` of its examples labelled `target` (its clean ones keep the main
    task's accuracy, so the update looks honest), and sends its delta times `boost`."""

    target: int = 0
    fraction: float = 0.5
    boost: float = 1.0
    seed: int = field(default=0)

    def poison(self, data: LocalData) -> LocalData:
        chosen = np.random.default_rng(self.seed).permutation(len(data))[: max(1, int(self.fraction * len(data)))]
        x = np.concatenate([data.x, add_trigger(data.x[chosen])])
        y = np.concatenate([data.y, np.full(len(chosen), self.target, dtype=data.y.dtype)])
        return LocalData(x, y)

    def __call__(self, delta: Parameters) -> Parameters:
        return scaled(delta, self.boost) if self.boost != 1.0 else delta


def attack_success_rate(predict, x: np.ndarray, y: np.ndarray, target: int) -> float:
    """The backdoor's success: of the test images whose label is not `target`, the fraction that `predict`
    (images in [0, 1] -> labels) classifies as `target` once the trigger is stamped on."""
    others = y != target
    return float((predict(add_trigger(x[others])) == target).mean())
