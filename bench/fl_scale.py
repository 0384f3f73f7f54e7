"""Benchmark: federated rounds at fleet scale, fedzoo's engines against Flower 1.42, side by side in one run.

For 200, 1,000 and 10,000 clients (every client in every round), each arm runs the same rounds of the same model
(a 2-layer perceptron pre-trained on 10% of MNIST-5k's training split, shipped as ONNX with its training graph),
on the same shards (the training split, shuffled with the seed, cut into near-equal parts), with the same local
work (`fedzoo.edge.local_training.train_locally`: one epoch of SGD on the shard with the stock onnxruntime). fedzoo's
rounds need half the clients' updates to pass its default screening (`--min-clients`; a round needing every one
fails whenever direction screening leaves out one):
- fedzoo-inprocess: `fedzoo fl simulate --engine inprocess`: the devices one after another in this process and the
  aggregation core (`fedzoo.aggregation`) aggregating with the server's default robust screening (norm bound,
  weight bound, direction screening against the round's median), no HTTP or database;
- fedzoo-ray: `--engine ray`, the same with the devices' training as Ray tasks (`--workers` CPUs);
- fedzoo-ray-1node, fedzoo-ray-2nodes: `--engine ray` connected (`RAY_ADDRESS`) to a local Ray cluster of one or two
  nodes of one CPU each (`ray.cluster_utils.Cluster`, what `ray start --num-cpus 1` on each machine makes): the same
  rounds on twice the nodes, for the cluster's speed-up (goal: a round >= 1.6x faster on two nodes than on one);
- fedzoo (the server engine): `fedzoo fl simulate --engine server --executor processes` (the devices in one
  process per core; the real server reached through WSGI without TCP, `--transport wsgi`);
- fedzoo-tcp: the server engine with `--transport tcp` (loopback HTTP);
- Flower in-process: Flower's FedAvg and NumPyClients in one process, no transport;
- Flower on Ray: `flwr.simulation.run_simulation`, one CPU per virtual client.
Each run is its own process, so its peak RSS is its own. Figures per round, rounds after the first (the first
starts worker processes or Ray actors):
- overhead = round wall time - the clients' summed training seconds / the clients trained at once (1 for the
  in-process arms, the workers or Ray CPUs otherwise): what the framework adds around the local work;
- peak RSS (VmHWM) of the process holding the aggregation (fedzoo: server or core + driver; Flower: the driver
  with the strategy), and for the server engine the device processes' peaks (`workers MB`: with WSGI they hold
  server workers too, so its memory is the simulating process plus its workers).
Goals: fedzoo-inprocess's overhead <= 2x Flower in-process at 200 and 1,000 clients; 10,000 clients per round
within 4 GB (peak RSS of the inprocess arm); fedzoo-ray-2nodes's round wall time <= fedzoo-ray-1node's / 1.6.

MNIST-5k's training split holds 3,500 examples, fewer than 10,000 clients: `--shifted-copies K` adds K copies of
every image shifted by one pixel (right, down, left, up in turn) before the split, for every arm alike.

Flower lives in its own venv, never in fedzoo's: `--setup-flower` creates it (default .flwr-venv at the
repository root, git-ignored) with `flwr[simulation]==1.42.*` and the onnx/onnxruntime/numpy versions this venv
has, plus fedzoo itself without dependencies (for `train_locally`).

Usage: python bench/fl_scale.py [--setup-flower] [--clients 200,1000] [--rounds 2] [--workers 2]
       [--frameworks fedzoo-inprocess,flower-inprocess,fedzoo] [--shifted-copies 0] [--timeout-s 1800]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from importlib.metadata import version
from pathlib import Path

import numpy as np

REPOSITORY = Path(__file__).resolve().parent.parent
DEFAULT_FLOWER_VENV = REPOSITORY / ".flwr-venv"
DATASET, SEED, HIDDEN_UNITS = "mnist", 0, 32
# every arm's numpy on one BLAS thread: on a shared machine OpenBLAS's threads spin against the other jobs (a 25k-
# element float64 dot product took 16 ms with its default threads under load, 0.16 ms with one)
ONE_BLAS_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
TRAINING = {"optimizer": "sgd", "learning_rate": 0.05, "momentum": 0.0, "batch_size": 32, "local_epochs": 1}


def setup_flower(venv: Path) -> None:
    """Create the Flower venv (Flower's simulation extra and the device-side packages fedzoo's local work needs)."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pins = [f"onnxruntime=={version('onnxruntime')}", f"onnx=={version('onnx')}", f"numpy=={version('numpy')}"]
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "flwr[simulation]==1.42.*", *pins], check=True)
    subprocess.run([*pip, "--no-deps", "-e", str(REPOSITORY)], check=True)


