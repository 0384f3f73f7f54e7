"""Deterministic calibration models: small MobileNet-style ONNX graphs a device times so the latency
predictor can be adapted to it in seconds, without running the whole zoo.

The graphs are built with `onnx.helper` from numpy weights drawn with a fixed seed (never torch, since a
device builds or receives them without it), in the same op vocabulary as the zoo's exports: Conv (BN
already folded) + Clip(0, 6) / Relu / HardSwish, residual Add, GlobalAveragePool, Flatten, Gemm. INT8
variants go through `onnxruntime.quantization.quantize_static` with the settings the compression stage
publishes (QDQ, per-channel, U8 activations, S8 weights, reduce_range), so their kernels match the zoo's.

Needs `onnx` (and `onnxruntime.quantization` for INT8), imported lazily: `import fedzoo.edge.calibration_models`
is cheap, building a model is not.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

OPSET = 17
INPUT_NAME = "input"
OUTPUT_NAME = "logits"
Activation = Literal["relu6", "relu", "hardswish"]
Precision = Literal["fp32", "int8"]


@dataclass(frozen=True)
class Block:
    """An inverted-residual block: 1x1 expand (skipped when expand_ratio == 1), depthwise k x k, 1x1 project."""

    expand_ratio: int
    out_channels: int
    stride: int = 1
    kernel_size: int = 3
    activation: Activation | None = None  # None: the network's activation
    depthwise: bool = True  # False: a plain dense k x k conv instead (calibration models that isolate dense convs)


@dataclass(frozen=True)
class Architecture:
    """A MobileNetV2-style network: stem conv (none if stem_channels is 0), inverted-residual blocks, 1x1 head,
    global pool, classifier."""

    input_shape: tuple[int, int, int]  # (C, H, W)
    stem_channels: int
    blocks: tuple[Block, ...]
    head_channels: int
    num_classes: int = 10
    stem_stride: int = 1
    activation: Activation = "relu6"
    head_activation: Activation | None = None  # None: the network's activation


# The handful of models a device times. Each is dominated by one of the predictor's calibration groups, so
# the group scales can be told apart: dense convs (no depthwise at all), depthwise convs (no stem, thin
# projections), per-op overhead and element-wise ops (many tiny ops), and a zoo-like mix, each in fp32 and INT8.
_DENSE = dict(depthwise=False)
CALIBRATION_ARCHITECTURES: dict[str, Architecture] = {
    "cal-dense": Architecture(
        (16, 16, 16), 32, (Block(1, 64, 1, 3, **_DENSE), Block(1, 64, 1, 1, **_DENSE), Block(1, 96, 1, 1, **_DENSE)), 64
    ),
    "cal-depthwise": Architecture(
        (16, 48, 48), 0, (Block(1, 16, 1, 7), Block(1, 16, 1, 5), Block(1, 16, 1, 5), Block(1, 16, 1, 3)), 16
    ),
    "cal-tiny": Architecture((1, 8, 8), 4, tuple(Block(1, 4) for _ in range(10)), 8),
    "cal-mobilenet": Architecture(
        (1, 28, 28),
        16,
        (Block(1, 16), Block(4, 24, 2), Block(4, 24), Block(4, 32, 2, 5, "hardswish"), Block(4, 32, 1, 3, "hardswish")),
        128,
        stem_stride=2,
    ),
}
CALIBRATION_MODEL_NAMES: tuple[str, ...] = tuple(
    f"{name}-{precision}" for name in CALIBRATION_ARCHITECTURES for precision in ("fp32", "int8")
)


def calibration_model(name: str) -> bytes:
    """The serialized ONNX bytes of calibration model `name` (e.g. "cal-dense-int8"); identical on every call."""
    base, _, precision = name.rpartition("-")
    if base not in CALIBRATION_ARCHITECTURES or precision not in ("fp32", "int8"):
        from fedzoo.errors import InvalidInputError

        raise InvalidInputError(
            f"unknown calibration model {name!r}; known: {', '.join(CALIBRATION_MODEL_NAMES)}", field="model"
        )
    return build_model(CALIBRATION_ARCHITECTURES[base], precision=precision, seed=len(base))  # type: ignore[arg-type]


def calibration_models() -> dict[str, bytes]:
    """Every calibration model by name."""
    return {name: calibration_model(name) for name in CALIBRATION_MODEL_NAMES}


def build_model(architecture: Architecture, precision: Precision = "fp32", seed: int = 0) -> bytes:
    """Serialized ONNX bytes of `architecture` with weights from `seed`, quantized to INT8 if asked."""
    fp32 = _GraphBuilder(architecture, seed).build()
    if precision == "fp32":
        return fp32
    return quantize_int8(fp32, architecture.input_shape, seed)


def quantize_int8(
    model_bytes: bytes, input_shape: tuple[int, ...], seed: int = 0, samples: int = 4, quant_format: str = "qdq"
) -> bytes:
    """INT8 version of an fp32 model in QDQ (or "qoperator") form, quantized the way the compression stage
    publishes (per-channel U8S8, reduce_range), calibrated on `samples` deterministic random inputs."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    rng = np.random.default_rng(seed)
    batches = [{INPUT_NAME: rng.random((1, *input_shape), dtype=np.float32)} for _ in range(samples)]

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._batches = iter(batches)

        def get_next(self) -> dict | None:
            return next(self._batches, None)

    with tempfile.TemporaryDirectory() as folder:
        source, target = Path(folder) / "fp32.onnx", Path(folder) / "int8.onnx"
        prepared = Path(folder) / "prepared.onnx"
        source.write_bytes(model_bytes)
        quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)  # as the compression stage does
        quantize_static(
            str(prepared),
            str(target),
            _Reader(),
            quant_format=QuantFormat.QOperator if quant_format == "qoperator" else QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            reduce_range=True,
            extra_options={"ActivationSymmetric": False, "WeightSymmetric": True},
        )
        return target.read_bytes()


