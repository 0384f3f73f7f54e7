"""The search space, standalone subnets and weight extraction from the supernet."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedzoo.errors import InvalidInputError
from fedzoo.nas.export import export_onnx
from fedzoo.nas.space import arch_hash, arch_key, default_space, tiny_space
from fedzoo.nas.subnet import build_subnet, count_macs, count_params, recalibrate_batchnorm
from fedzoo.nas.supernet import Supernet, extract_subnet

torch.set_num_threads(1)
# Constant holds the bounds of ReLU6 exported as Clip
ALLOWED_ONNX_OPS = {"Constant", "Conv", "BatchNormalization", "Relu", "Clip", "HardSwish", "Add", "GlobalAveragePool", "Flatten", "Gemm"}


def _randomise_batchnorm(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.copy_(torch.randn(module.num_features, generator=generator))
            module.running_var.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
            module.weight.data.copy_(torch.randn(module.num_features, generator=generator))


@pytest.mark.parametrize("space", [default_space(28), tiny_space(8)], ids=["default", "tiny-elastic-width"])
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_sampled_mutated_and_crossed_archs_stay_in_the_space(space, seed):
    rng = np.random.default_rng(seed)
    first, second = space.sample_arch(rng), space.sample_arch(rng)
    for arch in (first, space.mutate(first, rng, 0.5), space.crossover(first, second, rng)):
        assert space.contains(arch)
        assert json.loads(json.dumps(arch)) == arch
        assert all(len(stage["kernels"]) in space.depth_choices for stage in arch["stages"])


def test_arch_key_and_hash_are_stable_and_distinguish_archs():
    space = default_space(28)
    assert arch_key(space.max_arch()) == arch_key(json.loads(json.dumps(space.max_arch())))
    assert arch_hash(space.max_arch()) != arch_hash(space.min_arch())
    assert len(arch_hash(space.max_arch())) == 8


def test_space_rejects_even_kernels_and_ratio_one():
    space = tiny_space(8)
    with pytest.raises(InvalidInputError, match="odd"):
        type(space)(**{**space.__dict__, "kernel_choices": (3, 4)})
    with pytest.raises(InvalidInputError, match="at least 2"):
        type(space)(**{**space.__dict__, "expand_ratio_choices": (1, 2)})
    for widths in ((0.5, 0.75), (0.0, 1.0), (0.5, 1.5)):  # the supernet's own width must be a choice, none wider
        with pytest.raises(InvalidInputError, match="width choices"):
            type(space)(**{**space.__dict__, "width_choices": widths})


def test_stage_widths_are_the_width_choices_of_each_stage_and_archs_record_them():
    space = tiny_space(8)  # stages of 8, 16 and 24 channels, widths 0.5, 0.75 and 1
    assert [space.stage_widths(index) for index in range(3)] == [(4, 6, 8), (8, 12, 16), (12, 18, 24)]
    assert [stage["out_channels"] for stage in space.min_arch()["stages"]] == [4, 8, 12]
    assert [stage["out_channels"] for stage in space.max_arch()["stages"]] == [8, 16, 24]
    arch = space.max_arch()
    arch["stages"][1]["out_channels"] = 10  # not a width choice of the 16-channel stage
    assert not space.contains(arch)


def test_a_space_and_archs_saved_before_widths_were_elastic_still_load():
    saved = default_space(28).to_dict()
    del saved["width_choices"]
    space = type(default_space(28)).from_dict(json.loads(json.dumps(saved)))
    assert space.width_choices == (1.0,) and space == default_space(28)
    assert space.contains(space.max_arch()) and space.contains(space.min_arch())
    assert [stage["out_channels"] for stage in space.min_arch()["stages"]] == [16, 24, 40, 64]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("space", [default_space(28), tiny_space(28)], ids=["default", "tiny-elastic-width"])
def test_extracted_subnet_computes_exactly_what_the_supernet_computes(space, seed):
    torch.manual_seed(seed)
    supernet = Supernet(space, 10, 1)
    _randomise_batchnorm(supernet, seed)
    supernet.eval()
    images = torch.randn(3, 1, 28, 28)
    for arch in (space.max_arch(), space.min_arch(), space.sample_arch(np.random.default_rng(seed))):
        supernet.set_active(arch)
        expected = supernet(images)
        subnet = extract_subnet(supernet, arch).eval()
        torch.testing.assert_close(subnet(images), expected, rtol=1e-5, atol=1e-5)


def test_small_kernel_is_the_transformed_centre_of_the_large_one():
    space = tiny_space(8)
    block = Supernet(space, 10, 1).stages[0][0]
    with torch.no_grad():
        block.kernel_transforms["3"].copy_(torch.eye(9) * 2.0)
    kernel = block.depthwise_kernel(3, 4)
    torch.testing.assert_close(kernel, 2.0 * block.depthwise_weight[:4, :, 1:4, 1:4])


def test_build_subnet_from_json_arch_loads_the_extracted_state_dict():
    space = tiny_space(8)
    supernet = Supernet(space, 10, 1)
    arch = space.sample_arch(np.random.default_rng(3))
    subnet = extract_subnet(supernet, arch).eval()
    rebuilt = build_subnet(json.loads(json.dumps(arch)), 10, 1)
    rebuilt.load_state_dict(subnet.state_dict())
    rebuilt.eval()
    images = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(rebuilt(images), subnet(images))


def test_build_subnet_rejects_a_malformed_arch():
    arch = tiny_space(8).max_arch()
    arch["stages"][0]["expand_ratios"] = arch["stages"][0]["expand_ratios"][:1]
    with pytest.raises(InvalidInputError, match="as many kernels as expand_ratios"):
        build_subnet(arch, 10, 1)
    with pytest.raises(InvalidInputError, match="arch"):
        build_subnet({"stages": []}, 10, 1)


def test_subnet_exports_to_standard_onnx_ops_and_matches_torch(tmp_path):
    space = default_space(28)
    arch = space.sample_arch(np.random.default_rng(5))
    subnet = build_subnet(arch, 10, 1)
    _randomise_batchnorm(subnet, 5)
    subnet.eval()
    proto = export_onnx(subnet, (1, 1, 28, 28), tmp_path / "subnet.onnx")
    assert {node.op_type for node in proto.graph.node} <= ALLOWED_ONNX_OPS
    assert all(node.domain in ("", "ai.onnx") for node in proto.graph.node)
    images = np.random.default_rng(0).standard_normal((4, 1, 28, 28)).astype(np.float32)
    session = ort.InferenceSession(str(tmp_path / "subnet.onnx"), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"input": images})
    np.testing.assert_allclose(logits, subnet(torch.from_numpy(images)).detach().numpy(), rtol=1e-4, atol=1e-4)
    onnx.checker.check_model(proto)


def test_macs_and_params_of_a_hand_counted_net():
    space = tiny_space(8)
    # stem 8ch stride 1 on 8x8; stages (8,s1),(16,s2),(24,s2) at half width (4, 8, 12), 1 block each, ratio 2, kernel 3
    arch = space.min_arch()
    model = build_subnet(arch, 10, 1)
    stem = 8 * 8 * 8 * 1 * 9
    block1 = 64 * 16 * 8 + 64 * 16 * 9 + 64 * 4 * 16  # expand 8->16, dw 3x3 16, project 16->4 at 8x8
    block2 = 64 * 8 * 4 + 16 * 8 * 9 + 16 * 8 * 8  # expand 4->8 at 8x8, dw stride 2 -> 4x4, project 8->8
    block3 = 16 * 16 * 8 + 4 * 16 * 9 + 4 * 12 * 16  # expand 8->16 at 4x4, dw -> 2x2, project 16->12
    head = 4 * 32 * 12
    classifier = 32 * 10
    assert count_macs(model, (1, 1, 8, 8)) == stem + block1 + block2 + block3 + head + classifier
    assert count_params(model) == sum(p.numel() for p in model.parameters())
    assert count_macs(build_subnet(space.max_arch(), 10, 1), (1, 1, 8, 8)) > count_macs(model, (1, 1, 8, 8))


def test_recalibration_replaces_mixed_statistics_with_the_subnets_own():
    space = tiny_space(8)
    subnet = build_subnet(space.max_arch(), 10, 1)
    _randomise_batchnorm(subnet, 1)
    images = np.random.default_rng(0).standard_normal((64, 1, 8, 8)).astype(np.float32) * 3.0 + 1.0
    recalibrate_batchnorm(subnet, images, batch_size=16)
    first_norm = subnet.stem[1]
    with torch.no_grad():
        stem_out = subnet.stem[0](torch.from_numpy(images))
    torch.testing.assert_close(first_norm.running_mean, stem_out.mean(dim=(0, 2, 3)), rtol=1e-4, atol=1e-4)
    assert first_norm.momentum == 0.1  # restored after the cumulative pass
