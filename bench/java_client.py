"""The Java (Android) SDK's trainer beside the Python SDK's, on the same zoo model and batch.

1. Training-step time (loss and gradients from the standard-op training graph in onnxruntime, then the
   SGD-momentum step; batch 32 of MNIST 28x28, 1 intra-op thread) of the MobileNetV2-style NAS subnet of
   `bench/train_benchmark.py`: the Python `fedzoo.edge.trainer.Trainer` and the Java `dev.fedzoo.edge.Trainer`
   (onnxruntime-java from Maven Central), alternating round by round, each round a fresh process after 5 warm-up
   steps; the median of the rounds' medians.
   Goal: Java within 1.2x of Python.
2. Peak RSS (VmHWM) of a client process of each that loads the shard and trains 20 steps over it (the JVM with
   its defaults and with a 64 MB heap).
3. The `fedzoo-client` jar's size, without ONNX Runtime (goal: at most 200 KB).

Needs a JDK and Maven on PATH. Run: .venv/bin/python bench/java_client.py [--rounds 9] [--steps-per-round 10]
"""

from __future__ import annotations

import argparse
import json
import os
import re
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


def java_command(folder: Path) -> list[str]:
    """`java -cp <the bench class, the fedzoo-client jar and its dependencies> JavaTrainingStep`, after building the
    jar with Maven and compiling the bench class (ahead of time: the source launcher would keep javac in the
    measured process)."""
    classpath_file = folder / "classpath.txt"
    subprocess.run(["mvn", "-B", "-q", "-Dstyle.color=never", "-f", str(POM), "-pl", "fedzoo-client", "-DskipTests",
                    "package", "dependency:build-classpath", "-DincludeScope=compile",
                    f"-Dmdep.outputFile={classpath_file}"], check=True, stdout=subprocess.DEVNULL)
    classpath = f"{jar_path()}{os.pathsep}{classpath_file.read_text().strip()}"
    classes = folder / "classes"
    subprocess.run(["javac", "-d", str(classes), "-cp", classpath, str(Path(__file__).resolve().parent / "JavaTrainingStep.java")],
                   check=True)
    return ["java", "-cp", f"{classes}{os.pathsep}{classpath}", "JavaTrainingStep"]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds (one process each) per runtime")
    parser.add_argument("--steps-per-round", type=int, default=10)
    arguments = parser.parse_args()

    import onnx
    import onnxruntime

    from fedzoo.cloud.autodiff import build_training_graph
    from fedzoo.compress.export import export_onnx

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
        print(f"fedzoo-client jar without ONNX Runtime: {jar_path().stat().st_size / 1024:.0f} KB (goal <= 200 KB)")


if __name__ == "__main__":
    main()
