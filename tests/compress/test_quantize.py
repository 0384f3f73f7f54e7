import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from fedzoo.compress.errors import CalibrationDataError, UnsupportedOperationError
from fedzoo.compress.measure import evaluate_onnx
from fedzoo.compress.quantize import CALIBRATION_METHODS, DEFAULT_INT8_RECIPES, INT8_RECIPES, quantize_int8
from fedzoo.edge.latency_predictor import kernel_features
from fedzoo.errors import InvalidInputError


def op_types(path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path)).graph.node}


@pytest.mark.parametrize("calibration", sorted(CALIBRATION_METHODS))
def test_static_qdq_per_channel_keeps_accuracy(calibration, trained_mobilenet, digits, tmp_path):
    _model, fp32 = trained_mobilenet
    split, train_x, test_x = digits
    recipe = quantize_int8(fp32, tmp_path / "int8.onnx", train_x[:200], calibration)
    types = op_types(tmp_path / "int8.onnx")
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= types and not types & {"ConvInteger", "MatMulInteger"}
    fp32_accuracy, _ = evaluate_onnx(fp32, test_x, split.test.y)
    int8_accuracy, _ = evaluate_onnx(tmp_path / "int8.onnx", test_x, split.test.y)
    assert fp32_accuracy > 0.8
    assert int8_accuracy >= fp32_accuracy - 0.02
    assert recipe.per_channel and recipe.reduce_range and recipe.activation_type == "uint8"
    assert recipe.calibration == calibration and recipe.calibration_images == 200


def test_weights_are_quantized_per_channel(trained_mobilenet, digits, tmp_path):
    _model, fp32 = trained_mobilenet
    quantize_int8(fp32, tmp_path / "int8.onnx", digits[1][:64])
    model = onnx.load(str(tmp_path / "int8.onnx"))
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    weight_scales = [
        initializers[node.input[1]] for node in model.graph.node
        if node.op_type == "DequantizeLinear" and initializers.get(node.input[0]) is not None
        and initializers[node.input[0]].data_type == TensorProto.INT8
    ]  # fmt: skip
    assert weight_scales and all(len(scale.dims) == 1 and scale.dims[0] > 1 for scale in weight_scales[:-1])


def test_per_tensor_leaves_depthwise_convs_in_fp32(trained_mobilenet, digits, tmp_path):
    _model, fp32 = trained_mobilenet
    recipe = quantize_int8(fp32, tmp_path / "int8.onnx", digits[1][:64], per_channel=False)
    assert len(recipe.excluded_nodes) == 4  # one depthwise conv per block of TinyMobileNet
    graph = onnx.load(str(tmp_path / "int8.onnx")).graph
    producers = {output: node for node in graph.node for output in node.output}
    for node in graph.node:
        if node.name in recipe.excluded_nodes:
            weight = node.input[1]
            assert weight not in producers or producers[weight].op_type != "DequantizeLinear"


def test_empty_calibration_data_is_a_clear_error(trained_mobilenet, tmp_path):
    _model, fp32 = trained_mobilenet
    with pytest.raises(CalibrationDataError, match="calibration data is empty"):
        quantize_int8(fp32, tmp_path / "int8.onnx", np.zeros((0, 1, 8, 8), np.float32))
    assert not (tmp_path / "int8.onnx").exists()


def test_calibration_images_of_the_wrong_shape_are_refused(trained_mobilenet, tmp_path):
    _model, fp32 = trained_mobilenet
    with pytest.raises(CalibrationDataError, match=r"shape \(4, 1, 28, 28\)"):
        quantize_int8(fp32, tmp_path / "int8.onnx", np.zeros((4, 1, 28, 28), np.float32))


def test_corrupt_model_is_a_clear_error(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"\x08\x01garbage")
    with pytest.raises(InvalidInputError, match="not a valid ONNX model"):
        quantize_int8(tmp_path / "model.onnx", tmp_path / "int8.onnx", np.zeros((4, 1, 8, 8), np.float32))


def test_an_op_we_cannot_handle_is_refused(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Sin", ["input"], ["logits"])],
        "sine",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "sine.onnx"))
    with pytest.raises(UnsupportedOperationError, match="Sin"):
        quantize_int8(tmp_path / "sine.onnx", tmp_path / "int8.onnx", np.zeros((4, 4), np.float32))


def test_unknown_calibration_method_names_the_choices(trained_mobilenet, tmp_path):
    _model, fp32 = trained_mobilenet
    with pytest.raises(InvalidInputError, match="entropy") as error:
        quantize_int8(fp32, tmp_path / "int8.onnx", np.zeros((4, 1, 8, 8), np.float32), calibration="dynamic")
    assert error.value.field == "calibration"


