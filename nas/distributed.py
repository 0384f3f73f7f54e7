"""Data-parallel supernet training with torch.distributed, launched by torchrun (or, on one machine, by the
same elastic agent started from Python: `run_local_workers`).

Why torch.distributed and not Ray Train: it ships with torch (no new dependency), torchrun's elastic agent
restarts every worker when one dies (`--max-restarts`), which with the build's epoch checkpoints is all that
"a dead rank resumes" needs, and the same command line scales from one machine to many.

Why not the `DistributedDataParallel` wrapper: one sandwich step runs 2 to 4 subnets, each using another part
of the weights, and accumulates their gradients into one optimiser step. DDP would need
`find_unused_parameters` (a graph walk after every pass) and `no_sync` to get one reduction per step;
`average_gradients` is that one reduction, explicitly: after the step's last backward pass, every gradient is
summed over the workers in one flat all-reduce and divided by their number. As every worker runs the same
subnets (same generators), every worker has the same parameters with a gradient.

BatchNorm normalises each worker's slice by default, as DDP does: N workers with B/N images each train the
weights one process trains when it normalises each batch in N slices (`train_supernet_epoch`'s
`batchnorm_groups`), and the running statistics are averaged over the workers after each epoch (the zoo's
subnets are recalibrated on extraction anyway). `SynchronisedBatchNorm` (`zoo build --sync-batchnorm`)
all-reduces each channel's sum and sum of squares instead (autograd-aware, so the backward pass reduces too),
so N workers train the weights of one worker with B images, up to float rounding; its two collectives per
BatchNorm and pass cost more than a second worker gains on 2 CPUs (bench/zoo_build_scale.py).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from fedzoo.nas.training import Replica

_ENVIRONMENT_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
FRESH_STORE_PER_ATTEMPT = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"  # torchrun users set it to 1 too (docs)


class _SumOverWorkers(torch.autograd.Function):
    """All-reduce (sum) whose backward pass all-reduces the gradient: d(sum over workers)/d(each worker's part)
    is the sum of every worker's gradient of its loss with respect to the total."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        return sum_over_workers(tensor)

    @staticmethod
    def backward(ctx: Any, gradient: torch.Tensor) -> torch.Tensor:
        return sum_over_workers(gradient)


class SynchronisedBatchNorm(nn.BatchNorm2d):
    """BatchNorm over the first `channels` features (as `DynamicBatchNorm`) whose training statistics are
    the global batch's: the mean and variance over every worker's images."""

    counts_batches: bool = True  # plain BatchNorm2d counts its batches; DynamicBatchNorm does not

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channels = x.shape[1]
        weight, bias = self.weight[:channels], self.bias[:channels]
        running_mean, running_var = self.running_mean[:channels], self.running_var[:channels]
        if not self.training:
            return F.batch_norm(x, running_mean, running_var, weight, bias, False, 0.0, self.eps)
        if self.counts_batches:
            self.num_batches_tracked.add_(1)
        values = x.float()
        local_count = values.new_full((1,), values.numel() // channels)
        sums = _SumOverWorkers.apply(torch.cat([values.sum((0, 2, 3)), (values * values).sum((0, 2, 3)), local_count]))
        count = sums[-1]
        mean = sums[:channels] / count
        variance = (sums[channels : 2 * channels] / count - mean * mean).clamp_min(0.0)
        with torch.no_grad():
            running_mean.mul_(1 - self.momentum).add_(mean.detach(), alpha=self.momentum)
            running_var.mul_(1 - self.momentum).add_(variance.detach() * (count / (count - 1)), alpha=self.momentum)
        scale = weight * torch.rsqrt(variance + self.eps)
        shift = bias - mean * scale
        return (values * scale[None, :, None, None] + shift[None, :, None, None]).to(x.dtype)


def synchronise_batchnorm(module: nn.Module) -> nn.Module:
    """Replace every BatchNorm2d of `module` by a `SynchronisedBatchNorm` sharing its parameters and buffers
    (the state dict keeps its keys, so checkpoints load into a plain supernet)."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d) and not isinstance(child, SynchronisedBatchNorm):
            replacement = SynchronisedBatchNorm(child.num_features, child.eps, child.momentum, device="meta")
            replacement.counts_batches = type(child) is nn.BatchNorm2d
            replacement.weight, replacement.bias = child.weight, child.bias
            for buffer in ("running_mean", "running_var", "num_batches_tracked"):
                setattr(replacement, buffer, getattr(child, buffer))
            replacement.train(child.training)
            setattr(module, name, replacement)
        else:
            synchronise_batchnorm(child)
    return module


def average_gradients(module: nn.Module) -> None:
    """Make every gradient of `module` the mean over the workers, in one all-reduce."""
    gradients = [parameter.grad for parameter in module.parameters() if parameter.grad is not None]
    if not gradients:
        return
    flat = torch.cat([gradient.reshape(-1) for gradient in gradients])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for gradient in gradients:
        gradient.copy_(flat[offset : offset + gradient.numel()].view_as(gradient))
        offset += gradient.numel()


def sum_over_workers(value: torch.Tensor) -> torch.Tensor:
    """`value` summed over the workers (a copy; `value` is left as it was)."""
    total = value.clone()
    dist.all_reduce(total)
    return total


def launched_as_worker() -> bool:
    """True inside a process torchrun (or `run_local_workers`) started as one of several workers."""
    return all(key in os.environ for key in _ENVIRONMENT_KEYS) and int(os.environ["WORLD_SIZE"]) > 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def join_workers(device: torch.device) -> Replica:
    """Join the process group torchrun described in the environment (NCCL for GPUs, gloo for CPUs) and return
    this worker's `Replica`."""
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", device_id=device if device.type == "cuda" else None)
    return Replica(dist.get_rank(), dist.get_world_size(), average_gradients, sum_over_workers)


def leave_workers() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def newest_state(local_state: dict[str, Any] | None, epoch_key: str = "epoch") -> dict[str, Any] | None:
    """The checkpoint with the most epochs that any worker holds, on every worker: after a restart, machines
    that do not share a folder still resume from the newest copy (each machine's first worker writes one)."""
    epochs: list[int | None] = [None] * dist.get_world_size()
    dist.all_gather_object(epochs, -1 if local_state is None else int(local_state[epoch_key]))
    source = max(range(len(epochs)), key=lambda rank: (epochs[rank], -rank))
    if epochs[source] < 0:
        return None
    holder = [local_state if dist.get_rank() == source else None]
    dist.broadcast_object_list(holder, src=source)
    return holder[0]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_local_workers(entrypoint: Callable[..., Any], arguments: tuple, workers: int, max_restarts: int = 3) -> dict[int, Any]:
    """Run `entrypoint(*arguments)` in `workers` processes on this machine under torch's elastic agent (what
    torchrun runs): every worker is restarted, up to `max_restarts` times, when one of them fails. Returns
    each rank's return value. `entrypoint` must be importable (spawned processes)."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    # the agent's shared TCP store outlives a restart with the failed attempt's keys in it, and the restarted
    # workers' gloo then dials the dead workers' addresses: a fresh store for every attempt instead
    os.environ[FRESH_STORE_PER_ATTEMPT] = "1"
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=workers, run_id=f"fedzoo-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{_free_port()}", max_restarts=max_restarts,
        monitor_interval=0.1, start_method="spawn",
    )
    return elastic_launch(config, entrypoint)(*arguments)
