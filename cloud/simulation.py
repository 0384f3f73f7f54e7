"""Federated simulation: N virtual devices over Dirichlet(alpha) shards against a real server on loopback.

Nothing is faked between the parts: the server is `fedzoo.server.create_app` on a SQLite file
(`fedzoo.server.testing.LoopbackServer`), served by werkzeug on 127.0.0.1 (or, with `transport="wsgi"`, called
through WSGI in each process that holds devices, without TCP); every virtual device registers, checks in,
downloads, trains with `fedzoo.edge.trainer` and uploads through the `fedzoo.clients` SDK over HTTP. Only the data
differs per device (its Dirichlet shard) and, for robustness experiments, what an attacker does to
its data and delta (`fedzoo.cloud.attacks`).

Each simulated round: every device checks in (the server selects `target x (1 + over_selection)`),
the selected ones do their work, in this process one after another (`executor="in-process"`) or as
parallel Ray tasks (`executor="ray"`, for many devices), and the server aggregates as soon as the
target is reached (surplus reports are refused, as in Bonawitz et al.) or at the deadline.

This is the `server` engine of `fedzoo fl simulate`; `fedzoo.cloud.inprocess` is the `inprocess` and `ray`
engines (the same plan without HTTP or database, aggregated by the same core) and the private rounds over
hundreds of devices (`run_private_rounds`).
"""

from __future__ import annotations

import hashlib
import io
import random
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from fedzoo.cards import InputSpec, Metrics, ModelCard, Normalisation
from fedzoo.cloud.attacks import DeviceAttack, ScaledUpdateAttack
from fedzoo.graphs.autodiff import build_training_graph
from fedzoo.datasets import DatasetSplit, dirichlet_partition, load_dataset, split_dataset
from fedzoo.cloud.executors import make_executor
from fedzoo.cloud.mlp import mlp_classifier
from fedzoo.admin.operator_client import OperatorClient
from fedzoo.clients.client import FedzooClient
from fedzoo.clients.device_certification import certify_devices
from fedzoo.clients.http import FedzooHTTP
from fedzoo.clients.participation import ParticipationResult, run_task
from fedzoo.edge.local_training import LocalData, normalise
from fedzoo.update_codec import Encoding
from fedzoo.device import CpuInfo, DeviceProfile, RuntimeInfo
from fedzoo.edge.optimizers import SGD
from fedzoo.edge.runtime import create_session
from fedzoo.edge.trainer import Trainer, write_parameters
from fedzoo.errors import InvalidInputError
from fedzoo.secagg.signatures import load_signing_key
from fedzoo.secagg.signatures import private_bytes as signing_private_bytes
from fedzoo.server.testing import DEFAULT_ADMIN_TOKEN, InProcessServer
from fedzoo.signing import CardSigningKey, TrustedKeys, sign_card


def accuracy_of(model: bytes, features: np.ndarray, targets: np.ndarray) -> float:
    """Top-1 accuracy of an ONNX classifier on already normalised features."""
    session = create_session(model)
    logits = session.run(None, {session.get_inputs()[0].name: features})[0]
    return float((logits.argmax(axis=1) == targets).mean())


