"""On-device training: our standard-op training graph on onnxruntime vs PyTorch eager, side by side.

1. Time per training step (forward, backward, SGD-momentum update; batch 32 of MNIST 28x28) of a
   MobileNetV2-style NAS subnet, interleaved rounds, same thread count for both runtimes, training every
   parameter and training all but the depthwise kernels (frozen the same way in torch):
   - ours: `fedzoo.edge.trainer.Trainer` running the training graph (BN folded, as shipped);
   - torch folded: the same BN-folded network as torch modules (the identical computation);
   - torch with BN: the unfolded subnet in train mode (what a torch client would train).
2. Peak RSS (VmHWM) of two client processes that load a data shard and train for a few steps: one
   with `fedzoo.edge.trainer` (checked not to import torch), one with torch.

Run: .venv/bin/python bench/train_benchmark.py [--rounds 7] [--threads 1 2]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BATCH_SIZE = 32
MEMORY_STEPS = 20
ARCH = {  # a mid-sized subnet of the MNIST search space (ReLU6 and HardSwish stages, 3x3 and 5x5 depthwise)
    "family": "ofa-mbv2", "resolution": 28, "stem_channels": 16, "stem_stride": 2, "stem_activation": "relu6",
    "head_channels": 128, "head_activation": "hswish",
    "stages": [
        {"out_channels": 16, "stride": 1, "activation": "relu6", "kernels": [3, 5], "expand_ratios": [4, 4]},
        {"out_channels": 24, "stride": 2, "activation": "relu6", "kernels": [3, 5], "expand_ratios": [4, 4]},
        {"out_channels": 40, "stride": 2, "activation": "hswish", "kernels": [3, 5], "expand_ratios": [4, 4]},
        {"out_channels": 64, "stride": 1, "activation": "hswish", "kernels": [3, 5], "expand_ratios": [4, 4]},
    ],
}  # fmt: skip


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


# client processes (peak memory) ------------------------------------------------------------------


def ort_client(folder: Path) -> dict:
    """A device client: numpy + onnxruntime only."""
    from fedzoo.edge.optimizers import SGD
    from fedzoo.edge.trainer import Trainer, save_parameters

    shard = np.load(folder / "shard.npz")
    trainer = Trainer.from_inference_model(folder / "train.onnx", folder / "model.onnx", SGD(0.01, momentum=0.9), threads=1)
    x, y = shard["x"], shard["y"]
    for step in range(MEMORY_STEPS):
        start = step * BATCH_SIZE % len(x)
        trainer.step(x[start : start + BATCH_SIZE], y[start : start + BATCH_SIZE])
    save_parameters(folder / "ort-update.npz", trainer.parameters)
    assert "torch" not in sys.modules, "the onnxruntime client imported torch"
    return {"peak_rss_mb": peak_rss_mb(), "torch_imported": "torch" in sys.modules}


def torch_client(folder: Path) -> dict:
    """The same client written with torch: the NAS subnet (with BN) trained in eager mode."""
    import torch

    from fedzoo.nas.subnet import build_subnet

    torch.set_num_threads(1)
    shard = np.load(folder / "shard.npz")
    model = build_subnet(ARCH, num_classes=10, in_channels=1)
    model.load_state_dict(torch.load(folder / "model.pt"))
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.from_numpy(shard["x"]), torch.from_numpy(shard["y"])
    for step in range(MEMORY_STEPS):
        start = step * BATCH_SIZE % len(x)
        loss = torch.nn.functional.cross_entropy(model(x[start : start + BATCH_SIZE]), y[start : start + BATCH_SIZE])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.save(model.state_dict(), folder / "torch-update.pt")
    return {"peak_rss_mb": peak_rss_mb(), "torch_imported": True}


CLIENTS = {"ort": ort_client, "torch": torch_client}


def run_client(kind: str, folder: Path) -> dict:
    result = subprocess.run(
        [sys.executable, __file__, "--client", kind, "--folder", str(folder)], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


# step time ---------------------------------------------------------------------------------------


def fold_batchnorm(model):
    """The eval-mode network with every Conv+BN pair fused: what the ONNX export ships."""
    import torch
    from torch import nn

    folded = copy.deepcopy(model).eval()
    for sequential in [module for module in folded.modules() if isinstance(module, nn.Sequential)]:
        names = list(sequential._modules)
        for conv_name, bn_name in zip(names, names[1:]):
            conv, bn = sequential._modules[conv_name], sequential._modules[bn_name]
            if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d):
                sequential._modules[conv_name] = torch.nn.utils.fusion.fuse_conv_bn_eval(conv, bn)
                sequential._modules[bn_name] = nn.Identity()
    return folded.train()


def freeze_depthwise_convolutions(network) -> None:
    """Freeze what `all_but_depthwise` freezes: each depthwise conv and the BN folded into it."""
    from torch import nn

    for sequential in [module for module in network.modules() if isinstance(module, nn.Sequential)]:
        layers = list(sequential)
        for index, layer in enumerate(layers):
            if isinstance(layer, nn.Conv2d) and layer.groups > 1:
                layer.requires_grad_(False)
                if index + 1 < len(layers) and isinstance(layers[index + 1], nn.BatchNorm2d):
                    layers[index + 1].requires_grad_(False)


def time_steps(steps: dict, rounds: int, steps_per_round: int, clock=time.perf_counter) -> dict[str, float]:
    """Median over interleaved rounds of the mean time per step, in ms: wall time, or with
    `clock=time.process_time` this process's CPU time (steadier than wall time on a shared machine)."""
    timings: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():
        for _ in range(3):
            step()
    for _ in range(rounds):
        for name, step in steps.items():
            start = clock()
            for _ in range(steps_per_round):
                step()
            timings[name].append((clock() - start) / steps_per_round * 1e3)
    return {name: statistics.median(values) for name, values in timings.items()}


