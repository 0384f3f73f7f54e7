"""Federated fine-tuning on MNIST-5k against a real server on loopback, all figures from one run.

20 devices hold Dirichlet(0.5) shards of MNIST-5k's training split (less the 10% the cloud pre-trained
the base model on); each round selects 10 (+30% over-selection) and the server measures every new
version on the test split. Printed side by side:

1. FedAvg and FedProx accuracy per round vs centralized fine-tuning of the same base model on the
   same data pooled (goal: within 1.5 points within 30 rounds);
2. with 20% of devices poisoning (delta x -10), FedAvg vs coordinate median, trimmed mean, norm
   clipping and multi-Krum, against the clean FedAvg run (goal: robust within 2 points of clean,
   FedAvg not);
3. INT8 deltas: upload bytes and accuracy vs float32 (goal: >= 3.5x fewer bytes, <= 0.5 point loss).

    .venv/bin/python bench/fl_mnist.py [--rounds 30] [--executor ray]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from fedzoo.cloud.simulation import LoopbackServer, ScaledUpdateAttack, Simulation, centralized_baseline, prepare_federation


def run_plan(federation, round_config, executor, attackers=frozenset(), encoding="fp32", label=""):
    with tempfile.TemporaryDirectory(prefix="fedzoo-bench-") as folder:
        with LoopbackServer(Path(folder) / "server") as server:
            with Simulation(federation, server.url, executor=executor, cache_root=Path(folder) / "devices",
                            attackers=attackers, attack=ScaledUpdateAttack(-10.0), encoding=encoding, seed=1) as sim:
                sim.publish_base_model()
                sim.register_devices()
                started = time.perf_counter()
                records = sim.run(round_config)
                elapsed = time.perf_counter() - started
    accuracies = [r.accuracy if r.accuracy is not None else float("nan") for r in records]
    upload_bytes = sum(r.upload_bytes for r in records)
    accepted = sum(r.accepted_updates for r in records)
    print(f"  {label:<28} {len(records)} rounds in {elapsed:5.1f} s, {sum(r.state == 'failed' for r in records)} failed, "
          f"final {accuracies[-1]:.4f}, best {max(accuracies):.4f}, {upload_bytes / max(accepted, 1) / 1024:.1f} KiB/update")
    return accuracies, upload_bytes, accepted


def tail_mean(values, count=3):
    return statistics.fmean(values[-count:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--executor", default="in-process", choices=["in-process", "ray"])
    args = parser.parse_args()

    started = time.perf_counter()
    federation = prepare_federation("mnist", num_clients=args.clients, alpha=args.alpha, hidden_units=64,
                                    pretrain_fraction=0.1, pretrain_epochs=3, seed=0)
    sizes = sorted(len(shard) for shard in federation.shards)
    print(f"MNIST-5k: {len(federation.pool.y)} examples over {args.clients} devices (Dirichlet {args.alpha}: "
          f"{sizes[0]}..{sizes[-1]} each), test {len(federation.split.test)}; base model (MLP 784-64-10, "
          f"{federation.card.params} params) pre-trained on the cloud's 10%: accuracy {federation.card.metrics.accuracy:.4f}")
    config = {"min_clients": max(1, args.per_round * 8 // 10), "target_clients": args.per_round, "over_selection": 0.3,
              "deadline_s": 300, "num_rounds": args.rounds, "local_epochs": 2, "batch_size": 20, "learning_rate": 0.05}

    print("\n1. clean runs (test accuracy of each round's published version)")
    fedavg, fp32_bytes, fp32_updates = run_plan(federation, {**config, "strategy": {"name": "fedavg"}}, args.executor,
                                                label="FedAvg fp32")
    fedprox, _, _ = run_plan(federation, {**config, "strategy": {"name": "fedprox", "proximal_mu": 0.1}},
                             args.executor, label="FedProx mu=0.1")
    central_epochs = 10
    central = centralized_baseline(federation, epochs=central_epochs, batch_size=20, learning_rate=0.05)
    print(f"  {'centralized fine-tuning':<28} {central_epochs} epochs over the pooled data: final {central[-1]:.4f}, "
          f"best {max(central):.4f}")
    print("  round  " + " ".join(f"{n:>6}" for n in range(1, args.rounds + 1, max(1, args.rounds // 10))))
    for label, values in (("FedAvg", fedavg), ("FedProx", fedprox)):
        print(f"  {label:<6} " + " ".join(f"{values[n - 1]:6.4f}" for n in range(1, args.rounds + 1, max(1, args.rounds // 10))))
    print("  centralized per epoch: " + " ".join(f"{value:.4f}" for value in central))
    for label, values in (("FedAvg", fedavg), ("FedProx", fedprox)):
        gap = (max(central) - max(values)) * 100
        print(f"  {label}: best within {args.rounds} rounds is {gap:+.2f} points below centralized's best "
              f"(goal <= 1.5): {'met' if gap <= 1.5 else 'NOT met'}")

    attackers = frozenset(range(0, args.clients, 5))  # every fifth device: 20%
    print(f"\n2. {len(attackers)} of {args.clients} devices send delta x -10 (mean accuracy of the last 3 rounds)")
    clean = tail_mean(fedavg)
    poisoned = {}
    for label, strategy in (("FedAvg", {"name": "fedavg"}), ("coordinate median", {"name": "median"}),
                            ("trimmed mean 0.3", {"name": "trimmed_mean", "trim_fraction": 0.3}),
                            ("norm clipping (median)", {"name": "norm_clipping"}),
                            ("multi-Krum f=30%", {"name": "multi_krum", "byzantine_fraction": 0.3})):
        values, _, _ = run_plan(federation, {**config, "strategy": strategy}, args.executor, attackers=attackers,
                                label=f"{label} poisoned")
        poisoned[label] = tail_mean(values)
    print(f"  clean FedAvg: {clean:.4f}")
    for label, value in poisoned.items():
        gap = (clean - value) * 100
        print(f"  {label:<24} poisoned {value:.4f}: {gap:+.2f} points below clean FedAvg "
              f"({'within' if gap <= 2 else 'NOT within'} 2 points)")

    print("\n3. INT8 deltas (clean FedAvg)")
    int8, int8_bytes, int8_updates = run_plan(federation, {**config, "strategy": {"name": "fedavg"}}, args.executor,
                                              encoding="int8", label="FedAvg int8")
    ratio = (fp32_bytes / fp32_updates) / (int8_bytes / int8_updates)
    loss = (tail_mean(fedavg) - tail_mean(int8)) * 100
    print(f"  upload bytes per update: fp32 {fp32_bytes / fp32_updates:,.0f}, int8 {int8_bytes / int8_updates:,.0f} "
          f"-> {ratio:.2f}x fewer (goal >= 3.5x); accuracy fp32 {tail_mean(fedavg):.4f} vs int8 {tail_mean(int8):.4f}: "
          f"{loss:+.2f} points (goal <= 0.5)")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
