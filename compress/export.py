"""Export a torch classifier to ONNX the way every zoo model is shipped: eval mode (BatchNorm folded
into the convolutions), opset 17, a symbolic batch dimension, shapes inferred and the checker passed."""

from __future__ import annotations

from pathlib import Path

import onnx
import torch

OPSET = 17
INPUT_NAME = "input"
OUTPUT_NAME = "logits"


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