def subnet_and_shard():
    """The NAS subnet of `ARCH` (torch, train mode, BN statistics from the shard) and a normalised MNIST shard of 640."""
    import torch

    from fedzoo.datasets import load_dataset
    from fedzoo.nas.subnet import build_subnet

    torch.manual_seed(0)
    dataset = load_dataset("mnist")
    mean, std = float(dataset.x.mean()), float(dataset.x.std())
    order = np.random.default_rng(0).permutation(len(dataset.x))[:640]
    shard_x, shard_y = ((dataset.x[order] - mean) / std).astype(np.float32), dataset.y[order]
    model = build_subnet(ARCH, num_classes=10, in_channels=1)
    model.train()
    with torch.no_grad():  # real BN statistics, so folding changes the weights
        for start in range(0, len(shard_x), 64):
            model(torch.from_numpy(shard_x[start : start + 64]))
    return model, shard_x, shard_y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client", choices=sorted(CLIENTS))
    parser.add_argument("--folder", type=Path)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps-per-round", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    arguments = parser.parse_args()
    if arguments.client:
        print(json.dumps(CLIENTS[arguments.client](arguments.folder)))
        return

    import onnx
    import onnxruntime
    import torch

    from fedzoo.edge.optimizers import SGD
    from fedzoo.edge.trainer import Trainer
    from fedzoo.graphs.autodiff import build_training_graph
    from fedzoo.nas.export import export_onnx

    model, shard_x, shard_y = subnet_and_shard()
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        proto = export_onnx(model, (1, 1, 28, 28), folder / "model.onnx")
        graph = build_training_graph(proto)
        onnx.save(graph, folder / "train.onnx")  # what the memory clients train: every parameter
        torch.save(model.state_dict(), folder / "model.pt")
        np.savez(folder / "shard.npz", x=shard_x, y=shard_y)
        parameters = sum(int(np.prod(init.dims)) for init in proto.graph.initializer)
        print(f"model: NAS subnet, {len(proto.graph.node)} inference nodes, {parameters} parameters; "
              f"training graph: {len(graph.graph.node)} nodes; batch {BATCH_SIZE} x 1x28x28")  # fmt: skip
        print(f"onnxruntime {onnxruntime.__version__}, torch {torch.__version__}, CPU, wall time, "
              f"median of {arguments.rounds} interleaved rounds x {arguments.steps_per_round} steps")  # fmt: skip

        x, y = shard_x[:BATCH_SIZE], shard_y[:BATCH_SIZE]
        x_torch, y_torch = torch.from_numpy(x), torch.from_numpy(y)

        def torch_step(network, freeze_depthwise: bool):
            if freeze_depthwise:
                freeze_depthwise_convolutions(network)
            trainable = [parameter for parameter in network.parameters() if parameter.requires_grad]
            optimizer = torch.optim.SGD(trainable, lr=0.01, momentum=0.9)

            def step():
                loss = torch.nn.functional.cross_entropy(network(x_torch), y_torch)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

            return step

        for threads in arguments.threads:
            torch.set_num_threads(threads)
            for trainable, freeze_depthwise in (("all", False), ("all_but_depthwise", True)):
                graph_path = folder / f"train-{trainable}.onnx"
                onnx.save(build_training_graph(proto, trainable), graph_path)
                trainer = Trainer.from_inference_model(graph_path, folder / "model.onnx", SGD(0.01, momentum=0.9), threads)
                steps = {
                    "onnxruntime training graph": lambda: trainer.step(x, y),
                    "torch eager, BN folded": torch_step(fold_batchnorm(model), freeze_depthwise),
                    "torch eager, with BN": torch_step(copy.deepcopy(model).train(), freeze_depthwise),
                }
                times = time_steps(steps, arguments.rounds, arguments.steps_per_round)
                ours = times["onnxruntime training graph"]
                print(f"threads={threads}, trainable={trainable} ({len(trainer.parameter_names)} parameter tensors)")
                for name, milliseconds in times.items():
                    ratio = "" if name == "onnxruntime training graph" else f"   ratio ours/this = {ours / milliseconds:.2f} (goal <= 1.0)"
                    print(f"  {name:28s} {milliseconds:8.1f} ms/step{ratio}")

        ort_result, torch_result = run_client("ort", folder), run_client("torch", folder)
        print(f"peak RSS of a training client process ({MEMORY_STEPS} steps, 1 thread, VmHWM):")
        print(f"  fedzoo.edge.trainer (onnxruntime+numpy, torch imported: {ort_result['torch_imported']}) "
              f"{ort_result['peak_rss_mb']:7.1f} MB")  # fmt: skip
        print(f"  torch eager                                                 {torch_result['peak_rss_mb']:7.1f} MB")
        print(f"  ratio ours/torch = {ort_result['peak_rss_mb'] / torch_result['peak_rss_mb']:.2f} (goal <= 0.33)")


if __name__ == "__main__":
    main()
