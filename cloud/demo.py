"""`fedzoo demo`: the whole system end to end on MNIST-5k, on this machine.

It builds a zoo (supernet training and search), compresses it behind the accuracy gate, attaches
training graphs, signs its cards with an operator key, serves it with the production server (`fedzoo serve`, gunicorn on loopback), then
acts as a device (register with calibration timings, look up the best model under a budget,
verify the card against the pinned keys, download, run, report latency), runs federated rounds that fine-tune a zoo model from virtual devices'
Dirichlet shards and publish new versions, and finally lets a device of the Java (Android) SDK run a model and
take part in a round beside a Python device, when a JDK and Maven are present (it says so when it skips).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click
import httpx
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fedzoo.cards import ModelCard
from fedzoo.cloud.data import DatasetSplit, dirichlet_partition, load_dataset, split_dataset
from fedzoo.errors import FedzooError
from fedzoo.zoo import Zoo

console = Console()
DEVICE_CLASS = "cloud-x86-1t"
SERVER_START_TIMEOUT_S = 120.0


@dataclass
class DemoRun:
    """What the stages hand on to each other."""

    workdir: Path
    preset: str
    admin_token: str = "demo-admin-token"
    split: DatasetSplit | None = None
    server: subprocess.Popen | None = None
    server_url: str = ""
    federation: object = None  # the federated stage's Federation, which the Java device's round reuses
    latest_model_id: str = ""
    evaluation_sha256: str = ""  # the federated stage's evaluation set, which judges the Java device's round too

    @property
    def zoo_dir(self) -> Path:
        return self.workdir / "zoo"

    @property
    def operator_keys_file(self) -> Path:
        """The operator's public key set, which the server trusts (FEDZOO_TRUSTED_KEYS)."""
        return self.workdir / "operator-keys.json"


def stage_data(run: DemoRun) -> str:
    run.split = split_dataset(load_dataset("mnist"), seed=0)
    shards = dirichlet_partition(run.split.train.y, num_clients=20, alpha=0.5, seed=0)
    sizes = [len(shard) for shard in shards]
    classes = np.mean([len(np.unique(run.split.train.y[shard])) for shard in shards])
    return (
        f"MNIST-5k split {len(run.split.train)}/{len(run.split.validation)}/{len(run.split.test)}; "
        f"Dirichlet(0.5) over 20 clients: {min(sizes)}..{max(sizes)} examples each, {classes:.1f} classes on average"
    )


def stage_build(run: DemoRun) -> str:
    from fedzoo.cloud.pipeline import BuildConfig, build_zoo
    from fedzoo.cloud.zoo_cli import RichReporter

    config = BuildConfig(dataset="mnist", out=run.zoo_dir, preset=run.preset, seed=0, compress=False,
                         training_graphs=False, zoo_min_size=4, zoo_max_size=4)
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

    report = compress_zoo(run.zoo_dir, run.split, pruning_ratios=(0.5,), fine_tuning=FineTuning(epochs=2))
    reasons = "; ".join(f"{rejected.variant_id}: {', '.join(rejected.reasons)}" for rejected in report.rejected[:2])
    return f"{len(report.accepted)} variants published, {len(report.rejected)} rejected by the gate" + (
        f" (e.g. {reasons})" if reasons else ""
    )


def stage_training_graphs(run: DemoRun) -> str:
    from fedzoo.cloud.training_graphs import attach_training_graphs

    updated = attach_training_graphs(run.zoo_dir)
    return f"training graphs attached to {len(updated)} cards (standard ONNX ops only)"


def stage_sign(run: DemoRun) -> str:
    from fedzoo.keyring import KeyDirectory
    from fedzoo.signing import CardSigningKey

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
    models = httpx.get(f"{run.server_url}/v1/models", params={"task": "mnist", "limit": 200}).json()
    return f"gunicorn on {run.server_url} serves {len(models['models'])} models (log: {run.workdir / 'server.log'})"


