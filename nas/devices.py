"""Where cloud-side training runs: `--device auto|cpu|cuda[:N]`, and a data set held so that a GPU is not
starved between steps.

`auto` takes the first CUDA GPU torch sees, else the CPU. A data set goes onto the GPU whole when it fits in
a quarter of the GPU's free memory (then a batch is an index on the GPU, no copy at all); otherwise it stays
in pinned host memory and each batch is copied asynchronously (`non_blocking`), so the copy overlaps the
previous step's kernels. On the CPU the arrays are used in place (`torch.from_numpy`, no copy).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import click
import numpy as np
import torch

from fedzoo.errors import InvalidInputError

DEVICE_CHOICES_HELP = "auto (the first CUDA GPU if torch sees one, else the CPU), cpu, cuda or cuda:N"
_DEVICE_SHARE_OF_FREE_MEMORY = 0.25  # the rest is for activations, the model and the optimiser state


def device_option(command: click.Command) -> click.Command:
    """The `--device` option of the commands that run torch (zoo build, zoo compress)."""
    return click.option("--device", default="auto", show_default=True, help=f"Where torch runs: {DEVICE_CHOICES_HELP}.")(command)


def resolve_device(name: str, local_rank: int | None = None) -> torch.device:
    """The torch device `name` asks for; `local_rank` picks the GPU of a data-parallel worker on its machine
    (cuda and auto only: an explicit cuda:N is kept)."""
    text = name.strip().lower()
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    if text == "cpu":
        return torch.device("cpu")
    if text == "cuda" or text.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise InvalidInputError(f"--device {name}: torch sees no CUDA GPU here; use --device cpu or auto", field="device")
        if text == "cuda":
            return torch.device("cuda", (local_rank or 0) % torch.cuda.device_count())
        index_text = text.removeprefix("cuda:")
        if not index_text.isdigit() or int(index_text) >= torch.cuda.device_count():
            raise InvalidInputError(
                f"--device {name}: no such GPU; this machine has cuda:0 to cuda:{torch.cuda.device_count() - 1}", field="device"
            )
        return torch.device("cuda", int(index_text))
    raise InvalidInputError(f"--device {name!r} is not a device; use {DEVICE_CHOICES_HELP}", field="device")


def describe_device(device: torch.device) -> dict[str, str]:
    """What the build report records about the device: its torch name and, for a GPU, the card's name."""
    description = {"device": str(device)}
    if device.type == "cuda":
        description["name"] = torch.cuda.get_device_name(device)
    return description


def autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    """Mixed precision for the forward passes when `enabled`: bfloat16, which needs no loss scaling (its range
    is float32's). A no-op context when not enabled."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


@dataclass
class DeviceData:
    """Images and labels where a training loop can take batches from them without waiting."""

    x: torch.Tensor
    y: torch.Tensor
    device: torch.device

    @classmethod
    def place(cls, x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor, device: torch.device) -> DeviceData:
        """Hold `x`, `y` for training on `device`: whole on a GPU when they fit, else pinned on the host."""
        x_tensor = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))
        y_tensor = y if isinstance(y, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(y))
        if device.type == "cuda":
            free_bytes, _ = torch.cuda.mem_get_info(device)
            if x_tensor.nbytes + y_tensor.nbytes <= _DEVICE_SHARE_OF_FREE_MEMORY * free_bytes:
                x_tensor, y_tensor = x_tensor.to(device), y_tensor.to(device)
            else:
                x_tensor, y_tensor = x_tensor.pin_memory(), y_tensor.pin_memory()
        return cls(x_tensor, y_tensor, device)

    def __len__(self) -> int:
        return len(self.y)

    @property
    def on_device(self) -> bool:
        return self.x.device == self.device

    def batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The examples at `index` (a CPU tensor), on the device."""
        if self.on_device:
            index = index.to(self.device, non_blocking=True)
            return self.x[index], self.y[index]
        images, labels = self.x[index], self.y[index]
        if self.device.type == "cpu":
            return images, labels
        return images.pin_memory().to(self.device, non_blocking=True), labels.pin_memory().to(self.device, non_blocking=True)