def shifted_pool(copies: int, folder: Path) -> str:
    """The data set every arm splits: MNIST-5k itself (copies 0), or an .npz of it with `copies` one-pixel shifts
    of every image added."""
    if copies == 0:
        return DATASET
    from fedzoo.datasets import load_dataset

    dataset = load_dataset(DATASET)
    shifts = [(0, 1), (1, 0), (0, -1), (-1, 0)]
    xs = [dataset.x] + [np.roll(dataset.x, shifts[copy % 4], axis=(2, 3)) for copy in range(copies)]
    path = folder / f"{DATASET}-shifted-{copies}.npz"
    np.savez(path, x=np.concatenate(xs), y=np.tile(dataset.y, copies + 1))
    return str(path)


def prepare(folder: Path, dataset: str) -> tuple[Path, str, Path]:
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
    pool = split_dataset(load_dataset(dataset), seed=SEED).train
    data = folder / "flower.npz"
    np.savez(data, model=np.frombuffer(federation.model, np.uint8), graph=np.frombuffer(federation.training_graph, np.uint8),
             card=np.frombuffer(federation.card.to_json().encode(), np.uint8),
             training=np.frombuffer(json.dumps(TRAINING).encode(), np.uint8),
             x=pool.x, y=pool.y, order=np.random.default_rng(SEED).permutation(len(pool)))
    return zoo.root, federation.card.id, data


def run_json(command: list[str], timeout_s: float, ray_address: str | None = None) -> dict | str:
    """The JSON document the command prints last on stdout, or why there is none."""
    cluster = {"RAY_ADDRESS": ray_address} if ray_address else {}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=REPOSITORY,
                              env={**os.environ, **ONE_BLAS_THREAD, **cluster})
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


ENGINES = {"fedzoo": ("server", "wsgi"), "fedzoo-tcp": ("server", "tcp"), "fedzoo-inprocess": ("inprocess", None),
           "fedzoo-ray": ("ray", None), "fedzoo-ray-1node": ("ray", None), "fedzoo-ray-2nodes": ("ray", None)}
CLUSTER_NODES = {"fedzoo-ray-1node": 1, "fedzoo-ray-2nodes": 2}  # one-CPU nodes of the arm's local Ray cluster