def stage_client(run: DemoRun) -> str:
    from fedzoo.clients.client import FedzooClient
    from fedzoo.edge.benchmark import benchmark_model
    from fedzoo.edge.device_profile import collect_device_profile
    from fedzoo.signing import TrustedKeys

    cards = [card for card in Zoo(run.zoo_dir).cards() if DEVICE_CLASS in card.latency_ms]
    budget_ms = 2 * min(card.latency_ms[DEVICE_CLASS].median_ms for card in cards)
    # a real device ships with this key set; the demo fetches it once, before the device starts
    pinned = TrustedKeys.from_json(httpx.get(f"{run.server_url}/v1/keys").json())
    with FedzooClient(run.server_url, cache_dir=run.workdir / "device-cache", trusted_keys=pinned) as client:
        profile = collect_device_profile(f"demo-device-{os.getpid()}", threads=1)
        # enrolled as an operator would enroll a device: an enrollment token made with the admin token
        client.register(profile, client.create_enrollment_token(run.admin_token, label="demo device")["token"])
        answer = client.lookup("mnist", latency_budget_ms=budget_ms)
        card = ModelCard.from_dict(answer["model"])
        session = client.session(card)
        predictions = np.argmax(session.run(run.split.test.x), axis=-1)
        accuracy = float((predictions == run.split.test.y).mean())
        measured = benchmark_model(client.download_model(card), threads=1)
        client.report_latency(card.id, measured.median_ms, measured.p90_ms, 1)
        again = client.lookup("mnist", latency_budget_ms=budget_ms)
    return (
        f"lookup under {budget_ms:.3f} ms chose {card.id} ({card.precision}, {answer['latency_ms']:.3f} ms "
        f"{answer['latency_source']}), its signature verified against {len(pinned.key_ids)} pinned keys; on-device test accuracy {accuracy:.4f}; measured {measured.median_ms:.3f} ms "
        f"and reported it; the next lookup used '{again['latency_source']}' latency for {again['model']['id']}"
    )


def stage_federated(run: DemoRun) -> str:
    from fedzoo.cloud.simulation import Simulation, federation_from_zoo

    roots = [card for card in Zoo(run.zoo_dir).cards() if card.parent_id is None and card.training_graph]
    base = max(roots, key=lambda card: card.metrics.accuracy)
    federation = federation_from_zoo(run.zoo_dir, base.id, run.split, num_clients=5, alpha=0.5, seed=0)
    # every selected device's update reaches the server only inside the SecAgg+ sum (5 devices: k = 4, t = 3)
    config = {"min_clients": 3, "target_clients": 5, "over_selection": 0.0, "deadline_s": 300, "num_rounds": 2,
              "local_epochs": 1, "batch_size": 32, "learning_rate": 0.01, "poll_interval_s": 0.2,
              "privacy": {"secure_aggregation": {"neighbour_count": 4, "threshold": 3, "stage_deadline_s": 60}}}
    with Simulation(federation, run.server_url, run.admin_token, cache_root=run.workdir / "federation") as simulation:
        simulation.publish_base_model()
        simulation.register_devices(prefix=f"demo-fl-{os.getpid()}")
        records = simulation.run(config)
    run.federation = federation
    run.evaluation_sha256 = simulation.evaluation_sha256
    run.latest_model_id = next((r.result_model_id for r in reversed(records) if r.result_model_id), base.id)
    rounds = ", ".join(
        f"round {record.number}: {record.state}, {record.accepted_updates} updates"
        + (f", accuracy {record.accuracy:.4f} -> {record.result_model_id}" if record.accuracy is not None else "")
        + (f" ({record.outcome['failure']})" if record.outcome and "failure" in record.outcome else "")
        for record in records
    )
    return (f"fine-tuned {base.id} (accuracy {base.metrics.accuracy:.4f}) with 5 virtual devices under SecAgg+ "
            f"(the server saw only the sum of their updates): {rounds}; no DP: with 5 devices any useful epsilon "
            f"costs 20-30 accuracy points (docs/privacy.md), so the demo runs none rather than report a hollow one")


