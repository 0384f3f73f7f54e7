"""The Flower 1.42 side of bench/fl_scale.py: runs in its own venv (`bench/fl_scale.py --setup-flower` makes
it; Flower is never a fedzoo dependency), on the data file fl_scale.py writes (the same model, training graph,
pool and shards), with the same local work as a fedzoo device: `fedzoo.clients.participation.train_locally`
(fedzoo is installed there without its dependencies; that function needs numpy and onnxruntime only).

Two ways to run Flower, each printing one JSON line (per round: wall seconds and the clients' summed training
seconds; this process's peak RSS):
- `inprocess`: Flower's FedAvg strategy and NumPyClients in this process, no transport: each round the
  strategy's parameters go to every client as `Parameters`, each `fit` result comes back as a `FitRes`, and
  `aggregate_fit` averages them (Flower's own serialisation and aggregation, nothing else);
- `ray`: `flwr.simulation.run_simulation` with a `ServerApp` and a `ClientApp` on the Ray backend, one CPU
  per virtual client.

Usage (inside the Flower venv): python bench/fl_scale_flower.py DATA.npz --clients N --rounds R --mode inprocess|ray
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from flwr.client import ClientApp, NumPyClient
from flwr.common import Code, FitIns, FitRes, Status, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg

from fedzoo.cards import ModelCard
from fedzoo.cloud.simulate_cli import peak_rss_mb
from fedzoo.clients.participation import LocalData, train_locally
from fedzoo.edge.onnx_initializers import read_float_initializers
from fedzoo.edge.trainer import write_parameters


class Shared:
    """What every client reads: the model, its training graph and card, the pool and the shards."""

    def __init__(self, path: str, clients: int) -> None:
        with np.load(path, allow_pickle=False) as archive:
            self.model = archive["model"].tobytes()
            self.graph = archive["graph"].tobytes()
            self.card = ModelCard.from_json(archive["card"].tobytes())
            self.training = json.loads(archive["training"].tobytes())
            self.x, self.y = archive["x"], archive["y"]
            self.shards = [np.sort(shard) for shard in np.array_split(archive["order"], clients)]  # as fedzoo cuts them
        self.names = list(read_float_initializers(self.model))


class FleetClient(NumPyClient):
    """One virtual device: the fedzoo device's local training on its shard."""

    def __init__(self, shared: Shared, index: int) -> None:
        self.shared, self.index = shared, index

    def fit(self, parameters, config):
        shared = self.shared
        shard = shared.shards[self.index]
        model = write_parameters(shared.model, dict(zip(shared.names, parameters)))
        started = time.perf_counter()
        delta, _ = train_locally(shared.graph, model, shared.card, shared.training, LocalData(shared.x[shard], shared.y[shard]),
                                 seed=int(config.get("seed", 0)) + self.index)
        train_seconds = time.perf_counter() - started
        updated = [value + delta[name] if name in delta else value for name, value in zip(shared.names, parameters)]
        return updated, len(shard), {"train_seconds": train_seconds}


def _sum_train_seconds(results: list[tuple[int, dict]]) -> dict:
    return {"train_seconds": sum(metrics["train_seconds"] for _, metrics in results)}


class TimedFedAvg(FedAvg):
    """FedAvg that records each round's wall time (from configuring the fit to the aggregate) and the
    clients' training seconds."""

    def __init__(self, **kwargs) -> None:
        super().__init__(fit_metrics_aggregation_fn=_sum_train_seconds, **kwargs)
        self.rounds: list[dict[str, float]] = []
        self._started = 0.0

    def configure_fit(self, server_round, parameters, client_manager):
        self._started = time.perf_counter()
        return super().configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(self, server_round, results, failures):
        aggregated, metrics = super().aggregate_fit(server_round, results, failures)
        self.rounds.append({"wall_seconds": time.perf_counter() - self._started, "train_seconds": metrics.get("train_seconds", 0.0),
                            "results": len(results), "failures": len(failures)})
        return aggregated, metrics


def run_in_process(shared: Shared, clients: int, rounds: int) -> list[dict[str, float]]:
    """Flower's strategy and clients in this process, no transport (see the module docstring)."""
    strategy = FedAvg(fit_metrics_aggregation_fn=_sum_train_seconds)
    parameters = ndarrays_to_parameters(list(read_float_initializers(shared.model).values()))
    fleet = [FleetClient(shared, index).to_client() for index in range(clients)]
    records = []
    for server_round in range(1, rounds + 1):
        started = time.perf_counter()
        results = []
        for client in fleet:
            fit = client.fit(FitIns(parameters, {"seed": server_round}))
            results.append((None, FitRes(Status(Code.OK, ""), fit.parameters, fit.num_examples, fit.metrics)))
        parameters, metrics = strategy.aggregate_fit(server_round, results, [])
        records.append({"wall_seconds": time.perf_counter() - started, "train_seconds": metrics["train_seconds"],
                        "results": len(results), "failures": 0})
    return records


def run_on_ray(shared_path: str, clients: int, rounds: int, cpus_per_client: float) -> list[dict[str, float]]:
    from flwr.simulation import run_simulation

    shared = Shared(shared_path, clients)
    strategy = TimedFedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=clients, min_available_clients=clients,
                           initial_parameters=ndarrays_to_parameters(list(read_float_initializers(shared.model).values())),
                           on_fit_config_fn=lambda server_round: {"seed": server_round})

    def client_fn(context):
        return FleetClient(shared, int(context.node_config["partition-id"])).to_client()

    def server_fn(context):
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=rounds))

    run_simulation(ServerApp(server_fn=server_fn), ClientApp(client_fn=client_fn), num_supernodes=clients,
                   backend_config={"client_resources": {"num_cpus": cpus_per_client, "num_gpus": 0.0}})
    return strategy.rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data")
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mode", choices=["inprocess", "ray"], required=True)
    parser.add_argument("--cpus-per-client", type=float, default=1.0)
    arguments = parser.parse_args()
    started = time.perf_counter()
    if arguments.mode == "inprocess":
        rounds = run_in_process(Shared(arguments.data, arguments.clients), arguments.clients, arguments.rounds)
    else:
        rounds = run_on_ray(arguments.data, arguments.clients, arguments.rounds, arguments.cpus_per_client)
    print(json.dumps({"rounds": rounds, "wall_seconds": time.perf_counter() - started, "peak_rss_mb": peak_rss_mb()}))


if __name__ == "__main__":
    main()
