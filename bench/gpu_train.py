"""GPU check, ready to run: without a CUDA GPU it prints "no GPU" and exits 0. With one, all in this run:

1. supernet training at a CIFAR-like shape (3x32x32, 10 classes, synthetic images: timing only), one
   sandwich epoch of the default preset on `cuda` and on `cpu`: images/s and the ratio;
2. the same tiny zoo built on `cuda` and on `cpu` (digits, tiny preset, same seed): the best and the mean
   card test accuracy of each, which must agree within noise (goal: within 3 points; the two devices sum in
   other orders, so the supernets differ, as two CPU builds with other thread counts do).

Usage: python bench/gpu_train.py [--images 4096] [--cpu-images 512]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from zoo_build_scale import timed_epoch, trained_images  # noqa: E402

ACCURACY_NOISE_POINTS = 3.0


def zoo_accuracies(device: str, folder: Path) -> tuple[float, float]:
    """(best, mean) test accuracy of a tiny digits zoo built on `device`."""
    from fedzoo.cloud.pipeline import BuildConfig, build_zoo

    config = BuildConfig(dataset="digits", out=folder / device.replace(":", "-"), preset="tiny", device=device,
                         compress=False, training_graphs=False, executor="in-process", latency_source="macs")
    accuracies = [card.metrics.accuracy for card in build_zoo(config).cards]
    return max(accuracies), sum(accuracies) / len(accuracies)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=4096, help="images in the GPU's timed epoch")
    parser.add_argument("--cpu-images", type=int, default=512, help="images in the CPU's timed epoch (it is slow)")
    arguments = parser.parse_args()
    if not torch.cuda.is_available():
        print("no GPU")
        return 0
    name = torch.cuda.get_device_name(0)
    gpu_seconds = timed_epoch(arguments.images, 1, "cuda", distributed=False)
    cpu_seconds = timed_epoch(arguments.cpu_images, torch.get_num_threads(), "cpu", distributed=False)
    gpu_rate = trained_images(arguments.images) / gpu_seconds
    cpu_rate = trained_images(arguments.cpu_images) / cpu_seconds
    print(f"supernet training, one sandwich epoch at 3x32x32: cuda ({name}) {gpu_rate:.0f} images/s, "
          f"cpu ({torch.get_num_threads()} threads) {cpu_rate:.0f} images/s: {gpu_rate / cpu_rate:.1f}x")
    with tempfile.TemporaryDirectory(prefix="fedzoo-gpu-bench-") as folder:
        gpu_best, gpu_mean = zoo_accuracies("cuda", Path(folder))
        cpu_best, cpu_mean = zoo_accuracies("cpu", Path(folder))
    gap_points = 100 * max(abs(gpu_best - cpu_best), abs(gpu_mean - cpu_mean))
    verdict = "within noise" if gap_points <= ACCURACY_NOISE_POINTS else "OUTSIDE noise"
    print(f"tiny digits zoo, test accuracy best/mean: cuda {gpu_best:.3f}/{gpu_mean:.3f}, cpu {cpu_best:.3f}/{cpu_mean:.3f}; "
          f"largest gap {gap_points:.1f} points ({verdict}; goal <= {ACCURACY_NOISE_POINTS:.0f})")
    return 0 if gap_points <= ACCURACY_NOISE_POINTS else 1


if __name__ == "__main__":
    sys.exit(main())
