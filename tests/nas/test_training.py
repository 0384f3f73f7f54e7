"""Sandwich-rule supernet training: seeded epochs repeat exactly, and training teaches every subnet; the zoo's
fine-tune trains only the chosen subnets, one epoch of steps at a time."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from fedzoo.datasets import load_dataset, split_dataset
from fedzoo.errors import InvalidInputError
from fedzoo.nas.evaluation import prepare_subnet
from fedzoo.nas.space import tiny_space
from fedzoo.nas.subnet import build_subnet, evaluate_accuracy
from fedzoo.nas.supernet import Supernet
from fedzoo.nas.training import (TrainingConfig, finetune_zoo_epoch, make_optimizer, random_shift, steps_per_epoch,
                                 train_from_scratch, train_supernet_epoch)

torch.set_num_threads(1)
CONFIG = TrainingConfig(epochs=2, batch_size=16, learning_rate=0.2, max_shift_pixels=1)


@pytest.fixture(scope="module")
def digits():
    split = split_dataset(load_dataset("digits"), seed=0)
    mean, std = np.float32(split.mean[0]), np.float32(split.std[0])
    return ((split.train.x[:768] - mean) / std, split.train.y[:768], (split.test.x - mean) / std, split.test.y)


def _trained_supernet(train_x, train_y, epochs):
    torch.manual_seed(0)
    supernet = Supernet(tiny_space(8), 10, 1)
    optimizer = make_optimizer(supernet, CONFIG)
    for epoch in range(epochs):
        train_supernet_epoch(supernet, optimizer, train_x, train_y, CONFIG, seed=0, epoch=epoch)
    return supernet


def test_seeded_training_repeats_exactly(digits):
    train_x, train_y, _, _ = digits
    first = _trained_supernet(train_x[:128], train_y[:128], 1).state_dict()
    second = _trained_supernet(train_x[:128], train_y[:128], 1).state_dict()
    assert all(torch.equal(first[name], second[name]) for name in first)


def test_largest_only_epochs_train_no_smaller_subnet(digits):
    train_x, train_y, _, _ = digits
    config = replace(CONFIG, largest_only_epochs=1)
    torch.manual_seed(0)
    supernet = Supernet(tiny_space(8), 10, 1)
    optimizer = make_optimizer(supernet, config)

    def transforms_are_identity() -> bool:  # the 3x3 kernel transforms run only in subnets smaller than the largest
        return all(torch.equal(p, torch.eye(p.shape[0])) for name, p in supernet.named_parameters() if "kernel_transforms" in name)

    train_supernet_epoch(supernet, optimizer, train_x[:128], train_y[:128], config, seed=0, epoch=0)
    assert transforms_are_identity()
    train_supernet_epoch(supernet, optimizer, train_x[:128], train_y[:128], config, seed=0, epoch=1)
    assert not transforms_are_identity()


def test_the_zoo_finetune_trains_only_the_chosen_subnets_one_epoch_of_steps_at_a_time(digits):
    train_x, train_y, _, _ = digits
    space = tiny_space(8)
    # one block a stage, 5x5 kernels only: no member runs a stage's second block or a 5x5 -> 3x3 transform
    members = [space.make_arch([1, 1, 1], [[5]] * 3, [[ratio]] * 3) for ratio in (2, 4)]
    members.insert(1, space.make_arch([1, 1, 1], [[5]] * 3, [[2], [4], [2]]))
    config = replace(CONFIG, zoo_finetune_epochs=1)
    torch.manual_seed(0)
    supernet = Supernet(space, 10, 1)
    before = {name: value.clone() for name, value in supernet.state_dict().items()}
    steps = []
    finetune_zoo_epoch(supernet, make_optimizer(supernet, config), train_x[:128], train_y[:128], members, config,
                       seed=0, epoch=0, on_step=lambda done, total: steps.append((done, total)))

    per_epoch = steps_per_epoch(128, config.batch_size)
    assert steps == [(step, per_epoch) for step in range(1, per_epoch + 1)]  # one pass over the examples
    after = supernet.state_dict()
    unused = [name for name in before if name.startswith("stages.") and name.split(".")[2] == "1"
              or "kernel_transforms" in name]
    assert unused and all(torch.equal(before[name], after[name]) for name in unused)
    assert not torch.equal(before["stages.2.0.expand_weight"], after["stages.2.0.expand_weight"])
    assert not torch.equal(before["classifier.weight"], after["classifier.weight"])


def test_the_zoo_finetune_needs_a_chosen_subnet(digits):
    train_x, train_y, _, _ = digits
    supernet = Supernet(tiny_space(8), 10, 1)
    with pytest.raises(InvalidInputError) as error:
        finetune_zoo_epoch(supernet, make_optimizer(supernet, CONFIG), train_x[:32], train_y[:32], [], CONFIG, 0, 0)
    assert error.value.field == "members"


@pytest.mark.slow
def test_training_teaches_the_largest_and_the_smallest_subnet(digits):
    train_x, train_y, test_x, test_y = digits
    supernet = _trained_supernet(train_x, train_y, 2)
    space = supernet.space
    for arch in (space.max_arch(), space.min_arch()):
        accuracy, _ = evaluate_accuracy(prepare_subnet(supernet, arch, train_x), test_x, test_y)
        assert accuracy > 0.4  # chance is 0.1


@pytest.mark.slow
def test_from_scratch_training_learns(digits):
    train_x, train_y, test_x, test_y = digits
    torch.manual_seed(0)
    model = train_from_scratch(build_subnet(tiny_space(8).max_arch(), 10, 1), train_x, train_y, CONFIG, seed=0)
    assert evaluate_accuracy(model, test_x, test_y)[0] > 0.4


def test_random_shift_moves_content_within_bounds():
    images = torch.zeros(4, 1, 8, 8)
    images[:, :, 4, 4] = 1.0
    shifted = random_shift(images, 2, torch.Generator().manual_seed(0))
    assert shifted.shape == images.shape and torch.all(shifted.sum(dim=(1, 2, 3)) == 1.0)
    rows = [torch.nonzero(image[0])[0].tolist() for image in shifted]
    assert all(2 <= row <= 6 and 2 <= column <= 6 for row, column in rows)