def stage_zoo_round(run: DemoRun) -> str:
    """One zoo-wide round (docs/zoo-federated.md): two tiers of devices train the subnets their lookups pick, and
    every zoo model is re-extracted from the improved supernet and re-published behind the accuracy gate."""
    from fedzoo.cards import is_supernet
    from fedzoo.clients.client import FedzooClient
    from fedzoo.clients.participation import participate_once
    from fedzoo.device import CpuInfo, DeviceProfile, RuntimeInfo

    zoo = Zoo(run.zoo_dir)
    supernet = next(card for card in zoo.cards() if is_supernet(card))
    smallest = min((card for card in zoo.cards() if DEVICE_CLASS in card.latency_ms and card.precision == "fp32"
                    and card.pruning is None and not is_supernet(card)), key=lambda card: card.macs)
    admin = FedzooClient(run.server_url, cache_dir=run.workdir / "zoo-round-admin")
    calibration = io.BytesIO()
    np.savez(calibration, x=run.split.validation.x)
    # the small tier (this machine's class) may spend 1.5x the smallest model's latency, the other tier anything
    config = {"model_id": supernet.id, "evaluation_sha256": run.evaluation_sha256, "min_clients": 4,
              "target_clients": 4, "over_selection": 0.0, "deadline_s": 300, "local_epochs": 1, "batch_size": 32,
              "learning_rate": 0.01, "max_accuracy_drop": 0.01,
              "zoo": {"latency_budget_ms": 1e5, "calibration_sha256": admin.publish_blob(calibration.getvalue(),
                                                                                          run.admin_token),
                      "latency_budget_ms_by_class": {DEVICE_CLASS: 1.5 * smallest.latency_ms[DEVICE_CLASS].median_ms}}}
    round_id = admin.create_zoo_rounds(config, run.admin_token)["id"]
    enrollment_token = admin.create_enrollment_token(run.admin_token, max_uses=4, label="demo zoo-wide round")["token"]
    for index in range(4):
        profile = DeviceProfile(device_id=f"demo-zoo-{os.getpid()}-{index}", platform="linux-x86_64",
                                device_class=DEVICE_CLASS if index % 2 == 0 else None,
                                cpu=CpuInfo(model="virtual", cores=1), memory_mb=2048,
                                runtime=RuntimeInfo(onnxruntime="simulated", threads=1))
        with FedzooClient(run.server_url, cache_dir=run.workdir / f"zoo-device-{index}") as device:
            device.register(profile, enrollment_token)
            participate_once(device, "mnist", run.federation.client_data(index), "fp32")
    view = admin.fl_round(round_id)
    while view["state"] in ("open", "collecting", "aggregating"):
        time.sleep(0.2)
        view = admin.fl_round(round_id)
    admin.close()
    outcome = (view.get("outcome") or {}).get("zoo")
    if outcome is None:
        return f"zoo-wide round {round_id} {view['state']}: {(view.get('outcome') or {}).get('failure')}"
    changes = "; ".join(f"{model['model_id']} {model['accuracy_before']:.4f} -> {model['accuracy_after']:.4f} "
                        f"({100 * (model['accuracy_after'] - model['accuracy_before']):+.2f} points"
                        f"{', new version ' + model['new_model_id'] if model['published'] else ', not published'})"
                        for model in outcome["models"])
    return (f"zoo-wide round {round_id} {view['state']}: devices trained {len(outcome['devices_per_zoo_model'])} "
            f"subnets, {outcome['coverage']['released']} of {outcome['coverage']['parameters']} supernet parameters "
            f"moved; {outcome['new_versions']} of {len(outcome['models'])} zoo models got a new version: {changes}")


def _java_sdk_command(run: DemoRun) -> list[str] | None:
    """`java -cp <fedzoo-client and its dependencies> dev.fedzoo.Cli`, built with Maven; None without a JDK and Maven."""
    pom = Path(__file__).resolve().parent.parent / "clients" / "java" / "pom.xml"
    if not (shutil.which("java") and shutil.which("mvn") and pom.is_file()):
        return None
    classpath_file = run.workdir / "java-classpath.txt"
    subprocess.run(["mvn", "-B", "-q", "-Dstyle.color=never", "-f", str(pom), "-pl", "fedzoo-client", "-DskipTests", "package",
                    "dependency:build-classpath", "-DincludeScope=compile", f"-Dmdep.outputFile={classpath_file}"],
                   check=True, stdout=subprocess.DEVNULL)
    jar = next((pom.parent / "fedzoo-client" / "target").glob("fedzoo-client-*.jar"))
    return ["java", "-cp", f"{jar}{os.pathsep}{classpath_file.read_text().strip()}", "dev.fedzoo.Cli"]


