"""`fedzoo demo`: the whole system end to end on MNIST-5k (or mnist1d), on this machine.

It builds a zoo (supernet training and search), compresses it behind the accuracy gate, attaches
training graphs, signs its cards with an operator key, serves it with the production server (`fedzoo serve`, gunicorn on loopback), then
acts as a device (register with calibration timings, look up the best model under a budget,
verify the card against the pinned keys, download, run, report latency), runs federated rounds that fine-tune a zoo model from virtual devices'
Dirichlet shards and publish new versions, runs a zoo-wide round, lets a device of the Java (Android) SDK run a
model and take part in a round beside Python devices (that stage needs a JDK and Maven; `--skip-java` skips it),
and ends with a private zoo-wide round (SecAgg+ per subnet, distributed DP) of the Java and Python devices. A stage
that cannot run ends the demo with a one-line reason and a non-zero exit status. Every stage's line says what
happened (how many models improved, which fell), not what was meant to.

Presets (`DEMO_PRESETS`): `default` and `tiny` build on MNIST-5k with the build preset of that name; `mnist1d`
builds with the tiny preset on mnist1d (20,000 generated signals), where the cloud's 768 labelled examples give a
weak zoo and the devices' data is what lifts it.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import click
import httpx
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fedzoo.cards import ModelCard
from fedzoo.datasets import DatasetSplit, Subset, dirichlet_partition, load_dataset, split_dataset
from fedzoo.errors import FedzooError
from fedzoo.signing import CardSigningKey
from fedzoo.zoo import Zoo

if TYPE_CHECKING:  # imported where used: `fedzoo demo --help` stays quick
    from fedzoo.admin.operator_client import OperatorClient
    from fedzoo.clients.client import FedzooClient
    from fedzoo.signing import TrustedKeys

console = Console()
DEVICE_CLASS = "cloud-x86-1t"
SERVER_START_TIMEOUT_S = 120.0
COMPRESS_TRAIN_EXAMPLES = 3500  # MNIST-5k's training split


@dataclass(frozen=True)
class DemoPreset:
    """What `fedzoo demo --preset` picks: the data set (also the task's name) and the zoo build's preset."""

    dataset: str
    build_preset: str
    description: str


DEMO_PRESETS = {
    "default": DemoPreset("mnist", "default", "MNIST-5k"),
    "tiny": DemoPreset("mnist", "tiny", "MNIST-5k"),
    "mnist1d": DemoPreset("mnist1d", "tiny", "mnist1d (20,000 signals generated locally, as 21x21 Hankel images)"),
}


@dataclass
class DemoRun:
    """What the stages hand on to each other."""

    workdir: Path  # absolute: every path the demo hands to a subprocess derives from it
    preset: str  # a key of DEMO_PRESETS
    skip_java: bool = False
    admin_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))  # never printed
    split: DatasetSplit | None = None
    server: subprocess.Popen | None = None
    server_url: str = ""
    federation: object = None  # the federated stage's Federation, which the Java device's round reuses
    latest_model_id: str = ""
    evaluation_sha256: str = ""  # the federated stage's evaluation set, which judges the Java device's round too
    supernet_id: str = ""  # the supernet version the last zoo-wide round published (the private round starts there)
    java_command: list[str] | None = None  # built once by the Java stage, reused by the private zoo-wide round

    @property
    def dataset(self) -> str:
        """The data set, which is also the zoo's task name."""
        return DEMO_PRESETS[self.preset].dataset

    @property
    def zoo_dir(self) -> Path:
        return self.workdir / "zoo"

    @property
    def operator_key(self) -> CardSigningKey:
        """The operator's private key (stage_sign made it): it signs the cards and certifies the devices' keys."""
        from fedzoo.keyring import KeyDirectory

        return CardSigningKey.load(next(key for key in KeyDirectory(self.workdir / "keys").keys() if not key.retired).path)

    @property
    def operator_keys_file(self) -> Path:
        """The operator's public key set, which the server trusts (FEDZOO_TRUSTED_KEYS)."""
        return self.workdir / "operator-keys.json"


def stage_data(run: DemoRun) -> str:
    run.split = split_dataset(load_dataset(run.dataset), seed=0)
    shards = dirichlet_partition(run.split.train.y, num_clients=20, alpha=0.5, seed=0)
    sizes = [len(shard) for shard in shards]
    classes = np.mean([len(np.unique(run.split.train.y[shard])) for shard in shards])
    return (
        f"{DEMO_PRESETS[run.preset].description} split "
        f"{len(run.split.train)}/{len(run.split.validation)}/{len(run.split.test)}; "
        f"Dirichlet(0.5) over 20 clients: {min(sizes)}..{max(sizes)} examples each, {classes:.1f} classes on average"
    )


def stage_build(run: DemoRun) -> str:
    from fedzoo.cloud.pipeline import BuildConfig, build_zoo
    from fedzoo.cloud.zoo_cli import RichReporter

    config = BuildConfig(dataset=run.dataset, out=run.zoo_dir, preset=DEMO_PRESETS[run.preset].build_preset, seed=0,
                         compress=False, training_graphs=False, zoo_min_size=4, zoo_max_size=4)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        result = build_zoo(config, RichReporter(progress))
    accuracies = [card.metrics.accuracy for card in result.cards]
    latencies = [card.latency_ms[DEVICE_CLASS].median_ms for card in result.cards]
    return (
        f"{len(result.cards)} subnets in {run.zoo_dir}: test accuracy {min(accuracies):.3f}..{max(accuracies):.3f}, "
        f"latency {min(latencies):.3f}..{max(latencies):.3f} ms on this machine"
    )


def stage_compress(run: DemoRun) -> str:
    from fedzoo.compress.finetune import FineTuning
    from fedzoo.compress.pipeline import compress_zoo

    # fine-tuning sees at most MNIST-5k's training-split size, so mnist1d's 14,000 signals cost what MNIST does
    # (all of them took 53 of the mnist1d demo's 57 minutes); the gate still judges on the whole validation split
    train = Subset(run.split.train.x[:COMPRESS_TRAIN_EXAMPLES], run.split.train.y[:COMPRESS_TRAIN_EXAMPLES])
    report = compress_zoo(run.zoo_dir, replace(run.split, train=train), pruning_ratios=(0.5,),
                          fine_tuning=FineTuning(epochs=2))
    reasons = "; ".join(f"{rejected.variant_id}: {', '.join(rejected.reasons)}" for rejected in report.rejected[:2])
    return f"{len(report.accepted)} variants published, {len(report.rejected)} rejected by the gate" + (
        f" (e.g. {reasons})" if reasons else ""
    )


def stage_training_graphs(run: DemoRun) -> str:
    from fedzoo.graphs.training_graphs import attach_training_graphs

    updated = attach_training_graphs(run.zoo_dir)
    return f"training graphs attached to {len(updated)} cards (standard ONNX ops only)"


def stage_sign(run: DemoRun) -> str:
    from fedzoo.keyring import KeyDirectory

    keys = KeyDirectory(run.workdir / "keys")
    stored = next((key for key in keys.keys() if not key.retired), None) or keys.generate()  # a rerun keeps its key
    key = CardSigningKey.load(stored.path)
    signed = Zoo(run.zoo_dir).sign_cards(key)
    run.operator_keys_file.write_text(json.dumps(keys.active_public_keys().to_json(), indent=2))
    return f"{len(signed)} cards signed with operator key {key.key_id} ({stored.path}); public set: {run.operator_keys_file}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stage_serve(run: DemoRun) -> str:
    port = _free_port()
    run.server_url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-c", "from fedzoo.cli import main; main()", "serve", "--zoo", str(run.zoo_dir),
               "--port", str(port), "--data-dir", str(run.workdir / "server")]
    with open(run.workdir / "server.log", "wb") as log:  # the child keeps its own copy of the descriptor
        run.server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                      env={**os.environ, "FEDZOO_ADMIN_TOKEN": run.admin_token,
                                           "FEDZOO_TRUSTED_KEYS": str(run.operator_keys_file)})
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if run.server.poll() is not None:
            raise FedzooError(f"the server exited with code {run.server.returncode}; see {run.workdir / 'server.log'}")
        try:
            if httpx.get(f"{run.server_url}/v1/health", timeout=1.0).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    else:
        raise FedzooError(f"the server did not answer within {SERVER_START_TIMEOUT_S:.0f} s; see {run.workdir / 'server.log'}")
    models = httpx.get(f"{run.server_url}/v1/models", params={"task": run.dataset, "limit": 200}).json()
    return f"gunicorn on {run.server_url} serves {len(models['models'])} models (log: {run.workdir / 'server.log'})"


