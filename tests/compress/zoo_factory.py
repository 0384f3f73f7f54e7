"""A real little zoo for the pipeline tests: a NAS subnet trained for a few epochs on sklearn digits."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedzoo.cards import InputSpec, Latency, Metrics, ModelCard, Normalisation
from fedzoo.compress.macs import count_cost
from fedzoo.compress.measure import evaluate_onnx, normalise
from fedzoo.datasets import DatasetSplit, load_dataset, split_dataset
from fedzoo.nas.export import export_checked
from fedzoo.nas.subnet import build_subnet
from fedzoo.zoo import Zoo


def digits_split() -> DatasetSplit:
    return split_dataset(load_dataset("digits"), seed=0)


def train(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, epochs: int, seed: int = 0) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    images, labels = torch.from_numpy(x), torch.from_numpy(y)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(images), generator=generator)
        for start in range(0, len(images), 64):
            batch = order[start : start + 64]
            loss = F.cross_entropy(model(images[batch]), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.eval()


def make_arch(stem_channels: int, head_channels: int, stages: list[tuple[int, int, str, list[int], list[int]]], stem_stride: int = 1) -> dict:
    """An ofa-mbv2 arch dict (the JSON contract of `build_subnet`); a stage is (width, stride, activation,
    kernels, expand_ratios), its depth the number of kernels."""
    return {
        "family": "ofa-mbv2", "stem_channels": stem_channels, "stem_stride": stem_stride, "stem_activation": "relu6",
        "head_channels": head_channels, "head_activation": "hswish",
        "stages": [
            {"out_channels": width, "stride": stride, "activation": activation, "kernels": kernels, "expand_ratios": ratios}
            for width, stride, activation, kernels, ratios in stages
        ],
    }  # fmt: skip


def add_trained_model(zoo: Zoo, split: DatasetSplit, card_id: str, arch: dict, epochs: int, workdir: Path) -> ModelCard:
    """Train `build_subnet(arch)` on the split and add it to the zoo as a root fp32 card with its torch_state."""
    torch.manual_seed(0)
    channels = split.dataset.image_shape[0]
    model = build_subnet(arch, split.dataset.num_classes, channels)
    normalisation = Normalisation(mean=split.mean, std=split.std)
    train(model, normalise(split.train.x, normalisation), split.train.y, epochs)
    input_shape = (1, *split.dataset.image_shape)
    path = workdir / f"{card_id}.onnx"
    test_x = normalise(split.test.x, normalisation)
    export_checked(model, input_shape, path, test_x[:8])
    accuracy, loss = evaluate_onnx(path, test_x, split.test.y)
    state = io.BytesIO()
    torch.save(model.state_dict(), state)
    cost = count_cost(model, input_shape)
    card = ModelCard(
        id=card_id,
        family="ofa-mbv2",
        task=split.dataset.name,
        input=InputSpec(name="input", shape=["batch", *split.dataset.image_shape], normalisation=normalisation),
        labels=split.dataset.labels,
        arch=arch,
        metrics=Metrics(accuracy=accuracy, loss=loss, num_examples=len(split.test)),
        macs=cost.macs,
        params=cost.params,
        size_bytes=path.stat().st_size,
        sha256=zoo.add_blob_file(path),
        latency_ms={"cloud-x86-1t": Latency(median_ms=0.1, source="predicted", threads=1)},
        artifacts={"torch_state": zoo.add_blob_bytes(state.getvalue())},
    )
    zoo.add_card(card)
    return card


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under a zoo with its bytes, to prove a failed run changed nothing."""
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def digits_arch() -> dict:
    """A subnet big enough (about 13k parameters) that INT8 shrinks it despite the QDQ graph overhead."""
    return make_arch(16, 64, [(16, 1, "relu6", [3], [2]), (24, 2, "relu6", [3], [4]), (32, 2, "relu6", [3], [4])])
