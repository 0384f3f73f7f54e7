"""Benchmark: one sandwich-rule epoch of supernet training at a CIFAR-like shape (3x32x32, 10 classes,
synthetic images: the timing does not depend on what the pixels show), on 1 and 2 data-parallel workers on
the CPU, and on the GPU when torch sees one, all measured in this one run.

Prints images/s per line and the 2-worker scaling (2-worker images/s over 1-worker images/s; efficiency is
that over 2). Goal: >= 1.7x at 2 workers on 2 cores of a quiet machine. Each line times the epoch inside the
workers (after they started and joined); "with start" adds spawning the workers and loading the data.

`--accuracy-epochs N` adds what the build's default, worker-local batch norm, costs in accuracy against
`--sync-batchnorm`: the default preset's supernet trained N epochs on MNIST-5k in one process with its batches
normalised whole (what synchronised workers compute) and in 2 halves (what 2 workers with local batch norm
compute: tests/nas/test_distributed.py pins that equality), then the largest and smallest subnets' test
accuracy after BatchNorm recalibration, as the search and the zoo see them.

Usage: python bench/zoo_build_scale.py [--images 2048] [--threads 1] [--accuracy-epochs 0] [--seeds 0,1]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from fedzoo.cloud.pipeline import PRESETS, BuildConfig, prepare_data
from fedzoo.nas.evaluation import prepare_subnet
from fedzoo.nas.devices import DeviceData, resolve_device
from fedzoo.nas.distributed import join_workers, leave_workers, run_local_workers, synchronise_batchnorm
from fedzoo.nas.space import default_space
from fedzoo.nas.supernet import Supernet
from fedzoo.nas.subnet import evaluate_accuracy
from fedzoo.nas.training import ONE_WORKER, make_optimizer, train_supernet_epoch

SHAPE = (3, 32, 32)
CLASSES = 10


def synthetic_images(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`count` normalised CIFAR-shaped images and labels."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((count, *SHAPE), dtype=np.float32), rng.integers(0, CLASSES, count).astype(np.int64)


def timed_epoch(images: int, threads: int, device_name: str, distributed: bool, synchronised: bool = False) -> float:
    """Seconds of one sandwich epoch of the default preset's supernet (in this process or as one worker, with
    worker-local batch norm as the build's default, or `synchronised` over the global batch as with
    `zoo build --sync-batchnorm`)."""
    torch.set_num_threads(threads)
    training = PRESETS["default"].training
    x, y = synthetic_images(images)
    device = resolve_device(device_name, int(os.environ.get("LOCAL_RANK", "0")))
    torch.manual_seed(0)
    supernet = Supernet(default_space(SHAPE[1]), CLASSES, SHAPE[0]).to(memory_format=torch.channels_last)
    replica = ONE_WORKER
    if distributed:
        if synchronised:
            synchronise_batchnorm(supernet)
        replica = join_workers(device)
    supernet.to(device)
    optimizer = make_optimizer(supernet, training)
    data = DeviceData.place(x, y, device)
    sandwich_epoch = training.largest_only_epochs  # the first epoch with the sandwich rule: the costly kind
    try:
        if device.type == "cuda":  # a few steps first: cuDNN's autotuning and the CUDA context are not the epoch
            train_supernet_epoch(supernet, optimizer, DeviceData.place(x[:256], y[:256], device), None,
                                 replace(training, batch_size=64), 0, sandwich_epoch, replica=replica)
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        train_supernet_epoch(supernet, optimizer, data, None, training, 0, sandwich_epoch, replica=replica)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - started
    finally:
        if distributed:
            leave_workers()


def batchnorm_group_accuracy(epochs: int, batchnorm_groups: int, seed: int) -> tuple[float, float]:
    """Test accuracy (largest, smallest subnet) of the default preset's supernet trained `epochs` epochs on
    MNIST-5k in one process, each batch normalised in `batchnorm_groups` slices."""
    torch.set_num_threads(1)
    default = PRESETS["default"].training
    training = replace(default, epochs=epochs, largest_only_epochs=min(epochs - 1, default.largest_only_epochs))
    # the build's own split and normalisation (nothing is written under `out`)
    _, parts = prepare_data(BuildConfig(dataset="mnist", out=Path(tempfile.gettempdir()), seed=seed))
    train, test = parts["train"], parts["test"]
    torch.manual_seed(seed)
    supernet = Supernet(default_space(train.x.shape[2]), CLASSES, train.x.shape[1]).to(memory_format=torch.channels_last)
    optimizer = make_optimizer(supernet, training)
    for epoch in range(epochs):
        train_supernet_epoch(supernet, optimizer, train.x, train.y, training, seed, epoch, batchnorm_groups=batchnorm_groups)
    accuracies = []
    for arch in (supernet.space.max_arch(), supernet.space.min_arch()):
        subnet = prepare_subnet(supernet, arch, train.x[:1000])
        accuracies.append(evaluate_accuracy(subnet, test.x, test.y)[0])
    return accuracies[0], accuracies[1]


def trained_images(images: int) -> int:
    batch_size = PRESETS["default"].training.batch_size
    return (images // batch_size) * batch_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2048, help="training images in the epoch")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--accuracy-epochs", type=int, default=0, help="also measure local vs synchronised batch norm's accuracy")
    parser.add_argument("--seeds", default="0,1", help="seeds of the accuracy measurement")
    arguments = parser.parse_args()
    count = trained_images(arguments.images)
    print(f"one sandwich epoch, default preset supernet, {count} images of {SHAPE}, batch {PRESETS['default'].training.batch_size}, "
          f"{arguments.threads} torch thread(s) per worker, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    rows = []
    seconds = timed_epoch(arguments.images, arguments.threads, "cpu", distributed=False)
    rows.append(("cpu, 1 worker", seconds, seconds))
    started = time.perf_counter()
    seconds = run_local_workers(timed_epoch, (arguments.images, arguments.threads, "cpu", True), workers=2)[0]
    rows.append(("cpu, 2 workers (gloo)", seconds, time.perf_counter() - started))
    started = time.perf_counter()
    seconds = run_local_workers(timed_epoch, (arguments.images, arguments.threads, "cpu", True, True), workers=2)[0]
    rows.append(("cpu, 2 workers, --sync-batchnorm", seconds, time.perf_counter() - started))
    if torch.cuda.is_available():
        seconds = timed_epoch(arguments.images, arguments.threads, "cuda", distributed=False)
        rows.append((f"cuda ({torch.cuda.get_device_name(0)}), 1 worker", seconds, seconds))
    for name, seconds, with_start in rows:
        print(f"  {name:<40} {count / seconds:8.1f} images/s   ({seconds:.1f} s; with start {count / with_start:.1f} images/s)")
    speedup = rows[0][1] / rows[1][1]
    print(f"2-worker scaling: {speedup:.2f}x (efficiency {speedup / 2:.0%}); goal >= 1.7x on 2 quiet cores")
    print(f"  (with --sync-batchnorm, two all-reduces per batch norm per pass on top of the step's one: "
          f"{rows[0][1] / rows[2][1]:.2f}x)")
    if len(rows) > 3:
        print(f"GPU over 1 CPU worker: {rows[0][1] / rows[3][1]:.1f}x")
    if arguments.accuracy_epochs:
        print(f"test accuracy after {arguments.accuracy_epochs} epochs on MNIST-5k (largest / smallest subnet, BN recalibrated):")
        for seed in (int(value) for value in arguments.seeds.split(",")):
            synchronised = batchnorm_group_accuracy(arguments.accuracy_epochs, 1, seed)
            local = batchnorm_group_accuracy(arguments.accuracy_epochs, 2, seed)
            print(f"  seed {seed}: batch norm over the global batch {synchronised[0]:.4f} / {synchronised[1]:.4f}, "
                  f"over each of 2 workers' halves {local[0]:.4f} / {local[1]:.4f}")


if __name__ == "__main__":
    main()
