"""Export a torch classifier to ONNX the way every zoo model is shipped: eval mode (BatchNorm folded
into the convolutions), constants folded, opset 17, a symbolic batch dimension, shapes inferred and
the checker passed - and prove the file computes what the torch model computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from google.protobuf.message import DecodeError

from fedzoo.errors import FedzooError, InvalidInputError

OPSET = 17
INPUT_NAME = "input"
OUTPUT_NAME = "logits"
DEFAULT_TOLERANCE = 1e-4  # max |torch - onnx| on logits; BN folding reorders float sums, nothing more


class ExportMismatchError(FedzooError):
    """The exported ONNX model does not compute what the torch model computes."""


def export_onnx(model: torch.nn.Module, input_shape: tuple[int, ...], path: str | Path) -> onnx.ModelProto:
    """Write `model` (fed tensors of `input_shape`, batch first) to `path` as ONNX and return the proto."""
    path = Path(path)
    was_training = model.training
    model.eval()
    example = torch.zeros((1, *input_shape[1:]), dtype=torch.float32)
    try:
        with torch.no_grad():
            torch.onnx.export(
                model,
                (example,),
                str(path),
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
            )
    finally:
        model.train(was_training)
    proto = onnx.shape_inference.infer_shapes(onnx.load(str(path)), check_type=True, strict_mode=True)
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, str(path))
    return proto


def load_onnx_file(path: str | Path) -> onnx.ModelProto:
    """Read and check an ONNX file; a missing, non-ONNX or corrupt file is an InvalidInputError naming it."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"ONNX model {path} does not exist", field="model")
    try:
        proto = onnx.load(str(path))
        onnx.checker.check_model(proto, full_check=True)
    except (DecodeError, onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InvalidInputError(f"{path} is not a valid ONNX model: {first_line}", field="model") from None
    if not proto.graph.node:
        raise InvalidInputError(f"{path} is not a valid ONNX model: its graph has no nodes", field="model")
    return proto


def onnx_outputs(path: str | Path, inputs: np.ndarray) -> np.ndarray:
    """The first output of the ONNX model at `path` for a batch of inputs, on ORT's CPU provider."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: inputs.astype(np.float32)})[0]


def max_abs_difference(model: torch.nn.Module, path: str | Path, inputs: np.ndarray) -> float:
    """Largest |torch(x) - onnx(x)| over a batch, torch run in eval mode."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            expected = model(torch.from_numpy(inputs.astype(np.float32))).numpy()
    finally:
        model.train(was_training)
    return float(np.max(np.abs(expected - onnx_outputs(path, inputs))))


def assert_equivalent(
    model: torch.nn.Module, path: str | Path, inputs: np.ndarray, tolerance: float = DEFAULT_TOLERANCE
) -> float:
    """Raise ExportMismatchError unless the ONNX file matches the torch model within `tolerance`; return the gap."""
    difference = max_abs_difference(model, path, inputs)
    if not difference <= tolerance:
        raise ExportMismatchError(
            f"{path} differs from the torch model by up to {difference:.3g} on {len(inputs)} inputs "
            f"(tolerance {tolerance:.3g})"
        )
    return difference


def export_checked(
    model: torch.nn.Module, input_shape: tuple[int, ...], path: str | Path, check_inputs: np.ndarray,
    tolerance: float = DEFAULT_TOLERANCE,
) -> onnx.ModelProto:
    """`export_onnx`, then `assert_equivalent` on `check_inputs`; a file that fails the check is removed."""
    proto = export_onnx(model, input_shape, path)
    try:
        assert_equivalent(model, path, check_inputs, tolerance)
    except ExportMismatchError:
        Path(path).unlink(missing_ok=True)
        raise
    return proto
