"""On-device training of the architectures users bring: our training graph on onnxruntime vs torch eager.

For each hand-built architecture of tests/graphs/architectures.py (MobileNetV3-small with squeeze-excite,
ResNet-18, an EfficientNet-B0-like net, SqueezeNet, ShuffleNetV2, LeNet-5, an MLP regressor with MSE),
exported with non-trivial BatchNorm statistics, side by side in one run, 1 thread each:
1. time per training step (forward, backward, SGD-momentum update; batch 32), every parameter trained,
   median over interleaved rounds, as wall time and as the process's CPU time (both runtimes use one thread;
   CPU time is the steadier figure on a shared, loaded machine, where wall time also counts waiting for a core):
   - ours: `fedzoo.edge.trainer.Trainer` running the training graph (BN folded, as shipped);
   - torch eager: the same BN-folded network as torch modules in eval mode (the identical computation);
2. peak RSS (VmHWM) of a client process per runtime that loads the model and trains 20 steps.

Run: .venv/bin/python bench/train_architectures.py [--rounds 5] [--architectures resnet18 lenet5]
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))  # train_benchmark's timing and memory helpers
sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "graphs"))  # the architectures
from train_benchmark import fold_batchnorm, peak_rss_mb, time_steps  # noqa: E402

BATCH_SIZE = 32
MEMORY_STEPS = 20
LEARNING_RATE, MOMENTUM = 0.01, 0.9


def _shard(name: str, size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    from architectures import ARCHITECTURES

    architecture = ARCHITECTURES[name]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((size, *architecture.input_shape)).astype(np.float32)
    if architecture.loss == "mse":
        return x, rng.standard_normal((size, 2)).astype(np.float32)
    return x, rng.integers(0, 10, size).astype(np.int64)


# client processes (peak memory) ------------------------------------------------------------------


def ort_client(folder: Path, name: str) -> dict:
    """A device client: numpy + onnxruntime only."""
    from fedzoo.edge.optimizers import SGD
    from fedzoo.edge.trainer import Trainer

    shard = np.load(folder / f"{name}-shard.npz")
    trainer = Trainer.from_inference_model(
        folder / f"{name}-train.onnx", folder / f"{name}.onnx", SGD(LEARNING_RATE, momentum=MOMENTUM), threads=1
    )
    for step in range(MEMORY_STEPS):
        start = step * BATCH_SIZE % len(shard["x"])
        trainer.step(shard["x"][start : start + BATCH_SIZE], shard["y"][start : start + BATCH_SIZE])
    assert "torch" not in sys.modules, "the onnxruntime client imported torch"
    return {"peak_rss_mb": peak_rss_mb()}


def torch_client(folder: Path, name: str) -> dict:
    """The same client written with torch: the BN-folded network trained in eager mode."""
    import torch
    from architectures import ARCHITECTURES

    torch.set_num_threads(1)
    network = torch.load(folder / f"{name}.pt", weights_only=False)
    shard = np.load(folder / f"{name}-shard.npz")
    step = _torch_step(network, ARCHITECTURES[name].loss)
    for index in range(MEMORY_STEPS):
        start = index * BATCH_SIZE % len(shard["x"])
        step(torch.from_numpy(shard["x"][start : start + BATCH_SIZE]), torch.from_numpy(shard["y"][start : start + BATCH_SIZE]))
    return {"peak_rss_mb": peak_rss_mb()}


CLIENTS = {"ort": ort_client, "torch": torch_client}


def run_client(kind: str, folder: Path, name: str) -> dict:
    command = [sys.executable, __file__, "--client", kind, "--folder", str(folder), "--architectures", name]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def _torch_step(network, loss: str):
    import torch

    optimizer = torch.optim.SGD(network.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    loss_function = torch.nn.functional.mse_loss if loss == "mse" else torch.nn.functional.cross_entropy

    def step(x, y):
        value = loss_function(network(x), y)
        optimizer.zero_grad()
        value.backward()
        optimizer.step()

    return step


# the comparison ----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client", choices=sorted(CLIENTS))
    parser.add_argument("--folder", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-round", type=int, default=3)
    parser.add_argument("--architectures", nargs="+", help="default: all of tests/graphs/architectures.py")
    arguments = parser.parse_args()
    if arguments.client:  # before importing the architectures, which import torch
        print(json.dumps(CLIENTS[arguments.client](arguments.folder, arguments.architectures[0])))
        return

    import onnx
    import onnxruntime
    import torch
    from architectures import ARCHITECTURES, with_batchnorm_statistics

    unknown = sorted(set(arguments.architectures or ()) - set(ARCHITECTURES))
    if unknown:
        parser.error(f"unknown architectures {unknown}; choose from {sorted(ARCHITECTURES)}")

    from fedzoo.edge.optimizers import SGD
    from fedzoo.edge.trainer import Trainer
    from fedzoo.graphs.autodiff import build_training_graph
    from fedzoo.nas.export import export_onnx

    torch.set_num_threads(1)
    print(f"onnxruntime {onnxruntime.__version__}, torch {torch.__version__}, CPU, 1 thread, batch {BATCH_SIZE}, "
          f"wall and CPU time, median of {arguments.rounds} interleaved rounds x {arguments.steps_per_round} steps; "
          "measured on a shared, loaded machine (other jobs running): compare the columns of one row, not runs")  # fmt: skip
    header = (f"{'architecture':22s} {'params':>8s} {'ours ms':>8s} {'torch ms':>8s} {'ours/torch':>10s} "
              f"{'ours CPU ms':>11s} {'torch CPU ms':>12s} {'CPU ours/torch':>14s} {'ours RSS MB':>11s} {'torch RSS MB':>12s}")
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        for name in arguments.architectures or sorted(ARCHITECTURES):
            architecture = ARCHITECTURES[name]
            torch.manual_seed(0)
            module = with_batchnorm_statistics(architecture.build())
            proto = export_onnx(module, (1, *architecture.input_shape), folder / f"{name}.onnx")
            onnx.save(build_training_graph(proto, loss=architecture.loss), folder / f"{name}-train.onnx")
            network = fold_batchnorm(module).eval()
            torch.save(network, folder / f"{name}.pt")
            x, y = _shard(name, 4 * BATCH_SIZE)
            np.savez(folder / f"{name}-shard.npz", x=x, y=y)

            trainer = Trainer.from_inference_model(
                folder / f"{name}-train.onnx", folder / f"{name}.onnx", SGD(LEARNING_RATE, momentum=MOMENTUM), threads=1
            )
            batch_x, batch_y = x[:BATCH_SIZE], y[:BATCH_SIZE]
            torch_x, torch_y = torch.from_numpy(batch_x), torch.from_numpy(batch_y)
            torch_step = _torch_step(copy.deepcopy(network), architecture.loss)
            steps = {"ours": lambda: trainer.step(batch_x, batch_y), "torch": lambda: torch_step(torch_x, torch_y)}
            times = time_steps(steps, arguments.rounds, arguments.steps_per_round)
            cpu_times = time_steps(steps, arguments.rounds, arguments.steps_per_round, clock=time.process_time)
            memory = {kind: run_client(kind, folder, name)["peak_rss_mb"] for kind in CLIENTS}
            parameters = sum(int(np.prod(init.dims)) for init in proto.graph.initializer)
            rows.append(
                f"{name:22s} {parameters:8d} {times['ours']:8.1f} {times['torch']:8.1f} {times['ours'] / times['torch']:10.2f} "
                f"{cpu_times['ours']:11.1f} {cpu_times['torch']:12.1f} {cpu_times['ours'] / cpu_times['torch']:14.2f} "
                f"{memory['ort']:11.1f} {memory['torch']:12.1f}"
            )
            print(rows[-1] if len(rows) > 1 else f"{header}\n{rows[-1]}", flush=True)
    print("goal: ours/torch <= 1.0 on every architecture")


if __name__ == "__main__":
    main()
