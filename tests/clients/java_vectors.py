"""Golden vectors for the Java SDK, written by the Python SDK itself.

The Java build runs this script before its tests (JUnit calls `$FEDZOO_PYTHON tests/clients/java_vectors.py
--out DIR` once per test run), so the vectors always come from the Python code of the same checkout, never
from a stale copy. What it writes (every file read by `clients/java/fedzoo-client/src/test`):

- `model.onnx`, `training_graph.onnx`, `card.json`: a digits MLP, its standard-op training graph and card;
- `batch.npz` (normalised `x`, `y`) and `trainer.npz` (`loss`, `grad.<name>` of Python's Trainer on it);
- `optimizer.npz`: start parameters `param.<name>`, recorded gradients `grad<step>.<name>`, and the
  parameters after every step of each optimizer in `OPTIMIZER_CASES` (`<case>.<step>.<name>`);
- `local.npz` + `local.json`: a device's shard (`x` in [0, 1], `y`), the batch orders Python's
  `train_locally` draws (`order<epoch>`), the training config and the resulting delta (`delta.<name>`) and
  metrics, for each case in `LOCAL_CASES` (the `batch_norm` case trains `bn_model.onnx` with `bn_graph.onnx`);
- `codec_delta.npz` (a float32 delta) with `codec_fp32.npz` / `codec_int8.npz`, Python's encodings of it;
- `calibration/<name>.onnx`: calibration models a device times for its profile;
- `bn_model.onnx` + `bn_graph.onnx` (a conv net whose BatchNorm trains with batch statistics, `batch_norm="training"`)
  and `mse_graph.onnx` (the MLP with an `mse` loss, float32 `y`), with `graphs.npz`: their batches and, after each of
  `GRAPH_STEPS` Python trainer steps, the loss, the parameters and the running statistics (`<case>.<step>.<name>`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fedzoo.graphs.autodiff import build_training_graph
from fedzoo.datasets import load_dataset, split_dataset
from fedzoo.cloud.mlp import mlp_classifier
from fedzoo.cards import Normalisation
from fedzoo.edge.local_training import LocalData, normalise, train_locally
from fedzoo.update_codec import encode_update
from fedzoo.edge.calibration_models import calibration_model
from fedzoo.edge.onnx_initializers import read_float_initializers
from fedzoo.edge.optimizers import SGD, Adam
from fedzoo.edge.trainer import Trainer

OPTIMIZER_STEPS = 5
OPTIMIZER_CASES = {
    "sgd": lambda: SGD(0.1),
    "sgd_momentum": lambda: SGD(0.05, momentum=0.9),
    "sgd_nesterov_decay": lambda: SGD(0.05, momentum=0.8, weight_decay=1e-3, nesterov=True),
    "adam": lambda: Adam(0.01),
    "adam_decay": lambda: Adam(0.003, betas=(0.8, 0.99), epsilon=1e-6, weight_decay=1e-2),
}
LOCAL_CASES = {
    "sgd_momentum_fedprox": {"local_epochs": 2, "batch_size": 16, "learning_rate": 0.05, "optimizer": "sgd",
                             "momentum": 0.9, "proximal_mu": 0.5},
    "adam": {"local_epochs": 2, "batch_size": 32, "learning_rate": 0.01, "optimizer": "adam", "momentum": 0.0},
    # the BatchNorm model in training mode: the delta carries the running statistics as `running.<name>`
    "batch_norm": {"local_epochs": 1, "batch_size": 16, "learning_rate": 0.05, "optimizer": "sgd", "momentum": 0.9},
}
CALIBRATION_MODELS = ("cal-tiny-fp32",)
GRAPH_STEPS = 3


def conv_batchnorm_classifier(seed: int) -> onnx.ModelProto:
    """Conv 3x3 (4 filters) → BatchNormalization → Relu → GlobalAveragePool → Flatten → Gemm, on 1x8x8 digits."""
    rng = np.random.default_rng(seed)
    initializers = [
        numpy_helper.from_array((rng.normal(size=(4, 1, 3, 3)) * 0.5).astype(np.float32), "conv.weight"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 4).astype(np.float32), "bn.weight"),
        numpy_helper.from_array(rng.normal(size=4).astype(np.float32) * 0.1, "bn.bias"),
        numpy_helper.from_array(rng.normal(size=4).astype(np.float32) * 0.1, "bn.running_mean"),
        numpy_helper.from_array(rng.uniform(0.5, 2.0, 4).astype(np.float32), "bn.running_var"),
        numpy_helper.from_array((rng.normal(size=(4, 10)) * 0.5).astype(np.float32), "fc.weight"),
        numpy_helper.from_array(np.zeros(10, np.float32), "fc.bias"),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "conv.weight"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["conv", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
                         ["normalised"], epsilon=1e-5, momentum=0.9),
        helper.make_node("Relu", ["normalised"], ["activated"]),
        helper.make_node("GlobalAveragePool", ["activated"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"]),
    ]
    graph = helper.make_graph(nodes, "conv-bn", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _graph_steps(trainer: Trainer, batches: list[tuple[np.ndarray, np.ndarray]], case: str) -> dict[str, np.ndarray]:
    """The loss and the state after each step of `trainer` over `batches`, keyed `<case>.<step>.<name>`."""
    arrays = {}
    for step, (x, y) in enumerate(batches):
        arrays[f"{case}.{step}.loss"] = np.float32(trainer.step(x, y))
        arrays.update({f"{case}.{step}.{k}": v.copy() for k, v in {**trainer.parameters, **trainer.statistics}.items()})
    return arrays


def _npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    np.savez(path, **arrays)


def write_vectors(out: Path, seed: int = 0) -> None:
    out.mkdir(parents=True, exist_ok=True)
    split = split_dataset(load_dataset("digits"), seed=seed)
    model_proto = mlp_classifier(split.dataset.image_shape, 16, split.dataset.num_classes, seed)
    model = model_proto.SerializeToString()
    graph = build_training_graph(model_proto).SerializeToString()
    (out / "model.onnx").write_bytes(model)
    (out / "training_graph.onnx").write_bytes(graph)
    card = {"id": "digits-mlp16-v1", "family": "digits-mlp16", "version": 1, "task": "digits", "sha256": "0" * 64,
            "input": {"name": "input", "shape": ["batch", *split.dataset.image_shape], "dtype": "float32",
                      "normalisation": {"mean": list(split.mean), "std": list(split.std)}},
            "labels": list(split.dataset.labels)}
    (out / "card.json").write_text(json.dumps(card))
    normalisation = Normalisation(mean=list(split.mean), std=list(split.std))

    # one batch: the trainer's loss and gradients
    x = normalise(split.train.x[:32], normalisation)
    y = split.train.y[:32]
    _npz(out / "batch.npz", {"x": x, "y": y})
    trainer = Trainer.from_inference_model(graph, model, SGD(0.1))
    loss, gradients = trainer.loss_and_gradients(x, y)
    _npz(out / "trainer.npz", {"loss": np.float32(loss), **{f"grad.{k}": v for k, v in gradients.items()}})

    # optimizer steps from recorded gradients
    rng = np.random.default_rng(seed)
    start = read_float_initializers(model)
    recorded = [{name: rng.normal(scale=0.5, size=value.shape).astype(np.float32) for name, value in start.items()}
                for _ in range(OPTIMIZER_STEPS)]
    arrays = {f"param.{k}": v for k, v in start.items()}
    for step, step_gradients in enumerate(recorded):
        arrays.update({f"grad{step}.{k}": v for k, v in step_gradients.items()})
    for case, make in OPTIMIZER_CASES.items():
        optimizer, parameters = make(), {k: v.copy() for k, v in start.items()}
        for step, step_gradients in enumerate(recorded):
            optimizer.step(parameters, {k: v.copy() for k, v in step_gradients.items()})
            arrays.update({f"{case}.{step}.{k}": v.copy() for k, v in parameters.items()})
    _npz(out / "optimizer.npz", arrays)

    bn_model = conv_batchnorm_classifier(seed).SerializeToString()
    bn_graph = build_training_graph(onnx.load_from_string(bn_model), batch_norm="training").SerializeToString()

    # one device's local training, with the batch orders train_locally draws from its seed
    shard = split.train.x[32:232], split.train.y[32:232]
    data = LocalData(*shard)
    card_object = SimpleNamespace(input=SimpleNamespace(normalisation=normalisation))  # all train_locally reads
    local_arrays = {"x": shard[0], "y": shard[1]}
    local_json = {}
    for case, training in LOCAL_CASES.items():
        local_seed = 7
        orders = np.random.default_rng(local_seed)
        for epoch in range(training["local_epochs"]):
            local_arrays[f"{case}.order{epoch}"] = orders.permutation(len(shard[1])).astype(np.int64)
        case_graph, case_model = (bn_graph, bn_model) if case == "batch_norm" else (graph, model)
        delta, metrics = train_locally(case_graph, case_model, card_object, training, data, seed=local_seed)
        local_arrays.update({f"{case}.delta.{k}": v for k, v in delta.items()})
        local_json[case] = {"training": training, "metrics": metrics}
    _npz(out / "local.npz", local_arrays)
    (out / "local.json").write_text(json.dumps(local_json))

    # the update codec: one delta, Python's two encodings of it
    delta = {name: (rng.normal(size=value.shape) * 10.0 ** rng.uniform(-4, 0)).astype(np.float32)
             for name, value in start.items()}
    delta["fc2.bias"][3] = 0.0
    _npz(out / "codec_delta.npz", delta)
    (out / "codec_fp32.npz").write_bytes(encode_update(delta, "fp32"))
    (out / "codec_int8.npz").write_bytes(encode_update(delta, "int8"))

    # graphs beyond cross-entropy on folded weights: BatchNorm in training mode, and an mse loss on float targets
    mse_graph = build_training_graph(model_proto, loss="mse").SerializeToString()
    (out / "bn_model.onnx").write_bytes(bn_model)
    (out / "bn_graph.onnx").write_bytes(bn_graph)
    (out / "mse_graph.onnx").write_bytes(mse_graph)
    features = normalise(split.train.x[:GRAPH_STEPS * 16], normalisation)
    labels = split.train.y[:GRAPH_STEPS * 16]
    one_hot = np.eye(10, dtype=np.float32)[labels]
    graph_arrays = {"x": features, "y": labels, "y_one_hot": one_hot}
    graph_arrays.update(_graph_steps(Trainer.from_inference_model(bn_graph, bn_model, SGD(0.05, momentum=0.9)),
                                     [(features[i * 16:(i + 1) * 16], labels[i * 16:(i + 1) * 16]) for i in range(GRAPH_STEPS)],
                                     "bn"))
    graph_arrays.update(_graph_steps(Trainer.from_inference_model(mse_graph, model, Adam(0.01)),
                                     [(features[i * 16:(i + 1) * 16], one_hot[i * 16:(i + 1) * 16]) for i in range(GRAPH_STEPS)],
                                     "mse"))
    _npz(out / "graphs.npz", graph_arrays)

    (out / "calibration").mkdir(exist_ok=True)
    for name in CALIBRATION_MODELS:
        (out / "calibration" / f"{name}.onnx").write_bytes(calibration_model(name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory to write the vectors into")
    write_vectors(parser.parse_args().out)


if __name__ == "__main__":
    main()
