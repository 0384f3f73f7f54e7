"""INT8 post-training static quantization with onnxruntime.quantization: int8 weights per channel with
reduce_range, uint8 or int8 activations, in QDQ or QOperator form (`INT8_RECIPES`).

Which form is fastest depends on the CPU (U8S8 is the fast x86 path, with or without VNNI; S8S8 is the
one ARM kernels prefer), so the pipeline quantizes with several recipes and keeps the one it measures
best. `reduce_range` (7-bit weights) avoids the int16 saturation of U8S8 on x86 CPUs without VNNI; we
keep it on because the model is built once and run on devices of either kind, and on a VNNI CPU it
measured neither slower nor less accurate.

Pitfalls handled here rather than left to the gate:
- per-tensor weights collapse depthwise convs (one scale for channels of very different range):
  with `per_channel=False` depthwise convs are left in fp32;
- `quantize_dynamic` turns convs into ConvInteger, which ORT CPU runs ~7x slower or not at all:
  we offer no dynamic recipe, and reject any result containing ConvInteger/MatMulInteger;
- `quant_pre_process` (shape inference + graph optimisation) always runs first;
- it splits HardSwish into HardSigmoid * x, which ORT runs as fp32 HardSigmoid between DQ/Q plus a
  QLinearMul (ORT has no int8 HardSwish). We leave that form: fusing it back into one fp32 HardSwish
  measured no faster on the zoo's 1-6 M MAC models (side by side, quiet machine), and it is not the INT8
  form the kernel-level latency predictor was fitted on (it then predicted those models 10-20% low).
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

from fedzoo.compress.compact import compact_model
from fedzoo.compress.errors import CalibrationDataError, UnsupportedOperationError
from fedzoo.errors import InvalidInputError
from fedzoo.nas.export import load_onnx_file

CALIBRATION_METHODS = {
    "minmax": (CalibrationMethod.MinMax, {}),
    "entropy": (CalibrationMethod.Entropy, {}),
    "percentile": (CalibrationMethod.Percentile, {"CalibPercentile": 99.999}),
}
QUANT_FORMATS = {"qdq": QuantFormat.QDQ, "qoperator": QuantFormat.QOperator}
ACTIVATION_TYPES = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}
# Weight scales: one per output channel of every conv and Gemm, or one per dense weight (convs and the
# classifier) with depthwise convs kept per channel (one scale collapses them). A dense conv's channels share
# their range well enough: on the 12 zoo models the drop stayed within -0.2..+0.2 points, and one float
# instead of one per channel is ~5% of a small INT8 file (0.30-0.32x -> 0.28-0.30x of fp32).
WEIGHT_SCALES = ("per-channel", "dense-per-tensor")
# name -> (format, activation type, weight scales). QOperator S8S8 is left out: ORT warns it is slow on x64.
INT8_RECIPES = {
    "qoperator-u8s8-dense-pt": ("qoperator", "uint8", "dense-per-tensor"),
    "qoperator-u8s8": ("qoperator", "uint8", "per-channel"),
    "qdq-u8s8": ("qdq", "uint8", "per-channel"),
    "qdq-s8s8": ("qdq", "int8", "per-channel"),
}
# What `zoo compress` tries unless told otherwise: all of them. QOperator files are 12-15% smaller than QDQ
# at the same kernels (the latency predictor reads them as their QDQ twins, fedzoo.edge.qoperator);
# per-channel QOperator stays as the fallback for a model that per-tensor dense weights cost accuracy.
DEFAULT_INT8_RECIPES = tuple(INT8_RECIPES)

# Ops of an fp32 classifier we know how to quantize or pass through untouched; anything else is refused
# up front rather than producing a model nobody has measured the behaviour of.
SUPPORTED_OPS = frozenset({
    "Conv", "Gemm", "MatMul", "Add", "Mul", "Sub", "Div", "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid",
    "HardSwish", "Tanh", "GlobalAveragePool", "AveragePool", "MaxPool", "Flatten", "Reshape", "Squeeze",
    "Unsqueeze", "Transpose", "Constant", "Identity", "Dropout", "ReduceMean", "Softmax", "Shape", "Gather",
    "Concat", "BatchNormalization",
})  # fmt: skip
SLOW_INTEGER_OPS = frozenset({"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"})
CALIBRATION_BATCH = 32


@dataclass(frozen=True)
class QuantizationRecipe:
    """How a model was quantized; stored in the card's `details["quantization"]`."""

    format: str = "qdq"
    calibration: str = "minmax"
    per_channel: bool = True
    reduce_range: bool = True
    activation_type: str = "uint8"
    weight_scales: str = "per-channel"
    weight_type: str = "int8"
    calibration_images: int = 0
    excluded_nodes: tuple[str, ...] = ()

    def as_details(self) -> dict:
        details = asdict(self)
        details["excluded_nodes"] = list(self.excluded_nodes)
        return details


