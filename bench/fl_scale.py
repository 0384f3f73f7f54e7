"""Benchmark: federated rounds at fleet scale, fedzoo against Flower 1.42, side by side in one run.

For 10, 200 and 1,000 clients (every client in every round), each framework runs the same rounds of the same
model (a 2-layer perceptron pre-trained on 10% of MNIST-5k's training split, shipped as ONNX with its
training graph), on the same shards (the training split, shuffled with the seed, cut into near-equal parts),
with the same local work (`fedzoo.clients.participation.train_locally`: one epoch of SGD on the shard with the
stock onnxruntime):
- fedzoo: `fedzoo fl simulate --executor processes` (the devices in one process per core; the real server
  reached through WSGI without TCP, `--transport wsgi`: its app in the simulating process for check-ins and
  in each device process as a server worker on the same database);
- fedzoo-tcp: the same with `--transport tcp` (the server in the simulating process over loopback HTTP);
- Flower in-process: Flower's FedAvg and NumPyClients in one process, no transport;
- Flower on Ray: `flwr.simulation.run_simulation`, one CPU per virtual client.
Each run is its own process, so its peak RSS is its own. Figures per round, rounds after the first (the first
starts worker processes or Ray actors):
- overhead = round wall time - the clients' summed training seconds / the clients trained at once (1 for
  Flower in-process, the workers or Ray CPUs otherwise): what the framework adds around the local work;
- peak RSS (VmHWM) of the process holding the server (fedzoo: server + driver; Flower: the driver with the
  strategy), and for fedzoo the device processes' peaks (`workers MB`: with WSGI they hold server workers too,
  so the goal is checked on the simulating process plus its workers).
Goals: fedzoo's overhead <= 2x Flower in-process at 200 clients; 1,000 clients per round complete with the
server's peak RSS <= 1 GB.

Flower lives in its own venv, never in fedzoo's: `--setup-flower` creates it (default .flwr-venv at the
repository root, git-ignored) with `flwr[simulation]==1.42.*` and the onnx/onnxruntime/numpy versions this venv
has, plus fedzoo itself without dependencies (for `train_locally`).

Usage: python bench/fl_scale.py [--setup-flower] [--clients 10,200,1000] [--rounds 2] [--workers 2]
       [--frameworks fedzoo,fedzoo-tcp,flower-inprocess,flower-ray] [--timeout-s 1800]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import numpy as np

REPOSITORY = Path(__file__).resolve().parent.parent
DEFAULT_FLOWER_VENV = REPOSITORY / ".flwr-venv"
DATASET, SEED, HIDDEN_UNITS = "mnist", 0, 32
TRAINING = {"optimizer": "sgd", "learning_rate": 0.05, "momentum": 0.0, "batch_size": 32, "local_epochs": 1}


def setup_flower(venv: Path) -> None:
    """Create the Flower venv (Flower's simulation extra and the device-side packages fedzoo's local work needs)."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pins = [f"onnxruntime=={version('onnxruntime')}", f"onnx=={version('onnx')}", f"numpy=={version('numpy')}"]
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "flwr[simulation]==1.42.*", *pins], check=True)
    subprocess.run([*pip, "--no-deps", "-e", str(REPOSITORY)], check=True)


def prepare(folder: Path) -> tuple[Path, str, Path]:
    """The zoo fedzoo simulates from, and the data file Flower reads: the same model, pool and shard order."""
    from fedzoo.cloud.simulation import prepare_federation
    from fedzoo.datasets import load_dataset, split_dataset
    from fedzoo.zoo import Zoo

    federation = prepare_federation(DATASET, num_clients=1, alpha=None, hidden_units=HIDDEN_UNITS, seed=SEED)
    zoo = Zoo.create(folder / "zoo")
    for blob in federation.blobs.values():
        zoo.add_blob_bytes(blob)
    zoo.add_card(federation.card)
    # what `fedzoo fl simulate` shards: the split's training part, in the seed's order (fedzoo.cloud.simulation.make_shards)
    pool = split_dataset(load_dataset(DATASET), seed=SEED).train
    data = folder / "flower.npz"
    np.savez(data, model=np.frombuffer(federation.model, np.uint8), graph=np.frombuffer(federation.training_graph, np.uint8),
             card=np.frombuffer(federation.card.to_json().encode(), np.uint8),
             training=np.frombuffer(json.dumps(TRAINING).encode(), np.uint8),
             x=pool.x, y=pool.y, order=np.random.default_rng(SEED).permutation(len(pool)))
    return zoo.root, federation.card.id, data


