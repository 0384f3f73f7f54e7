import numpy as np
import onnx
import pytest
import torch
from models import PlainNet, TinyMobileNet, randomise_batchnorm

from fedzoo.nas.export import (
    OPSET,
    ExportMismatchError,
    assert_equivalent,
    export_checked,
    export_onnx,
    load_onnx_file,
    max_abs_difference,
    onnx_outputs,
)
from fedzoo.errors import InvalidInputError

SHAPE = (1, 1, 8, 8)
TOLERANCE = 1e-5


@pytest.mark.parametrize("network", [TinyMobileNet, PlainNet])
def test_export_folds_batchnorm_and_matches_torch(network, tmp_path):
    model = randomise_batchnorm(network())
    proto = export_onnx(model, SHAPE, tmp_path / "model.onnx")
    op_types = {node.op_type for node in proto.graph.node}
    assert "BatchNormalization" not in op_types and "Conv" in op_types
    assert OPSET >= 17 and proto.opset_import[0].version == OPSET
    onnx.checker.check_model(proto, full_check=True)
    assert all(value.type.tensor_type.HasField("shape") for value in proto.graph.value_info)  # shapes inferred
    inputs = np.random.default_rng(0).normal(size=(16, *SHAPE[1:])).astype(np.float32)
    assert max_abs_difference(model, tmp_path / "model.onnx", inputs) <= TOLERANCE


def test_batch_dimension_is_symbolic(tmp_path):
    model = randomise_batchnorm(TinyMobileNet())
    proto = export_onnx(model, SHAPE, tmp_path / "model.onnx")
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert onnx_outputs(tmp_path / "model.onnx", np.zeros((5, *SHAPE[1:]), np.float32)).shape == (5, 10)


def test_export_leaves_the_training_mode_as_it_was(tmp_path):
    model = TinyMobileNet().train()
    export_onnx(model, SHAPE, tmp_path / "model.onnx")
    assert model.training


def test_a_file_that_computes_something_else_is_caught(tmp_path):
    model = randomise_batchnorm(TinyMobileNet())
    path = tmp_path / "model.onnx"
    export_checked(model, SHAPE, path, np.ones((2, *SHAPE[1:]), np.float32))
    with torch.no_grad():
        model.classifier.bias += 0.01
    with pytest.raises(ExportMismatchError, match="differs from the torch model"):
        assert_equivalent(model, path, np.ones((2, *SHAPE[1:]), np.float32))


def test_non_onnx_truncated_and_missing_files_are_clear_errors(tmp_path):
    good = tmp_path / "good.onnx"
    export_onnx(TinyMobileNet(), SHAPE, good)
    (tmp_path / "text.onnx").write_text("this is not a model")
    (tmp_path / "truncated.onnx").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    for name in ("text.onnx", "truncated.onnx", "missing.onnx"):
        with pytest.raises(InvalidInputError, match=name) as error:
            load_onnx_file(tmp_path / name)
        assert error.value.field == "model"
    assert load_onnx_file(good).graph.node