def stage_client(run: DemoRun) -> str:
    from fedzoo.admin.operator_client import OperatorClient
    from fedzoo.clients.client import FedzooClient
    from fedzoo.edge.benchmark import benchmark_model
    from fedzoo.edge.device_profile import collect_device_profile
    from fedzoo.signing import TrustedKeys

    cards = [card for card in Zoo(run.zoo_dir).cards() if DEVICE_CLASS in card.latency_ms]
    budget_ms = 2 * min(card.latency_ms[DEVICE_CLASS].median_ms for card in cards)
    # a real device ships with this key set; the demo fetches it once, before the device starts
    pinned = TrustedKeys.from_json(httpx.get(f"{run.server_url}/v1/keys").json())
    # enrolled as an operator would enroll a device: an enrollment token made with the admin token
    with OperatorClient(run.server_url) as operator:
        enrollment_token = operator.create_enrollment_token(run.admin_token, label="demo device")["token"]
    with FedzooClient(run.server_url, cache_dir=run.workdir / "device-cache", trusted_keys=pinned,
                      state_file=run.workdir / "device-state" / "client.json") as client:
        profile = collect_device_profile(f"demo-device-{os.getpid()}", threads=1)
        client.register(profile, enrollment_token)
        answer = client.lookup(run.dataset, latency_budget_ms=budget_ms)
        card = ModelCard.from_dict(answer["model"])
        session = client.session(card)
        predictions = np.argmax(session.run(run.split.test.x), axis=-1)
        accuracy = float((predictions == run.split.test.y).mean())
        measured = benchmark_model(client.download_model(card), threads=1)
        client.report_latency(card.id, measured.median_ms, measured.p90_ms, 1)
        again = client.lookup(run.dataset, latency_budget_ms=budget_ms)
    return (
        f"lookup under {budget_ms:.3f} ms chose {card.id} ({card.precision}, {answer['latency_ms']:.3f} ms "
        f"{answer['latency_source']}), its signature verified against {len(pinned.key_ids)} pinned keys; on-device test accuracy {accuracy:.4f}; measured {measured.median_ms:.3f} ms "
        f"and reported it; the next lookup used '{again['latency_source']}' latency for {again['model']['id']}"
    )


