"""bench/zoo_private.py, the private arms of `bench/fl_zoo.py --private`: what a DP arm releases carries exactly the
noise its calibration states (central: z x the cohort sensitivity on every public subnet's sum; distributed: each
survivor's share, at the cohort's honest floor), so the noise measurement (`--noise-rounds`) that locates the gap
between distributed and central DP reads the calibration and nothing else (no rounding bias, no ring wrap); and a
survivor floor at the whole cohort leaves distributed DP's noise above central's only by the corrupt devices' share
(docs/privacy.md, "Where distributed DP's extra noise comes from")."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))

from zoo_arms import Device, MacCounter, make_arms  # noqa: E402
from zoo_private import released_noise  # noqa: E402

from fedzoo.compress.zoo_extraction import SupernetSpec, supernet_weights  # noqa: E402
from fedzoo.nas.space import tiny_space  # noqa: E402
from fedzoo.nas.supernet import Supernet  # noqa: E402

TIER_DEVICES = (20, 10, 5, 2)  # the slowest tier's cohort first; the fastest tier's 2 form no cohort
ARMS = {"central": ("central", 32767, None), "distributed": ("distributed", 32767, None),
        "distributed-f1": ("distributed", 32767, 1.0)}


@pytest.fixture(scope="module")
def measured():
    torch.manual_seed(0)
    space = tiny_space(8)
    spec = SupernetSpec(space, 10, 1, "digits", "ofa")
    weights = supernet_weights(Supernet(space, 10, 1).eval())
    stages = len(space.stages)
    archs = [space.make_arch([depth] * stages, [[kernel] * depth] * stages, [[ratio] * depth] * stages)
             for depth, kernel, ratio in ((1, 3, 2), (1, 5, 4), (2, 3, 4), (2, 5, 4))]
    macs = MacCounter(spec)
    arm = make_arms(spec, archs, [macs(arch) for arch in archs], macs)["fedzoo"]  # each tier's budget: its model
    empty = np.zeros((0, 1, 8, 8), np.float32)
    devices = [Device(tier, empty, np.zeros(0, np.int64), empty, np.zeros(0, np.int64))
               for tier, count in enumerate(TIER_DEVICES) for _ in range(count)]
    return released_noise(arm, spec, weights, devices, rounds=2, per_round=len(devices), seed=0,
                          noise_multiplier=1.1, clip_norm=0.5, arms=ARMS)


def test_every_arms_release_carries_the_noise_its_calibration_states(measured):
    for arm, by_pattern in measured.items():
        for pattern, (sd, predicted) in by_pattern.items():
            assert sd == pytest.approx(predicted, rel=0.1), (arm, pattern)


def test_a_floor_at_the_whole_cohort_leaves_distributed_noise_above_central_by_the_corrupt_devices_share(measured):
    central, default, whole = (measured[arm]["all"][1] for arm in ("central", "distributed", "distributed-f1"))
    assert central < whole < default
    # cohorts of 20, 10 and 5 at the whole-cohort floor: 20/18, 10/8 and 5/3 times central's variance; the absent
    # subnet gets a cohort of 3's shares, 3/2 times; so every element's variance lies within those factors of
    # central's (the per-element sums of several subnets mix them)
    for pattern, (_, predicted) in measured["distributed-f1"].items():
        ratio = (predicted / measured["central"][pattern][1]) ** 2
        assert 20 / 18 * 0.99 <= ratio <= 5 / 3 * 1.01, pattern
