import numpy as np
import onnx
import pytest
from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

from fedzoo.compress.compact import compact_model
from fedzoo.compress.quantize import _ArrayReader
from fedzoo.nas.export import onnx_outputs


@pytest.fixture(scope="module")
def uncompacted_int8(trained_mobilenet, digits, tmp_path_factory):
    """The quantizer's raw output, long names and zero-point vectors included, in both graph forms."""
    _model, fp32 = trained_mobilenet
    paths = {}
    for name, quant_format in (("qdq", QuantFormat.QDQ), ("qoperator", QuantFormat.QOperator)):
        paths[name] = tmp_path_factory.mktemp(name) / "int8.onnx"
        quantize_static(str(fp32), str(paths[name]), _ArrayReader("input", digits[1][:32]), quant_format=quant_format,
                        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip
    return paths


@pytest.mark.parametrize("form", ["fp32", "qdq", "qoperator"])
def test_compacting_shrinks_the_file_and_keeps_every_output(form, trained_mobilenet, uncompacted_int8, digits, tmp_path):
    path = trained_mobilenet[1] if form == "fp32" else uncompacted_int8[form]
    compacted = tmp_path / "compact.onnx"
    onnx.save(compact_model(onnx.load(str(path))), str(compacted))
    onnx.checker.check_model(str(compacted), full_check=True)
    assert compacted.stat().st_size < path.stat().st_size
    images = digits[2][:64]
    np.testing.assert_array_equal(onnx_outputs(compacted, images), onnx_outputs(path, images))
    graph = onnx.load(str(compacted)).graph
    assert [v.name for v in graph.input] == ["input"] and [v.name for v in graph.output] == ["logits"]
    assert not graph.value_info and not any(node.name for node in graph.node)
    tensor_names = {name for node in graph.node for name in [*node.input, *node.output]} - {"input", "logits", ""}
    assert max(len(name) for name in tensor_names) <= 2


@pytest.mark.parametrize("form", ["fp32", "qoperator"])
def test_attributes_at_their_defaults_are_dropped(form, trained_mobilenet, uncompacted_int8):
    path = trained_mobilenet[1] if form == "fp32" else uncompacted_int8[form]
    before, after = onnx.load(str(path)).graph, compact_model(onnx.load(str(path))).graph
    conv = "Conv" if form == "fp32" else "QLinearConv"
    attributes = lambda graph: [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in graph.node if n.op_type == conv]
    assert any(a.get("group") == 1 and a.get("dilations") == [1, 1] and "kernel_shape" in a for a in attributes(before))
    for kept in attributes(after):
        assert "dilations" not in kept and "kernel_shape" not in kept and "auto_pad" not in kept
        assert kept.get("group", 2) > 1 and kept.get("strides", [2]) != [1, 1] and any(kept.get("pads", [1]))


def test_equal_per_channel_scales_become_one_scalar(uncompacted_int8, digits, tmp_path):
    """A QLinearConv weight scale vector with one value repeated (what the dense-per-tensor recipe writes)
    is stored as that scalar; the outputs stay bit-identical."""
    model = onnx.load(str(uncompacted_int8["qoperator"]))
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    first_conv = next(node for node in model.graph.node if node.op_type == "QLinearConv")
    scale = initializers[first_conv.input[4]]
    values = onnx.numpy_helper.to_array(scale)
    assert values.ndim == 1 and len(values) > 1
    scale.CopyFrom(onnx.numpy_helper.from_array(np.full_like(values, values.max()), scale.name))
    equal_scales = tmp_path / "equal-scales.onnx"
    onnx.save(model, str(equal_scales))
    compacted = tmp_path / "compact.onnx"
    onnx.save(compact_model(model), str(compacted))
    compact_graph = onnx.load(str(compacted)).graph
    compact_initializers = {tensor.name: tensor for tensor in compact_graph.initializer}
    conv = next(node for node in compact_graph.node if node.op_type == "QLinearConv")
    assert list(compact_initializers[conv.input[4]].dims) == []
    images = digits[2][:64]
    np.testing.assert_array_equal(onnx_outputs(compacted, images), onnx_outputs(equal_scales, images))


def test_all_zero_weight_zero_points_are_dropped(uncompacted_int8):
    compact = {form: compact_model(onnx.load(str(path))) for form, path in uncompacted_int8.items()}
    graph = compact["qdq"].graph
    weight_dequantizers = [node for node in graph.node if node.op_type == "DequantizeLinear"
                           and node.input[0] in {t.name for t in graph.initializer}]  # fmt: skip
    gemm_inputs = {name for node in graph.node if node.op_type == "Gemm" for name in node.input}
    for_gemm = [node for node in weight_dequantizers if node.output[0] in gemm_inputs]
    for_convs = [node for node in weight_dequantizers if node.output[0] not in gemm_inputs]
    assert for_convs and all(len(node.input) == 2 for node in for_convs)
    # kept where onnxruntime needs them to fuse the classifier into QGemm
    assert for_gemm and all(len(node.input) == 3 for node in for_gemm)
    initializers = {tensor.name: tensor for tensor in compact["qoperator"].graph.initializer}
    weight_zero_points = {node.input[5] for node in compact["qoperator"].graph.node if node.op_type == "QLinearConv"}
    assert len(weight_zero_points) == 1 and list(initializers[weight_zero_points.pop()].dims) == []