def _round_summary(state: str, accepted_updates: int, result_model_id: str | None, outcome: dict | None) -> str:
    """'closed, N updates, accuracy A -> model' or 'failed, N updates (the server's reason)'."""
    outcome = outcome or {}
    if state == "closed":
        accuracy = outcome.get("evaluation", {}).get("accuracy")
        parent = outcome.get("parent_evaluation", {}).get("accuracy")
        measured = f", accuracy {accuracy:.4f}" if accuracy is not None else ""
        measured += f" (parent {parent:.4f})" if parent is not None else ""
        return f"closed, {accepted_updates} updates{measured} -> {result_model_id}"
    return f"{state}, {accepted_updates} updates ({outcome.get('failure', 'no reason recorded')})"


def stage_federated(run: DemoRun) -> str:
    from fedzoo.cloud.simulation import Simulation, federation_from_zoo

    roots = [card for card in Zoo(run.zoo_dir).cards() if card.parent_id is None and card.training_graph]
    base = max(roots, key=lambda card: card.metrics.accuracy)
    federation = federation_from_zoo(run.zoo_dir, base.id, run.split, num_clients=5, alpha=0.5, seed=0)
    # every selected device's update reaches the server only inside the SecAgg+ sum (5 devices: k = 4, and the
    # devices' floor t = 4 against 2 corrupt devices, so all must answer: docs/privacy.md)
    # three rounds at a small learning rate: the tiny preset's first round can lose a few points on some CPUs'
    # numerics (measured: 0.767 -> 0.742 with torch's default kernels), the plan still publishes (0.772, 0.812)
    config = {"min_clients": 3, "target_clients": 5, "over_selection": 0.0, "deadline_s": 300, "num_rounds": 3,
              "local_epochs": 1, "batch_size": 32, "learning_rate": 0.005, "poll_interval_s": 0.2,
              "privacy": {"secure_aggregation": {"neighbour_count": 4, "stage_deadline_s": 60}}}
    with Simulation(federation, run.server_url, run.admin_token, cache_root=run.workdir / "federation",
                    operator_key=run.operator_key) as simulation:
        simulation.publish_base_model()
        simulation.register_devices(prefix=f"demo-fl-{os.getpid()}")
        records = simulation.run(config)
    run.federation = federation
    run.evaluation_sha256 = simulation.evaluation_sha256
    run.latest_model_id = next((r.result_model_id for r in reversed(records) if r.result_model_id), base.id)
    rounds = "; ".join(f"round {record.number}: " + _round_summary(record.state, record.accepted_updates,
                                                                    record.result_model_id, record.outcome)
                       for record in records)
    published = sum(1 for record in records if record.result_model_id)
    return (f"{published} of {len(records)} rounds published a new version; "
            f"fine-tuned {base.id} (accuracy {base.metrics.accuracy:.4f}) with 5 virtual devices under SecAgg+ "
            f"(the server saw only the sum of their updates): {rounds}; no DP: with 5 devices any useful epsilon "
            f"costs 20-30 accuracy points (docs/privacy.md), so the demo runs none rather than report a hollow one")