def random_architecture(seed: int) -> Architecture:
    """A random MobileNet-style architecture (the reference predictor's training set draws from these):
    small images, kernels 3-7, expand ratios 1-6, mixed activations, and widths that are often not multiples
    of 4, as structured pruning leaves them."""
    rng = np.random.default_rng(seed)
    channels = int(rng.choice([1, 1, 3, 8]))
    resolution = int(rng.choice([8, 14, 16, 28, 28, 32, 48]))
    width = float(rng.choice([0.25, 0.5, 0.75, 1.0, 1.5, 2.0]))
    pruned = rng.random() < 0.4

    def round_channels(value: float) -> int:
        return max(2, int(round(value))) if pruned else max(4, int(round(value / 4.0)) * 4)

    stem = round_channels(int(rng.choice([8, 16, 32])) * width)
    blocks: list[Block] = []
    out_channels = stem
    spatial = resolution
    for _ in range(int(rng.integers(1, 10))):
        stride = 2 if spatial >= 8 and rng.random() < 0.3 else 1
        spatial = (spatial + stride - 1) // stride
        if stride == 2 or rng.random() < 0.3:
            out_channels = round_channels(out_channels * float(rng.choice([1.0, 1.5, 2.0])))
        activation = str(rng.choice(["relu6", "relu", "hardswish"]))
        blocks.append(
            Block(int(rng.choice([1, 3, 4, 6])), out_channels, stride, int(rng.choice([3, 3, 5, 7])), activation)  # type: ignore[arg-type]
        )
    return Architecture(
        input_shape=(channels, resolution, resolution),
        stem_channels=stem,
        blocks=tuple(blocks),
        head_channels=round_channels(int(rng.choice([32, 64, 128, 256])) * width),
        num_classes=10,
        stem_stride=int(rng.choice([1, 2])) if resolution >= 14 else 1,
        activation=str(rng.choice(["relu6", "relu6", "relu", "hardswish"])),  # type: ignore[arg-type]
    )


# The zoo's search space as the NAS stage defines it (nas/space.py default_space(28)): out channels, stride
# and activation per stage; each stage has 1-3 blocks with kernels 3/5 and expand ratios 3/4/6.
ZOO_LIKE_STAGES: tuple[tuple[int, int, Activation], ...] = (
    (16, 1, "relu6"), (24, 2, "relu6"), (40, 2, "hardswish"), (64, 1, "hardswish"),
)


def zoo_like_architecture(seed: int) -> Architecture:
    """A random subnet of the zoo's MNIST search space, half of them with pruned widths: nn-Meter samples its
    kernel configurations around the target space the same way. (Its own seeds and weights: never a zoo model.)"""
    rng = np.random.default_rng(seed)
    keep = 1.0 if rng.random() < 0.5 else float(rng.uniform(0.5, 0.95))

    def width(channels: int) -> int:
        return max(4, int(channels * keep))

    blocks = []
    for out_channels, stride, activation in ZOO_LIKE_STAGES:
        for index in range(int(rng.integers(1, 4))):
            blocks.append(
                Block(
                    int(rng.choice([3, 4, 6])), width(out_channels), stride if index == 0 else 1,
                    int(rng.choice([3, 5])), activation,
                )
            )
    return Architecture(
        (1, 28, 28), width(16), tuple(blocks), width(128), stem_stride=2, activation="relu6",
        head_activation="hardswish",
    )


