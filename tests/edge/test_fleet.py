"""The device fleet emulator: restricted worker processes, and what this machine can emulate."""

from __future__ import annotations

import os

import pytest

from fedzoo.edge.calibration_models import calibration_model
from fedzoo.edge.fleet import (
    CGROUP_V1_CPU,
    QUOTA_PERIOD_US,
    QUOTA_SAMPLE_PERIODS,
    DeviceClass,
    FleetError,
    available_fleet,
    quota_sample_ms,
    quota_support,
    run_on_device_class,
)

MODELS = {"tiny": calibration_model("cal-tiny-fp32"), "tiny-int8": calibration_model("cal-tiny-int8")}


def test_pinned_class_runs_in_a_restricted_worker() -> None:
    cpu = min(os.sched_getaffinity(0))
    results = run_on_device_class(DeviceClass("pinned", threads=1, cpus=(cpu,)), MODELS, rounds=2, runs_per_round=2)
    assert set(results) == set(MODELS)
    assert all(m.threads == 1 and m.runs == 4 and m.median_ms > 0 for m in results.values())


def test_graph_optimization_level_reaches_the_worker() -> None:
    results = run_on_device_class(DeviceClass("basic", graph_optimization="basic"), MODELS, rounds=1, runs_per_round=2)
    assert {m.graph_optimization for m in results.values()} == {"basic"}


def test_classes_this_machine_cannot_emulate_are_dropped_with_a_reason() -> None:
    impossible = DeviceClass("big", cpus=(4096,))
    kept, dropped = available_fleet((impossible, DeviceClass("any")))
    assert [c.name for c in kept] == ["any"]
    assert dropped and "big: needs CPUs (4096,)" in dropped[0]


def test_a_failing_worker_is_a_fleet_error() -> None:
    with pytest.raises(FleetError, match="failed"):
        run_on_device_class(DeviceClass("broken", cpus=(4096,)), MODELS, rounds=1, runs_per_round=1)


@pytest.mark.skipif(quota_support() is not None, reason=f"no CPU quota here: {quota_support()}")
def test_quota_class_runs_in_its_own_cgroup_and_cleans_up() -> None:
    before = set(os.listdir(CGROUP_V1_CPU)) if CGROUP_V1_CPU.exists() else set()
    results = run_on_device_class(
        DeviceClass("quota", cpus=(min(os.sched_getaffinity(0)),), cpu_quota=0.5), MODELS, rounds=2, runs_per_round=2
    )
    # Each sample averages back-to-back runs over QUOTA_SAMPLE_PERIODS periods' worth of quota.
    assert all(m.median_ms > 0 and m.runs == 4 and m.runs_per_sample > 1 for m in results.values())
    after = set(os.listdir(CGROUP_V1_CPU)) if CGROUP_V1_CPU.exists() else set()
    assert not {name for name in after - before if name.startswith("fedzoo-")}


def test_quota_support_answers_with_none_or_a_reason() -> None:
    answer = quota_support()
    assert answer is None or "cgroup" in answer


def test_quota_samples_span_whole_quota_periods_and_other_classes_time_single_runs() -> None:
    half_core = DeviceClass("half", cpu_quota=0.5)
    assert quota_sample_ms(half_core) == pytest.approx(QUOTA_SAMPLE_PERIODS * 0.5 * QUOTA_PERIOD_US / 1000)
    assert quota_sample_ms(DeviceClass("whole")) == 0.0