def _zoo_plan(run: DemoRun, admin: OperatorClient, supernet_id: str, devices: int) -> dict:
    """A zoo-wide plan over `devices` devices: the small tier (this machine's class) may spend 1.5x the smallest
    model's latency, the other tier anything; each new version must keep its parent's accuracy within a point."""
    from fedzoo.cards import is_supernet

    zoo = Zoo(run.zoo_dir)
    smallest = min((card for card in zoo.cards() if DEVICE_CLASS in card.latency_ms and card.precision == "fp32"
                    and card.pruning is None and not is_supernet(card)), key=lambda card: card.macs)
    calibration = io.BytesIO()
    np.savez(calibration, x=run.split.validation.x)
    return {"model_id": supernet_id, "evaluation_sha256": run.evaluation_sha256, "target_clients": devices,
            "over_selection": 0.0, "deadline_s": 300, "local_epochs": 1, "batch_size": 32, "learning_rate": 0.01,
            "max_accuracy_drop": 0.01,
            "zoo": {"latency_budget_ms": 1e5, "calibration_sha256": admin.publish_blob(calibration.getvalue(),
                                                                                        run.admin_token),
                    "latency_budget_ms_by_class": {DEVICE_CLASS: 1.5 * smallest.latency_ms[DEVICE_CLASS].median_ms}}}


def _python_zoo_device(run: DemoRun, name: str, device_class: str | None, enrollment_token: str,
                       operator_keys: TrustedKeys | None = None) -> FedzooClient:
    """A registered Python SDK device of the given class (None: no class, so no latency budget)."""
    from fedzoo.clients.client import FedzooClient
    from fedzoo.device import CpuInfo, DeviceProfile, RuntimeInfo

    profile = DeviceProfile(device_id=f"{name}-{os.getpid()}", platform="linux-x86_64", device_class=device_class,
                            cpu=CpuInfo(model="virtual", cores=1), memory_mb=2048,
                            runtime=RuntimeInfo(onnxruntime="simulated", threads=1))
    device = FedzooClient(run.server_url, cache_dir=run.workdir / name, operator_keys=operator_keys,
                          state_file=run.workdir / name / "state.json")
    device.register(profile, enrollment_token)
    return device


def stage_zoo_round(run: DemoRun) -> str:
    """One zoo-wide round (docs/zoo-federated.md): two tiers of devices train the subnets their lookups pick, and
    every zoo model is re-extracted from the improved supernet and re-published behind the accuracy gate."""
    from fedzoo.admin.operator_client import OperatorClient
    from fedzoo.cards import is_supernet
    from fedzoo.clients.participation import participate_once

    supernet = next(card for card in Zoo(run.zoo_dir).cards() if is_supernet(card))
    admin = OperatorClient(run.server_url, token=run.admin_token, cache_dir=run.workdir / "zoo-round-admin")
    # 3 of the 4 updates are enough: on mnist1d's Dirichlet(0.5) shards the direction screening left one device's
    # update out (cosine -0.33 with the round's median) and with 4 required the round failed
    round_id = admin.create_zoo_rounds({**_zoo_plan(run, admin, supernet.id, 4), "min_clients": 3},
                                       run.admin_token)["id"]
    enrollment_token = admin.create_enrollment_token(run.admin_token, max_uses=4, label="demo zoo-wide round")["token"]
    for index in range(4):
        with _python_zoo_device(run, f"zoo-device-{index}", DEVICE_CLASS if index % 2 == 0 else None,
                                enrollment_token) as device:
            participate_once(device, run.dataset, run.federation.client_data(index), "fp32")
    view = admin.wait_for_round(round_id)
    admin.close()
    outcome = (view.get("outcome") or {}).get("zoo")
    if outcome is None:
        return f"zoo-wide round {round_id} {view['state']}: {(view.get('outcome') or {}).get('failure')}"
    run.supernet_id = view["result_model_id"]
    return f"zoo-wide round {round_id} {view['state']}: " + zoo_round_summary(outcome)


