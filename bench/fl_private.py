"""Private federated rounds: SecAgg+ cost and exactness, and DP-FedAvg accuracy against epsilon; one run.

1. SecAgg+ (fedzoo.secagg), 100 clients, d = 60,000 int8-level values, 30% of clients vanish after key
   sharing (before sending their masked input, the case that makes the server reconstruct mask keys):
   exact sum in every seeded run (goal 100/100), upload per client against the int8 update (goal <= 2.4x the
   raw int8 values with the signatures and the consistency check; as JSON and as the REST endpoints take it:
   masked vector raw, share replies framed), server unmasking time (goal <= 1.5 s), the whole round against a
   plain sum of int8 updates, and what the malicious-server defences add per device: the consistency
   check's bytes (stage 4 request and reply, the neighbours' signatures in the stage 5 request) and time
   (CPU time: signing, the server's stage, each device's signature checks, Ed25519 verification timed in the
   same run), and the server's unmasking in wall-clock and CPU time (the machine is shared: CPU time is what
   its load does not inflate).
   All clients run in this one process, so "round" is the sum of every client's crypto plus the server's.
2. DP-FedAvg (fedzoo.dp) on MNIST-5k (the 3,150 examples left after the cloud's 10% pre-training share,
   split IID over 100, 500 and 1,000 simulated devices; 200 expected per round by Poisson sampling
   (`--per-round`, chosen on validation: docs/privacy.md);
   30 rounds; MLP 784-64-10, 50,890 parameters; adaptive clipping from 0.3 towards the median norm):
   test accuracy at epsilon 1, 2, 4, 8 (delta 1e-5, RDP) against the same plan without DP: equal weights
   and the same server optimizer, only without clipping and noise (the example-weighted plan is printed too)
   (goal: epsilon <= 8 within 3 points of non-private at >= 500 devices). Settings are chosen with
   `--evaluate-on validation` (the validation split, unused by training), then reported on the test split.
   The simulator's noise is seeded (reproducible): its figures describe the mechanism, nothing it trains is private.
   `--engine server` runs the same plans through the REST server instead (`fedzoo.server.testing.LoopbackServer`,
   every device over the SDK, `fedzoo fl simulate --engine server`'s machinery): same shards, seed and training, the
   server's secure noise and adaptive clipping. Its DP plans sample as the simulator does, q = per-round / devices,
   by random check-ins (`privacy.dp.sampling_probability`: each device's coin drawn on the server, docs/privacy.md),
   so both engines run the same mechanism and z; its reference is its own non-private plan (weighted by examples,
   the server's FedAvg, seating the first `--per-round` devices to check in).
3. The epsilon table from the code (no training): for each device count and epsilon, the plan's z, how adaptive
   clipping splits it between the deltas and the centred unclipped count (`fedzoo.dp.noise.adaptive_noise_split`),
   and dp-accounting's epsilon for that released pair, computed directly from the two noises; and the discrete
   Gaussian sampler's cost (exact, from os.urandom: what the server draws) per million coordinates against
   numpy's floating-point Gaussian.

    .venv/bin/python bench/fl_private.py [--parts 1,2,3] [--secagg-runs 100] [--dimension 60000]
        [--devices 100,500,1000]
        [--epsilons 1,2,4,8] [--rounds 30] [--executor processes] [--workers 2] [--server-momentum 0]
        [--per-round 200] [--seed 0]
        [--evaluate-on test] [--engine inprocess|server]
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import dp_accounting

from fedzoo.update_codec import decode_update, encode_update
from fedzoo.cloud.inprocess import SEEDED_NOISE_NOTICE, DpOptions, run_private_rounds
from fedzoo.cloud.simulation import prepare_federation
from fedzoo.dp.accountant import noise_multiplier_for, round_event
from fedzoo.dp.discrete_gaussian import discrete_gaussian_noise
from fedzoo.dp.noise import AdaptiveClipping, adaptive_noise_split
from fedzoo.secagg import RoundAborted, SecAggConfig, quantise, run_local_round, signatures
from fedzoo.secagg.bounds import corrupt_devices, threshold_floor

TRAINING = {"optimizer": "sgd", "learning_rate": 0.1, "local_epochs": 2, "batch_size": 8}


def secagg_part(runs: int, clients: int, dimension: int, neighbour_count: int, threshold: int, drop: float) -> None:
    print(f"\n== SecAgg+: {clients} clients, d={dimension}, k={neighbour_count}, t={threshold}, "
          f"{drop:.0%} drop after key sharing, {runs} seeded runs ==")
    exact, unmask_s, round_s, plain_s, uploads, rest_uploads, aborted = 0, [], [], [], [], [], 0
    unmask_cpu_s = []
    int8_update_bytes = []
    consistency = {"request": [], "reply": [], "unmask_request": [], "sign_s": [], "server_s": [], "unmask_s": []}
    for seed in range(runs):
        rng = np.random.default_rng(seed)
        config = SecAggConfig(f"bench-{seed}", clients, neighbour_count, threshold, dimension, clip_range=0.05)
        deltas = [rng.normal(scale=0.01, size=dimension) for _ in range(clients)]
        inputs = {index: quantise(delta, config, 1.0, rng) for index, delta in enumerate(deltas)}
        dropping = set(random.Random(seed).sample(range(clients), round(drop * clients)))
        started = time.perf_counter()
        try:
            local = run_local_round(config, inputs, {"masked_input": dropping})
        except RoundAborted as error:  # counted: an abort is never a wrong sum
            aborted += 1
            print(f"  run {seed}: aborted ({error})")
            continue
        round_s.append(time.perf_counter() - started)
        unmask_s.append(local.unmask_seconds)
        unmask_cpu_s.append(local.unmask_cpu_seconds)
        survivors = local.result.survivors
        expected = (sum(inputs[i].astype(np.int64) for i in survivors) % 2**config.modulus_bits)
        exact += int(np.array_equal(local.result.ring_sum, expected.astype(local.result.ring_sum.dtype)))
        # the plain round it replaces: decode and sum the survivors' int8 updates
        payloads = [encode_update({"delta": deltas[i].astype(np.float32)}, "int8") for i in survivors]
        int8_update_bytes.append(statistics.mean(map(len, payloads)))
        started = time.perf_counter()
        total = np.zeros(dimension)
        for payload in payloads:
            total += decode_update(payload)[0]["delta"]
        plain_s.append(time.perf_counter() - started)
        for client in survivors:
            sent = local.upload_bytes[client]
            uploads.append(sum(sent.values()))
            # over REST: the masked vector raw (2 or 4 bytes a value), the share replies framed, keys as JSON
            rest_uploads.append(sum(local.rest_bytes[client].values()))
        signers = [client for client in survivors if "consistency_check" in local.client_seconds[client]]
        consistency["server_s"].append(local.consistency_cpu_seconds / len(signers))
        for client in signers:
            consistency["request"].append(local.download_bytes[client]["consistency_check"])
            consistency["reply"].append(local.rest_bytes[client]["consistency_check"])
            consistency["sign_s"].append(local.client_seconds[client]["consistency_check"])
            consistency["unmask_request"].append(local.download_bytes[client].get("unmask", 0))
            consistency["unmask_s"].append(local.client_seconds[client].get("unmask", 0.0))
    int8_bytes = statistics.mean(int8_update_bytes) if int8_update_bytes else float("nan")
    print(f"exact sum: {exact}/{runs} runs ({aborted} aborted)")
    print(f"upload per surviving client: {statistics.mean(uploads) / 1e3:.1f} KB as JSON (vector in base64) = "
          f"{statistics.mean(uploads) / int8_bytes:.2f}x the int8 update ({int8_bytes / 1e3:.1f} KB .npz) and "
          f"{statistics.mean(uploads) / dimension:.2f}x the raw int8 values; over REST (vector raw, shares framed) "
          f"{statistics.mean(rest_uploads) / 1e3:.1f} KB = {statistics.mean(rest_uploads) / int8_bytes:.2f}x / "
          f"{statistics.mean(rest_uploads) / dimension:.3f}x")
    print(f"server unmasking: median {statistics.median(unmask_s):.3f} s, max {max(unmask_s):.3f} s wall clock; "
          f"CPU time median {statistics.median(unmask_cpu_s):.3f} s, max {max(unmask_cpu_s):.3f} s")
    print(f"whole round (all {clients} clients' crypto in this process + server): median "
          f"{statistics.median(round_s):.2f} s = {statistics.median(round_s) / clients * 1e3:.0f} ms per client; "
          f"plain int8 round (decode + sum of survivors): median {statistics.median(plain_s) * 1e3:.0f} ms")
    _consistency_report(consistency, neighbour_count, dimension)


def _consistency_report(measured: dict[str, list[float]], neighbour_count: int, dimension: int) -> None:
    """What the defences against a lying server add per device: the consistency check, and the signatures."""
    verify_s = _ed25519_verify_seconds()
    mean = {name: statistics.mean(values) for name, values in measured.items()}
    signature_field = len(', "signature": ""') + 88  # stage 1's signature, as JSON
    added_upload = mean["reply"] + signature_field
    print(f"consistency check per device: upload {mean['reply']:.0f} B (its signature) + {signature_field} B "
          f"(stage 1's signature) = {added_upload:.0f} B = {added_upload / dimension:.4f}x the raw int8 values; "
          f"download {mean['request']:.0f} B (the survivor set) and a {mean['unmask_request'] / 1e3:.1f} KB "
          f"unmask request (the set + up to k = {neighbour_count} signatures)")
    print(f"consistency check CPU time per device: signing {mean['sign_s'] * 1e3:.2f} ms, the server's stage "
          f"{mean['server_s'] * 1e3:.2f} ms a device; Ed25519 verify {verify_s * 1e6:.0f} us here, so the up to "
          f"2k = {2 * neighbour_count} signatures a device checks (keys in stage 2, the set in stage 5) cost "
          f"{2 * neighbour_count * verify_s * 1e3:.1f} ms (its whole unmask stage, CPU: median "
          f"{statistics.median(measured['unmask_s']) * 1e3:.1f} ms)")


def _ed25519_verify_seconds(count: int = 500) -> float:
    key = signatures.new_signing_key()
    public_key, message = signatures.public_bytes(key), b"fedzoo" * 20
    signature = key.sign(message)
    started = time.process_time()
    for _ in range(count):
        signatures.verify(public_key, signature, message)
    return (time.process_time() - started) / count


def expected_cohort(per_round: int, devices: int) -> int:
    """Devices expected a round: `per_round`, but at most half the fleet (q <= 0.5; 100 devices: 50)."""
    return min(per_round, devices // 2)


def dp_part(device_counts: list[int], epsilons: list[float], rounds: int, executor: str, workers: int,
            server_momentum: float, evaluate_on: str, per_round: int = 50, seed: int = 0) -> None:
    print(f"\n== DP-FedAvg: MNIST-5k, {per_round} expected per round (at most half the fleet), {rounds} rounds, "
          f"delta 1e-5, server momentum "
          f"{server_momentum:g}, accuracy on the {evaluate_on} split, seed {seed} ==")
    print(SEEDED_NOISE_NOTICE % seed)
    print("devices  epsilon  noise z  final acc  best acc  eps spent  rounds  vs non-private (final)")
    for devices in device_counts:
        cohort = expected_cohort(per_round, devices)
        federation = prepare_federation("mnist", num_clients=devices, alpha=None, hidden_units=64, seed=seed)
        common = {"executor": executor, "num_workers": workers, "server_momentum": server_momentum,
                  "evaluate_on": evaluate_on, "seed": seed}
        started = time.perf_counter()
        weighted = run_private_rounds(federation, rounds, cohort, TRAINING, **common)
        print(f"{devices:7d}  {'none':>7}  {'-':>7}  {weighted[-1].accuracy:9.3f}  "
              f"{max(r.accuracy for r in weighted):8.3f}  {'-':>9}  {len(weighted):6d}  weighted by examples "
              f"(base model {federation.card.metrics.accuracy:.3f}; {time.perf_counter() - started:.0f} s)")
        started = time.perf_counter()
        # the reference: DP's equal weights and server optimizer, without the clipping and the noise
        baseline = run_private_rounds(federation, rounds, cohort, TRAINING, equal_weights=True, **common)
        base_final = baseline[-1].accuracy
        print(f"{devices:7d}  {'none':>7}  {'-':>7}  {base_final:9.3f}  {max(r.accuracy for r in baseline):8.3f}  "
              f"{'-':>9}  {len(baseline):6d}  equal weights, the reference ({time.perf_counter() - started:.0f} s)")
        for epsilon in epsilons:
            started = time.perf_counter()
            dp = DpOptions(max_epsilon=epsilon, clip_norm=0.3, adaptive=AdaptiveClipping())
            records = run_private_rounds(federation, rounds, cohort, TRAINING, dp=dp, **common)
            z = noise_multiplier_for(epsilon, 1e-5, rounds, cohort / devices)
            final = records[-1].accuracy
            print(f"{devices:7d}  {epsilon:7g}  {z:7.3f}  {final:9.3f}  {max(r.accuracy for r in records):8.3f}  "
                  f"{records[-1].epsilon:9.3f}  {len(records):6d}  {100 * (final - base_final):+.1f} pt "
                  f"(clip {records[-1].clip_norm:.3f}; {time.perf_counter() - started:.0f} s)")


def server_dp_part(device_counts: list[int], epsilons: list[float], rounds: int, per_round: int,
                   seed: int = 0) -> None:
    """Part 2 on the server engine: the same federation and seed, each plan through the REST server."""
    from fedzoo.cloud.simulation import Simulation
    from fedzoo.server.testing import LoopbackServer

    print(f"\n== DP-FedAvg on the server engine (REST): MNIST-5k, {per_round} expected a round (at most half the "
          f"fleet; random check-ins on the server, q = expected / devices), {rounds} rounds, delta 1e-5, accuracy on "
          f"the test split, seed {seed}; coins and noise from os.urandom ==")
    print("devices  epsilon  noise z  final acc  best acc  eps spent  rounds  vs non-private (final)")
    for devices in device_counts:
        cohort = expected_cohort(per_round, devices)
        federation = prepare_federation("mnist", num_clients=devices, alpha=None, hidden_units=64, seed=seed)
        # min_clients below the cohort: the server's default screening may leave a few updates of a clear round out
        plan = {"min_clients": cohort // 2, "target_clients": cohort, "over_selection": 0.0, "num_rounds": rounds,
                "deadline_s": 3600, "max_accuracy_drop": 1.0,  # no gate: the simulator publishes every round
                "local_epochs": TRAINING["local_epochs"], "batch_size": TRAINING["batch_size"],
                "learning_rate": TRAINING["learning_rate"], "optimizer": TRAINING["optimizer"]}
        with tempfile.TemporaryDirectory(prefix="fl-private-") as folder:
            # each plan continues the base model's line: the line's lifetime budget must hold them all
            with LoopbackServer(Path(folder) / "server", transport="wsgi",
                                environ={"FEDZOO_DP_LINE_MAX_EPSILON": "1000"}) as server:
                with Simulation(federation, server.url, cache_root=Path(folder) / "devices", seed=seed,
                                in_process=server.in_process) as simulation:
                    simulation.publish_base_model()
                    simulation.register_devices()
                    started = time.perf_counter()
                    plain = simulation.run(plan)
                    base_final = _final_accuracy(plain)
                    print(f"{devices:7d}  {'none':>7}  {'-':>7}  {base_final:9.3f}  {_best_accuracy(plain):8.3f}  "
                          f"{'-':>9}  {len(plain):6d}  weighted by examples, the reference "
                          f"({sum(r.state == 'closed' for r in plain)} published; {_failures(plain)}"
                          f"{time.perf_counter() - started:.0f} s)")
                    for epsilon in epsilons:
                        started = time.perf_counter()
                        privacy = {"dp": {"max_epsilon": epsilon, "delta": 1e-5, "clip_norm": 0.3, "adaptive": {},
                                          "sampling_probability": cohort / devices}}
                        # selection closes once every device drew its coin, well within the window
                        records = simulation.run({**plan, "privacy": privacy, "selection_window_s": 600})
                        claim = (records[-1].outcome or {}).get("privacy", {}).get("dp") or {}
                        final = _final_accuracy(records)
                        print(f"{devices:7d}  {epsilon:7g}  {claim.get('noise_multiplier', float('nan')):7.3f}  "
                              f"{final:9.3f}  {_best_accuracy(records):8.3f}  "
                              f"{claim.get('plan_epsilon', float('nan')):9.3f}  {len(records):6d}  "
                              f"{100 * (final - base_final):+.1f} pt (clip {claim.get('clip_norm', float('nan')):.3f}; "
                              f"{sum(r.state == 'closed' for r in records)} published; {_failures(records)}"
                              f"{time.perf_counter() - started:.0f} s)")


def _final_accuracy(records: list) -> float:
    """The last published round's accuracy (the model the plan leaves)."""
    published = [record.accuracy for record in records if record.accuracy is not None]
    return published[-1] if published else float("nan")


