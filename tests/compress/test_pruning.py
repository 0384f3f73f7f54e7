import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from zoo_factory import make_arch
from models import PlainNet, TinyMobileNet, randomise_batchnorm
from torch import nn

from fedzoo.compress.dependency import CONV_IN, LINEAR_IN, analyse_channel_groups
from fedzoo.compress.macs import count_cost
from fedzoo.compress.pruning import IMPORTANCE_CRITERIA, channel_importance, prune_channels, resize_to_state_dict
from fedzoo.errors import InvalidInputError
from fedzoo.nas.subnet import build_subnet

SHAPE = (1, 1, 8, 8)


def nas_subnet() -> nn.Module:
    arch = make_arch(8, 32, [(8, 1, "relu6", [3, 5], [4, 2]), (16, 2, "relu6", [3], [2]), (24, 2, "hswish", [5, 3], [4, 4])])
    return build_subnet(arch, 10, 1)


MODELS = {"mobilenet": TinyMobileNet, "plain": PlainNet, "nas-subnet": nas_subnet}


def masked_copy(model: nn.Module, kept: dict[str, tuple[int, ...]]) -> nn.Module:
    """The unpruned model with every removed channel cut off from all its consumers (weights zeroed):
    it must compute exactly what the pruned model computes."""
    masked = copy.deepcopy(model)
    for group in analyse_channel_groups(masked, SHAPE):
        if group.name not in kept:
            continue
        removed = sorted(set(range(group.channels)) - set(kept[group.name]))
        for slot in group.slots:
            module = masked.get_submodule(slot.module)
            with torch.no_grad():
                if slot.role == CONV_IN:
                    module.weight[:, removed] = 0
                elif slot.role == LINEAR_IN:
                    width = slot.features_per_channel
                    for channel in removed:
                        module.weight[:, channel * width : (channel + 1) * width] = 0
    return masked


@settings(max_examples=12, deadline=None)
@given(
    name=st.sampled_from(sorted(MODELS)),
    ratio=st.floats(0.05, 0.9),
    method=st.sampled_from(sorted(IMPORTANCE_CRITERIA)),
    scope=st.sampled_from(["layer", "global"]),
    seed=st.integers(0, 1000),
)
def test_pruned_model_computes_what_the_masked_original_computes(name, ratio, method, scope, seed):
    torch.manual_seed(seed)
    model = randomise_batchnorm(MODELS[name](), seed)
    result = prune_channels(model, SHAPE, ratio, method, scope)
    x = torch.randn(4, *SHAPE[1:])
    with torch.no_grad():
        expected = masked_copy(model, result.kept_indices)(x)
        actual = result.model.eval()(x)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)
    assert result.macs_after < result.macs_before
    assert count_cost(result.model, SHAPE).macs == result.macs_after


def test_the_original_model_is_left_untouched():
    model = randomise_batchnorm(TinyMobileNet())
    before = {key: value.clone() for key, value in model.state_dict().items()}
    prune_channels(model, SHAPE, 0.5)
    assert all(torch.equal(before[key], value) for key, value in model.state_dict().items())


def test_layer_scope_removes_the_ratio_from_every_group():
    result = prune_channels(TinyMobileNet(width=8), SHAPE, 0.5, scope="layer")
    assert result.kept_channels == {
        "stem.0": 4, "blocks.1.conv.0.0": 12, "blocks.1.conv.2": 8, "blocks.2.conv.0.0": 24,
        "blocks.3.conv.0.0": 24, "head.0": 16,
    }  # fmt: skip
    assert result.channel_ratio == pytest.approx(0.5)


def test_layer_ratios_override_per_group_and_the_floor_keeps_a_channel():
    result = prune_channels(TinyMobileNet(), SHAPE, 0.0, layer_ratios={"head.0": 0.99}, min_keep_fraction=0.0)
    assert result.kept_channels["head.0"] == 1 and result.kept_channels["stem.0"] == 8


def test_global_scope_prunes_weak_layers_harder():
    model = randomise_batchnorm(TinyMobileNet())
    with torch.no_grad():
        model.head[0].weight.mul_(1e-3)  # the head's channels are globally the weakest
    result = prune_channels(model, SHAPE, 0.2, method="l1", scope="global", min_keep_fraction=0.25)
    assert result.kept_channels["head.0"] == 8  # pruned down to its floor: 25% of 32
    assert result.channel_ratio == pytest.approx(0.2, abs=0.01)


def test_l1_importance_ranks_channels_by_weight_norm():
    model = TinyMobileNet()
    group = next(g for g in analyse_channel_groups(model, SHAPE) if g.name == "head.0")
    with torch.no_grad():
        model.head[0].weight[5] = 0
    scores = channel_importance(model, group, "l1")
    assert scores.argmin() == 5


def test_bn_scale_importance_follows_gamma():
    model = randomise_batchnorm(TinyMobileNet())
    with torch.no_grad():
        model.head[1].weight[3] = 1e-4
    result = prune_channels(model, SHAPE, 0.05, method="bn-scale")
    assert 3 not in result.kept_indices["head.0"]


def test_resize_to_state_dict_rebuilds_a_pruned_model_from_its_skeleton():
    model = randomise_batchnorm(nas_subnet())
    pruned = prune_channels(model, SHAPE, 0.4).model
    rebuilt = resize_to_state_dict(nas_subnet(), pruned.state_dict()).eval()
    x = torch.randn(3, *SHAPE[1:])
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), pruned(x))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"ratio": 1.0}, "ratio"), ({"method": "taylor"}, "method"), ({"scope": "block"}, "scope"),
     ({"layer_ratios": {"nope": 0.1}}, "layer_ratios"), ({"layer_ratios": {"head.0": 0.1}, "scope": "global"}, "layer_ratios")],
)  # fmt: skip
def test_bad_arguments_name_the_field(kwargs, field):
    arguments = {"ratio": 0.3, **kwargs}
    with pytest.raises(InvalidInputError) as error:
        prune_channels(TinyMobileNet(), SHAPE, **arguments)
    assert error.value.field == field