class _ArrayReader(CalibrationDataReader):
    """Feeds calibration images in equal batches: ORT's histogram calibrators (entropy, percentile) stack
    per-batch outputs and fail on a short last batch, so the batch size is a divisor of the image count."""

    def __init__(self, input_name: str, images: np.ndarray) -> None:
        batch = max(size for size in range(1, CALIBRATION_BATCH + 1) if len(images) % size == 0)
        self._batches = iter([{input_name: images[i : i + batch]} for i in range(0, len(images), batch)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)


def _check_calibration(images: np.ndarray, model: onnx.ModelProto) -> np.ndarray:
    images = np.asarray(images)
    if images.size == 0 or images.ndim == 0 or len(images) == 0:
        raise CalibrationDataError("calibration data is empty: static quantization needs a few hundred train images", field="calibration")
    expected = [dim.dim_value or None for dim in model.graph.input[0].type.tensor_type.shape.dim][1:]
    if images.ndim != len(expected) + 1 or any(want and want != got for want, got in zip(expected, images.shape[1:])):
        raise CalibrationDataError(
            f"calibration images have shape {images.shape} but the model takes (batch, {', '.join(map(str, expected))})",
            field="calibration",
        )
    if not np.all(np.isfinite(images)):
        raise CalibrationDataError("calibration images contain NaN or infinite values", field="calibration")
    return images.astype(np.float32)


def _is_depthwise(node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> bool:
    if node.op_type != "Conv":
        return False
    group = next((attribute.i for attribute in node.attribute if attribute.name == "group"), 1)
    weight = initializers.get(node.input[1]) if len(node.input) > 1 else None
    return weight is not None and group > 1 and group == weight.dims[0] and weight.dims[1] == 1


def _depthwise_conv_names(model: onnx.ModelProto) -> list[str]:
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    return [node.name for node in model.graph.node if _is_depthwise(node, initializers)]


def _dense_per_tensor_overrides(model: onnx.ModelProto) -> dict[str, list[dict]]:
    """Per-channel overrides that give every channel of a dense conv's (or Gemm's) weight the whole tensor's
    range: the quantizer's own per-channel path then writes equal scales, which `compact_model` stores as one
    scalar. (ORT's QOperator quantizer takes per-tensor or per-channel for all weights at once, not per node.)"""
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    overrides = {}
    for node in model.graph.node:
        if node.op_type not in ("Conv", "Gemm") or node.input[1] not in initializers or _is_depthwise(node, initializers):
            continue
        transposed = any(attribute.name == "transB" and attribute.i for attribute in node.attribute)
        axis = 0 if node.op_type == "Conv" or transposed else 1  # the output-channel axis the quantizer uses
        weight = numpy_helper.to_array(initializers[node.input[1]])
        overrides[node.input[1]] = [{"axis": axis, "rmin": np.float32(weight.min()), "rmax": np.float32(weight.max())}]
    return overrides


def quantize_int8(
    fp32_path: str | Path,
    output_path: str | Path,
    calibration_images: np.ndarray,
    calibration: str = "minmax",
    per_channel: bool = True,
    quant_format: str = "qdq",
    reduce_range: bool = True,
    activation_type: str = "uint8",
    weight_scales: str = "per-channel",
) -> QuantizationRecipe:
    """Write a statically quantized copy of the ONNX model at `fp32_path` to `output_path`.

    `calibration_images` are already-normalised train images (N, C, H, W); `weight_scales` is one of
    WEIGHT_SCALES ("dense-per-tensor" gives each dense conv and Gemm weight one scale; needs `per_channel`).
    Raises InvalidInputError for a corrupt model, UnsupportedOperationError for ops we cannot handle,
    CalibrationDataError for bad data.
    """
    if calibration not in CALIBRATION_METHODS:
        raise InvalidInputError(f"unknown calibration method {calibration!r}; use one of {sorted(CALIBRATION_METHODS)}", field="calibration")
    if quant_format not in QUANT_FORMATS:
        raise InvalidInputError(f"unknown quantization format {quant_format!r}; use one of {sorted(QUANT_FORMATS)}", field="format")
    if weight_scales not in WEIGHT_SCALES:
        raise InvalidInputError(f"unknown weight scales {weight_scales!r}; use one of {list(WEIGHT_SCALES)}", field="weight_scales")
    if weight_scales != "per-channel" and not per_channel:
        raise InvalidInputError("weight_scales='dense-per-tensor' keeps depthwise convs per channel: it needs per_channel=True", field="weight_scales")
    if activation_type not in ACTIVATION_TYPES:
        raise InvalidInputError(f"unknown activation type {activation_type!r}; use one of {sorted(ACTIVATION_TYPES)}", field="activation_type")
    model = load_onnx_file(fp32_path)
    unsupported = sorted({node.op_type for node in model.graph.node if node.domain not in ("", "ai.onnx")} |
                         {node.op_type for node in model.graph.node} - SUPPORTED_OPS)  # fmt: skip
    if unsupported:
        raise UnsupportedOperationError(f"{fp32_path} uses ops quantization cannot handle: {unsupported}", field="model")
    images = _check_calibration(calibration_images, model)
    method, extra_options = CALIBRATION_METHODS[calibration]
    output_path = Path(output_path)
    # Work next to the output and rename at the end: a failure never leaves a half-made model behind.
    with tempfile.TemporaryDirectory(prefix=".fedzoo-quant-", dir=output_path.parent) as scratch:
        preprocessed = Path(scratch) / "preprocessed.onnx"
        quantized = Path(scratch) / "quantized.onnx"
        quant_pre_process(str(fp32_path), str(preprocessed))
        prepared = onnx.load(str(preprocessed))
        excluded = [] if per_channel else _depthwise_conv_names(prepared)
        overrides = _dense_per_tensor_overrides(prepared) if weight_scales == "dense-per-tensor" else {}
        with contextlib.redirect_stdout(io.StringIO()):  # the histogram calibrators print progress
            quantize_static(
                str(preprocessed),
                str(quantized),
                _ArrayReader(model.graph.input[0].name, images),
                quant_format=QUANT_FORMATS[quant_format],
                per_channel=per_channel,
                reduce_range=reduce_range,
                activation_type=ACTIVATION_TYPES[activation_type],
                weight_type=QuantType.QInt8,
                calibrate_method=method,
                nodes_to_exclude=excluded,
                extra_options={"ActivationSymmetric": False, "WeightSymmetric": True, "TensorQuantOverrides": overrides, **extra_options},
            )
        onnx.save(compact_model(onnx.load(str(quantized))), str(quantized))
        check_quantized(quantized)
        os.replace(quantized, output_path)
    return QuantizationRecipe(
        format=quant_format,
        calibration=calibration,
        per_channel=per_channel,
        reduce_range=reduce_range,
        activation_type=activation_type,
        weight_scales=weight_scales,
        calibration_images=len(images),
        excluded_nodes=tuple(excluded),
    )


def check_quantized(path: Path) -> None:
    """The result must pass the checker, load in ORT, actually contain int8 ops and no slow integer ops."""
    model = load_onnx_file(path)
    op_types = {node.op_type for node in model.graph.node}
    slow = sorted(op_types & SLOW_INTEGER_OPS)
    if slow:
        raise UnsupportedOperationError(f"quantized model {path} contains {slow}, which ORT CPU runs slowly", field="model")
    if not op_types & {"QuantizeLinear", "QLinearConv", "QLinearMatMul"}:
        raise UnsupportedOperationError(f"quantization left {path} without any int8 op; nothing was quantized", field="model")
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
