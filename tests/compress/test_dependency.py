import pytest
import torch
from zoo_factory import make_arch
from models import PlainNet, TinyMobileNet, conv_bn_act
from torch import nn

from fedzoo.compress.dependency import (
    BATCHNORM,
    CONV_IN,
    CONV_OUT,
    DEPTHWISE,
    LINEAR_IN,
    analyse_channel_groups,
)
from fedzoo.compress.errors import UnsupportedOperationError
from fedzoo.nas.subnet import build_subnet


def group_with(groups, module: str, role: str):
    matches = [g for g in groups if any(s.module == module and s.role == role for s in g.slots)]
    assert len(matches) == 1, f"{module}/{role} is in {len(matches)} groups"
    return matches[0]


def roles(group) -> set[tuple[str, str]]:
    return {(slot.module, slot.role) for slot in group.slots}


def test_residual_adds_couple_every_branch_and_the_stem():
    groups = analyse_channel_groups(TinyMobileNet(), (1, 1, 8, 8))
    stem = group_with(groups, "stem.0", CONV_OUT)
    # blocks.0 adds its output to the stem's: both producers and the depthwise that follows are one group
    assert {("blocks.0.conv.1", CONV_OUT), ("blocks.0.conv.0.0", DEPTHWISE), ("stem.1", BATCHNORM)} <= roles(stem)
    wide = group_with(groups, "blocks.1.conv.2", CONV_OUT)
    assert {("blocks.2.conv.2", CONV_OUT), ("blocks.3.conv.2", CONV_OUT), ("head.0", CONV_IN)} <= roles(wide)
    assert wide.prunable and stem.prunable


def test_depthwise_follows_its_producer_and_classifier_input_follows_the_head():
    groups = analyse_channel_groups(TinyMobileNet(), (1, 1, 8, 8))
    expand = group_with(groups, "blocks.2.conv.0.0", CONV_OUT)
    assert roles(expand) == {
        ("blocks.2.conv.0.0", CONV_OUT), ("blocks.2.conv.0.1", BATCHNORM), ("blocks.2.conv.1.0", DEPTHWISE),
        ("blocks.2.conv.1.1", BATCHNORM), ("blocks.2.conv.2", CONV_IN),
    }  # fmt: skip
    head = group_with(groups, "head.0", CONV_OUT)
    assert ("classifier", LINEAR_IN) in roles(head)


def test_model_input_and_output_are_pinned():
    groups = analyse_channel_groups(TinyMobileNet(), (1, 1, 8, 8))
    assert group_with(groups, "stem.0", CONV_IN).pinned_because == ["model input"]
    assert not group_with(groups, "classifier", "linear_out").prunable


def test_flatten_of_spatial_maps_gives_features_per_channel():
    groups = analyse_channel_groups(PlainNet(), (1, 1, 8, 8))
    slot = next(s for s in group_with(groups, "features.3", CONV_OUT).slots if s.role == LINEAR_IN)
    assert slot.module == "hidden" and slot.features_per_channel == 16  # 16 channels of 4x4 after pooling


def test_real_nas_subnet_is_analysed():
    arch = make_arch(8, 32, [(8, 1, "relu6", [3, 5], [4, 2]), (16, 2, "relu6", [3], [2]), (24, 2, "hswish", [5], [4])])
    groups = analyse_channel_groups(build_subnet(arch, 10, 1), (1, 1, 8, 8))
    stage_one = group_with(groups, "stem.0", CONV_OUT)  # stem feeds stage 1 (stride 1, same width): residuals
    assert ("blocks.0.layers.6", CONV_OUT) in roles(stage_one) and ("blocks.1.layers.6", CONV_OUT) in roles(stage_one)
    assert sum(g.prunable for g in groups) >= 5


class Concatenating(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(1, 4, 3), nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(torch.cat([self.a(x), self.b(x)], 1).mean((2, 3)))


class CustomOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm, self.fc = nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.norm(self.conv(x)).mean((2, 3)))


class Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.conv, self.fc = nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1), nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.conv(self.conv(self.stem(x))).mean((2, 3)))


@pytest.mark.parametrize(
    ("model", "message"),
    [(Concatenating(), "cat"), (CustomOp(), "GroupNorm"), (Shared(), "more than once")],
)
def test_an_operation_without_a_rule_is_an_explicit_error(model, message):
    with pytest.raises(UnsupportedOperationError, match=message):
        analyse_channel_groups(model, (1, 1, 8, 8))


def test_grouped_conv_pins_both_sides():
    model = nn.Sequential(conv_bn_act(1, 8), nn.Conv2d(8, 8, 3, groups=2), nn.Flatten(), nn.LazyLinear(2))
    model(torch.zeros(1, 1, 8, 8))
    groups = analyse_channel_groups(model, (1, 1, 8, 8))
    assert not group_with(groups, "0.0", CONV_OUT).prunable
    assert not group_with(groups, "3", LINEAR_IN).prunable
