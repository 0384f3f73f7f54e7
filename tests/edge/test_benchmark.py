"""The latency benchmark and the device profile, on real onnxruntime sessions."""

from __future__ import annotations

import pytest

from fedzoo.device import DeviceProfile
from fedzoo.edge.benchmark import benchmark_model, benchmark_models_interleaved
from fedzoo.edge.calibration_models import CALIBRATION_MODEL_NAMES, calibration_model
from fedzoo.edge.device_profile import collect_device_profile, cpu_model, memory_mb
from fedzoo.errors import InvalidInputError


def test_benchmark_reports_consistent_statistics() -> None:
    measurement = benchmark_model(calibration_model("cal-tiny-fp32"), threads=1, warmup_runs=2, timed_runs=15)
    assert measurement.runs == 15 and measurement.threads == 1 and measurement.warmup_runs == 2
    assert 0 < measurement.min_ms <= measurement.median_ms <= measurement.p90_ms <= measurement.max_ms
    assert measurement.input_shape == (1, 1, 8, 8)
    assert measurement.to_dict()["graph_optimization"] == "all"


def test_benchmark_takes_a_batch_shape_and_rejects_one_that_does_not_fit() -> None:
    model = calibration_model("cal-tiny-fp32")
    assert benchmark_model(model, timed_runs=3, input_shape=(4, 1, 8, 8)).input_shape == (4, 1, 8, 8)
    with pytest.raises(InvalidInputError, match=r"input_shape \[1, 3, 8, 8\] does not fit"):
        benchmark_model(model, timed_runs=3, input_shape=(1, 3, 8, 8))
    with pytest.raises(InvalidInputError, match="timed_runs >= 1"):
        benchmark_model(model, timed_runs=0)


def test_benchmark_accepts_a_path(tmp_path) -> None:
    path = tmp_path / "tiny.onnx"
    path.write_bytes(calibration_model("cal-tiny-int8"))
    assert benchmark_model(path, timed_runs=3).median_ms > 0


def test_interleaved_benchmark_measures_every_model() -> None:
    models = {name: calibration_model(name) for name in ("cal-tiny-fp32", "cal-dense-fp32")}
    results = benchmark_models_interleaved(models, threads=1, rounds=3, runs_per_round=2, warmup_runs=1)
    assert set(results) == set(models)
    assert all(result.runs == 6 for result in results.values())
    # The dense model does ~100x the MACs of the tiny one: it cannot be faster.
    assert results["cal-dense-fp32"].median_ms > results["cal-tiny-fp32"].median_ms


def test_a_minimum_sample_time_averages_back_to_back_runs_per_sample() -> None:
    models = {"tiny": calibration_model("cal-tiny-fp32")}
    single = benchmark_models_interleaved(models, rounds=2, runs_per_round=2, warmup_runs=3)["tiny"]
    averaged = benchmark_models_interleaved(models, rounds=2, runs_per_round=2, warmup_runs=3, min_sample_ms=5.0)["tiny"]
    assert single.runs_per_sample == 1 and averaged.runs == 4
    # cal-tiny runs in well under a millisecond: 5 ms of runs is many of them, each sample their mean.
    assert averaged.runs_per_sample >= 5.0 / (3 * single.median_ms)
    assert averaged.median_ms < 5.0


def test_device_profile_describes_this_machine(tmp_path) -> None:
    models = {name: calibration_model(name) for name in CALIBRATION_MODEL_NAMES[:2]}
    profile = collect_device_profile("bench-device", threads=1, device_class="x86-1t", calibration_models=models)
    assert isinstance(profile, DeviceProfile)
    assert [b.model for b in profile.benchmarks] == list(models)
    assert all(b.median_ms > 0 and b.p90_ms >= b.median_ms for b in profile.benchmarks)
    assert profile.cpu.cores >= 1 and profile.memory_mb > 0
    assert profile.runtime.threads == 1 and profile.runtime.onnxruntime.count(".") >= 1
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU 9000\n")
    assert cpu_model(cpuinfo) == "Test CPU 9000"
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:        2048000 kB\n")
    assert memory_mb(meminfo) == 2000
