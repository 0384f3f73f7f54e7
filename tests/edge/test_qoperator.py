"""QOperator INT8 models read as their QDQ twins: the same kernels, predictions and outputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from fedzoo.edge.calibration_models import Architecture, Block, build_model, quantize_int8, random_architecture
from fedzoo.edge.kernels import split_kernels
from fedzoo.edge.latency_predictor import KernelLatencyPredictor
from fedzoo.edge.qoperator import qoperator_as_qdq
from fedzoo.errors import InvalidInputError

ARCHITECTURES = {
    "relu6-residual": Architecture((1, 8, 8), 8, (Block(1, 8), Block(3, 16, stride=2)), 16),
    "hardswish": Architecture((1, 12, 12), 8, (Block(2, 8, activation="hardswish"),), 24, head_activation="hardswish"),
    **{f"random-{seed}": random_architecture(seed) for seed in range(4)},
}


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def both_forms(request) -> tuple[Architecture, bytes, bytes]:
    architecture = ARCHITECTURES[request.param]
    fp32 = build_model(architecture, "fp32")
    qdq = quantize_int8(fp32, architecture.input_shape)
    qoperator = quantize_int8(fp32, architecture.input_shape, quant_format="qoperator")
    assert any(node.domain == "com.microsoft" for node in onnx.load_from_string(qoperator).graph.node)
    return architecture, qdq, qoperator


def unnamed(kernels: list) -> list:
    return [dataclasses.replace(kernel, name="") for kernel in kernels]


@pytest.mark.parametrize("all_plain_layout", [False, True])
def test_qoperator_and_qdq_forms_split_into_the_same_kernels(both_forms, all_plain_layout: bool) -> None:
    _architecture, qdq, qoperator = both_forms
    qdq_kernels = split_kernels(qdq, all_plain_layout)
    assert any(kernel.precision == "int8" for kernel in qdq_kernels)
    assert unnamed(split_kernels(qoperator, all_plain_layout)) == unnamed(qdq_kernels)


def test_qoperator_and_qdq_forms_get_the_same_prediction(both_forms) -> None:
    _architecture, qdq, qoperator = both_forms
    reference = KernelLatencyPredictor.load()
    assert reference.predict_ms(qoperator) == pytest.approx(reference.predict_ms(qdq), rel=1e-12)


def test_the_rewritten_model_computes_what_the_qoperator_model_computes(both_forms) -> None:
    architecture, _qdq, qoperator = both_forms
    rewritten = qoperator_as_qdq(onnx.load_from_string(qoperator))
    onnx.checker.check_model(rewritten, full_check=True)
    assert not {node.op_type for node in rewritten.graph.node} & {"QLinearConv", "QGemm", "QLinearAdd", "QLinearMul"}
    images = np.random.default_rng(1).random((4, *architecture.input_shape), dtype=np.float32)
    outputs = [
        ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"input": images})[0]
        for model in (qoperator, rewritten.SerializeToString())
    ]
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_an_op_on_quantized_data_without_a_rule_is_refused_by_name() -> None:
    scale, zero = numpy_helper.from_array(np.float32(0.1), "scale"), numpy_helper.from_array(np.uint8(128), "zero")
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["input", "scale", "zero"], ["q"]),
            helper.make_node("QLinearAdd", ["q", "scale", "zero", "q", "scale", "zero", "scale", "zero"], ["sum"], domain="com.microsoft"),
            helper.make_node("Abs", ["sum"], ["abs"], name="odd"),
            helper.make_node("DequantizeLinear", ["abs", "scale", "zero"], ["logits"]),
        ],
        "abs",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])],
        [scale, zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(InvalidInputError, match="Abs node 'odd' reads quantized data"):
        split_kernels(model)
