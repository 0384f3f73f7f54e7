"""This device's profile, as sent to the server at registration: CPU model and usable cores, memory,
onnxruntime version and threads, and the timings of the calibration models (from which the server's latency
predictor adapts itself to this device; see `fedzoo.edge.latency_predictor`)."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Mapping

import onnxruntime as ort

from fedzoo.device import CalibrationBenchmark, CpuInfo, DeviceProfile, RuntimeInfo
from fedzoo.edge.benchmark import benchmark_model

CALIBRATION_WARMUP_RUNS = 10
CALIBRATION_TIMED_RUNS = 60


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's marketing name ("model name" in /proc/cpuinfo), else what the platform module reports."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "Processor") and value.strip():
                return value.strip()[:200]
    except OSError:
        pass
    return (platform.processor() or platform.machine() or "unknown")[:200]


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), which is what a pinned device class sees."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def memory_mb(meminfo: Path = Path("/proc/meminfo")) -> int:
    """Total memory in MiB (MemTotal), else from sysconf."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return max(1, int(line.split()[1]) // 1024)
    except (OSError, ValueError, IndexError):
        pass
    return max(1, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024))


def calibration_benchmarks(
    threads: int = 1,
    models: Mapping[str, bytes] | None = None,
    warmup_runs: int = CALIBRATION_WARMUP_RUNS,
    timed_runs: int = CALIBRATION_TIMED_RUNS,
) -> list[CalibrationBenchmark]:
    """Time each calibration model (given as bytes, e.g. downloaded; else built here, which needs onnx)."""
    if models is None:
        from fedzoo.edge.calibration_models import calibration_models

        models = calibration_models()
    results = []
    for name, model in models.items():
        measurement = benchmark_model(model, threads=threads, warmup_runs=warmup_runs, timed_runs=timed_runs)
        results.append(CalibrationBenchmark(model=name, median_ms=measurement.median_ms, p90_ms=measurement.p90_ms))
    return results


def collect_device_profile(
    device_id: str,
    threads: int = 1,
    device_class: str | None = None,
    run_calibration: bool = True,
    calibration_models: Mapping[str, bytes] | None = None,
) -> DeviceProfile:
    """The profile of this device, with calibration timings unless `run_calibration` is False."""
    benchmarks = calibration_benchmarks(threads, calibration_models) if run_calibration else []
    return DeviceProfile(
        device_id=device_id,
        platform=f"{platform.system().lower()}-{platform.machine().lower()}",
        device_class=device_class,
        cpu=CpuInfo(model=cpu_model(), cores=usable_cores()),
        memory_mb=memory_mb(),
        runtime=RuntimeInfo(onnxruntime=ort.__version__, threads=threads),
        benchmarks=benchmarks,
    )