def test_qoperator_format_fuses_into_qlinear_ops(trained_mobilenet, digits, tmp_path):
    _model, fp32 = trained_mobilenet
    split, train_x, test_x = digits
    recipe = quantize_int8(fp32, tmp_path / "int8.onnx", train_x[:128], quant_format="qoperator")
    assert "QLinearConv" in op_types(tmp_path / "int8.onnx") and recipe.format == "qoperator"
    fp32_accuracy, _ = evaluate_onnx(fp32, test_x, split.test.y)
    assert evaluate_onnx(tmp_path / "int8.onnx", test_x, split.test.y)[0] >= fp32_accuracy - 0.02


def test_compacted_names_keep_the_input_and_output_names(trained_mobilenet, digits, tmp_path):
    _model, fp32 = trained_mobilenet
    quantize_int8(fp32, tmp_path / "int8.onnx", digits[1][:32])
    graph = onnx.load(str(tmp_path / "int8.onnx")).graph
    assert [v.name for v in graph.input] == ["input"] and [v.name for v in graph.output] == ["logits"]
    assert not any(node.name for node in graph.node)


def test_a_dynamic_quantized_conv_model_is_refused(trained_mobilenet, tmp_path):
    """quantize_dynamic turns convs into ConvInteger, which ORT CPU runs several times slower: never published."""
    from onnxruntime.quantization import quantize_dynamic

    from fedzoo.compress.quantize import check_quantized

    _model, fp32 = trained_mobilenet
    quantize_dynamic(str(fp32), str(tmp_path / "dynamic.onnx"))
    assert "ConvInteger" in op_types(tmp_path / "dynamic.onnx")
    with pytest.raises(UnsupportedOperationError, match="ConvInteger"):
        check_quantized(tmp_path / "dynamic.onnx")


def test_int8_activations_give_signed_quantize_ops(trained_mobilenet, digits, tmp_path):
    _model, fp32 = trained_mobilenet
    recipe = quantize_int8(fp32, tmp_path / "int8.onnx", digits[1][:32], activation_type="int8")
    model = onnx.load(str(tmp_path / "int8.onnx"))
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    zero_points = [initializers[node.input[2]] for node in model.graph.node if node.op_type == "QuantizeLinear"]
    assert recipe.activation_type == "int8" and zero_points
    assert all(tensor.data_type == TensorProto.INT8 for tensor in zero_points)


@pytest.mark.parametrize("recipe_name", DEFAULT_INT8_RECIPES)
def test_default_recipes_are_readable_by_the_latency_predictor(recipe_name, trained_mobilenet, digits, tmp_path):
    """The server costs every published model with the kernel-level predictor; a default INT8 form it cannot
    read would leave INT8 lookups on the fallback."""
    _model, fp32 = trained_mobilenet
    quant_format, activation_type, weight_scales = INT8_RECIPES[recipe_name]
    quantize_int8(fp32, tmp_path / "int8.onnx", digits[1][:32], quant_format=quant_format, activation_type=activation_type,
                  weight_scales=weight_scales)  # fmt: skip
    features = kernel_features(tmp_path / "int8.onnx")
    assert any(key.endswith("/int8") for key in features), sorted(features)


def test_dense_per_tensor_gives_dense_weights_one_scale_and_keeps_depthwise_per_channel(trained_mobilenet, digits, tmp_path):
    _model, fp32 = trained_mobilenet
    split, train_x, test_x = digits
    per_channel, dense_pt = tmp_path / "per-channel.onnx", tmp_path / "dense-pt.onnx"
    quantize_int8(fp32, per_channel, train_x[:128], quant_format="qoperator")
    recipe = quantize_int8(fp32, dense_pt, train_x[:128], quant_format="qoperator", weight_scales="dense-per-tensor")
    model = onnx.load(str(dense_pt))
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    scale_shapes = {  # (group attribute given, weight scale dims) per QLinearConv
        (any(a.name == "group" for a in node.attribute), tuple(initializers[node.input[4]].dims))
        for node in model.graph.node if node.op_type == "QLinearConv"
    }  # fmt: skip
    assert {(False, ())} < scale_shapes and all(dims for grouped, dims in scale_shapes if grouped)
    classifier = next(node for node in model.graph.node if node.op_type == "QGemm")
    assert list(initializers[classifier.input[4]].dims) == list(initializers[classifier.input[5]].dims) == []
    assert recipe.weight_scales == "dense-per-tensor" and dense_pt.stat().st_size < per_channel.stat().st_size
    fp32_accuracy, _ = evaluate_onnx(fp32, test_x, split.test.y)
    assert evaluate_onnx(dense_pt, test_x, split.test.y)[0] >= fp32_accuracy - 0.02


def test_dense_per_tensor_needs_per_channel_depthwise_weights(trained_mobilenet, tmp_path):
    _model, fp32 = trained_mobilenet
    with pytest.raises(InvalidInputError, match="per_channel=True") as error:
        quantize_int8(fp32, tmp_path / "int8.onnx", np.zeros((4, 1, 8, 8), np.float32), per_channel=False, weight_scales="dense-per-tensor")
    assert error.value.field == "weight_scales"