def stage_java_device(run: DemoRun) -> str:
    """A Java SDK device (the Android SDK on the JVM) beside a Python one: it looks up and runs a model, then both
    take part in one federated round."""
    from fedzoo.clients.client import FedzooClient
    from fedzoo.clients.participation import participate_once
    from fedzoo.edge.device_profile import collect_device_profile

    task = run.federation.card.task
    java = _java_sdk_command(run)
    if java is None:
        return "skipped: the Java device needs a JDK and Maven on PATH and the source tree's clients/java (not found)"
    state, data = run.workdir / "java-device", run.workdir / "java-data"
    data.mkdir(parents=True, exist_ok=True)
    np.savez(data / "test.npz", x=run.split.test.x, y=run.split.test.y)
    shard = run.federation.client_data(0)
    np.savez(data / "shard.npz", x=shard.x, y=shard.y)
    cli = lambda *args: json.loads(subprocess.run([*java, *args, "--state", str(state)], check=True,  # noqa: E731
                                                  capture_output=True, text=True).stdout.strip().splitlines()[-1])
    admin = FedzooClient(run.server_url, cache_dir=run.workdir / "java-round-admin")
    enrollment_token = admin.create_enrollment_token(run.admin_token, max_uses=2, label="demo java + python")["token"]
    cli("register", "--server", run.server_url, "--device-id", f"demo-java-{os.getpid()}",
        "--enrollment-token", enrollment_token)
    ran = cli("run", "--task", task, "--latency-budget-ms", "1000", "--inputs", str(data / "test.npz"))
    round_id = admin.create_rounds({"model_id": run.latest_model_id, "evaluation_sha256": run.evaluation_sha256,
                                    "min_clients": 2, "target_clients": 2,
                                    "over_selection": 0.0, "deadline_s": 300, "local_epochs": 1, "batch_size": 32,
                                    "learning_rate": 0.01}, run.admin_token)["id"]
    java_device = subprocess.Popen([*java, "participate", "--task", task, "--data", str(data / "shard.npz"),
                                    "--encoding", "int8", "--max-idle-s", "60", "--state", str(state)],
                                   stdout=subprocess.PIPE, text=True)
    with FedzooClient(run.server_url, cache_dir=run.workdir / "python-device") as python_device:
        python_device.register(collect_device_profile(f"demo-python-{os.getpid()}", run_calibration=False),
                               enrollment_token)
        python_result = participate_once(python_device, task, run.federation.client_data(1), "fp32")
    java_result = json.loads(java_device.communicate(timeout=300)[0].strip().splitlines()[-1])
    view = admin.fl_round(round_id)
    while view["state"] in ("open", "collecting", "aggregating"):
        time.sleep(0.2)
        view = admin.fl_round(round_id)
    admin.close()
    return (f"Java device ran {ran['model_id']} at test accuracy {ran['accuracy']:.4f}; round {round_id} with it "
            f"(int8: {java_result['outcome']}) and a Python device (fp32: {python_result.outcome}) {view['state']} "
            f"with {view['accepted_updates']} updates -> {view['result_model_id']} (a plain round: the Java SDK does "
            f"not speak SecAgg+ yet)")


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
    ("a zoo-wide round: every tier trains its subnet, every zoo model improves", stage_zoo_round),
    ("a Java SDK device beside a Python one", stage_java_device),
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
@click.option("--preset", type=click.Choice(["default", "tiny"]), default="default", show_default=True,
              help="Size of the zoo build: default (a few minutes) or tiny (a smoke run, low accuracy).")
def demo(workdir: Path, preset: str) -> None:
    """Build a zoo, compress it, serve it, act as a device and run federated rounds, on MNIST-5k."""
    run = DemoRun(workdir=workdir, preset=preset)
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        for title, stage in STAGES:
            stage_started = time.perf_counter()
            console.print(f"[bold]▶ {title}[/bold]")
            summary = stage(run)
            console.print(f"[green]✓[/green] {summary} [dim]({time.perf_counter() - stage_started:.0f} s)[/dim]")
    finally:
        stop_server(run)
    console.print(f"demo finished in {time.perf_counter() - started:.0f} s; everything it made is in {workdir}")
