"""bench/zoo_arms.py, the arms of bench/fl_zoo.py: FedRolex's rolled supernet computes what the supernet computes,
HeteroFL's and the depth arm's tier models are slices of the largest model (every layer's channels scaled) within
every tier's budget, the widest that fits, a scaled slice's delta lands on the channels it took, and the bytes and
MACs an arm reports are counted from what it ran, and the anchors' cloud warm-up trains their own family within
the zoo supernet's training budget."""

from dataclasses import replace
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))

from zoo_arms import (  # noqa: E402
    WIDTH_STEPS,
    Device,
    MacCounter,
    best_within,
    depth_capped,
    make_arms,
    over_budget,
    roll_channels,
    run_arm,
    sent_subnet,
    sliced_map_back,
    tier_module,
    train_locally,
    warm_up,
    width_scaled,
)

from fedzoo.compress.zoo_extraction import SupernetSpec, subnet_module, supernet_weights  # noqa: E402
from fedzoo.datasets import load_dataset, split_dataset  # noqa: E402
from fedzoo.nas.subnet import evaluate_accuracy, recalibrate_batchnorm  # noqa: E402
from fedzoo.nas.training import TrainingConfig, steps_per_epoch  # noqa: E402
from fedzoo.nas.space import arch_key, tiny_space  # noqa: E402
from fedzoo.nas.subnet_mapping import map_back  # noqa: E402
from fedzoo.nas.supernet import Supernet  # noqa: E402


def _supernet():
    torch.manual_seed(0)
    space = tiny_space(8)
    spec = SupernetSpec(space, 10, 1, "digits", "ofa")
    return spec, supernet_weights(Supernet(space, 10, 1).eval())


def _largest(spec):
    space = spec.space
    return space.make_arch([space.max_depth] * len(space.stages), [[space.max_kernel] * space.max_depth]
                           * len(space.stages), [[space.max_expand_ratio] * space.max_depth] * len(space.stages))


def test_the_rolled_supernet_computes_the_same_and_its_prefix_is_a_rolled_window_on_every_layer():
    spec, weights = _supernet()
    x = torch.from_numpy(np.random.default_rng(0).normal(size=(3, 1, 8, 8)).astype(np.float32))
    largest = _largest(spec)
    rolled = roll_channels(weights, -3)
    with torch.no_grad():
        assert torch.allclose(subnet_module(spec, largest, weights)(x), subnet_module(spec, largest, rolled)(x),
                              atol=1e-5)
    name = "stages.1.0.expand_weight"  # hidden channels x the stage's input (the first stage's 8) channels
    assert np.array_equal(rolled[name][:4, :4], weights[name][3:7, 3:7])  # the window starting at channel 3
    assert np.array_equal(rolled["stem.0.weight"][:4], weights["stem.0.weight"][3:7])
    assert np.array_equal(rolled["classifier.weight"][:, :4], weights["classifier.weight"][:, 3:7])
    assert np.array_equal(rolled["classifier.bias"], weights["classifier.bias"])
    assert all(np.array_equal(roll_channels(rolled, 3)[name], weights[name]) for name in weights)


def test_width_arms_scale_every_layer_by_the_largest_ratio_within_each_budget():
    spec, weights = _supernet()
    macs = MacCounter(spec)
    largest = _largest(spec)
    small = width_scaled(depth_capped(largest, 1), 0.5)  # no slice of the largest by depth or expand ratio fits it
    zoo = [small, depth_capped(largest, 1), width_scaled(largest, 0.75), largest]
    budgets = [macs(arch) for arch in zoo]
    arms = make_arms(spec, zoo, budgets, macs)
    for name in ("heterofl", "fedrolex", "depthwise", "tier_alone", "fedzoo"):
        assert over_budget(arms[name], budgets, macs) == []
    assert over_budget(arms["everyone_largest"], budgets, macs) == [0, 1, 2]
    assert arms["everyone_largest"].ignores_budgets
    heterofl = arms["heterofl"].tier_archs
    assert heterofl[2] == width_scaled(largest, 0.75) and heterofl[3] == largest
    for arch, budget in zip(heterofl[:2], budgets):
        ratio = next(step / WIDTH_STEPS for step in range(WIDTH_STEPS, 0, -1)
                     if width_scaled(largest, step / WIDTH_STEPS) == arch)
        assert macs(width_scaled(largest, ratio + 1 / WIDTH_STEPS)) > budget  # the next wider one is over
        assert arch["stem_channels"] < 8 and arch["head_channels"] < 32  # the stem and head scale too
        assert all(stage["out_channels"] < full for stage, full in zip(arch["stages"], (8, 16, 24)))
    assert arms["fedrolex"].tier_archs == heterofl and arms["fedrolex"].rolling
    depthwise = arms["depthwise"].tier_archs
    assert depthwise[1] == depth_capped(largest, 1)  # depth alone fits here
    assert depthwise[0]["stem_channels"] < 8 and all(len(stage["kernels"]) == 1 for stage in depthwise[0]["stages"])


