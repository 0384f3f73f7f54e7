"""The device profile: what a device tells the server about itself when it registers (see docs/design.md)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fedzoo.cards import IDENTIFIER_PATTERN


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CpuInfo(_Strict):
    model: str = Field(min_length=1, max_length=200)
    cores: int = Field(ge=1, le=1024)


class RuntimeInfo(_Strict):
    onnxruntime: str = Field(min_length=1, max_length=50, description="onnxruntime version")
    threads: int = Field(ge=1, le=1024, description="intra-op threads the device runs models with")


# A calibration run takes microseconds at the very least and never minutes: timings outside this range are
# measurement errors (or attacks) whose ratios to the reference (1e308 ms, 5e-324 ms) overflow or vanish.
MIN_CALIBRATION_MS = 1e-3
MAX_CALIBRATION_MS = 600_000.0


class CalibrationBenchmark(_Strict):
    """One calibration model the device ran, and how long it took (batch 1)."""

    model: str = Field(min_length=1, max_length=128, description="calibration model name")
    median_ms: float = Field(ge=MIN_CALIBRATION_MS, le=MAX_CALIBRATION_MS)
    p90_ms: float | None = Field(default=None, ge=MIN_CALIBRATION_MS, le=MAX_CALIBRATION_MS)


class DeviceProfile(_Strict):
    """Identity, hardware and runtime of a device, plus its measured calibration benchmarks."""

    device_id: str = Field(pattern=IDENTIFIER_PATTERN)
    platform: str = Field(min_length=1, max_length=100, description="e.g. linux-x86_64, android-arm64")
    device_class: str | None = Field(default=None, pattern=IDENTIFIER_PATTERN, description="fleet class, if known")
    cpu: CpuInfo
    memory_mb: int = Field(ge=1)
    runtime: RuntimeInfo
    benchmarks: list[CalibrationBenchmark] = Field(default_factory=list, max_length=64)
