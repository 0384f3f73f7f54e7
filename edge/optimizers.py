"""Optimizer steps in numpy for on-device training; the update rules are torch.optim's, so a device
and a cloud-side torch run given the same gradients move the parameters identically."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import numpy as np

from fedzoo.errors import InvalidInputError


class Optimizer(ABC):
    """Updates parameters in place from their gradients; keeps whatever per-parameter state it needs."""

    def __init__(self, learning_rate: float, weight_decay: float = 0.0) -> None:
        if not learning_rate > 0.0:
            raise InvalidInputError(f"learning_rate must be positive, got {learning_rate}", field="learning_rate")
        if weight_decay < 0.0:
            raise InvalidInputError(f"weight_decay must be >= 0, got {weight_decay}", field="weight_decay")
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay

    def step(self, parameters: Mapping[str, np.ndarray], gradients: Mapping[str, np.ndarray]) -> None:
        """Apply one update to every parameter that has a gradient (arrays are modified in place)."""
        for name, gradient in gradients.items():
            parameter = parameters[name]
            if gradient.shape != parameter.shape:
                raise InvalidInputError(
                    f"gradient of {name!r} has shape {gradient.shape}, the parameter {parameter.shape}", field=name
                )
            if self.weight_decay:
                gradient = gradient + self.weight_decay * parameter  # L2 penalty, as torch.optim adds it
            self.update(name, parameter, gradient)

    @abstractmethod
    def update(self, name: str, parameter: np.ndarray, gradient: np.ndarray) -> None:
        """Change `parameter` in place given its (weight-decayed) gradient."""


class SGD(Optimizer):
    """Stochastic gradient descent with (optionally Nesterov) momentum, like torch.optim.SGD (dampening 0)."""

    def __init__(
        self, learning_rate: float, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False
    ) -> None:
        super().__init__(learning_rate, weight_decay)
        if not 0.0 <= momentum < 1.0:
            raise InvalidInputError(f"momentum must be in [0, 1), got {momentum}", field="momentum")
        if nesterov and momentum == 0.0:
            raise InvalidInputError("nesterov momentum needs momentum > 0", field="nesterov")
        self.momentum = momentum
        self.nesterov = nesterov
        self.velocity: dict[str, np.ndarray] = {}

    def update(self, name: str, parameter: np.ndarray, gradient: np.ndarray) -> None:
        direction = gradient
        if self.momentum:
            velocity = self.velocity.get(name)
            if velocity is None:
                velocity = self.velocity[name] = gradient.astype(np.float32, copy=True)
            else:
                velocity *= self.momentum
                velocity += gradient
            direction = gradient + self.momentum * velocity if self.nesterov else velocity
        parameter -= self.learning_rate * direction


class Adam(Optimizer):
    """Adam with bias correction, like torch.optim.Adam (weight decay as an L2 term, amsgrad off)."""

    def __init__(
        self,
        learning_rate: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        epsilon: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(learning_rate, weight_decay)
        if not all(0.0 <= beta < 1.0 for beta in betas):
            raise InvalidInputError(f"betas must be in [0, 1), got {betas}", field="betas")
        self.betas = betas
        self.epsilon = epsilon
        self.first_moment: dict[str, np.ndarray] = {}
        self.second_moment: dict[str, np.ndarray] = {}
        self.steps: dict[str, int] = {}

    def update(self, name: str, parameter: np.ndarray, gradient: np.ndarray) -> None:
        beta1, beta2 = self.betas
        first = self.first_moment.setdefault(name, np.zeros_like(parameter))
        second = self.second_moment.setdefault(name, np.zeros_like(parameter))
        step = self.steps[name] = self.steps.get(name, 0) + 1
        first *= beta1
        first += (1.0 - beta1) * gradient
        second *= beta2
        second += (1.0 - beta2) * gradient * gradient
        corrected_denominator = np.sqrt(second / (1.0 - beta2**step)) + self.epsilon
        parameter -= (self.learning_rate / (1.0 - beta1**step)) * first / corrected_denominator
