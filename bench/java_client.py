"""The Java (Android) SDK's trainer beside the Python SDK's, on the same zoo model and batch.

1. Training-step time (loss and gradients from the standard-op training graph in onnxruntime, then the
   SGD-momentum step; batch 32 of MNIST 28x28, 1 intra-op thread) of the MobileNetV2-style NAS subnet of
   `bench/train_benchmark.py`: the Python `fedzoo.edge.trainer.Trainer` and the Java `dev.fedzoo.edge.Trainer`
   (onnxruntime-java from Maven Central), alternating round by round, each round a fresh process after 5 warm-up
   steps; the median of the rounds' medians.
   Goal: Java within 1.2x of Python.
2. Peak RSS (VmHWM) of a client process of each that loads the shard and trains 20 steps over it (the JVM with
   its defaults and with a 64 MB heap).
3. The `fedzoo-client` jar's size, without its provided dependencies (ONNX Runtime, org.json) and without
   BouncyCastle (goal: at most 250 KB).
4. SecAgg+ (protocol v2) on the device side: the time of one device's work in each of the five stages (the SDK's
   client and the REST framing of its reply, no HTTP) for a model of 60,000 parameters with 60 neighbours (a round
   of 61 devices, all simulated in one process per language, each run a fresh round), Java
   (`dev.fedzoo.secagg.SecAggClient`) beside Python (`fedzoo.secagg.SecAggClient`); and the peak RSS (VmHWM) of
   each process. Goal: Java within 1.5x of Python in each stage. The Java SDK computes the masked-input stage's
   pairwise masks on all cores (Python's client on one): Java runs twice, as it comes and pinned to one core
   (`taskset -c 0`), and both are printed.

Needs a JDK and Maven on PATH. Run: .venv/bin/python bench/java_client.py [--rounds 9] [--steps-per-round 10]
[--part training|secagg|all] [--secagg-runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_benchmark import BATCH_SIZE, MEMORY_STEPS, subnet_and_shard  # noqa: E402  (the same model, batch, steps)

REPOSITORY = Path(__file__).resolve().parent.parent
POM = REPOSITORY / "clients" / "java" / "pom.xml"
SMALL_HEAP = ("-Xmx64m", "-XX:+UseSerialGC")  # a heap nearer an app's budget than a server JVM's default


SECAGG_CLIENTS, SECAGG_NEIGHBOURS, SECAGG_LENGTH = 61, 60, 60_000
SECAGG_STAGES = ("advertise_keys", "share_keys", "masked_input", "consistency_check", "unmask")


def java_command(folder: Path, main_class: str = "JavaTrainingStep") -> list[str]:
    """`java -cp <the bench class, the fedzoo-client jar and its dependencies> <main_class>`, after building the
    jar with Maven and compiling the bench classes (ahead of time: the source launcher would keep javac in the
    measured process)."""
    classpath_file = folder / "classpath.txt"
    subprocess.run(["mvn", "-B", "-q", "-Dstyle.color=never", "-f", str(POM), "-pl", "fedzoo-client", "-DskipTests",
                    "package", "dependency:build-classpath", "-DincludeScope=compile",
                    f"-Dmdep.outputFile={classpath_file}"], check=True, stdout=subprocess.DEVNULL)
    classpath = f"{jar_path()}{os.pathsep}{classpath_file.read_text().strip()}"
    classes = folder / "classes"
    subprocess.run(["javac", "-d", str(classes), "-cp", classpath, str(Path(__file__).resolve().parent / f"{main_class}.java")],
                   check=True)
    return ["java", "-cp", f"{classes}{os.pathsep}{classpath}", main_class]


def jar_path() -> Path:
    return next((POM.parent / "fedzoo-client" / "target").glob("fedzoo-client-*.jar"))


def python_step_ms(folder: Path, rounds: int, steps: int) -> list[float]:
    """Median step time per round of the Python trainer, in a fresh process like the Java one."""
    code = (
        "import json, sys, time, numpy as np\n"
        "from fedzoo.edge.optimizers import SGD\nfrom fedzoo.edge.trainer import Trainer\n"
        f"folder = {str(folder)!r}\nshard = np.load(folder + '/shard.npz')\n"
        f"x, y = shard['x'][:{BATCH_SIZE}], shard['y'][:{BATCH_SIZE}]\n"
        "trainer = Trainer.from_inference_model(folder + '/train.onnx', folder + '/model.onnx', SGD(0.01, momentum=0.9))\n"
        "for _ in range(5): trainer.step(x, y)\n"
        "medians = []\n"
        f"for _ in range({rounds}):\n"
        "    times = []\n"
        f"    for _ in range({steps}):\n"
        "        start = time.perf_counter(); trainer.step(x, y); times.append((time.perf_counter() - start) * 1e3)\n"
        "    medians.append(sorted(times)[len(times) // 2])\n"
        "print(json.dumps({'step_ms': medians}))\n"
    )
    output = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(output)["step_ms"]


def java_run(java: list[str], *args: str, jvm_options: tuple[str, ...] = ()) -> dict:
    output = subprocess.run([java[0], *jvm_options, *java[1:], *args], check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def python_secagg_stages(runs: int) -> dict:
    """Python's side of part 4 (run in its own process by `--python-secagg-worker`): device 0's time per stage."""
    from fedzoo.secagg import SecAggClient, SecAggConfig, signatures
    from fedzoo.secagg.framing import rest_reply
    from fedzoo.secagg.bounds import corrupt_devices, survivors_floor, threshold_floor
    from fedzoo.secagg.graph import advertised_bytes, graph_seed, neighbours
    from fedzoo.secagg.messages import from_base64, to_base64

    times: dict[str, list[float]] = {stage: [] for stage in SECAGG_STAGES}
    rng = np.random.default_rng(1)
    for run in range(runs):
        k, n = SECAGG_NEIGHBOURS, SECAGG_CLIENTS
        t = threshold_floor(k, corrupt_devices(n))
        config = SecAggConfig(f"bench-{run}", n, k, t, SECAGG_LENGTH, 0.05, 127, survivors_floor(t, corrupt_devices(n)))
        order = list(reversed(range(n)))  # device 0 last in every stage, as in Java
        keys = {c: signatures.new_signing_key() for c in order}
        clients, adverts, inbox, signed = {}, {}, {c: [] for c in order}, {}

        def timed(client: int, stage: str, work):
            start = time.perf_counter()
            result = work()
            if client == 0:
                times[stage].append((time.perf_counter() - start) * 1e3)
            return result

        for c in order:
            def advertise(c=c):
                clients[c] = SecAggClient(config, c, keys[c])
                return clients[c].advertise_keys()
            adverts[c] = timed(c, "advertise_keys", advertise)
        nonces = {c: from_base64(adverts[c]["nonce"], "nonce") for c in order}
        graph = neighbours(config, graph_seed(config, nonces))
        for c in order:
            request = {"stage": "share_keys", "advertised": to_base64(advertised_bytes(nonces)), "public_keys": [
                {**{key: adverts[p][key] for key in ("cipher_public_key", "mask_public_key", "signature")}, "client": p,
                 "signing_public_key": to_base64(signatures.public_bytes(keys[p]))} for p in graph[c]]}
            reply = timed(c, "share_keys", lambda c=c, request=request: _framed(clients[c].share_keys(request), rest_reply))
            for share in reply["shares"]:
                inbox[share["holder"]].append({"owner": c, "ciphertext": share["ciphertext"]})
        for c in order:
            ring = rng.integers(0, 2**16, SECAGG_LENGTH + 1).astype(np.uint16)
            request = {"stage": "masked_input", "encrypted_shares": inbox[c]}
            timed(c, "masked_input", lambda c=c, request=request, ring=ring: rest_reply(clients[c].masked_input(request, ring)))
        survivors = list(range(n))
        for c in order:
            request = {"stage": "consistency_check", "survivors": survivors}
            signed[c] = timed(c, "consistency_check", lambda c=c, request=request: clients[c].consistency_check(request))
        request = {"stage": "unmask", "survivors": survivors,
                   "signatures": [{"client": p, "signature": signed[p]["signature"]} for p in graph[0]]}
        timed(0, "unmask", lambda: rest_reply(clients[0].unmask(request)))
    return {"stage_ms": times, "peak_rss_mb": _peak_rss_mb()}


def _framed(reply: dict, rest_reply) -> dict:
    rest_reply(reply)  # the framing is part of the device's work; the dict routes the shares here
    return reply


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def secagg_part(runs: int) -> None:
    """Part 4: Java vs Python per SecAgg+ stage, each in its own process (alternating would not change a round)."""
    with tempfile.TemporaryDirectory() as directory:
        java = java_command(Path(directory), "JavaSecAggStages")
        arguments = (str(runs), str(SECAGG_CLIENTS), str(SECAGG_NEIGHBOURS), str(SECAGG_LENGTH))
        java_result = java_run(java, *arguments)
        # the Java SDK sums the masked-input stage's pairwise masks on all cores; Python's client uses one
        java_one_core = java_run(["taskset", "-c", "0", *java], *arguments) if shutil.which("taskset") else None
    python_result = json.loads(subprocess.run([sys.executable, __file__, "--python-secagg-worker", "--secagg-runs",
                                               str(runs)], check=True, capture_output=True, text=True).stdout)
    print(f"SecAgg+ v3, one device's work per stage ({SECAGG_LENGTH} parameters, {SECAGG_NEIGHBOURS} neighbours, "
          f"{SECAGG_CLIENTS} devices; median of {runs} fresh rounds; goal Java <= 1.5x Python; Java on all "
          f"{os.cpu_count()} cores, and pinned to one):")
    for stage in SECAGG_STAGES:
        python_ms = statistics.median(python_result["stage_ms"][stage])
        java_ms = statistics.median(java_result["stage_ms"][stage])
        line = f"  {stage:18s} Python {python_ms:8.2f} ms   Java {java_ms:8.2f} ms   Java/Python {java_ms / python_ms:5.2f}x"
        if java_one_core is not None:
            one_core_ms = statistics.median(java_one_core["stage_ms"][stage])
            line += f"   Java on 1 core {one_core_ms:8.2f} ms ({one_core_ms / python_ms:5.2f}x)"
        print(line)
    print(f"peak RSS of the process simulating the round: Python {python_result['peak_rss_mb']:.0f} MB, "
          f"Java {java_result['peak_rss_mb']:.0f} MB (JVM defaults)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds (one process each) per runtime")
    parser.add_argument("--steps-per-round", type=int, default=10)
    parser.add_argument("--part", choices=("training", "secagg", "all"), default="all")
    parser.add_argument("--secagg-runs", type=int, default=5, help="fresh SecAgg+ rounds per language")
    parser.add_argument("--python-secagg-worker", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.python_secagg_worker:
        print(json.dumps(python_secagg_stages(arguments.secagg_runs)))
        return
    if arguments.part in ("training", "all"):
        training_part(arguments)
    if arguments.part in ("secagg", "all"):
        secagg_part(arguments.secagg_runs)
    print(f"fedzoo-client jar without its provided dependencies (ONNX Runtime, org.json) and BouncyCastle: "
          f"{jar_path().stat().st_size / 1024:.0f} KB (goal <= 250 KB)")


def training_part(arguments: argparse.Namespace) -> None:
    """Parts 1 and 2: the training step and the training client's peak RSS."""

    import onnx
    import onnxruntime

    from fedzoo.graphs.autodiff import build_training_graph
    from fedzoo.nas.export import export_onnx

    model, shard_x, shard_y = subnet_and_shard()
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        proto = export_onnx(model, (1, 1, 28, 28), folder / "model.onnx")
        onnx.save(build_training_graph(proto), folder / "train.onnx")
        np.savez(folder / "shard.npz", x=shard_x, y=shard_y.astype(np.int64))
        java = java_command(folder)
        java_version = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
        parameters = sum(int(np.prod(init.dims)) for init in proto.graph.initializer)
        print(f"model: NAS subnet of bench/train_benchmark.py, {parameters} parameters; batch {BATCH_SIZE} x 1x28x28, "
              f"SGD momentum 0.9, 1 thread")
        java_ort = re.search(r"onnxruntime-([0-9.]+)\.jar", java[2]).group(1)
        print(f"Python: onnxruntime {onnxruntime.__version__}; Java: {java_version}, onnxruntime-java {java_ort}")

        python_ms, java_ms = [], []
        started = time.perf_counter()
        for _ in range(arguments.rounds):  # alternate round by round, so drift on a shared machine hits both
            python_ms += python_step_ms(folder, 1, arguments.steps_per_round)
            java_ms += java_run(java, "time", str(folder), "1", str(arguments.steps_per_round))["step_ms"]
        python_median, java_median = statistics.median(python_ms), statistics.median(java_ms)
        print(f"training step: Python {python_median:.2f} ms, Java {java_median:.2f} ms -> Java/Python "
              f"{java_median / python_median:.2f}x (goal <= 1.2x; medians of {len(python_ms)} rounds x "
              f"{arguments.steps_per_round} steps each, {time.perf_counter() - started:.0f} s)")

        python_memory = json.loads(subprocess.run(
            [sys.executable, "-c", f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                                   f"from train_benchmark import ort_client; from pathlib import Path; "
                                   f"print(json.dumps(ort_client(Path({str(folder)!r}))))"],
            check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
        java_memory = java_run(java, "memory", str(folder), str(MEMORY_STEPS))
        small_heap = java_run(java, "memory", str(folder), str(MEMORY_STEPS), jvm_options=SMALL_HEAP)
        print(f"peak RSS of a client training {MEMORY_STEPS} steps: Python {python_memory['peak_rss_mb']:.0f} MB, "
              f"Java {java_memory['peak_rss_mb']:.0f} MB with the JVM's defaults, {small_heap['peak_rss_mb']:.0f} MB "
              f"with {' '.join(SMALL_HEAP)} (ONNX Runtime's native memory is outside the Java heap)")


if __name__ == "__main__":
    main()
