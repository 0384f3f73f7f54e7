"""The zoo's supernet as data, and subnets made from it (torch side of zoo-wide federated learning).

The supernet travels as a card like any model (`supernet_card`): its ONNX blob is the largest subnet, its
`artifacts["supernet_weights"]` an `.npz` of every supernet tensor (no pickles: the server reads it with
numpy), its `details["supernet"]` the search space, classes and input channels. Its task is
`<task>.supernet`, so lookup never serves it.

From the weights, for any arch of the space (tensors placed by `fedzoo.nas.subnet_mapping`):
- `training_blobs`: the subnet exported with its BatchNorm kept (not folded into the convolutions), so a device's
  delta names the subnet's own tensors (conv weights, BN scale and shift), and its training graph with BatchNorm
  in training mode (the delta carries the BN running statistics) or, given calibration images, in inference mode
  (statistics recalibrated on them and fixed on the device);
- `deployable_blob`: the subnet with BatchNorm recalibrated on calibration images and folded, exported as
  the zoo's models are.
"""

from __future__ import annotations

import io
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from fedzoo.cards import SUPERNET_DETAILS, InputSpec, Metrics, ModelCard
from fedzoo.graphs.autodiff import build_training_graph
from fedzoo.nas.export import INPUT_NAME, OPSET, OUTPUT_NAME, export_onnx
from fedzoo.nas.space import Arch, SearchSpace
from fedzoo.nas.subnet import Subnet, count_macs, count_params, recalibrate_batchnorm
from fedzoo.nas.subnet_mapping import Weights, extract_weights
from fedzoo.nas.supernet import Supernet
from fedzoo.zoo import Zoo

WEIGHTS_ARTIFACT = "supernet_weights"
SUPERNET_TASK_SUFFIX = ".supernet"


def weights_npz(weights: Weights) -> bytes:
    """The supernet's tensors as an `.npz` (float32, keyed by state-dict name)."""
    buffer = io.BytesIO()
    np.savez(buffer, **{name: np.asarray(value, np.float32) for name, value in weights.items()})
    return buffer.getvalue()


def read_weights_npz(data: bytes) -> Weights:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def supernet_weights(supernet: Supernet) -> Weights:
    """Every float tensor of the supernet (parameters, kernel transforms, BN running statistics)."""
    return {name: value.detach().cpu().numpy().astype(np.float32).copy()
            for name, value in supernet.state_dict().items() if value.is_floating_point()}


@dataclass(frozen=True)
class SupernetSpec:
    """What the supernet card's details say: the space and the shape of the classifier."""

    space: SearchSpace
    num_classes: int
    in_channels: int
    task: str
    zoo_family: str

    def to_dict(self) -> dict[str, Any]:
        return {"space": self.space.to_dict(), "num_classes": self.num_classes, "in_channels": self.in_channels,
                "task": self.task, "zoo_family": self.zoo_family}

    @classmethod
    def from_card(cls, card: ModelCard) -> SupernetSpec:
        details = card.details[SUPERNET_DETAILS]
        return cls(SearchSpace.from_dict(details["space"]), int(details["num_classes"]), int(details["in_channels"]),
                   str(details["task"]), str(details["zoo_family"]))


def subnet_module(spec: SupernetSpec, arch: Arch, weights: Weights) -> Subnet:
    """A standalone torch subnet holding `arch`'s tensors from the supernet weights."""
    module = Subnet(arch, spec.num_classes, spec.in_channels)
    state = module.state_dict()
    with torch.no_grad():
        for name, value in extract_weights(spec.space, arch, weights).items():
            state[name].copy_(torch.from_numpy(value))
    return module.eval()


def _input_shape(spec: SupernetSpec) -> tuple[int, int, int, int]:
    return (1, spec.in_channels, spec.space.resolution, spec.space.resolution)


