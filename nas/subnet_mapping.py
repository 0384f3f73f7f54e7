"""Where each tensor of a subnet lives in the supernet, both ways, in numpy (the server maps devices'
deltas without torch).

A subnet of `fedzoo.nas.supernet.Supernet` takes, per tensor (names as `fedzoo.nas.subnet.Subnet`'s state
dict, which are also its ONNX initializer names):

- **width**: leading slices: a block's project conv and its BatchNorm the first `out_channels` of its stage
  (the arch's), the next block's expand conv (or the head conv) the first input channels;
- **expand ratio**: leading slices: a block's expand conv and its BatchNorm the first
  `mid = in_channels x ratio` channels (`in_channels` the subnet's), the project conv the first `mid` input channels;
- **depth**: a stage's first `d` blocks (subnet block `i` is the supernet's block `(stage, b)` in order);
- **elastic kernel**: a `k x k` depthwise kernel is `crop(W) @ M_s` applied from the largest kernel down
  (one learned matrix `M_s` per smaller size, shared by all channels). Per channel this is one linear map
  `w_k = vec(W_K) @ A` with `A` of shape (K², k²).

`map_back` turns a subnet's delta into a supernet delta and the mask of the elements it covers. For
slices it is the inverse selection. For a kernel it is the minimum-norm solution of
`vec(ΔW) @ A = Δw_k`, i.e. `Δw_k @ pinv(A)`: re-extracting the updated supernet then gives exactly the
device's kernel (`extract(W + map_back(Δ)) = extract(W) + Δ`). It equals the adjoint `Δw_k @ Aᵀ` when
`A`'s columns are orthonormal, as at initialisation (`M_s` is the identity); unlike the adjoint it does not
shrink or stretch the update where the learned transform is not orthogonal. The transform matrices
themselves are not in any subnet, so no device trains them: they keep their values.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from fedzoo.errors import InvalidInputError
from fedzoo.nas.space import Arch, SearchSpace

Weights = dict[str, np.ndarray]
NORM_TENSORS = ("weight", "bias", "running_mean", "running_var")
PINV_RCOND = 1e-6


@dataclass(frozen=True)
class Placement:
    """One subnet tensor: the supernet tensor it comes from, the leading slice it takes and, for a smaller
    depthwise kernel, the per-channel linear map `A` (K², k²) from the supernet kernel to the subnet's."""

    subnet_name: str
    supernet_name: str
    index: tuple[slice, ...]
    kernel_map: np.ndarray | None = None

    def extract(self, weights: Weights) -> np.ndarray:
        """The subnet tensor taken from the supernet weights."""
        region = weights[self.supernet_name][self.index]
        if self.kernel_map is None:
            return np.array(region, dtype=np.float32)
        channels, kernel = region.shape[0], int(round(np.sqrt(self.kernel_map.shape[1])))
        flat = region.reshape(channels, -1).astype(np.float64) @ self.kernel_map
        return flat.reshape(channels, 1, kernel, kernel).astype(np.float32)

    def map_back(self, delta: np.ndarray, supernet_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(the delta on the supernet region `self.index`, the mask of the region's elements it covers)."""
        if self.kernel_map is None:
            return delta.astype(np.float32), np.ones(delta.shape, dtype=bool)
        channels = delta.shape[0]
        largest = supernet_shape[-1]
        inverse = np.linalg.pinv(self.kernel_map, rcond=PINV_RCOND)  # (k², K²)
        region = (delta.reshape(channels, -1).astype(np.float64) @ inverse).reshape(channels, 1, largest, largest)
        covered = np.any(self.kernel_map != 0, axis=1).reshape(1, 1, largest, largest)
        return region.astype(np.float32), np.broadcast_to(covered, region.shape).copy()


def kernel_map(transforms: Weights, prefix: str, space: SearchSpace, kernel: int) -> np.ndarray | None:
    """`A` for a depthwise kernel of size `kernel` (None for the largest: a plain slice), built by running
    the supernet's crop-and-transform steps (`DynamicInvertedResidual.depthwise_kernel`) on a basis."""
    largest = space.max_kernel
    if kernel == largest:
        return None
    basis = np.eye(largest * largest).reshape(largest * largest, 1, largest, largest)
    current = basis
    for size in sorted(space.kernel_choices, reverse=True):
        if size == largest or size < kernel:
            continue
        start = (current.shape[-1] - size) // 2
        centre = current[:, :, start : start + size, start : start + size]
        matrix = transforms[f"{prefix}kernel_transforms.{size}"].astype(np.float64)
        current = (centre.reshape(len(basis), size * size) @ matrix).reshape(len(basis), 1, size, size)
    return current.reshape(len(basis), kernel * kernel)


def _norm(subnet_prefix: str, supernet_prefix: str, channels: int | None) -> Iterator[Placement]:
    index = (slice(0, channels),) if channels is not None else (slice(None),)
    for tensor in NORM_TENSORS:
        yield Placement(f"{subnet_prefix}.{tensor}", f"{supernet_prefix}.{tensor}", index)


def placements(space: SearchSpace, arch: Arch, weights: Weights) -> list[Placement]:
    """Every tensor of `arch`'s subnet (parameters and BatchNorm running statistics) and where it lives in the
    supernet; `weights` supplies the kernel transforms."""
    if not space.contains(arch):
        raise InvalidInputError("arch is not a subnet of this supernet's search space", field="arch")
    everything = (slice(None),)
    result = [Placement("stem.0.weight", "stem.0.weight", everything), *_norm("stem.1", "stem.1", None)]
    block_index, in_channels = 0, space.stem_channels
    for stage_index, stage in enumerate(arch["stages"]):
        out_channels = int(stage["out_channels"])
        for block, (kernel, ratio) in enumerate(zip(stage["kernels"], stage["expand_ratios"])):
            mid = in_channels * int(ratio)
            source, target = f"stages.{stage_index}.{block}", f"blocks.{block_index}.layers"
            result += [
                Placement(f"{target}.0.weight", f"{source}.expand_weight", (slice(0, mid), slice(0, in_channels))),
                *_norm(f"{target}.1", f"{source}.expand_norm", mid),
                Placement(f"{target}.3.weight", f"{source}.depthwise_weight", (slice(0, mid),),
                          kernel_map(weights, f"{source}.", space, int(kernel))),
                *_norm(f"{target}.4", f"{source}.depthwise_norm", mid),
                Placement(f"{target}.6.weight", f"{source}.project_weight", (slice(0, out_channels), slice(0, mid))),
                *_norm(f"{target}.7", f"{source}.project_norm", out_channels),
            ]
            block_index += 1
            in_channels = out_channels
    result += [Placement("head.0.weight", "head.0.weight", (slice(None), slice(0, in_channels))),
               *_norm("head.1", "head.1", None),
               Placement("classifier.weight", "classifier.weight", everything),
               Placement("classifier.bias", "classifier.bias", everything)]
    return result


def extract_weights(space: SearchSpace, arch: Arch, weights: Weights) -> Weights:
    """The subnet's tensors (its state dict without `num_batches_tracked`) from the supernet weights."""
    return {placement.subnet_name: placement.extract(weights) for placement in placements(space, arch, weights)}


@dataclass(frozen=True)
class MappedDelta:
    """A subnet delta on the supernet: per supernet tensor, the delta (zero where not covered) and the mask
    of the elements the subnet covers."""

    deltas: Weights
    masks: dict[str, np.ndarray]


def map_back(space: SearchSpace, arch: Arch, weights: Weights, delta: Weights) -> MappedDelta:
    """Map a subnet's delta (keyed by subnet tensor names; tensors it lacks count as not covered) onto the
    supernet's tensors."""
    deltas: Weights = {}
    masks: dict[str, np.ndarray] = {}
    for placement in placements(space, arch, weights):
        if placement.subnet_name not in delta:
            continue
        shape = weights[placement.supernet_name].shape
        region, covered = placement.map_back(delta[placement.subnet_name], shape)
        full = deltas.setdefault(placement.supernet_name, np.zeros(shape, np.float32))
        mask = masks.setdefault(placement.supernet_name, np.zeros(shape, bool))
        full[placement.index] = np.where(covered, region, 0.0)
        mask[placement.index] = covered
    return MappedDelta(deltas, masks)