def zoo_round_summary(outcome: dict) -> str:
    """What a zoo-wide round did, headline first: how many zoo models improved ("every" only when every one did),
    then each model's accuracy before -> after on the server's evaluation set and whether it was published."""
    models = outcome["models"]
    improved = [model for model in models if model["accuracy_after"] > model["accuracy_before"]]
    fell = [model for model in models if model["accuracy_after"] < model["accuracy_before"]]
    if models and len(improved) == len(models):
        headline = f"every zoo model improved ({len(models)} of {len(models)})"
    else:
        headline = f"{len(improved)} of {len(models)} zoo models improved, {len(fell)} fell"
    changes = "; ".join(f"{model['model_id']} {model['accuracy_before']:.4f} -> {model['accuracy_after']:.4f} "
                        f"({100 * (model['accuracy_after'] - model['accuracy_before']):+.2f} points"
                        f"{', new version ' + model['new_model_id'] if model['published'] else ', not published'})"
                        for model in models)
    if "devices_per_zoo_model" not in outcome:  # a DP round's view withholds what counts devices
        return f"{headline}; {outcome['new_versions']} of {len(models)} zoo models got a new version: {changes}"
    return (f"{headline}; {outcome['new_versions']} of {len(models)} zoo models got a new version; devices trained "
            f"{len(outcome['devices_per_zoo_model'])} subnets, {outcome['coverage']['released']} of "
            f"{outcome['coverage']['parameters']} supernet parameters moved: {changes}")


class StageError(FedzooError):
    """A demo stage that cannot run: the message is the one-line reason the demo ends with."""


def _run_quietly(command: list[str], log: Path, what: str, timeout_s: float) -> str:
    """Run `command` with its output kept in `log` (none reaches the terminal: Maven's colour codes included) and
    return its stdout; a failure becomes a StageError naming `what`, the exit status and the log."""
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise StageError(f"{what} did not finish within {timeout_s:.0f} s") from None
    log.write_text(completed.stdout + completed.stderr)
    if completed.returncode != 0:
        last_line = next((line for line in reversed((completed.stderr or completed.stdout).splitlines()) if line.strip()), "")
        raise StageError(f"{what} failed with exit status {completed.returncode}: {last_line.strip()[:300]} (log: {log})")
    return completed.stdout


def _java_sdk_command(run: DemoRun) -> list[str]:
    """`java -cp <fedzoo-client and its dependencies> dev.fedzoo.Cli`, built with Maven (quiet, output in a log)."""
    pom = Path(__file__).resolve().parent.parent / "clients" / "java" / "pom.xml"
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    if missing or not pom.is_file():
        absent = " and ".join(f"'{tool}'" for tool in missing) + " on PATH" if missing else str(pom)
        raise StageError(f"the Java device needs a JDK, Maven and the source tree's clients/java: {absent} not found "
                         f"(install them, or pass --skip-java)")
    classpath_file = run.workdir / "java-classpath.txt"  # absolute: Maven resolves a relative one against the module
    _run_quietly(["mvn", "-B", "-q", "-Dstyle.color=never", "-f", str(pom), "-pl", "fedzoo-client", "-DskipTests",
                  "package", "dependency:build-classpath", "-DincludeScope=compile",
                  f"-Dmdep.outputFile={classpath_file}"],
                 run.workdir / "java-build.log", "building the Java SDK with Maven (offline?)", timeout_s=900)
    jar = next((pom.parent / "fedzoo-client" / "target").glob("fedzoo-client-*.jar"))
    return ["java", "-cp", f"{jar}{os.pathsep}{classpath_file.read_text().strip()}", "dev.fedzoo.Cli"]


def _java_participation(run: DemoRun, task: str, shard: Path, encoding: str) -> subprocess.Popen:
    """The Java device (registered and certified by `stage_java_device`) checking in for one task and doing it."""
    return subprocess.Popen([*run.java_command, "participate", "--task", task, "--data", str(shard), "--encoding",
                             encoding, "--max-idle-s", "60", "--state", str(run.workdir / "java-device"),
                             "--operator-keys", str(run.operator_keys_file)],
                            stdout=subprocess.PIPE, text=True)