def _failures(records: list) -> str:
    """Why rounds failed, if any did (a DP round's read withholds the reason)."""
    reasons = [str((record.outcome or {}).get("failure", "?"))[:80] for record in records if record.state != "closed"]
    return f"failed: {reasons}; " if reasons else ""


def _best_accuracy(records: list) -> float:
    return max((record.accuracy for record in records if record.accuracy is not None), default=float("nan"))


def epsilon_table(device_counts: list[int], epsilons: list[float], rounds: int, per_round: int = 50,
                  clip_norm: float = 0.3) -> None:
    print(f"\n== The epsilon table from the code: {per_round} expected per round (at most half the fleet), "
          f"{rounds} rounds, delta 1e-5, "
          f"RDP, adaptive clipping at its defaults ==")
    print("devices  epsilon  plan z  deltas' z  count stddev  epsilon of the released pair (dp-accounting)")
    for devices in device_counts:
        cohort = expected_cohort(per_round, devices)
        q = cohort / devices
        for epsilon in epsilons:
            z = noise_multiplier_for(epsilon, 1e-5, rounds, q)
            count_stddev, delta_z = adaptive_noise_split(z, cohort, None)
            # one round releases (sum + N(0, (delta_z C)^2), centred count + N(0, count_stddev^2)): the pair is one
            # Gaussian mechanism whose sensitivities (C, 1/2) over their noises add in quadrature
            effective = ((clip_norm / (delta_z * clip_norm)) ** 2 + (0.5 / count_stddev) ** 2) ** -0.5
            accountant = dp_accounting.rdp.RdpAccountant()
            accountant.compose(round_event(effective, q), rounds)
            print(f"{devices:7d}  {epsilon:7g}  {z:6.3f}  {delta_z:9.3f}  {count_stddev:12.3f}  "
                  f"{accountant.get_epsilon(1e-5):.3f}")


