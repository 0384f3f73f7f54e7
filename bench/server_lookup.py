"""Lookup throughput of the production server: requests/s, p50 and p99 latency, errors.

A fresh registry of 1,000 models (4 tasks, fp32 and int8, some with per-device-class latencies) and
10,000 devices (250 hardware types, each device registered with its own token, 2,000 of them with
telemetry) is built through the server's own service functions, then `fedzoo serve` (gunicorn,
2 workers x 4 threads) answers POST /v1/lookup from 50 concurrent keep-alive clients on loopback.
The load generator is `wrk` (C, with a Lua script cycling through pre-drawn device tokens and
budgets) when installed, else Python threads with httpx; either shares the machine's cores with the
server, so the figures are a lower bound of what the server alone sustains.

    .venv/bin/python bench/server_lookup.py [--duration-s 20] [--server 2x4 3x2 ...] [--devices 10000]

With `--baseline OTHER/.venv/bin/fedzoo` (another checkout, e.g. main, installed in its own venv) each
server configuration is also measured with that tree's server, alternating A B B A on copies of the
same registry (the copy migrated down to the baseline's newest revision), and the ratio is printed:
the same machine, load and data for both, so the comparison holds on a shared machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from fedzoo.cards import ModelCard
from fedzoo.device import DeviceProfile
from fedzoo.server import devices, lookup, registry
from fedzoo.server.app import prepare_registry
from fedzoo.server.blobstore import FileBlobStore
from fedzoo.server.config import ServerConfig
from fedzoo.server.db import Database
from fedzoo.server.errors import APIError
from fedzoo.server.latency import default_estimator

MODELS = 1_000
DEVICES = 10_000
HARDWARE_TYPES = 250
DEVICES_WITH_TELEMETRY = 2_000
CONNECTIONS = 50
WARM_UP_S = 5  # on a loaded 2-core machine 50 Python clients need seconds just to open their connections
TASKS = ("digits", "mnist", "cifar10", "keywords")
DEVICE_CLASSES = ("pi4", "pixel6", "jetson-nano", "laptop-x86", None)
REQUEST_POOL = 4_000
GOAL_REQUESTS_PER_S = 1_500
GOAL_P99_MS = 50.0


def onnx_classifier(seed: int, hidden: int) -> bytes:
    """A small real ONNX model (Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    initializers = [
        numpy_helper.from_array(rng.normal(size=(hidden, 1, 3, 3)).astype(np.float32), "conv.weight"),
        numpy_helper.from_array(np.zeros(hidden, np.float32), "conv.bias"),
        numpy_helper.from_array(rng.normal(size=(hidden, 10)).astype(np.float32), "fc.weight"),
        numpy_helper.from_array(np.zeros(10, np.float32), "fc.bias"),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "conv.weight", "conv.bias"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("GlobalAveragePool", ["relu"], ["pool"]),
        helper.make_node("Flatten", ["pool"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"]),
    ]
    graph = helper.make_graph(nodes, f"bench{seed}",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 28, 28])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
                              initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def build_registry(config: ServerConfig, rng: random.Random, device_count: int = DEVICES
                   ) -> tuple[list[tuple[str, dict]], dict[str, float]]:
    """Models, devices and telemetry through the service layer; returns a pool of lookup requests that
    succeed (token, body) and the timings of building it."""
    timings: dict[str, float] = {}
    estimator = default_estimator()
    prepare_registry(config, estimator)
    database = Database(config.database_url)
    store = FileBlobStore(config.blob_dir)
    blobs = [onnx_classifier(seed, hidden=8 * (1 + seed % 16)) for seed in range(40)]
    for blob in blobs:
        store.put(blob)

    started = time.perf_counter()
    with database.session() as session:
        for index in range(MODELS):
            blob = blobs[index % len(blobs)]
            latency_ms = {cls: {"median_ms": round(rng.uniform(0.5, 80.0), 3), "source": "measured"}
                          for cls in DEVICE_CLASSES[:4] if rng.random() < 0.2}
            card = ModelCard.from_dict({
                "id": f"model-{index:04d}", "family": "bench", "task": TASKS[index % len(TASKS)],
                "precision": "int8" if index % 3 == 0 else "fp32",
                "input": {"name": "input", "shape": ["batch", 1, 28, 28]}, "labels": [str(d) for d in range(10)],
                "metrics": {"accuracy": round(rng.uniform(0.6, 0.995), 4), "num_examples": 1000},
                "macs": rng.randint(100_000, 300_000_000), "params": rng.randint(1_000, 5_000_000),
                "size_bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest(), "latency_ms": latency_ms,
            })
            registry.publish(session, store, estimator, card)
    timings["publish_per_model_ms"] = (time.perf_counter() - started) * 1000 / MODELS

    hardware = []
    for kind in range(HARDWARE_TYPES):
        slowdown = rng.uniform(0.5, 8.0)
        hardware.append((DEVICE_CLASSES[kind % len(DEVICE_CLASSES)], rng.choice([512, 1024, 2048, 4096]),
                         [{"model": name, "median_ms": round(base_ms * slowdown * rng.uniform(0.8, 1.25), 4)}
                          for name, base_ms in (("cal-dense-fp32", 1.2), ("cal-dense-int8", 0.8),
                                                ("cal-depthwise-fp32", 0.9), ("cal-depthwise-int8", 0.7),
                                                ("cal-tiny-fp32", 0.15), ("cal-tiny-int8", 0.2),
                                                ("cal-mobilenet-fp32", 1.5), ("cal-mobilenet-int8", 1.1))]))
    tokens: list[str] = []
    started = time.perf_counter()
    with database.session() as session:
        for index in range(device_count):
            device_class, memory_mb, benchmarks = hardware[index % HARDWARE_TYPES]
            profile = DeviceProfile.model_validate({
                "device_id": f"device-{index:05d}", "platform": "linux-aarch64", "device_class": device_class,
                "cpu": {"model": "bench", "cores": 4}, "memory_mb": memory_mb,
                "runtime": {"onnxruntime": "1.32.0", "threads": 1}, "benchmarks": benchmarks,
            })
            tokens.append(devices.register(session, estimator, profile).token)
    timings["register_per_device_ms"] = (time.perf_counter() - started) * 1000 / device_count
    telemetry_devices = min(DEVICES_WITH_TELEMETRY, device_count // 5)
    timings["telemetry_reports"] = telemetry_devices * 3

    with database.session() as session:
        for index in rng.sample(range(device_count), telemetry_devices):
            for _ in range(3):
                devices.report_latency(session, f"device-{index:05d}", f"model-{rng.randrange(MODELS):04d}",
                                       rng.uniform(0.5, 60.0), None, 1, groups=len(estimator.groups))

    pool: list[tuple[str, dict]] = []
    refused = 0
    with database.session() as session:
        while len(pool) < REQUEST_POOL:
            token = rng.choice(tokens)
            body = {"task": rng.choice(TASKS), "latency_budget_ms": round(10 ** rng.uniform(1.3, 3.3), 2)}
            if rng.random() < 0.3:
                body["min_accuracy"] = 0.7
            try:
                lookup.lookup(session, devices.authenticate(session, token), lookup.LookupQuery(**body))
            except APIError:
                refused += 1  # a correct 404/409, but the benchmark measures successful lookups
                continue
            pool.append((token, body))
    timings["pool_refused"] = refused
    database.dispose()
    return pool, timings


WRK_SCRIPT = r"""
local requests = {}
local counter = 0
function init(args)
  for line in io.lines(args[1]) do
    local token, body = line:match("([^\t]+)\t(.+)")
    requests[#requests + 1] = wrk.format("POST", "/v1/lookup",
      {["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/json"}, body)
  end
  counter = math.random(#requests)
end
function request()
  counter = counter % #requests + 1
  return requests[counter]
end
function done(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format('RESULT {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, ' ..
    '"max_us": %d, "connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency.max,
    errors.connect, errors.read, errors.write, errors.status, errors.timeout))
end
"""


def run_wrk(base_url: str, pool: list[tuple[str, dict]], duration_s: int, workdir: Path) -> dict[str, float]:
    requests_file = workdir / "requests.tsv"
    requests_file.write_text("".join(f"{token}\t{json.dumps(body)}\n" for token, body in pool))
    script = workdir / "lookup.lua"
    script.write_text(WRK_SCRIPT)
    completed = subprocess.run(
        ["wrk", "-t2", f"-c{CONNECTIONS}", f"-d{duration_s}s", "--timeout", "5s", "-s", str(script), base_url,
         "--", str(requests_file)],
        capture_output=True, text=True, timeout=duration_s + 60, check=True,
    )
    line = next(line for line in completed.stdout.splitlines() if line.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    errors = sum(result[key] for key in ("connect", "read", "write", "status", "timeout"))
    return {"requests": result["requests"], "requests_per_s": result["requests"] / (result["duration_us"] / 1e6),
            "p50_ms": result["p50_us"] / 1000, "p99_ms": result["p99_us"] / 1000, "max_ms": result["max_us"] / 1000,
            "errors": errors, "client": "wrk -t2 -c50"}


def run_python_clients(base_url: str, pool: list[tuple[str, dict]], duration_s: int) -> dict[str, float]:
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    deadline = time.perf_counter() + duration_s

    def client(offset: int) -> None:
        local, failures = [], 0
        with httpx.Client(base_url=base_url, timeout=5) as http:
            index = offset
            while time.perf_counter() < deadline:
                token, body = pool[index % len(pool)]
                index += CONNECTIONS
                started = time.perf_counter()
                try:
                    ok = http.post("/v1/lookup", json=body, headers={"Authorization": f"Bearer {token}"}).status_code == 200
                except httpx.HTTPError:
                    ok = False
                local.append(time.perf_counter() - started)
                failures += not ok
        with lock:
            latencies.extend(local)
            errors[0] += failures

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(offset,)) for offset in range(CONNECTIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    values = np.array(latencies) * 1000
    return {"requests": len(values), "requests_per_s": len(values) / elapsed, "p50_ms": float(np.percentile(values, 50)),
            "p99_ms": float(np.percentile(values, 99)), "max_ms": float(values.max()), "errors": errors[0],
            "client": "50 Python threads (httpx)"}


def process_tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its children (gunicorn master and workers), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total, pending = 0.0, [pid]
    while pending:
        current = pending.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
            for task in Path(f"/proc/{current}/task").iterdir():
                pending.extend(int(child) for child in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def measure(config: ServerConfig, pool: list[tuple[str, dict]], workers: int, threads: int, duration_s: int,
            client: str, workdir: Path, fedzoo_executable: Path | None = None) -> dict[str, float]:
    """Start `fedzoo serve` (this tree's, or `fedzoo_executable`) with this many workers and threads, warm it
    up, load it, stop it."""
    port = 18000 + (os.getpid() + workers * 10 + threads) % 1000
    # 50 clients on one address: the per-address limit is raised out of the way, not switched off, so its
    # counting (and the per-device limit's) is part of what is measured; a baseline tree ignores the variable
    env = {**os.environ, "FEDZOO_DATA_DIR": str(config.data_dir),
           "FEDZOO_RATE_LIMIT_LOOKUP_PER_ADDRESS": "1000000000/minute"}
    env.pop("FEDZOO_DATABASE_URL", None)
    server = subprocess.Popen(
        [str(fedzoo_executable or Path(sys.executable).with_name("fedzoo")), "serve", "--port", str(port),
         "--workers", str(workers), "--threads", str(threads)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{base_url}/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        use_wrk = client == "wrk" or (client == "auto" and shutil.which("wrk"))
        run = run_wrk if use_wrk else (lambda url, requests, seconds, _: run_python_clients(url, requests, seconds))
        run(base_url, pool, WARM_UP_S, workdir)  # warm-up: connections, SQLite page cache
        server_cpu_before = process_tree_cpu_s(server.pid)
        result = run(base_url, pool, duration_s, workdir)
        result["server_cpu_ms_per_lookup"] = (process_tree_cpu_s(server.pid) - server_cpu_before) * 1000 / max(
            result["requests"], 1)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    return result


def baseline_registry(config: ServerConfig, baseline: Path, workdir: Path) -> ServerConfig:
    """A copy of the registry at the newest migration the baseline tree knows (it refuses newer ones)."""
    from alembic import command

    from fedzoo.server import migrations

    copy = ServerConfig.from_env({}, data_dir=workdir / "baseline-data")
    shutil.copytree(config.data_dir, copy.data_dir)
    head = subprocess.run([str(baseline.with_name("python")), "-c",
                           "from fedzoo.server import migrations; print(migrations.head_revision())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    command.downgrade(migrations.alembic_config(copy.database_url), head)
    return copy


def report(label: str, result: dict[str, float]) -> None:
    print(f"  {label}lookups: {result['requests']:.0f} = {result['requests_per_s']:.0f} req/s "
          f"(goal >= {GOAL_REQUESTS_PER_S}: {result['requests_per_s'] / GOAL_REQUESTS_PER_S:.2f}x); "
          f"p50 {result['p50_ms']:.2f} ms, p99 {result['p99_ms']:.2f} ms (goal < {GOAL_P99_MS:g} ms), "
          f"max {result['max_ms']:.2f} ms; errors {result['errors']}; "
          f"server CPU {result['server_cpu_ms_per_lookup']:.3f} ms/lookup "
          f"(= {2000 / result['server_cpu_ms_per_lookup']:.0f} lookups/s on 2 dedicated cores)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=int, default=20)
    parser.add_argument("--server", nargs="+", default=["2x2", "2x4", "3x2"],
                        help="server configurations WORKERSxTHREADS, measured one after the other on one registry")
    parser.add_argument("--client", choices=["auto", "wrk", "python"], default="auto")
    parser.add_argument("--devices", type=int, default=DEVICES, help="fewer for a quick try; the goal is for 10,000")
    parser.add_argument("--baseline", type=Path, help="another tree's `fedzoo` executable to compare with (A B B A)")
    arguments = parser.parse_args()
    logging.disable(logging.WARNING)

    workdir = Path(tempfile.mkdtemp(prefix="fedzoo-bench-server-"))
    config = ServerConfig.from_env({}, data_dir=workdir / "data")
    rng = random.Random(0)
    started = time.perf_counter()
    pool, build = build_registry(config, rng, arguments.devices)
    print(f"registry: {MODELS} models, {arguments.devices} devices ({HARDWARE_TYPES} hardware types), "
          f"{build['telemetry_reports']} telemetry reports; built in {time.perf_counter() - started:.1f} s "
          f"(publish {build['publish_per_model_ms']:.2f} ms/model, register {build['register_per_device_ms']:.2f} "
          f"ms/device); request pool {len(pool)} successful lookups ({build['pool_refused']} drawn requests were "
          f"404/409 and left out)")

    baseline = baseline_registry(config, arguments.baseline, workdir) if arguments.baseline else None
    for server_config in arguments.server:
        workers, threads = (int(part) for part in server_config.split("x"))
        print(f"server {workers} workers x {threads} threads (gunicorn gthread, SQLite WAL); {CONNECTIONS} "
              f"keep-alive connections, {arguments.duration_s} s, same {os.cpu_count()} cores "
              f"(load average before: {os.getloadavg()[0]:.1f})")

        def run(registry_config: ServerConfig, executable: Path | None) -> dict[str, float]:
            return measure(registry_config, pool, workers, threads, arguments.duration_s, arguments.client, workdir,
                           executable)

        if baseline is None:
            result = run(config, None)
            print(f"  client {result['client']}")
            report("", result)
            continue
        this_tree = [run(config, None)]
        other_tree = [run(baseline, arguments.baseline), run(baseline, arguments.baseline)]
        this_tree.append(run(config, None))
        for label, results in (("this tree ", this_tree), (f"baseline {arguments.baseline} ", other_tree)):
            for result in results:
                report(label, result)
        ratio = sum(r["requests_per_s"] for r in this_tree) / sum(r["requests_per_s"] for r in other_tree)
        cpu_ratio = (sum(r["server_cpu_ms_per_lookup"] for r in this_tree)
                     / sum(r["server_cpu_ms_per_lookup"] for r in other_tree))
        # throughput swings with whatever else the machine runs; server CPU per lookup much less so
        print(f"  this tree / baseline (A B B A means): throughput {ratio:.3f}, server CPU per lookup {cpu_ratio:.3f}")
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