def run_json(command: list[str], timeout_s: float) -> dict | str:
    """The JSON document the command prints last on stdout, or why there is none."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=REPOSITORY)
    except subprocess.TimeoutExpired:
        return f"did not finish in {timeout_s:.0f} s"
    if done.returncode != 0:
        return f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}"
    text = done.stdout.strip()
    return json.loads(text[text.index("{"):]) if "{" in text else f"no JSON in: {text[-200:]}"


def figures(rounds: list[dict], concurrency: int) -> tuple[float, float, float]:
    """(mean round wall s, mean training s, mean overhead s) over the rounds after the first (or the only one)."""
    measured = rounds[1:] or rounds
    wall = float(np.mean([r["wall_seconds"] for r in measured]))
    train = float(np.mean([r["train_seconds"] for r in measured]))
    return wall, train, wall - train / concurrency


def round_outcomes(rounds: list[dict]) -> str:
    """Each round's state (fedzoo) and the updates aggregated in it, e.g. `closed 1000, closed 1000`."""
    return ", ".join(f"{r.get('state', 'done')} {r.get('accepted_updates', r.get('results'))}" for r in rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup-flower", action="store_true", help="create the Flower venv first")
    parser.add_argument("--flower-venv", type=Path, default=DEFAULT_FLOWER_VENV)
    parser.add_argument("--clients", default="10,200,1000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="fedzoo's device processes")
    parser.add_argument("--frameworks", default="fedzoo,flower-inprocess,flower-ray")
    parser.add_argument("--timeout-s", type=float, default=1800)
    arguments = parser.parse_args()
    if arguments.setup_flower:
        setup_flower(arguments.flower_venv)
    flower_python = str(arguments.flower_venv / "bin" / "python")
    frameworks = arguments.frameworks.split(",")
    if any(name.startswith("flower") for name in frameworks) and not Path(flower_python).exists():
        sys.exit(f"no Flower venv at {arguments.flower_venv}: run with --setup-flower once")
    print(f"{DATASET}, MLP-{HIDDEN_UNITS}, every client every round, {arguments.rounds} rounds; {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'clients':>7} {'framework':<18} {'round s':>8} {'train s':>8} {'overhead s':>10} {'peak RSS MB':>11} "
          f"{'workers MB':>14}  rounds")
    results: dict[tuple[int, str], tuple[float, float, bool]] = {}  # overhead s, peak RSS MB, every round closed
    with tempfile.TemporaryDirectory(prefix="fedzoo-fl-scale-") as folder:
        zoo_dir, model_id, data = prepare(Path(folder))
        for clients in [int(value) for value in arguments.clients.split(",")]:
            for framework in frameworks:
                if framework.startswith("fedzoo"):
                    transport = "tcp" if framework == "fedzoo-tcp" else "wsgi"
                    command = [str(Path(sys.executable).parent / "fedzoo"), "fl", "simulate", "--zoo", str(zoo_dir), "--model", model_id,
                               "--clients", str(clients), "--per-round", str(clients), "--rounds", str(arguments.rounds),
                               "--executor", "processes", "--workers", str(arguments.workers), "--quiet", "--transport", transport,
                               "--local-epochs", str(TRAINING["local_epochs"]), "--batch-size", str(TRAINING["batch_size"]),
                               "--learning-rate", str(TRAINING["learning_rate"]), "--dataset", DATASET, "--seed", str(SEED)]
                else:
                    mode = framework.removeprefix("flower-")
                    command = [flower_python, "bench/fl_scale_flower.py", str(data), "--clients", str(clients),
                               "--rounds", str(arguments.rounds), "--mode", mode]
                outcome = run_json(command, arguments.timeout_s)
                if isinstance(outcome, str):
                    print(f"{clients:>7} {framework:<18} {outcome}", flush=True)
                    continue
                concurrency = (outcome.get("workers", 1) if framework.startswith("fedzoo")
                               else (os.cpu_count() if framework == "flower-ray" else 1))
                wall, train, overhead = figures(outcome["rounds"], concurrency)
                closed = all(r.get("state", "closed") == "closed" for r in outcome["rounds"])
                workers_mb = outcome.get("worker_peak_rss_mb", [])
                # with WSGI the device processes hold server workers: their memory counts as the server's
                server_mb = outcome["peak_rss_mb"] + (sum(workers_mb) if outcome.get("transport") == "wsgi" else 0)
                results[clients, framework] = (overhead, server_mb, closed)
                workers_text = "+".join(f"{value:.0f}" for value in workers_mb) or "-"
                print(f"{clients:>7} {framework:<18} {wall:8.2f} {train:8.2f} {overhead:10.2f} {outcome['peak_rss_mb']:11.1f} "
                      f"{workers_text:>14}  {round_outcomes(outcome['rounds'])}", flush=True)
    for framework in ("fedzoo", "fedzoo-tcp"):
        if (200, framework) in results and (200, "flower-inprocess") in results:
            ratio = results[200, framework][0] / max(results[200, "flower-inprocess"][0], 1e-9)
            print(f"overhead at 200 clients, {framework} / Flower in-process: {ratio:.1f}x (goal <= 2x)")
        if (1000, framework) in results:
            _, server_mb, closed = results[1000, framework]
            print(f"1,000 clients per round ({framework}): {'every round closed' if closed else 'NOT every round closed'}; "
                  f"server peak RSS {server_mb:.0f} MB (goal <= 1024)")


if __name__ == "__main__":
    main()