def _java_participation_result(java_device: subprocess.Popen) -> dict:
    """The Java device's result line (JSON), or a StageError with its exit status and last line."""
    java_output = java_device.communicate(timeout=300)[0].strip()
    if java_device.returncode != 0:
        raise StageError(f"the Java device's 'participate' failed with exit status {java_device.returncode}: "
                         f"{java_output.splitlines()[-1] if java_output else 'no output'}")
    return json.loads(java_output.splitlines()[-1])


def stage_java_device(run: DemoRun) -> str:
    """A Java SDK device (the Android SDK on the JVM) beside two Python ones: it looks up and runs a model, then the
    three take part in one private round (SecAgg+, the smallest cohort: k = 2, t = 2, all three must survive)."""
    from concurrent.futures import ThreadPoolExecutor

    from fedzoo.admin.operator_client import OperatorClient
    from fedzoo.clients.client import FedzooClient
    from fedzoo.clients.device_certification import certify_devices
    from fedzoo.clients.http import FedzooHTTP
    from fedzoo.clients.participation import participate_once
    from fedzoo.edge.device_profile import collect_device_profile
    from fedzoo.signing import TrustedKeys

    if run.skip_java:
        return "skipped (--skip-java)"
    task = run.federation.card.task
    java = run.java_command = _java_sdk_command(run)
    state, data = run.workdir / "java-device", run.workdir / "java-data"
    data.mkdir(parents=True, exist_ok=True)
    np.savez(data / "test.npz", x=run.split.test.x, y=run.split.test.y)
    shard = run.federation.client_data(0)
    np.savez(data / "shard.npz", x=shard.x, y=shard.y)
    log = run.workdir / "java-device.log"
    cli = lambda *args: json.loads(_run_quietly([*java, *args, "--state", str(state)], log,  # noqa: E731
                                                f"the Java device's '{args[0]}'", timeout_s=300).splitlines()[-1])
    admin = OperatorClient(run.server_url, token=run.admin_token, cache_dir=run.workdir / "java-round-admin")
    enrollment_token = admin.create_enrollment_token(run.admin_token, max_uses=3, label="demo java + python")["token"]
    cli("register", "--server", run.server_url, "--device-id", f"demo-java-{os.getpid()}",
        "--enrollment-token", enrollment_token)
    with FedzooHTTP(run.server_url, token=run.admin_token) as operator:  # the operator certifies the Java device's key
        certify_devices(operator, run.operator_key)
    ran = cli("run", "--task", task, "--latency-budget-ms", "1000", "--inputs", str(data / "test.npz"))
    round_id = admin.create_rounds({"model_id": run.latest_model_id, "evaluation_sha256": run.evaluation_sha256,
                                    "min_clients": 3, "target_clients": 3, "over_selection": 0.0, "deadline_s": 300,
                                    "local_epochs": 1, "batch_size": 32, "learning_rate": 0.01, "poll_interval_s": 0.5,
                                    "privacy": {"secure_aggregation": {"neighbour_count": 2, "threshold": 2,
                                                                       "stage_deadline_s": 60}}},
                                   run.admin_token)["id"]
    java_device = _java_participation(run, task, data / "shard.npz", "int8")

    def python_device(index: int) -> str:
        folder = run.workdir / f"python-device-{index}"
        with FedzooClient(run.server_url, cache_dir=folder, state_file=folder / "state.json",
                          operator_keys=TrustedKeys.load(run.operator_keys_file)) as device:
            device.register(collect_device_profile(f"demo-python-{index}-{os.getpid()}", run_calibration=False),
                            enrollment_token)
            with FedzooHTTP(run.server_url, token=run.admin_token) as operator:
                certify_devices(operator, run.operator_key)
            return participate_once(device, task, run.federation.client_data(index)).outcome

    with ThreadPoolExecutor(max_workers=2) as pool:  # SecAgg+ devices answer each stage together
        python_outcomes = list(pool.map(python_device, (1, 2)))
    java_result = _java_participation_result(java_device)
    view = admin.wait_for_round(round_id)
    admin.close()
    return (f"Java device ran {ran['model_id']} at test accuracy {ran['accuracy']:.4f}; with it "
            f"({java_result['outcome']}) and two Python devices ({', '.join(python_outcomes)}), SecAgg+ round "
            f"{round_id}: "
            f"{_round_summary(view['state'], view['accepted_updates'], view['result_model_id'], view['outcome'])}")