def sampler_part(coordinates: int) -> None:
    print(f"\n== Noise sampler cost: the discrete Gaussian (exact integers from os.urandom) on {coordinates:,} "
          "coordinates, numpy's Gaussian on 1,000,000 ==")
    for sigma in (300.0, 1.6e5):  # in grid steps: a SecAgg+ sum's grid, and a clear sum's finer one
        started = time.process_time()
        draws = discrete_gaussian_noise(sigma, coordinates)
        discrete_s = (time.process_time() - started) * 1_000_000 / coordinates
        started = time.process_time()
        np.random.default_rng().normal(0.0, sigma, size=1_000_000)
        numpy_s = time.process_time() - started
        print(f"sigma {sigma:>9g} steps: discrete {discrete_s:.1f} s per million (CPU; sample std "
              f"{draws.std() / sigma:.3f} sigma), numpy {numpy_s * 1e3:.1f} ms per million: "
              f"{discrete_s / numpy_s:,.0f}x")


def main() -> None:
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp-accounting notes every RDP order it skips
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="1,2,3")
    parser.add_argument("--sampler-coordinates", type=int, default=50_000)
    parser.add_argument("--secagg-runs", type=int, default=100)
    parser.add_argument("--dimension", type=int, default=60_000, help="SecAgg+ vector length (exactness does not "
                                                                         "depend on it; time and bytes do)")
    parser.add_argument("--neighbours", type=int, default=60)
    parser.add_argument("--threshold", type=int, default=None,
                        help="t (default: the devices' floor for the corruption budget, 33 at k = 60 of 100)")
    parser.add_argument("--devices", default="100,500,1000")
    parser.add_argument("--epsilons", default="1,2,4,8")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--executor", default="processes")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--server-momentum", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0, help="the split, the shards, the sampling and the noise")
    parser.add_argument("--per-round", type=int, default=200,
                        help="devices expected per round (Poisson sampling, q = per-round / devices)")
    parser.add_argument("--evaluate-on", choices=("test", "validation"), default="test",
                        help="choose settings on validation, report them on test")
    parser.add_argument("--engine", choices=("inprocess", "server"), default="inprocess",
                        help="part 2 in process (seeded noise) or through the REST server (the server's noise)")
    arguments = parser.parse_args()
    parts = {int(part) for part in arguments.parts.split(",")}
    print("measured on a shared 2-core VM (other engineers' jobs running): times are upper bounds")
    if 1 in parts:
        threshold = arguments.threshold or threshold_floor(arguments.neighbours, corrupt_devices(100))
        secagg_part(arguments.secagg_runs, 100, arguments.dimension, arguments.neighbours, threshold, 0.3)
    if 2 in parts and arguments.engine == "server":
        server_dp_part([int(d) for d in arguments.devices.split(",")],
                       [float(e) for e in arguments.epsilons.split(",")], arguments.rounds, arguments.per_round,
                       arguments.seed)
    elif 2 in parts:
        dp_part([int(d) for d in arguments.devices.split(",")], [float(e) for e in arguments.epsilons.split(",")],
                arguments.rounds, arguments.executor, arguments.workers, arguments.server_momentum,
                arguments.evaluate_on, arguments.per_round, arguments.seed)
    if 3 in parts:
        epsilon_table([int(d) for d in arguments.devices.split(",")], [float(e) for e in arguments.epsilons.split(",")],
                      arguments.rounds, arguments.per_round)
        sampler_part(arguments.sampler_coordinates)


if __name__ == "__main__":
    main()
