"""bench/zoo_arms.py, the arms of bench/fl_zoo.py: FedRolex's rolled supernet computes what the supernet computes,
HeteroFL's and the depth arm's tier models are slices of the largest model within the budgets where they can be,
and the bytes and MACs an arm reports are counted from what it ran."""

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))

from zoo_arms import (  # noqa: E402
    Device,
    MacCounter,
    depth_capped,
    make_arms,
    roll_hidden,
    run_arm,
    wide_spec,
    width_capped,
)

from fedzoo.compress.zoo_extraction import SupernetSpec, subnet_module, supernet_weights  # noqa: E402
from fedzoo.nas.space import tiny_space  # noqa: E402
from fedzoo.nas.supernet import Supernet  # noqa: E402


def _supernet():
    torch.manual_seed(0)
    space = tiny_space(8)
    spec = wide_spec(SupernetSpec(space, 10, 1, "digits", "ofa"))
    return spec, supernet_weights(Supernet(space, 10, 1).eval())


def _largest(spec):
    space = spec.space
    return space.make_arch([space.max_depth] * len(space.stages), [[space.max_kernel] * space.max_depth]
                           * len(space.stages), [[space.max_expand_ratio] * space.max_depth] * len(space.stages))


def test_the_rolled_supernet_computes_the_same_and_its_prefix_is_a_rolled_window():
    spec, weights = _supernet()
    x = torch.from_numpy(np.random.default_rng(0).normal(size=(3, 1, 8, 8)).astype(np.float32))
    largest = _largest(spec)
    rolled = roll_hidden(weights, spec, -3)
    with torch.no_grad():
        assert torch.allclose(subnet_module(spec, largest, weights)(x), subnet_module(spec, largest, rolled)(x),
                              atol=1e-5)
    name = "stages.0.0.expand_weight"
    assert np.array_equal(rolled[name][:4], weights[name][3:7])  # the window starting at channel 3
    assert np.array_equal(roll_hidden(rolled, spec, 3)[name], weights[name])


def test_width_and_depth_arms_slice_the_largest_model_within_budget_where_one_fits():
    spec, weights = _supernet()
    macs = MacCounter(spec, weights)
    largest = _largest(spec)
    small = width_capped(depth_capped(largest, 1), 2)
    arms = make_arms(spec, [small, width_capped(largest, 2), width_capped(largest, 3), largest], macs)
    assert arms["heterofl"].tier_archs[1:] == (width_capped(largest, 2), width_capped(largest, 3), largest)
    assert arms["heterofl"].tier_archs[0] == width_capped(largest, 2)  # no width of the largest fits: the narrowest
    assert arms["fedrolex"].tier_archs == arms["heterofl"].tier_archs and arms["fedrolex"].rolling
    assert all(len(stage["kernels"]) in (1, 2) and stage["expand_ratios"] == [4] * len(stage["kernels"])
               for arch in arms["depthwise"].tier_archs for stage in arch["stages"])
    assert arms["everyone_largest"].tier_archs == (largest,) * 4


def test_an_arm_reports_the_bytes_and_macs_it_ran():
    spec, weights = _supernet()
    macs = MacCounter(spec, weights)
    rng = np.random.default_rng(0)
    devices = [Device(tier % 4, rng.normal(size=(8, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, 8),
                      rng.normal(size=(2, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, 2)) for tier in range(4)]
    largest = _largest(spec)
    arm = make_arms(spec, [largest] * 4, macs)["everyone_largest"]
    result = run_arm(arm, spec, weights, devices, devices[0].x, rounds=1, per_round=4, local_epochs=1, seed=0,
                     server_learning_rate=1.0, coverage_step_exponent=0.0, macs=macs)
    state_bytes = sum(value.nbytes for name, value in subnet_module(spec, largest, weights).state_dict().items()
                      if value.is_floating_point())
    assert result.bytes_per_device_round == 2 * state_bytes  # the model down, its delta up
    assert result.forward_macs_per_device_round == macs(largest) * 8  # one epoch of 8 examples
    assert not np.array_equal(result.supernets[None]["classifier.weight"], weights["classifier.weight"])