class _GraphBuilder:
    """Builds one Architecture as an ONNX graph, node by node, with seeded He-initialised weights."""

    def __init__(self, architecture: Architecture, seed: int) -> None:
        import onnx.helper

        self.helper = onnx.helper
        self.architecture = architecture
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.initializers: list = []
        self.counter = 0

    def build(self) -> bytes:
        import onnx

        arch = self.architecture
        x = INPUT_NAME
        channels = arch.input_shape[0]
        if arch.stem_channels:
            x = self.conv(x, channels, arch.stem_channels, 3, arch.stem_stride, 1, arch.activation)
            channels = arch.stem_channels
        for block in arch.blocks:
            x, channels = self.inverted_residual(x, channels, block)
        x = self.conv(x, channels, arch.head_channels, 1, 1, 1, arch.head_activation or arch.activation)
        pooled = self.name("pool")
        self.nodes.append(self.helper.make_node("GlobalAveragePool", [x], [pooled]))
        flat = self.name("flatten")
        self.nodes.append(self.helper.make_node("Flatten", [pooled], [flat], axis=1))
        weight = self.initializer("fc.weight", self.he((arch.num_classes, arch.head_channels), arch.head_channels))
        bias = self.initializer("fc.bias", np.zeros(arch.num_classes, np.float32))
        self.nodes.append(self.helper.make_node("Gemm", [flat, weight, bias], [OUTPUT_NAME], transB=1))
        graph = self.helper.make_graph(
            self.nodes,
            "calibration",
            [self.helper.make_tensor_value_info(INPUT_NAME, onnx.TensorProto.FLOAT, ["batch", *arch.input_shape])],
            [self.helper.make_tensor_value_info(OUTPUT_NAME, onnx.TensorProto.FLOAT, ["batch", arch.num_classes])],
            self.initializers,
        )
        model = self.helper.make_model(graph, opset_imports=[self.helper.make_opsetid("", OPSET)])
        model.ir_version = 8
        model = onnx.shape_inference.infer_shapes(model)
        onnx.checker.check_model(model)
        return model.SerializeToString()

    def inverted_residual(self, x: str, channels: int, block: Block) -> tuple[str, int]:
        activation = block.activation or self.architecture.activation
        if not block.depthwise:
            y = self.conv(x, channels, block.out_channels, block.kernel_size, block.stride, 1, activation)
            return y, block.out_channels
        hidden = channels * block.expand_ratio
        y = x
        if block.expand_ratio != 1:
            y = self.conv(y, channels, hidden, 1, 1, 1, activation)
        y = self.conv(y, hidden, hidden, block.kernel_size, block.stride, hidden, activation)
        y = self.conv(y, hidden, block.out_channels, 1, 1, 1, None)
        if block.stride == 1 and channels == block.out_channels:
            total = self.name("add")
            self.nodes.append(self.helper.make_node("Add", [x, y], [total]))
            y = total
        return y, block.out_channels

    def conv(
        self, x: str, c_in: int, c_out: int, kernel: int, stride: int, groups: int, activation: Activation | None
    ) -> str:
        fan_in = (c_in // groups) * kernel * kernel
        weight = self.initializer("conv.weight", self.he((c_out, c_in // groups, kernel, kernel), fan_in))
        bias = self.initializer("conv.bias", (0.01 * self.rng.standard_normal(c_out)).astype(np.float32))
        out = self.name("conv")
        pad = kernel // 2
        self.nodes.append(
            self.helper.make_node(
                "Conv", [x, weight, bias], [out], kernel_shape=[kernel, kernel], strides=[stride, stride],
                pads=[pad, pad, pad, pad], group=groups,
            )
        )
        return self.activate(out, activation) if activation else out

    def activate(self, x: str, activation: Activation) -> str:
        out = self.name(activation)
        if activation == "relu":
            self.nodes.append(self.helper.make_node("Relu", [x], [out]))
        elif activation == "hardswish":
            self.nodes.append(self.helper.make_node("HardSwish", [x], [out]))
        else:  # relu6, exported by torch as Clip with constant bounds
            low = self.initializer("clip.min", np.array(0.0, np.float32))
            high = self.initializer("clip.max", np.array(6.0, np.float32))
            self.nodes.append(self.helper.make_node("Clip", [x, low, high], [out]))
        return out

    def he(self, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return (self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    def initializer(self, prefix: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.name(prefix)
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}_{self.counter}"