PRIVATE_ZOO_NOISE_MULTIPLIER = 0.7  # the plan's z: one round at delta 1e-5 costs each zoo line epsilon 7.2
PRIVATE_ZOO_DEVICES = 6  # two tiers of three: every subnet's cohort holds the 3 devices SecAgg+ needs


def stage_private_zoo_round(run: DemoRun) -> str:
    """One private zoo-wide round (docs/privacy.md, "Distributed DP in zoo-wide rounds"): the devices training one
    subnet form one SecAgg+ cohort, each adds its share of the Gaussian noise in the ring before masking, so the
    server sees only noised cohort sums; every zoo model's line is charged the round's epsilon, whether or not the
    gate lets its new version out. Three Python devices of this machine's class train the small tier's subnet,
    the Java device and two Python ones (three Python ones with --skip-java) the one their budget allows."""
    from concurrent.futures import ThreadPoolExecutor

    from fedzoo.admin.operator_client import OperatorClient
    from fedzoo.clients.device_certification import certify_devices
    from fedzoo.clients.http import FedzooHTTP
    from fedzoo.clients.participation import participate_once
    from fedzoo.cloud.simulation import make_shards
    from fedzoo.edge.local_training import LocalData
    from fedzoo.signing import TrustedKeys

    if not run.supernet_id:
        raise StageError("the zoo-wide round published no supernet version to start the private round from")
    pool = run.federation.pool
    shards = [LocalData(pool.x[shard], pool.y[shard])
              for shard in make_shards(pool, PRIVATE_ZOO_DEVICES, alpha=None, seed=1)]
    admin = OperatorClient(run.server_url, token=run.admin_token, cache_dir=run.workdir / "private-zoo-admin")
    # k and t are the server's defaults for each cohort's size (k = 2, t = 2 for three devices): a k the operator
    # fixes is below the devices' floor wherever one tier's budget seats both tiers on one subnet (a cohort of six)
    privacy = {"secure_aggregation": {"levels": 32767, "stage_deadline_s": 60},
               "dp": {"noise": "distributed", "noise_multiplier": PRIVATE_ZOO_NOISE_MULTIPLIER, "clip_norm": 0.5,
                      "delta": 1e-5, "max_epsilon": 8.0}}
    plan = {**_zoo_plan(run, admin, run.supernet_id, PRIVATE_ZOO_DEVICES), "min_clients": PRIVATE_ZOO_DEVICES,
            "poll_interval_s": 0.2, "privacy": privacy}
    round_id = admin.create_zoo_rounds(plan, run.admin_token)["id"]
    python_devices = PRIVATE_ZOO_DEVICES - (0 if run.skip_java else 1)
    enrollment_token = admin.create_enrollment_token(run.admin_token, max_uses=python_devices,
                                                     label="demo private zoo-wide round")["token"]
    keys = TrustedKeys.load(run.operator_keys_file)
    devices = [_python_zoo_device(run, f"private-zoo-device-{index}", DEVICE_CLASS if index < 3 else None,
                                  enrollment_token, keys) for index in range(python_devices)]
    with FedzooHTTP(run.server_url, token=run.admin_token) as operator:  # SecAgg+ neighbours' keys are certified
        certify_devices(operator, run.operator_key)
    java_device = None
    if not run.skip_java:
        np.savez(run.workdir / "java-data" / "private-zoo-shard.npz", x=shards[-1].x, y=shards[-1].y)
        java_device = _java_participation(run, run.dataset, run.workdir / "java-data" / "private-zoo-shard.npz",
                                          "fp32")
    with ThreadPoolExecutor(max_workers=python_devices) as pool_of_devices:  # SecAgg+ devices answer together
        outcomes = list(pool_of_devices.map(
            lambda index: participate_once(devices[index], run.dataset, shards[index], "fp32").outcome,
            range(python_devices)))
    for device in devices:
        device.close()
    java = f", the Java device ({_java_participation_result(java_device)['outcome']})" if java_device else ""
    view = admin.wait_for_round(round_id)
    outcome = view.get("outcome") or {}
    if outcome.get("zoo") is None:
        admin.close()
        return (f"private zoo-wide round {round_id} {view['state']}: {outcome.get('failure')} (the Python devices: "
                f"{', '.join(outcomes)}{java})")
    claim = admin.card(view["result_model_id"]).details["federated"]["privacy"]["dp"]
    lines = "; ".join(f"{model['new_model_id']} states epsilon "
                      f"{admin.card(model['new_model_id']).details['federated']['privacy']['dp']['epsilon']:.2f}"
                      for model in outcome["zoo"]["models"] if model["published"])
    admin.close()
    return (f"private zoo-wide round {round_id} {view['state']} with {python_devices} Python devices "
            f"({', '.join(outcomes)}){java}: each added its share of the noise (device z {claim['device_noise_multiplier']:.2f}) "
            f"before masking, so the server saw only noised sums of cohorts of at least 3 (k = "
            f"{outcome['secure_aggregation']['neighbour_count']}, t = {outcome['secure_aggregation']['threshold']}); "
            f"every zoo model's line was charged epsilon {claim['epsilon']:.2f} at delta {claim['delta']:g}; "
            + zoo_round_summary(outcome["zoo"]) + (f"; {lines}" if lines else
                                                  "; the gate kept every parent: at this epsilon the noise on the sums of "
                                                  "a cohort of a few devices outweighs their updates (fleets of 500 and "
                                                  "1,000 devices: docs/zoo-federated.md)"))


