"""A device fleet emulated on one machine, so latency predictors and lookups can be tested across devices.

Each `DeviceClass` is this machine restricted: onnxruntime intra-op threads, CPU affinity
(`os.sched_setaffinity`, what `taskset` does), the runtime's graph optimisation level (at "extended" the
x86-only NCHWc conv kernels are off, as on an ARM build: a device whose fp32 depthwise convs are several
times slower) and, where the kernel lets us, a CPU quota (a cgroup's `cpu.cfs_quota_us` under cgroup v1,
`cpu.max` under v2) over `QUOTA_PERIOD_US` periods. A sub-millisecond inference under a quota either fits
in what is left of the period's quota (and runs at full speed) or waits out the throttled rest of the period,
so the median of single runs measured the unrestricted machine plus noise (a class's re-measurement agreed
within 10% on only 60% of the zoo). So on a quota class every timed sample is the mean of back-to-back
runs that use `QUOTA_SAMPLE_PERIODS` periods' worth of quota: the sample then sees the device's sustained
speed (a half-core class measured a median 1.9-2.0x slower than the unrestricted core on 48 zoo models, as
a half-core should; its re-measurement agreed within 10% on 79% of them at load 4-6).

Every measurement runs in a fresh worker subprocess that puts itself under the restrictions *before*
onnxruntime starts its thread pool (optionally at real-time priority, so the other processes of a shared
machine do not preempt timed runs), times the models in interleaved rounds (see
`benchmark_models_interleaved`) and returns JSON on stdout.

What works where: affinity needs Linux; a quota needs root and a writable cpu controller. When a class asks
for a quota that cannot be applied, `run_on_device_class` raises `FleetError` saying why (`quota_support()`
tells in advance), rather than silently measuring an unrestricted machine under that class's name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from fedzoo.errors import FedzooError

if TYPE_CHECKING:  # the worker must import onnxruntime only after restricting itself
    from fedzoo.edge.benchmark import LatencyMeasurement

CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_V2_ROOT = Path("/sys/fs/cgroup")
# The kernel's default CFS period. Shorter periods (down to its 1 ms minimum) are enforced only roughly:
# the scheduler hands out quota in 5 ms slices (sched_cfs_bandwidth_slice_us).
QUOTA_PERIOD_US = 10_000
QUOTA_SAMPLE_PERIODS = 10  # a timed sample on a quota class uses this many periods' worth of quota
MIN_QUOTA_US = 1000  # the kernel's smallest quota


class FleetError(FedzooError):
    """A device class cannot be emulated here, or its worker failed."""


@dataclass(frozen=True)
class DeviceClass:
    """One kind of device: how many threads the runtime uses, which CPUs it may run on, what CPU share."""

    name: str
    threads: int = 1
    cpus: tuple[int, ...] | None = None  # None: every CPU of this machine
    cpu_quota: float | None = None  # fraction of one CPU per period, e.g. 0.5; None: unlimited
    graph_optimization: str = "all"  # "extended" drops the x86 NCHWc kernels, like runtimes on ARM


DEFAULT_FLEET: tuple[DeviceClass, ...] = (
    DeviceClass("x86-1core-1t", threads=1, cpus=(0,)),
    DeviceClass("x86-2core-2t", threads=2, cpus=(0, 1)),
    DeviceClass("x86-1core-1t-no-nchwc", threads=1, cpus=(1,), graph_optimization="extended"),
    DeviceClass("x86-halfcore-1t", threads=1, cpus=(1,), cpu_quota=0.5),
)


def quota_support() -> str | None:
    """None if CPU quotas can be applied here; otherwise the reason they cannot."""
    if _cgroup_v1_available():
        return None
    if _cgroup_v2_available():
        return None
    return (
        "no writable cgroup cpu controller (need root and /sys/fs/cgroup/cpu/cpu.cfs_quota_us for v1 "
        "or 'cpu' in /sys/fs/cgroup/cgroup.controllers for v2)"
    )


def available_fleet(fleet: tuple[DeviceClass, ...] = DEFAULT_FLEET) -> tuple[tuple[DeviceClass, ...], list[str]]:
    """The classes of `fleet` this machine can emulate, and a statement for each one left out."""
    cpus = set(os.sched_getaffinity(0))
    kept, dropped = [], []
    quota_problem = quota_support()
    for device_class in fleet:
        if device_class.cpus is not None and not set(device_class.cpus) <= cpus:
            dropped.append(f"{device_class.name}: needs CPUs {device_class.cpus}, this machine has {sorted(cpus)}")
        elif device_class.cpu_quota is not None and quota_problem:
            dropped.append(f"{device_class.name}: CPU quota unavailable: {quota_problem}")
        else:
            kept.append(device_class)
    return tuple(kept), dropped


def run_on_device_class(
    device_class: DeviceClass,
    models: Mapping[str, bytes | str | Path],
    rounds: int = 5,
    runs_per_round: int = 20,
    warmup_runs: int = 10,
    timeout_s: float = 600.0,
    realtime: bool = False,
) -> dict[str, LatencyMeasurement]:
    """Latency of each model (bytes or a path) measured on `device_class`, in a restricted worker process.

    `realtime` runs the worker at SCHED_FIFO priority (root only) so other processes on a shared machine do
    not preempt the timed runs; it is not applied to a class with a CPU quota, which real-time tasks escape."""
    cgroup = _make_cgroup(device_class) if device_class.cpu_quota is not None else None
    try:
        with tempfile.TemporaryDirectory() as folder:
            paths = {}
            for index, (name, model) in enumerate(models.items()):
                if isinstance(model, (bytes, bytearray)):
                    path = Path(folder) / f"{index}.onnx"
                    path.write_bytes(model)
                    paths[name] = str(path)
                else:
                    paths[name] = str(Path(model).resolve())  # a path handed to a subprocess is absolute
            job = {
                "threads": device_class.threads,
                "cpus": list(device_class.cpus) if device_class.cpus is not None else None,
                "cgroup_procs": str(cgroup / "cgroup.procs") if cgroup else None,
                "models": paths,
                "rounds": rounds,
                "runs_per_round": runs_per_round,
                "warmup_runs": warmup_runs,
                "graph_optimization": device_class.graph_optimization,
                "realtime": realtime and device_class.cpu_quota is None,
                "min_sample_ms": quota_sample_ms(device_class),
            }
            completed = subprocess.run(
                [sys.executable, "-m", "fedzoo.edge.fleet"],
                input=json.dumps(job),
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
    finally:
        if cgroup is not None:
            _remove_cgroup(cgroup)
    from fedzoo.edge.benchmark import LatencyMeasurement

    if completed.returncode != 0:
        raise FleetError(f"worker for device class {device_class.name!r} failed: {completed.stderr.strip()[-2000:]}")
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    if device_class.cpus is not None and set(report["affinity"]) != set(device_class.cpus):
        raise FleetError(f"worker for {device_class.name!r} ran on CPUs {report['affinity']}, not {device_class.cpus}")
    return {
        name: LatencyMeasurement(**{**values, "input_shape": tuple(values["input_shape"])})
        for name, values in report["measurements"].items()
    }


def quota_sample_ms(device_class: DeviceClass) -> float:
    """CPU time each timed sample must span on `device_class` (0: single runs): QUOTA_SAMPLE_PERIODS quotas."""
    if device_class.cpu_quota is None:
        return 0.0
    return QUOTA_SAMPLE_PERIODS * device_class.cpu_quota * QUOTA_PERIOD_US / 1000.0


def _cgroup_v1_available() -> bool:
    return os.access(CGROUP_V1_CPU / "cpu.cfs_quota_us", os.W_OK) and os.access(CGROUP_V1_CPU, os.W_OK)


def _cgroup_v2_available() -> bool:
    controllers = CGROUP_V2_ROOT / "cgroup.controllers"
    try:
        return "cpu" in controllers.read_text().split() and os.access(CGROUP_V2_ROOT, os.W_OK)
    except OSError:
        return False


def _make_cgroup(device_class: DeviceClass) -> Path:
    """A fresh cgroup limited to `cpu_quota` CPUs per QUOTA_PERIOD_US."""
    problem = quota_support()
    if problem:
        raise FleetError(f"device class {device_class.name!r} needs a CPU quota, but {problem}")
    period_us = QUOTA_PERIOD_US
    quota_us = max(MIN_QUOTA_US, int(round(float(device_class.cpu_quota) * period_us)))  # type: ignore[arg-type]
    name = f"fedzoo-{device_class.name}-{os.getpid()}"
    try:
        if _cgroup_v1_available():
            cgroup = CGROUP_V1_CPU / name
            cgroup.mkdir(exist_ok=True)
            (cgroup / "cpu.cfs_period_us").write_text(str(period_us))
            (cgroup / "cpu.cfs_quota_us").write_text(str(quota_us))
        else:
            cgroup = CGROUP_V2_ROOT / name
            cgroup.mkdir(exist_ok=True)
            (cgroup / "cpu.max").write_text(f"{quota_us} {period_us}")
    except OSError as error:
        raise FleetError(f"cannot set a CPU quota for {device_class.name!r}: {error}") from None
    return cgroup


def _remove_cgroup(cgroup: Path) -> None:
    try:
        cgroup.rmdir()
    except OSError:
        pass  # a worker is still exiting; an empty leftover cgroup limits nothing


def _worker() -> None:
    """Subprocess entry: restrict this process, then time the models and print the results as JSON."""
    job = json.loads(sys.stdin.read())
    if job["cgroup_procs"]:
        Path(job["cgroup_procs"]).write_text(str(os.getpid()))
    if job["cpus"] is not None:
        os.sched_setaffinity(0, set(job["cpus"]))
    if job["realtime"]:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except PermissionError:
            sys.exit("real-time priority (SCHED_FIFO) needs root; run without realtime=True")
    from fedzoo.edge.benchmark import benchmark_models_interleaved  # imports onnxruntime after the restrictions

    measurements = benchmark_models_interleaved(
        job["models"], job["threads"], job["rounds"], job["runs_per_round"], job["warmup_runs"],
        job["graph_optimization"], min_sample_ms=job["min_sample_ms"],
    )
    print(json.dumps({
        "affinity": sorted(os.sched_getaffinity(0)),
        "measurements": {name: measurement.to_dict() for name, measurement in measurements.items()},
    }))


if __name__ == "__main__":
    _worker()