def training_blobs(spec: SupernetSpec, arch: Arch, weights: Weights,
                   calibration: np.ndarray | None = None) -> tuple[bytes, bytes]:
    """(the subnet's ONNX with BatchNorm kept, its training graph). Without `calibration` the graph runs BatchNorm
    in training mode (each batch's statistics; the running statistics are outputs); with it (normalised images)
    the statistics are recalibrated on them and the graph runs BatchNorm in inference mode, for devices whose
    batches are too few-class to normalise with (docs/zoo-federated.md, "BatchNorm")."""
    module = subnet_module(spec, arch, weights)
    if calibration is not None:
        recalibrate_batchnorm(module, calibration)
    buffer = io.BytesIO()
    with torch.no_grad():
        # initializers kept as inputs while exporting: otherwise torch merges equal tensors (a fresh supernet's
        # BN scales are all ones) into one, and the subnet's tensors would lose their names
        torch.onnx.export(module, (torch.zeros(_input_shape(spec)),), buffer, input_names=[INPUT_NAME],
                          output_names=[OUTPUT_NAME], dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
                          opset_version=OPSET, do_constant_folding=False, keep_initializers_as_inputs=True,
                          dynamo=False)
    proto = onnx.load_model_from_string(buffer.getvalue())
    initializers = {initializer.name for initializer in proto.graph.initializer}
    kept_inputs = [value for value in proto.graph.input if value.name not in initializers]
    del proto.graph.input[:]
    proto.graph.input.extend(kept_inputs)
    onnx.checker.check_model(proto, full_check=True)
    batch_norm = "training" if calibration is None else "inference"
    return proto.SerializeToString(), build_training_graph(proto, batch_norm=batch_norm).SerializeToString()


def deployable_blob(spec: SupernetSpec, arch: Arch, weights: Weights, calibration: np.ndarray | None) -> bytes:
    """The subnet as the zoo serves it: BatchNorm recalibrated on `calibration` (normalised images; None keeps
    the statistics in `weights`), folded, exported."""
    module = subnet_module(spec, arch, weights)
    if calibration is not None:
        recalibrate_batchnorm(module, calibration)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.onnx"
        export_onnx(module, _input_shape(spec), path)
        return path.read_bytes()


def inference_training_graph(onnx_bytes: bytes) -> bytes:
    """The training graph of a deployable (BN folded) model, as the zoo's cards carry
    (`fedzoo.graphs.training_graphs`), so today's single-model plans can fine-tune a re-extracted version."""
    return build_training_graph(onnx.load_model_from_string(onnx_bytes)).SerializeToString()


def requantized_blob(fp32_onnx: bytes, quantization: dict[str, Any], calibration: np.ndarray) -> bytes:
    """An INT8 model of `fp32_onnx` made with the recipe an INT8 card records (`details["quantization"]`, written by
    `fedzoo.compress.pipeline`), calibrated on `calibration` (normalised images)."""
    from fedzoo.compress.quantize import quantize_int8

    with tempfile.TemporaryDirectory() as folder:
        fp32_path, int8_path = Path(folder) / "fp32.onnx", Path(folder) / "int8.onnx"
        fp32_path.write_bytes(fp32_onnx)
        quantize_int8(fp32_path, int8_path, calibration, calibration=quantization.get("calibration", "minmax"),
                      per_channel=quantization.get("per_channel", True), quant_format=quantization.get("format", "qdq"),
                      reduce_range=quantization.get("reduce_range", True),
                      activation_type=quantization.get("activation_type", "uint8"),
                      weight_scales=quantization.get("weight_scales", "per-channel"))
        return int8_path.read_bytes()


def write_supernet_card(zoo: Zoo, supernet: Supernet, template: ModelCard, metrics: Metrics) -> ModelCard:
    """Store the supernet as a card of the zoo: the largest subnet as its ONNX blob, every tensor as an
    artifact. `template` is a zoo card of the same task (input, labels, normalisation)."""
    spec = SupernetSpec(supernet.space, supernet.num_classes, supernet.in_channels, template.task, template.family)
    weights = supernet_weights(supernet)
    arch = supernet.space.max_arch()
    model = deployable_blob(spec, arch, weights, calibration=None)
    module = subnet_module(spec, arch, weights)
    card = ModelCard(
        id=f"{template.task}-supernet"[:128], family=f"{template.family}-supernet", task=template.task + SUPERNET_TASK_SUFFIX,
        input=InputSpec.model_validate(template.input.model_dump()), labels=template.labels, arch=arch,
        precision="fp32", metrics=metrics, macs=count_macs(module, _input_shape(spec)), params=count_params(module),
        size_bytes=len(model), sha256=zoo.add_blob_bytes(model),
        artifacts={WEIGHTS_ARTIFACT: zoo.add_blob_bytes(weights_npz(weights))},
        details={SUPERNET_DETAILS: spec.to_dict()},
    )
    zoo.add_card(card)
    return card