# (title, function) in data-flow order
STAGES: list[tuple[str, Callable[[DemoRun], str]]] = [
    ("data sets and federated partition", stage_data),
    ("NAS: supernet training and search into a zoo", stage_build),
    ("compression: pruning and INT8 behind the accuracy gate", stage_compress),
    ("training graphs for on-device training", stage_training_graphs),
    ("signing: the operator's key signs every card", stage_sign),
    ("model server: import the zoo and serve it", stage_serve),
    ("device: register, look up, download, run, report latency", stage_client),
    ("federated rounds driven by the server", stage_federated),
    ("a zoo-wide round: every tier trains its subnet, every zoo model is re-extracted and gated", stage_zoo_round),
    ("a Java SDK device beside two Python ones in a SecAgg+ round", stage_java_device),
    ("a private zoo-wide round: SecAgg+ per subnet, the noise added by the devices (distributed DP)",
     stage_private_zoo_round),
]


def stop_server(run: DemoRun) -> None:
    if run.server is not None and run.server.poll() is None:
        run.server.terminate()
        try:
            run.server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            run.server.kill()


@click.command()
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=Path(".fedzoo/demo"),
              show_default=True, help="Where the zoo, the server's data and the device caches go.")
@click.option("--preset", type=click.Choice(list(DEMO_PRESETS)), default="default", show_default=True,
              help="default (MNIST-5k, a few minutes), tiny (MNIST-5k, a smoke run, low accuracy) or mnist1d (the "
                   "tiny build on mnist1d, where the devices' data lifts a weak zoo).")
@click.option("--skip-java", is_flag=True, help="Skip the Java SDK device's stage (it needs a JDK and Maven).")
def demo(workdir: Path, preset: str, skip_java: bool) -> None:
    """Build a zoo, compress it, serve it, act as a device and run federated rounds, on MNIST-5k or mnist1d."""
    run = DemoRun(workdir=workdir.resolve(), preset=preset, skip_java=skip_java)
    run.workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        for title, stage in STAGES:
            stage_started = time.perf_counter()
            console.print(f"[bold]▶ {title}[/bold]")
            try:
                summary = stage(run)
            except Exception as error:  # a stage that cannot run ends the demo with one line, never a traceback
                raise click.ClickException(_failure_line(run, title, error)) from None
            console.print(f"[green]✓[/green] {summary} [dim]({time.perf_counter() - stage_started:.0f} s)[/dim]")
    finally:
        stop_server(run)
    console.print(f"demo finished in {time.perf_counter() - started:.0f} s; everything it made is in {run.workdir}")


def _failure_line(run: DemoRun, title: str, error: Exception) -> str:
    """The one line a failed stage ends the demo with; an unexpected error's traceback goes to a log beside it."""
    if isinstance(error, (FedzooError, OSError, httpx.HTTPError, subprocess.SubprocessError)):
        return f"stage '{title}' could not run: {error}"
    log = run.workdir / "demo-error.log"
    log.write_text("".join(traceback.format_exception(error)))
    return f"stage '{title}' failed: {type(error).__name__}: {error} (traceback: {log})"