def train_centrally(
    model: bytes, training_graph: bytes, features: np.ndarray, targets: np.ndarray, epochs: int, batch_size: int,
    learning_rate: float, seed: int = 0, evaluate_on: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[bytes, list[float]]:
    """Train with the same trainer the devices use; returns the model and, if asked, accuracy after each epoch."""
    trainer = Trainer.from_inference_model(training_graph, model, SGD(learning_rate))
    accuracies = []
    for epoch in range(epochs):
        trainer.train_epoch(features, targets, batch_size, seed=seed + epoch)
        if evaluate_on is not None:
            accuracies.append(accuracy_of(write_parameters(model, trainer.parameters), *evaluate_on))
    return write_parameters(model, trainer.parameters), accuracies


@dataclass
class Federation:
    """Everything a simulation needs: the base model and its card, the clients' shards and a held-out test set."""

    split: DatasetSplit
    pool: LocalData  # the data spread over the clients (never seen by the server)
    shards: list[np.ndarray]  # indices into `pool`, one array per client
    card: ModelCard
    blobs: dict[str, bytes]  # sha256 -> bytes: the ONNX model and its training graph
    evaluation_npz: bytes  # the test split as x, y: the server measures each new version on it

    @property
    def model(self) -> bytes:
        return self.blobs[self.card.sha256]

    @property
    def training_graph(self) -> bytes:
        return self.blobs[self.card.training_graph]

    def client_data(self, index: int) -> LocalData:
        return LocalData(self.pool.x[self.shards[index]], self.pool.y[self.shards[index]])


def make_shards(pool: LocalData, num_clients: int, alpha: float | None, seed: int) -> list[np.ndarray]:
    """Dirichlet(alpha) label-skewed shards of `pool`, or near-equal random ones when `alpha` is None."""
    if num_clients > len(pool):
        raise InvalidInputError(f"{num_clients} clients need at least as many examples; the pool has {len(pool)}",
                                field="num_clients")
    if alpha is None:
        order = np.random.default_rng(seed).permutation(len(pool))
        return [np.sort(shard) for shard in np.array_split(order, num_clients)]
    return dirichlet_partition(pool.y, num_clients, alpha, seed=seed)


def prepare_federation(
    dataset: str = "digits", num_clients: int = 5, alpha: float | None = 0.5, hidden_units: int = 32,
    pretrain_fraction: float = 0.1, pretrain_epochs: int = 3, seed: int = 0,
) -> Federation:
    """Split a data set, pre-train a small model on a `pretrain_fraction` of its training part (the cloud's
    own data), and spread the rest over `num_clients` devices with Dirichlet(alpha) label skew, or, with
    `alpha=None`, uniformly at random in near-equal shards (hundreds of devices with a few examples
    each, where Dirichlet draws leave some devices empty)."""

    if not 0 < pretrain_fraction < 1:
        raise InvalidInputError(f"pretrain_fraction must lie in (0, 1), got {pretrain_fraction}", field="pretrain_fraction")
    split = split_dataset(load_dataset(dataset), seed=seed)
    normalisation = Normalisation(mean=split.mean, std=split.std)
    spec = InputSpec(name="input", shape=["batch", *split.dataset.image_shape], normalisation=normalisation)
    order = np.random.default_rng(seed).permutation(len(split.train))
    cloud_count = max(1, int(len(order) * pretrain_fraction))
    cloud, pool_indices = order[:cloud_count], order[cloud_count:]
    pool = LocalData(split.train.x[pool_indices], split.train.y[pool_indices])
    shards = make_shards(pool, num_clients, alpha, seed)

    model = mlp_classifier(split.dataset.image_shape, hidden_units, split.dataset.num_classes, seed)
    graph = build_training_graph(model).SerializeToString()
    cloud_features = normalise(split.train.x[cloud], normalisation)
    model_bytes, _ = train_centrally(model.SerializeToString(), graph, cloud_features, split.train.y[cloud],
                                     pretrain_epochs, 32, 0.05, seed)
    test_features = normalise(split.test.x, normalisation)
    parameters = sum(int(np.prod(init.dims)) for init in model.graph.initializer)
    macs = sum(int(np.prod(init.dims)) for init in model.graph.initializer if init.name.endswith("weight"))
    card = ModelCard(
        id=f"{dataset}-mlp{hidden_units}-v1", family=f"{dataset}-mlp{hidden_units}", task=dataset, input=spec,
        labels=split.dataset.labels, arch={"kind": "mlp", "hidden_units": hidden_units},
        metrics=Metrics(accuracy=accuracy_of(model_bytes, test_features, split.test.y), num_examples=len(split.test)),
        macs=macs, params=parameters, size_bytes=len(model_bytes), sha256=hashlib.sha256(model_bytes).hexdigest(),
        training_graph=hashlib.sha256(graph).hexdigest(),
        details={"pretrained_on": f"{cloud_count} examples of the {dataset} training split, {pretrain_epochs} epochs"},
    )
    buffer = io.BytesIO()
    np.savez(buffer, x=split.test.x, y=split.test.y)
    return Federation(split, pool, shards, card, {card.sha256: model_bytes, card.training_graph: graph},
                      buffer.getvalue())


def federation_from_zoo(zoo_dir: str | Path, card_id: str, split: DatasetSplit, num_clients: int = 5,
                        alpha: float | None = 0.5, seed: int = 0, cloud_examples: int = 0) -> Federation:
    """A federation that fine-tunes a zoo model (which must carry a training graph) on Dirichlet(alpha)
    shards of `split`'s training part (`alpha=None`: near-equal random shards, for fleets of more devices
    than a Dirichlet draw leaves non-empty); `split` must be the one the zoo was built with. The first
    `cloud_examples` training examples are the cloud's own (a capped build such as the tiny preset
    trained on just those): they stay out of the devices' pool, so devices bring data the model never saw."""
    from fedzoo.zoo import Zoo

    if not 0 <= cloud_examples < len(split.train):
        raise InvalidInputError(f"cloud_examples must lie in [0, {len(split.train)}), got {cloud_examples}",
                                field="cloud_examples")
    zoo = Zoo(zoo_dir)
    card = zoo.card(card_id)
    if card.training_graph is None:
        raise InvalidInputError(f"model {card_id} has no training graph; run the zoo build's training-graph stage",
                                field="card_id")
    pool = LocalData(split.train.x[cloud_examples:], split.train.y[cloud_examples:])
    shards = make_shards(pool, num_clients, alpha, seed)
    # every blob the card names, so a fresh server accepts the card (artifacts such as the torch state included)
    digests = {card.sha256, card.training_graph, *card.artifacts.values()}
    blobs = {digest: zoo.blob_path(digest).read_bytes() for digest in digests}
    buffer = io.BytesIO()
    np.savez(buffer, x=split.test.x, y=split.test.y)
    return Federation(split, pool, shards, card, blobs, buffer.getvalue())


def centralized_baseline(federation: Federation, epochs: int, batch_size: int, learning_rate: float,
                         seed: int = 0) -> list[float]:
    """Test accuracy after each epoch of fine-tuning the same base model on all the clients' data pooled."""
    features = normalise(federation.pool.x, federation.card.input.normalisation)
    test = (normalise(federation.split.test.x, federation.card.input.normalisation), federation.split.test.y)
    _, accuracies = train_centrally(federation.model, federation.training_graph, features, federation.pool.y,
                                    epochs, batch_size, learning_rate, seed, evaluate_on=test)
    return accuracies


# the simulation ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Work:
    device_index: int
    token: str
    signing_key: bytes  # the device's raw Ed25519 private key (SecAgg+ rounds)
    task: dict[str, Any]
    seed: int
    attacker: bool


@dataclass(frozen=True)
class _Context:
    base_url: str
    in_process: InProcessServer | None  # None: over TCP
    cache_root: str
    pool_x: np.ndarray
    pool_y: np.ndarray
    shards: list[np.ndarray]
    encoding: Encoding
    attack: DeviceAttack
    operator_keys_raw: tuple[bytes, ...]  # the operator key set the devices pin (their neighbours' certificates)


# One SDK client per device and process, kept across rounds like a real device's (connections stay open).
_DEVICE_CLIENTS: dict[tuple[str, str], FedzooClient] = {}
_DEVICE_CLIENTS_LOCK = threading.Lock()  # devices check in from several threads


def _device_client(context: _Context, device_index: int, token: str, signing_key: bytes) -> FedzooClient:
    """The device's SDK client in this process (its cache folder under the context's cache root)."""
    key = (context.base_url, token)
    with _DEVICE_CLIENTS_LOCK:
        if key not in _DEVICE_CLIENTS:
            folder = Path(context.cache_root) / f"device-{device_index}"
            _DEVICE_CLIENTS[key] = FedzooClient(context.base_url, token=token, cache_dir=folder,
                                                signing_key=load_signing_key(signing_key),
                                                transport=_transport(context.in_process),
                                                operator_keys=TrustedKeys(list(context.operator_keys_raw)),
                                                state_file=folder / "state.json")
        return _DEVICE_CLIENTS[key]


def _transport(in_process: InProcessServer | None) -> httpx.WSGITransport | None:
    return in_process.transport() if in_process is not None else None


def _close_device_clients(base_url: str) -> None:
    for key in [key for key in _DEVICE_CLIENTS if key[0] == base_url]:
        _DEVICE_CLIENTS.pop(key).close()


@dataclass(frozen=True)
class _CheckIn:
    device_index: int
    token: str
    signing_key: bytes
    task: str  # the task name the device asks work for


def _check_in(context: _Context, check_in: _CheckIn) -> dict[str, Any] | None:
    """One device's check-in (on a check-in thread or an executor's worker): the task the server gives it, or None."""
    client = _device_client(context, check_in.device_index, check_in.token, check_in.signing_key)
    return client.fl_task(check_in.task)["task"]


def _do_work(context: _Context, work: _Work) -> ParticipationResult:
    """One selected device's work; a top-level function so Ray can ship it to a worker."""
    shard = context.shards[work.device_index]
    data = LocalData(context.pool_x[shard], context.pool_y[shard])
    client = _device_client(context, work.device_index, work.token, work.signing_key)
    if not work.attacker:
        return run_task(client, work.task, data, context.encoding, work.seed)
    return run_task(client, work.task, context.attack.poison(data), context.encoding, work.seed, context.attack)


@dataclass
class RoundRecord:
    round_id: int
    number: int
    state: str
    accepted_updates: int
    upload_bytes: int
    accuracy: float | None
    result_model_id: str | None
    refused: int
    outcome: dict[str, Any] | None = field(default=None, repr=False)
    participants: int = 0  # selected devices that did their work this round
    wall_seconds: float = 0.0  # from the first check-in to the server's finished round
    train_seconds: float = 0.0  # the participants' local training, summed
    check_in_seconds: float = 0.0  # the round's first part: every device checked in (selection)
    work_seconds: float = 0.0  # the second: the selected devices' download, training and upload (the last
    # upload's request aggregates, evaluates and publishes: that is in here too); the rest of wall_seconds is
    # reading the round's outcome


class Simulation:
    """Virtual devices, one per shard, registered with a running server; `run` drives a plan of rounds.

    Devices check in and register from `http_threads` threads (each a blocking HTTP call), and do their
    work on the executor: in this process, in `workers` processes, or as Ray tasks. The work's shared
    context (the data pool and the shards) goes to the executor once for the whole simulation: a process
    pool keeps it across rounds, Ray keeps it in its object store, where every task reads the same copy.
    With `in_process` (a `LoopbackServer(transport="wsgi")`'s), every request goes through WSGI instead of
    TCP; the executor's processes must then run on this machine (they open the server's data directory)."""

    def __init__(
        self, federation: Federation, server_url: str, admin_token: str = DEFAULT_ADMIN_TOKEN,
        executor: str = "in-process", cache_root: str | Path | None = None, attackers: frozenset[int] = frozenset(),
        attack: DeviceAttack = ScaledUpdateAttack(), encoding: Encoding = "fp32", seed: int = 0,
        workers: int | None = None, http_threads: int = 1, in_process: InProcessServer | None = None,
        operator_key: CardSigningKey | None = None,
    ) -> None:
        self.federation, self.server_url, self.admin_token = federation, server_url, admin_token
        self.in_process = in_process
        self.executor = make_executor(executor, workers)
        self.http_threads = http_threads
        self._own_cache = cache_root is None
        self.cache_root = Path(cache_root) if cache_root is not None else Path(tempfile.mkdtemp(prefix="fedzoo-sim-"))
        self.attackers, self.attack, self.encoding = attackers, attack, encoding
        self.rng = random.Random(seed)
        self.admin = OperatorClient(server_url, token=admin_token, cache_dir=self.cache_root / "admin",
                                    transport=_transport(in_process))
        self.tokens: list[str] = []
        self.signing_keys: list[bytes] = []  # each device's raw Ed25519 private key, beside its token
        # the operator's key (a fresh one unless given), which certifies every device's signing key after
        # registration; the server never has it
        self.operator_key = operator_key or CardSigningKey.generate()
        self.operator_keys = TrustedKeys([self.operator_key.public_key_raw])
        self._context: _Context | None = None

    def close(self) -> None:
        self.admin.close()
        _close_device_clients(self.server_url)
        self.executor.close()
        if self._own_cache:
            shutil.rmtree(self.cache_root, ignore_errors=True)

    def __enter__(self) -> Simulation:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def publish_base_model(self, signing_key: CardSigningKey | None = None) -> dict[str, Any]:
        """Upload the base model, its training graph and the evaluation set; publish the card (signed by the
        operator's `signing_key` if given)."""
        blobs = dict(self.federation.blobs)
        evaluation_sha = self.admin.publish_blob(self.federation.evaluation_npz, self.admin_token)
        self.evaluation_sha256 = evaluation_sha
        card = self.federation.card if signing_key is None else sign_card(self.federation.card, signing_key)
        return self.admin.publish_model(card, blobs, self.admin_token)

    def register_devices(self, prefix: str = "sim-device") -> None:
        """Register one device per shard, enrolled with one enrollment token the admin creates for them."""
        enrollment_token = self.admin.create_enrollment_token(self.admin_token, max_uses=len(self.federation.shards),
                                                              label=f"simulation {prefix}")["token"]

        def register(index: int) -> tuple[str, bytes]:
            profile = DeviceProfile(
                device_id=f"{prefix}-{index}", platform="linux-x86_64", device_class="simulated",
                cpu=CpuInfo(model="virtual", cores=1), memory_mb=2048,
                runtime=RuntimeInfo(onnxruntime="simulated", threads=1),
            )
            with FedzooClient(self.server_url, cache_dir=self.cache_root / "register",
                              transport=_transport(self.in_process)) as client:
                return client.register(profile, enrollment_token)["token"], signing_private_bytes(client.signing_key)

        with ThreadPoolExecutor(max_workers=self.http_threads) as pool:
            for token, signing_key in pool.map(register, range(len(self.federation.shards))):
                self.tokens.append(token)
                self.signing_keys.append(signing_key)
        self.certify_devices()

    def certify_devices(self) -> None:
        """The operator certifies every registered device's signing key (`fedzoo devices certify`)."""
        with FedzooHTTP(self.server_url, token=self.admin_token, transport=_transport(self.in_process)) as api:
            certify_devices(api, self.operator_key)

    def start_plan(self, round_config: dict[str, Any]) -> int:
        """Ask the server for a plan of rounds (evaluated on the federation's test split); returns the first round id."""
        config = {"model_id": self.federation.card.id, "evaluation_sha256": self.evaluation_sha256, **round_config}
        return self.admin.create_rounds(config, self.admin_token)["id"]

    def _work_context(self) -> _Context:
        """The devices' shared context, made again only when a setting it carries changed (so that an
        executor keeps its copy across rounds)."""
        if self._context is None or (self._context.encoding, self._context.attack) != (self.encoding, self.attack):
            self._context = _Context(self.server_url, self.in_process, str(self.cache_root), self.federation.pool.x,
                                     self.federation.pool.y, self.federation.shards, self.encoding, self.attack,
                                     tuple(self.operator_keys.public_keys_raw()))
        return self._context

    def run_round(self, round_id: int) -> RoundRecord:
        """Selection, local work and reporting for one round, then wait for the server to finish it."""
        started = time.perf_counter()
        order = list(range(len(self.tokens)))
        self.rng.shuffle(order)

        context = self._work_context()
        check_ins = [_CheckIn(index, self.tokens[index], self.signing_keys[index], self.federation.card.task)
                     for index in order]
        # the server selects devices in the order they check in: with several threads or worker processes,
        # that order is their race (one thread keeps the shuffled order)
        if self.in_process is not None and self.executor.name == "processes" and self.executor.workers > 1:
            # each worker process holds a server worker: check-ins spread over them instead of queueing
            # for this process's one
            tasks = self.executor.map(_check_in, context, check_ins)
        else:
            with ThreadPoolExecutor(max_workers=self.http_threads) as pool:
                tasks = list(pool.map(lambda check_in: _check_in(context, check_in), check_ins))
        checked_in = time.perf_counter()
        work = []
        for index, task in zip(order, tasks):
            if task is not None and task["round_id"] == round_id:
                work.append(_Work(index, self.tokens[index], self.signing_keys[index], task, self.rng.randrange(2**31),
                                  index in self.attackers))
        if any((item.task.get("privacy") or {}).get("secure_aggregation") for item in work):
            # SecAgg+ devices answer each stage together, so they must run at the same time
            with ThreadPoolExecutor(max_workers=max(1, len(work))) as pool:
                results = list(pool.map(lambda item: _do_work(context, item), work))
        else:
            results = self.executor.map(_do_work, context, work)
        worked = time.perf_counter()
        view = self.admin.wait_for_round(round_id)
        accuracy = None
        if view["result_model_id"] is not None:
            accuracy = self.admin.card(view["result_model_id"]).metrics.accuracy
        return RoundRecord(round_id, view["number"], view["state"], view["accepted_updates"], view["upload_bytes"],
                           accuracy, view["result_model_id"], sum(r.outcome != "accepted" for r in results),
                           view["outcome"], len(results), time.perf_counter() - started,
                           sum(r.train_seconds for r in results), checked_in - started, worked - checked_in)

    def run(self, round_config: dict[str, Any], progress=None, stop_after_failed_rounds: int | None = None
            ) -> list[RoundRecord]:
        """Run a whole plan; returns one record per round, in order. With `stop_after_failed_rounds`, stop
        early once that many rounds in a row failed (a collapsed model: each failure waits out a deadline)."""
        round_id: int | None = self.start_plan(round_config)
        records = []
        while round_id is not None:
            record = self.run_round(round_id)
            records.append(record)
            self.attack.observe(record.state)  # what every device sees: whether the round published
            if progress is not None:
                progress(record)
            recent = records[-stop_after_failed_rounds:] if stop_after_failed_rounds else []
            if recent and len(recent) == stop_after_failed_rounds and all(r.state == "failed" for r in recent):
                break
            round_id = self.admin.fl_round(round_id)["next_round_id"]
        return records
