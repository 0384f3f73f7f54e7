"""Latency estimators: measured ONNX Runtime time, the kernel predictor (when shipped) and the MACs model."""

import itertools
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fedzoo.compress.pruning import prune_channels
from fedzoo.errors import InvalidInputError
from fedzoo.nas.export import export_onnx
from fedzoo.nas.latency import KernelPredictedLatency, MacsLatencyModel, MeasuredOnnxLatency, make_latency_estimator
from fedzoo.nas.space import tiny_space
from fedzoo.nas.subnet import build_subnet, count_macs

torch.set_num_threads(1)
SPACE = tiny_space(8)


def test_measured_latency_is_positive_and_tagged_measured():
    estimator = make_latency_estimator("measured")
    assert isinstance(estimator, MeasuredOnnxLatency) and estimator.source == "measured"
    assert estimator.device_class == "cloud-x86-1t"
    assert estimator.latency_ms(build_subnet(SPACE.min_arch(), 10, 1), (1, 1, 8, 8)) > 0


def test_macs_model_is_deterministic_and_linear_in_macs():
    estimator = MacsLatencyModel(overhead_ms=0.1, ms_per_million_macs=2.0)
    model = build_subnet(SPACE.max_arch(), 10, 1)
    expected = 0.1 + 2.0 * count_macs(model, (1, 1, 8, 8)) / 1e6
    assert estimator.latency_ms(model, (1, 1, 8, 8)) == pytest.approx(expected)
    assert estimator.source == "predicted"


def test_predicted_latency_grows_with_the_subnet():
    estimator = KernelPredictedLatency()  # the reference model ships in the package
    small = estimator.latency_ms(build_subnet(SPACE.min_arch(), 10, 1), (1, 1, 8, 8))
    large = estimator.latency_ms(build_subnet(SPACE.max_arch(), 10, 1), (1, 1, 8, 8))
    assert 0 < small < large


def test_predicted_latency_without_the_reference_model_says_what_to_use_instead(monkeypatch):
    from fedzoo.edge.latency_predictor import KernelLatencyPredictor

    def missing(*args, **kwargs):
        raise FileNotFoundError("reference_latency_model.json")

    monkeypatch.setattr(KernelLatencyPredictor, "load", missing)
    with pytest.raises(InvalidInputError, match="use 'measured'") as refused:
        KernelPredictedLatency()
    assert refused.value.field == "latency_source"


def _predicted_on_export(estimator, model):
    with tempfile.TemporaryDirectory() as folder:
        export_onnx(model, (1, 1, 8, 8), Path(folder) / "subnet.onnx")
        return estimator.predictor.predict_ms(Path(folder) / "subnet.onnx")


def test_predicted_latency_from_the_part_table_equals_the_prediction_on_the_export():
    estimator = KernelPredictedLatency()
    depth = SPACE.max_depth
    width_sets = [[SPACE.stage_widths(stage)[choice] for stage in range(3)] for choice in range(len(SPACE.width_choices))]
    # every part of the archs whose stages all take the same width choice, once
    for kernel, ratio, widths in itertools.product(SPACE.kernel_choices, SPACE.expand_ratio_choices, width_sets):
        uniform = SPACE.make_arch([depth] * 3, [[kernel] * depth] * 3, [[ratio] * depth] * 3, widths)
        estimator.latency_ms(build_subnet(uniform, 10, 1), (1, 1, 8, 8))
    filled = estimator.exports
    assert filled == len(SPACE.kernel_choices) * len(SPACE.expand_ratio_choices) * len(width_sets)
    rng = np.random.default_rng(3)
    sampled = [SPACE.sample_arch(rng) for _ in range(4)]
    for arch, widths in zip(sampled, rng.permutation(width_sets + width_sets)):  # one width choice per arch
        for stage, width in zip(arch["stages"], widths):
            stage["out_channels"] = int(width)
    for arch in [SPACE.min_arch()] + sampled:
        model = build_subnet(arch, 10, 1).eval()
        assert estimator.latency_ms(model, (1, 1, 8, 8)) == pytest.approx(_predicted_on_export(estimator, model), rel=1e-9)
    assert estimator.exports == filled  # none of them was exported to be estimated
    # a pruned subnet has parts of other shapes: they are keyed apart, not mistaken for the unpruned ones
    unpruned = build_subnet(SPACE.max_arch(), 10, 1).eval()
    pruned = prune_channels(unpruned, (1, 1, 8, 8), 0.5).model.eval()
    assert estimator.latency_ms(pruned, (1, 1, 8, 8)) == pytest.approx(_predicted_on_export(estimator, pruned), rel=1e-9)
    assert estimator.latency_ms(pruned, (1, 1, 8, 8)) < estimator.latency_ms(unpruned, (1, 1, 8, 8))


def test_unknown_latency_source_is_refused():
    with pytest.raises(InvalidInputError, match="unknown latency source 'guess'"):
        make_latency_estimator("guess")