@contextmanager
def ray_cluster(nodes: int) -> Iterator[str]:
    """A local Ray cluster of `nodes` one-CPU nodes for the arm's run; yields the address the run connects to."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


def fedzoo_command(framework: str, zoo_dir: Path, model_id: str, dataset: str, clients: int, rounds: int,
                   workers: int) -> list[str]:
    engine, transport = ENGINES[framework]
    command = [str(Path(sys.executable).parent / "fedzoo"), "fl", "simulate", "--zoo", str(zoo_dir), "--model", model_id,
               "--clients", str(clients), "--per-round", str(clients), "--min-clients", str(max(1, clients // 2)),
               "--rounds", str(rounds), "--engine", engine,
               "--quiet", "--local-epochs", str(TRAINING["local_epochs"]), "--batch-size", str(TRAINING["batch_size"]),
               "--learning-rate", str(TRAINING["learning_rate"]), "--dataset", dataset, "--seed", str(SEED)]
    if engine == "server":
        command += ["--executor", "processes", "--workers", str(workers), "--transport", transport]
    if engine == "ray" and framework not in CLUSTER_NODES:  # on a cluster the run takes the cluster's CPUs
        command += ["--workers", str(workers)]
    return command


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup-flower", action="store_true", help="create the Flower venv first")
    parser.add_argument("--flower-venv", type=Path, default=DEFAULT_FLOWER_VENV)
    parser.add_argument("--clients", default="200,1000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="the server engine's device processes, the ray engine's CPUs")
    parser.add_argument("--frameworks", default="fedzoo-inprocess,flower-inprocess,fedzoo")
    parser.add_argument("--shifted-copies", type=int, default=0, help="one-pixel-shifted copies of MNIST-5k to add")
    parser.add_argument("--local-epochs", type=int, default=TRAINING["local_epochs"],
                        help="every arm's local epochs (more: rounds where the devices' work outweighs the framework's)")
    parser.add_argument("--timeout-s", type=float, default=1800)
    arguments = parser.parse_args()
    TRAINING["local_epochs"] = arguments.local_epochs
    if arguments.setup_flower:
        setup_flower(arguments.flower_venv)
    flower_python = str(arguments.flower_venv / "bin" / "python")
    frameworks = arguments.frameworks.split(",")
    if any(name.startswith("flower") for name in frameworks) and not Path(flower_python).exists():
        sys.exit(f"no Flower venv at {arguments.flower_venv}: run with --setup-flower once")
    print(f"{DATASET} + {arguments.shifted_copies} shifted copies, MLP-{HIDDEN_UNITS}, every client every round, "
          f"{arguments.rounds} rounds; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"{'clients':>7} {'framework':<18} {'round s':>8} {'train s':>8} {'overhead s':>10} {'peak RSS MB':>11} "
          f"{'workers MB':>14}  rounds")
    results: dict[tuple[int, str], tuple[float, float, bool]] = {}  # overhead s, peak RSS MB, every round closed
    walls: dict[tuple[int, str], float] = {}  # mean round wall s
    with tempfile.TemporaryDirectory(prefix="fedzoo-fl-scale-") as folder:
        dataset = shifted_pool(arguments.shifted_copies, Path(folder))
        zoo_dir, model_id, data = prepare(Path(folder), dataset)
        for clients in [int(value) for value in arguments.clients.split(",")]:
            for framework in frameworks:
                if framework in ENGINES:
                    command = fedzoo_command(framework, zoo_dir, model_id, dataset, clients, arguments.rounds,
                                             arguments.workers)
                else:
                    mode = framework.removeprefix("flower-")
                    command = [flower_python, "bench/fl_scale_flower.py", str(data), "--clients", str(clients),
                               "--rounds", str(arguments.rounds), "--mode", mode]
                nodes = CLUSTER_NODES.get(framework)
                with ray_cluster(nodes) if nodes else nullcontext() as address:
                    outcome = run_json(command, arguments.timeout_s, address)
                if isinstance(outcome, str):
                    print(f"{clients:>7} {framework:<18} {outcome}", flush=True)
                    continue
                concurrency = (outcome.get("workers", 1) if framework in ENGINES
                               else (os.cpu_count() if framework == "flower-ray" else 1))
                wall, train, overhead = figures(outcome["rounds"], concurrency)
                closed = all(r.get("state", "closed") == "closed" for r in outcome["rounds"])
                workers_mb = outcome.get("worker_peak_rss_mb", [])
                # with WSGI the device processes hold server workers: their memory counts as the server's
                server_mb = outcome["peak_rss_mb"] + (sum(workers_mb) if outcome.get("transport") == "wsgi" else 0)
                results[clients, framework] = (overhead, server_mb, closed)
                walls[clients, framework] = wall
                workers_text = "+".join(f"{value:.0f}" for value in workers_mb) or "-"
                print(f"{clients:>7} {framework:<18} {wall:8.2f} {train:8.2f} {overhead:10.2f} {outcome['peak_rss_mb']:11.1f} "
                      f"{workers_text:>14}  {round_outcomes(outcome['rounds'])}", flush=True)
    for clients in sorted({clients for clients, _ in results}):
        flower = results.get((clients, "flower-inprocess"))
        for framework in ENGINES:
            if (clients, framework) not in results:
                continue
            overhead, memory_mb, closed = results[clients, framework]
            ratio = f", {overhead / max(flower[0], 1e-9):.1f}x Flower in-process's" if flower else ""
            goal = " (goal <= 2x)" if framework == "fedzoo-inprocess" and flower and clients <= 1000 else ""
            print(f"{clients:>7} clients, {framework}: overhead {overhead:.2f} s per round{ratio}{goal}; peak RSS "
                  f"{memory_mb:.0f} MB{' (goal <= 4096)' if clients >= 10_000 else ''}; "
                  f"{'every round closed' if closed else 'NOT every round closed'}")
        one, two = walls.get((clients, "fedzoo-ray-1node")), walls.get((clients, "fedzoo-ray-2nodes"))
        if one and two:
            print(f"{clients:>7} clients, Ray cluster: a round takes {one:.2f} s on one node, {two:.2f} s on two: "
                  f"{one / two:.2f}x (goal >= 1.6x)")


if __name__ == "__main__":
    main()