def test_each_budget_gets_the_best_scoring_arch_within_it_not_the_largest():
    spec, _ = _supernet()
    macs = MacCounter(spec)
    largest = _largest(spec)
    small, middle = width_scaled(depth_capped(largest, 1), 0.5), depth_capped(largest, 1)
    scores = {arch_key(small): 0.9, arch_key(middle): 0.5, arch_key(largest): 0.8}
    budgets = [macs(small), macs(middle), macs(largest)]
    chosen = best_within([largest, middle, small], budgets, macs, lambda arch: scores[arch_key(arch)])
    assert chosen == [small, small, small]  # the best within every budget, though larger ones fit
    scores[arch_key(largest)] = 0.95
    assert best_within([largest, middle, small], budgets, macs, lambda arch: scores[arch_key(arch)])[2] == largest
    with pytest.raises(ValueError, match="no arch within"):
        best_within([largest, middle], [macs(small)], macs, lambda arch: scores[arch_key(arch)])


def test_a_scaled_slice_takes_and_returns_the_leading_channels_of_every_layer():
    spec, weights = _supernet()
    largest = _largest(spec)
    rng = np.random.default_rng(1)
    full = subnet_module(spec, largest, weights).state_dict()
    delta = {name: rng.normal(size=value.shape).astype(np.float32) for name, value in full.items()
             if value.is_floating_point()}
    ours, theirs = sliced_map_back(spec, largest, weights, delta), map_back(spec.space, largest, weights, delta)
    assert all(np.allclose(ours.deltas[name], theirs.deltas[name]) and np.array_equal(ours.masks[name],
               theirs.masks[name]) for name in theirs.deltas)  # at full width: the supernet's own mapping

    arch = width_scaled(spec.space.make_arch([1, 1, 1], [[3]] * 3, [[4]] * 3), 0.5)  # 3x3: a mapped kernel
    module = tier_module(spec, arch, weights)
    assert module.state_dict()["stem.0.weight"].shape == (4, 1, 3, 3)
    assert np.array_equal(module.state_dict()["stem.0.weight"].numpy(), weights["stem.0.weight"][:4])
    delta = {name: rng.normal(size=value.shape).astype(np.float32) for name, value in module.state_dict().items()
             if value.is_floating_point()}
    mapped = sliced_map_back(spec, arch, weights, delta)
    assert mapped.masks["head.0.weight"].sum() == 16 * 12 and mapped.masks["head.0.weight"][:16, :12].all()
    moved = {name: weights[name] + mapped.deltas.get(name, 0) for name in weights}
    after = tier_module(spec, arch, moved).state_dict()
    before = module.state_dict()
    assert all(np.allclose(after[name].numpy(), before[name].numpy() + delta[name], atol=1e-4) for name in delta)


