"""Latency estimators: measured ONNX Runtime time, the kernel predictor (when shipped) and the MACs model."""

import pytest
import torch

from fedzoo.errors import InvalidInputError
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


def test_predicted_latency_works_or_says_what_is_missing():
    try:
        estimator = KernelPredictedLatency()
    except InvalidInputError as error:
        assert "use 'measured'" in str(error) and error.field == "latency_source"
        return
    small = estimator.latency_ms(build_subnet(SPACE.min_arch(), 10, 1), (1, 1, 8, 8))
    large = estimator.latency_ms(build_subnet(SPACE.max_arch(), 10, 1), (1, 1, 8, 8))
    assert 0 < small < large


def test_unknown_latency_source_is_refused():
    with pytest.raises(InvalidInputError, match="unknown latency source 'guess'"):
        make_latency_estimator("guess")
