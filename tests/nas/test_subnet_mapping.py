"""The supernet ↔ subnet mapping in numpy: it extracts what the torch supernet extracts, and mapping a delta
back then re-extracting gives the delta (stage width and expand slices, depth prefixes, elastic kernels)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedzoo.errors import InvalidInputError
from fedzoo.nas.space import SearchSpace, StageSpec, tiny_space
from fedzoo.nas.subnet_mapping import extract_weights, map_back, placements
from fedzoo.nas.supernet import Supernet, extract_subnet

# three kernel sizes, so a 3x3 kernel goes through two learned transforms (7 -> 5 -> 3); two widths, so the first
# stage's residual from the stem comes and goes with its width
SPACE = SearchSpace(resolution=8, stem_channels=4, stem_stride=1, head_channels=8,
                    stages=(StageSpec(4, 1), StageSpec(6, 2, "hswish")), depth_choices=(1, 2),
                    expand_ratio_choices=(2, 3), kernel_choices=(3, 5, 7), width_choices=(0.5, 1.0))


def supernet_weights(space: SearchSpace, seed: int) -> dict[str, np.ndarray]:
    """A supernet with random weights, statistics and (not orthogonal) kernel transforms."""
    torch.manual_seed(seed)
    supernet = Supernet(space, num_classes=3, in_channels=1)
    with torch.no_grad():
        for name, tensor in supernet.state_dict().items():
            if tensor.is_floating_point():
                tensor.copy_(torch.rand_like(tensor) + 0.5 if "running_var" in name else torch.randn_like(tensor))
    return supernet, {name: value.numpy().copy() for name, value in supernet.state_dict().items()
                      if not name.endswith("num_batches_tracked")}


def archs(space: SearchSpace):
    return st.integers(0, 2**31 - 1).map(lambda seed: space.sample_arch(np.random.default_rng(seed)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_extract_matches_the_torch_supernet(seed):
    supernet, weights = supernet_weights(SPACE, seed)
    arch = SPACE.sample_arch(np.random.default_rng(seed))
    expected = {name: value.numpy() for name, value in extract_subnet(supernet, arch).state_dict().items()
                if not name.endswith("num_batches_tracked")}
    extracted = extract_weights(SPACE, arch, weights)
    assert extracted.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_allclose(extracted[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


@settings(max_examples=25, deadline=None)
@given(arch=archs(SPACE), seed=st.integers(0, 1000))
def test_map_back_then_extract_returns_the_delta(arch, seed):
    """extract(W + map_back(Δ)) = extract(W) + Δ on every element of the subnet, kernels included."""
    _, weights = supernet_weights(SPACE, 0)
    rng = np.random.default_rng(seed)
    before = extract_weights(SPACE, arch, weights)
    delta = {name: rng.normal(size=value.shape).astype(np.float32) for name, value in before.items()}
    mapped = map_back(SPACE, arch, weights, delta)
    updated = {name: value + mapped.deltas.get(name, 0.0) for name, value in weights.items()}
    after = extract_weights(SPACE, arch, updated)
    for name in before:
        np.testing.assert_allclose(after[name] - before[name], delta[name], rtol=1e-3, atol=1e-3, err_msg=name)


@settings(max_examples=25, deadline=None)
@given(arch=archs(SPACE), seed=st.integers(0, 1000))
def test_elements_outside_the_subnet_are_not_covered_and_not_moved(arch, seed):
    _, weights = supernet_weights(SPACE, 1)
    rng = np.random.default_rng(seed)
    delta = {name: rng.normal(size=value.shape).astype(np.float32)
             for name, value in extract_weights(SPACE, arch, weights).items()}
    mapped = map_back(SPACE, arch, weights, delta)
    for name, mask in mapped.masks.items():
        assert not np.any(mapped.deltas[name][~mask]), name
    depths = [len(stage["kernels"]) for stage in arch["stages"]]
    for stage, depth in enumerate(depths):  # depth prefixes: blocks past the depth are untouched
        for block in range(depth, SPACE.max_depth):
            assert not any(name.startswith(f"stages.{stage}.{block}.") for name in mapped.masks)
    assert not any("kernel_transforms" in name for name in mapped.masks)  # no device trains the transforms


@settings(max_examples=20, deadline=None)
@given(arch=archs(SPACE), seed=st.integers(0, 1000))
def test_slices_map_back_exactly_on_covered_elements(arch, seed):
    """For width, expand and depth (every tensor but a smaller kernel) map_back(extract(D)) = D where covered."""
    _, weights = supernet_weights(SPACE, 2)
    rng = np.random.default_rng(seed)
    supernet_delta = {name: rng.normal(size=value.shape).astype(np.float32) for name, value in weights.items()}
    mapped = map_back(SPACE, arch, weights, extract_weights(SPACE, arch, supernet_delta))
    for placement in placements(SPACE, arch, weights):
        if placement.kernel_map is not None:
            continue
        name = placement.supernet_name
        covered = mapped.masks[name]
        np.testing.assert_allclose(mapped.deltas[name][covered], supernet_delta[name][covered], rtol=1e-6)


def test_the_largest_subnet_covers_every_element_but_the_transforms():
    _, weights = supernet_weights(tiny_space(8), 0)
    arch = tiny_space(8).max_arch()
    delta = {name: np.ones_like(value) for name, value in extract_weights(tiny_space(8), arch, weights).items()}
    mapped = map_back(tiny_space(8), arch, weights, delta)
    assert set(mapped.masks) == {name for name in weights if "kernel_transforms" not in name}
    assert all(mask.all() for mask in mapped.masks.values())


def test_a_smaller_kernel_covers_the_centre_it_is_cut_from():
    space = tiny_space(8)  # kernels 5 and 3: the 3x3 kernel is the centre of the 5x5 one, transformed
    _, weights = supernet_weights(space, 0)
    arch = space.min_arch()
    delta = {name: np.ones_like(value) for name, value in extract_weights(space, arch, weights).items()}
    mask = map_back(space, arch, weights, delta).masks["stages.0.0.depthwise_weight"]
    mid = space.stem_channels * min(space.expand_ratio_choices)
    assert mask[:mid, 0, 1:4, 1:4].all() and mask[:mid].sum() == mid * 9 and not mask[mid:].any()


def test_a_narrower_stage_covers_only_its_leading_channels_and_the_next_layers_matching_inputs():
    _, weights = supernet_weights(SPACE, 0)
    arch = SPACE.max_arch()
    arch["stages"][1]["out_channels"] = SPACE.stage_widths(1)[0]  # 3 of the last stage's 6 channels
    delta = {name: np.ones_like(value) for name, value in extract_weights(SPACE, arch, weights).items()}
    masks = map_back(SPACE, arch, weights, delta).masks
    for block in range(SPACE.max_depth):
        project, norm = masks[f"stages.1.{block}.project_weight"], masks[f"stages.1.{block}.project_norm.weight"]
        assert project[:3, 0].all() and not project[3:].any() and norm[:3].all() and not norm[3:].any()
    second_expand = masks["stages.1.1.expand_weight"]  # its input is the first block's 3 channels
    assert second_expand[0, :3].all() and not second_expand[:, 3:].any()
    assert masks["head.0.weight"][:, :3].all() and not masks["head.0.weight"][:, 3:].any()
    assert masks["head.1.weight"].all()  # the head keeps its own width


def test_an_arch_outside_the_space_is_refused():
    _, weights = supernet_weights(tiny_space(8), 0)
    with pytest.raises(InvalidInputError, match="not a subnet"):
        placements(tiny_space(8), SPACE.max_arch(), weights)