def test_an_arm_reports_the_bytes_and_macs_it_ran():
    spec, weights = _supernet()
    macs = MacCounter(spec)
    rng = np.random.default_rng(0)
    devices = [Device(tier % 4, rng.normal(size=(8, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, 8),
                      rng.normal(size=(2, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, 2)) for tier in range(4)]
    largest = _largest(spec)
    arm = make_arms(spec, [largest] * 4, [macs(largest)] * 4, macs)["everyone_largest"]
    result = run_arm(arm, spec, weights, devices, devices[0].x, rounds=1, per_round=4, local_epochs=1, seed=0,
                     server_learning_rate=1.0, coverage_step_exponent=0.0, macs=macs)
    state_bytes = sum(value.nbytes for name, value in subnet_module(spec, largest, weights).state_dict().items()
                      if value.is_floating_point())
    assert result.bytes_per_device_round == 2 * state_bytes  # the model down, its delta up
    assert result.forward_macs_per_device_round == macs(largest) * 8  # one epoch of 8 examples
    assert not np.array_equal(result.supernets[None]["classifier.weight"], weights["classifier.weight"])


def test_devices_batchnorm_in_inference_mode_trains_with_the_sent_statistics_and_leaves_them():
    """`--local-batchnorm inference`: the subnet arrives with statistics recalibrated on the cloud's images, the
    device normalises with them (its own batches' statistics would differ) and changes only weights, scale and bias;
    in training mode the batch's statistics normalise and the running statistics move."""
    spec, weights = _supernet()
    rng = np.random.default_rng(0)
    cloud_x = rng.normal(size=(64, 1, 8, 8)).astype(np.float32)
    x, y = (rng.normal(size=(16, 1, 8, 8)) + 3).astype(np.float32), rng.integers(0, 10, 16)  # shifted: other statistics
    largest = _largest(spec)
    sent = sent_subnet(spec, largest, weights, cloud_x, "inference")
    calibrated = tier_module(spec, largest, weights)
    recalibrate_batchnorm(calibrated, cloud_x)
    statistics = [name for name in sent.state_dict() if name.endswith(("running_mean", "running_var"))]
    assert statistics and all(torch.equal(sent.state_dict()[name], calibrated.state_dict()[name]) for name in statistics)
    assert not torch.equal(sent.state_dict()[statistics[0]], tier_module(spec, largest, weights).state_dict()[statistics[0]])

    delta, examples = train_locally(sent, x, y, epochs=1, seed=0, batch_norm="inference")
    assert examples == 16
    assert all(not delta[name].any() for name in statistics)
    assert any(delta[name].any() for name in delta if name.endswith(".weight"))
    moved, _ = train_locally(sent_subnet(spec, largest, weights, cloud_x, "training"), x, y, epochs=1, seed=0)
    assert all(moved[name].any() for name in statistics if name.endswith("running_mean"))


def test_the_warm_up_trains_the_anchor_family_on_the_cloud_budget_and_nothing_else():
    spec, weights = _supernet()
    split = split_dataset(load_dataset("digits"), seed=0)
    mean, std = split.mean, split.std
    x = ((split.train.x - mean) / std).astype(np.float32)[:320]
    test_x, test_y = ((split.test.x - mean) / std).astype(np.float32), split.test.y
    largest = _largest(spec)
    half = width_scaled(spec.space.make_arch([1, 1, 1], [[3]] * 3, [[4]] * 3), 0.5)  # 3x3: a mapped kernel
    family = (half, width_scaled(largest, 0.5), width_scaled(largest, 0.75))  # stems of 4, 4 and 6 of 8 channels
    config = TrainingConfig(epochs=3, batch_size=16, learning_rate=0.2, max_shift_pixels=1)
    trained, examples = warm_up(spec, family, weights, x, split.train.y[:320], config, seed=0)

    assert examples == config.epochs * steps_per_epoch(320, 16) * 16  # the budget: epochs over the cloud's examples
    for arch in family:
        before, after = tier_module(spec, arch, weights), tier_module(spec, arch, trained)
        recalibrate_batchnorm(before, x)
        recalibrate_batchnorm(after, x)
        accuracy_before = evaluate_accuracy(before, test_x, test_y)[0]
        accuracy_after = evaluate_accuracy(after, test_x, test_y)[0]
        assert accuracy_after > max(0.3, accuracy_before + 0.2), (arch, accuracy_before, accuracy_after)  # chance: 0.1
    # kernel transforms and BatchNorm statistics keep the initialisation; channels no member uses only decay
    assert all(np.array_equal(trained[name], weights[name]) for name in weights
               if "kernel_transforms" in name or name.endswith(("running_mean", "running_var")))
    stem, initial_stem = trained["stem.0.weight"], weights["stem.0.weight"]
    assert np.abs(stem[:6] - initial_stem[:6]).max() > 0.05
    assert np.allclose(stem[6:], initial_stem[6:], rtol=1e-2, atol=0)


def test_the_warm_ups_largest_only_epochs_train_the_familys_largest_member_alone():
    """As the zoo's supernet training spends its first `largest_only_epochs` on its largest subnet, an anchor's
    warm-up spends them on its largest tier model: the same weights as warming up that member alone, and the
    smaller members join after."""
    spec, weights = _supernet()
    split = split_dataset(load_dataset("digits"), seed=0)
    x = ((split.train.x - split.mean) / split.std).astype(np.float32)[:64]
    y = split.train.y[:64]
    largest = _largest(spec)
    family = (width_scaled(largest, 0.5), width_scaled(largest, 0.75))
    config = TrainingConfig(epochs=1, batch_size=16, learning_rate=0.2, max_shift_pixels=1, largest_only_epochs=1)
    phased, _ = warm_up(spec, family, weights, x, y, config, seed=0)
    alone, _ = warm_up(spec, family[-1:], weights, x, y, config, seed=0)
    assert all(np.array_equal(phased[name], alone[name]) for name in weights)
    joint, _ = warm_up(spec, family, weights, x, y, replace(config, largest_only_epochs=0), seed=0)
    assert any(not np.array_equal(joint[name], alone[name]) for name in weights)
