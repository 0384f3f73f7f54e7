"""Helpers of the federated-round tests: a device client, a round config, honest deltas, a raw upload (waiting
for a round to end is `OperatorClient.wait_for_round`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from fedzoo.clients.client import FedzooClient
from fedzoo.update_codec import encode_update
from fedzoo.edge.onnx_initializers import read_float_initializers
from fedzoo.secagg.signatures import load_signing_key


def digits_federation(num_clients: int, alpha: float | None = None) -> Any:
    """The small digits federation the round tests share (8 hidden units, one pretraining epoch, seed 0); a test
    module's `federation` fixture returns it with its own device count."""
    from fedzoo.cloud.simulation import prepare_federation

    return prepare_federation("digits", num_clients=num_clients, alpha=alpha, hidden_units=8, pretrain_epochs=1,
                              seed=0)


@contextmanager
def ready_simulation(federation, server_url: str, cache_root: Path, admin_token: str | None = None) -> Iterator[Any]:
    """A Simulation whose base model is published and whose devices are registered."""
    from fedzoo.cloud.simulation import Simulation
    from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN

    with Simulation(federation, server_url, admin_token or DEFAULT_ADMIN_TOKEN, cache_root=cache_root) as simulation:
        simulation.publish_base_model()
        simulation.register_devices()
        yield simulation


def device_client(simulation, index: int) -> FedzooClient:
    folder = simulation.cache_root / f"device-{index}"
    return FedzooClient(simulation.server_url, token=simulation.tokens[index], cache_dir=folder,
                        signing_key=load_signing_key(simulation.signing_keys[index]),
                        operator_keys=simulation.operator_keys, state_file=folder / "state.json")


def selected_tasks(simulation, count: int, task: str = "digits") -> tuple[list[FedzooClient], list[dict[str, Any]]]:
    """The first `count` devices' clients, each checked in: (clients, their tasks)."""
    devices = [device_client(simulation, index) for index in range(count)]
    return devices, [device.fl_task(task)["task"] for device in devices]


# `max_accuracy_drop` that publishes whatever comes out. Real training's accuracy after a round depends on the
# CPU's floating-point path, so tests that are not about the gate open it; tests of the gate set their own.
OPEN_GATE = 1.0
# how soon a test's devices ask the server again: they share one machine, and a round's own work takes milliseconds
TEST_POLL_S = 0.05


def round_config(**overrides: Any) -> dict[str, Any]:
    """A small plan's config with the accuracy gate open (`OPEN_GATE`) unless `max_accuracy_drop` is given; its
    devices ask again after `TEST_POLL_S` (the production default, 5 s, makes each SecAgg+ stage wait it out)."""
    config = {"min_clients": 2, "target_clients": 3, "over_selection": 0.0, "deadline_s": 60, "local_epochs": 1,
              "batch_size": 16, "learning_rate": 0.05, "max_accuracy_drop": OPEN_GATE, "poll_interval_s": TEST_POLL_S}
    config.update(overrides)
    return config


def honest_delta(model: bytes, scale: float = 0.01) -> dict[str, np.ndarray]:
    """A delta of `scale` in every coordinate of the model's parameters."""
    return {name: np.full(value.shape, scale, dtype=np.float32) for name, value in read_float_initializers(model).items()}


def upload(client: FedzooClient, task: dict[str, Any], delta: dict[str, np.ndarray], base_version: int | None = None,
           encoding: str = "fp32", num_examples: int = 10, metrics: dict[str, float] | None = None) -> dict[str, Any]:
    metadata = {"base_version": base_version or task["base_version"], "num_examples": num_examples,
                "metrics": {"accuracy": 0.5, "loss": 1.0} if metrics is None else metrics}
    return client.upload_update(task["upload"]["url"], metadata, encode_update(delta, encoding))

