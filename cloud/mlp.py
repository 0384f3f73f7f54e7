"""The federated simulation's model: a small MLP classifier built directly as ONNX.

Its own module so that what only needs the model (the Java SDK's golden vectors) does not import the simulation,
which brings the server and the SDK with it.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def mlp_classifier(input_shape: tuple[int, int, int], hidden_units: int, num_classes: int, seed: int = 0) -> onnx.ModelProto:
    """A two-layer perceptron (Flatten, Gemm, Relu, Gemm) as ONNX, He-initialised: small enough for many clients."""
    rng = np.random.default_rng(seed)
    features = int(np.prod(input_shape))
    initializers = [
        numpy_helper.from_array((rng.normal(size=(features, hidden_units)) * math.sqrt(2 / features)).astype(np.float32),
                                "fc1.weight"),
        numpy_helper.from_array(np.zeros(hidden_units, np.float32), "fc1.bias"),
        numpy_helper.from_array((rng.normal(size=(hidden_units, num_classes)) * math.sqrt(1 / hidden_units))
                                .astype(np.float32), "fc2.weight"),
        numpy_helper.from_array(np.zeros(num_classes, np.float32), "fc2.bias"),
    ]
    nodes = [
        helper.make_node("Flatten", ["input"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fc1.weight", "fc1.bias"], ["hidden"]),
        helper.make_node("Relu", ["hidden"], ["activated"]),
        helper.make_node("Gemm", ["activated", "fc2.weight", "fc2.bias"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", *input_shape])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", num_classes])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
