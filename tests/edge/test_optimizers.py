"""The numpy optimizers take the same steps as torch.optim given the same gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedzoo.edge.optimizers import SGD, Adam, Optimizer
from fedzoo.errors import InvalidInputError

torch.set_num_threads(1)


def run_both(ours: Optimizer, make_torch, steps: int = 5) -> None:
    rng = np.random.default_rng(0)
    shapes = {"conv.weight": (4, 3, 3, 3), "fc.bias": (5,)}
    numpy_params = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    torch_params = {name: torch.tensor(value.copy(), requires_grad=True) for name, value in numpy_params.items()}
    reference = make_torch(list(torch_params.values()))
    for _ in range(steps):
        gradients = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
        ours.step(numpy_params, gradients)
        for name, parameter in torch_params.items():
            parameter.grad = torch.from_numpy(gradients[name].copy())
        reference.step()
    for name, parameter in torch_params.items():
        np.testing.assert_allclose(numpy_params[name], parameter.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "settings",
    [
        dict(lr=0.1),
        dict(lr=0.05, momentum=0.9),
        dict(lr=0.05, momentum=0.9, weight_decay=1e-2),
        dict(lr=0.05, momentum=0.8, weight_decay=1e-3, nesterov=True),
    ],
)
def test_sgd_matches_torch(settings):
    ours = SGD(settings["lr"], settings.get("momentum", 0.0), settings.get("weight_decay", 0.0), settings.get("nesterov", False))
    run_both(ours, lambda params: torch.optim.SGD(params, **settings))


@pytest.mark.parametrize("settings", [dict(lr=1e-2), dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=1e-2)])
def test_adam_matches_torch(settings):
    ours = Adam(settings["lr"], settings.get("betas", (0.9, 0.999)), settings.get("eps", 1e-8), settings.get("weight_decay", 0.0))
    run_both(ours, lambda params: torch.optim.Adam(params, **settings))


def test_step_updates_in_place_and_only_given_gradients():
    params = {"a": np.ones(3, np.float32), "b": np.ones(2, np.float32)}
    a_before = params["a"]
    SGD(0.5).step(params, {"a": np.full(3, 2.0, np.float32)})
    assert params["a"] is a_before
    np.testing.assert_allclose(params["a"], 0.0)
    np.testing.assert_allclose(params["b"], 1.0)


def test_gradient_of_the_wrong_shape_is_named():
    with pytest.raises(InvalidInputError, match="'w'"):
        SGD(0.1).step({"w": np.zeros((2, 2), np.float32)}, {"w": np.zeros(4, np.float32)})


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: SGD(0.0), "learning_rate"),
        (lambda: SGD(0.1, momentum=1.5), "momentum"),
        (lambda: SGD(0.1, nesterov=True), "nesterov"),
        (lambda: Adam(0.1, weight_decay=-1.0), "weight_decay"),
        (lambda: Adam(0.1, betas=(0.9, 1.0)), "betas"),
    ],
)
def test_bad_settings_name_the_field(make, field):
    with pytest.raises(InvalidInputError) as error:
        make()
    assert error.value.field == field
