"""Robust rounds against insiders: enrolled devices attacking a FedAvg plan from inside, with the server's
defences off and on, against the honest plan with the same seeds; all figures from one run.

The setting of issue 33: the real server on loopback, the real SDK, MNIST-5k over 20 devices in Dirichlet(0.5)
shards (~150 examples each), every device selected every round, FedAvg for 8 rounds; the base model is the
simulation's MLP pre-trained on the cloud's 10% of the training split. The server evaluates on the test split.

Defences **off**: what the server did before (FedAvg weights = counted examples, capped at 10,000; the norm
bound clips at 3 x the median; the gate compares with the parent; no quarantine). Defences **on**: the
defaults of robust rounds (weights at most 2 x the round's median, the gate against the plan's best, quarantine
after 3 exclusions among a device's last 5 updates) plus a root set: the first `--root-examples` examples of
the validation split, which the server trains its own update on (FLTrust).

Attacks (`fedzoo.cloud.attacks`), by devices 0, 5, 10, 15 (the first `share` of them):
- weight grab: trains on its shard tiled to 10,000 examples, claims them, flips its delta and adapts the scale
  (x0.5 after a failed round, x1.5 after a published one);
- sign flip: its honest delta x -1;
- label flip: trains on its own images with labels 9 - y;
- model replacement: a backdoor (below) whose delta is boosted x 20 / share (Bagdasaryan et al. 2020);
- backdoor: a 3x3 white square near the bottom-right corner on copies of half its images, labelled 0.

Reported per plan: final accuracy (of the version lookup serves at the end) minus the honest plan's, rounds
failed, published versions below the best so far minus the tolerance (a ratchet), the backdoor's success on
triggered test images whose label is not 0, devices quarantined (insiders / honest), and the server's time
per round (aggregation, root-set training and scoring, evaluation: `outcome.server_seconds`).

Goals (issue 33): with <= 10% insiders (1/20, 2/20) final accuracy within 1 point of honest and no published
version below the best minus the tolerance; with 20% (4/20) within 3 points; backdoor success <= 10% at 2/20;
defences' cost on the honest plan <= 0.5 point.

    .venv/bin/python bench/fl_robust.py                  # everything: 2 x (1 + 5 x 3) plans
    .venv/bin/python bench/fl_robust.py --attacks weight_grab,backdoor --shares 1,2 --rounds 8
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from fedzoo.local_training import normalise
from fedzoo.cloud.attacks import (
    BackdoorAttack, DeviceAttack, LabelFlipAttack, ScaledUpdateAttack, WeightGrabAttack, attack_success_rate,
)
from fedzoo.cloud.simulation import Federation, LoopbackServer, Simulation, prepare_federation
from fedzoo.edge.runtime import create_session

INSIDERS = (0, 5, 10, 15)  # the first `share` of these attack
BACKDOOR_TARGET = 0


def make_attack(name: str, share: int, selected: int) -> DeviceAttack:
    return {
        "weight_grab": lambda: WeightGrabAttack(claim=10_000, scale=1.0),
        "sign_flip": lambda: ScaledUpdateAttack(-1.0),
        "label_flip": lambda: LabelFlipAttack(num_classes=10),
        "model_replacement": lambda: BackdoorAttack(target=BACKDOOR_TARGET, boost=selected / share),
        "backdoor": lambda: BackdoorAttack(target=BACKDOOR_TARGET),
    }[name]()


ATTACKS = ("weight_grab", "sign_flip", "label_flip", "model_replacement", "backdoor")


@dataclass
class PlanResult:
    final_accuracy: float
    accuracies: list[float | None]  # per round: the published version's, None when the round failed
    failed_rounds: int
    ratchet_versions: int  # published versions below the best so far minus the tolerance
    backdoor_success: float
    quarantined_insiders: int
    quarantined_honest: int
    server_seconds_per_round: float
    wall_seconds: float


def root_set(federation: Federation, count: int) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, x=federation.split.validation.x[:count], y=federation.split.validation.y[:count])
    return buffer.getvalue()


def defences(on: bool, root_sha256: str | None) -> dict:
    if not on:
        return {"weight_bound": {"rule": "examples"}, "gate": {"compare_with": "parent"}, "quarantine": None}
    return {"root_trust": {"root_sha256": root_sha256}}  # the rest are robust rounds' defaults


def run_plan(federation: Federation, config: dict, defended: bool, root_examples: int, attackers: frozenset[int],
             attack: DeviceAttack, seed: int) -> PlanResult:
    """One plan on a fresh server (a fresh quarantine); returns its figures."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedzoo-robust-") as folder:
        with LoopbackServer(Path(folder) / "server") as server:
            with Simulation(federation, server.url, cache_root=Path(folder) / "devices", attackers=attackers,
                            attack=attack, seed=seed) as sim:
                sim.publish_base_model()
                sim.register_devices()
                root_sha = sim.admin.publish_blob(root_set(federation, root_examples), server.admin_token)
                records = sim.run({**config, **defences(defended, root_sha)})
                final_id = next((r.result_model_id for r in reversed(records) if r.result_model_id), None)
                final_card = sim.admin.card(final_id) if final_id else federation.card
                final_model = sim.admin.download_model(final_card).read_bytes() if final_id else federation.model
                quarantined = httpx.get(f"{server.url}/v1/fl/quarantine", params={"limit": 200},
                                        headers={"Authorization": f"Bearer {server.admin_token}"}).json()["devices"]
    flagged = {int(device["device_id"].rsplit("-", 1)[1]) for device in quarantined}
    accuracies = [r.accuracy for r in records]
    best, ratchet = federation.card.metrics.accuracy, 0
    for accuracy in accuracies:
        if accuracy is not None:
            ratchet += accuracy < best - config["max_accuracy_drop"] - 1e-12
            best = max(best, accuracy)
    session = create_session(final_model)
    name = session.get_inputs()[0].name
    predict = lambda x: session.run(None, {name: normalise(x, federation.card.input.normalisation)})[0].argmax(1)  # noqa: E731
    success = attack_success_rate(predict, federation.split.test.x, federation.split.test.y, BACKDOOR_TARGET)
    server_seconds = [r.outcome["server_seconds"] for r in records if r.outcome and "server_seconds" in r.outcome]
    return PlanResult(final_card.metrics.accuracy, accuracies, sum(r.state == "failed" for r in records), ratchet,
                      success, len(flagged & attackers), len(flagged - attackers),
                      statistics.fmean(server_seconds) if server_seconds else float("nan"),
                      time.perf_counter() - started)


def describe(label: str, result: PlanResult, honest: PlanResult | None) -> str:
    versus = "" if honest is None else f" ({(result.final_accuracy - honest.final_accuracy) * 100:+.2f} pt vs honest)"
    curve = " ".join("fail " if a is None else f"{a:.3f}" for a in result.accuracies)
    return (f"  {label:<34} final {result.final_accuracy:.4f}{versus}, failed {result.failed_rounds}, ratchet "
            f"{result.ratchet_versions}, backdoor {result.backdoor_success:.3f}, quarantined "
            f"{result.quarantined_insiders} insiders/{result.quarantined_honest} honest, server "
            f"{result.server_seconds_per_round:.3f} s/round, {result.wall_seconds:.0f} s\n    rounds: {curve}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--max-accuracy-drop", type=float, default=0.02)
    parser.add_argument("--deadline-s", type=float, default=20.0,
                        help="a round short of devices (insiders quarantined) aggregates at its deadline")
    parser.add_argument("--root-examples", type=int, default=200, help="the server's root set (validation split)")
    parser.add_argument("--attacks", default=",".join(ATTACKS), help=f"comma-separated, of {', '.join(ATTACKS)}")
    parser.add_argument("--shares", default="1,2,4", help="insiders among the devices, comma-separated")
    parser.add_argument("--defences", default="off,on", help="off, on or both")
    parser.add_argument("--seed", type=int, default=1, help="the simulation's: selection order, local shuffles")
    args = parser.parse_args()
    attacks = [name for name in args.attacks.split(",") if name]
    unknown = set(attacks) - set(ATTACKS)
    if unknown:
        parser.error(f"unknown attacks {sorted(unknown)}; choose from {', '.join(ATTACKS)}")
    shares = [int(share) for share in args.shares.split(",")]
    if any(not 1 <= share <= len(INSIDERS) for share in shares):
        parser.error(f"shares must lie in 1..{len(INSIDERS)}")
    settings = [setting == "on" for setting in args.defences.split(",")]

    started = time.perf_counter()
    print(f"load average before: {' '.join(f'{value:.2f}' for value in os.getloadavg())}")
    federation = prepare_federation("mnist", num_clients=args.clients, alpha=args.alpha, seed=0)
    sizes = sorted(len(shard) for shard in federation.shards)
    print(f"MNIST-5k over {args.clients} devices (Dirichlet {args.alpha}: {sizes[0]}..{sizes[-1]} examples, median "
          f"{statistics.median(sizes):.0f}); base {federation.card.id} test accuracy "
          f"{federation.card.metrics.accuracy:.4f}; root set {args.root_examples} validation examples")
    config = {"min_clients": args.clients // 2, "target_clients": args.clients, "over_selection": 0.0,
              "deadline_s": args.deadline_s, "num_rounds": args.rounds, "local_epochs": args.local_epochs,
              "batch_size": args.batch_size, "learning_rate": args.learning_rate,
              "max_accuracy_drop": args.max_accuracy_drop}
    print(f"plan: {config}")

    honest: dict[bool, PlanResult] = {}
    results: dict[tuple[bool, str, int], PlanResult] = {}
    for defended in settings:
        label = "defences on" if defended else "defences off"
        print(f"\n{label}", flush=True)
        honest[defended] = run_plan(federation, config, defended, args.root_examples, frozenset(), DeviceAttack(),
                                    args.seed)
        print(describe("honest", honest[defended], None), flush=True)
        for name in attacks:
            for share in shares:
                attackers = frozenset(INSIDERS[:share])
                result = run_plan(federation, config, defended, args.root_examples, attackers,
                                  make_attack(name, share, args.clients), args.seed)
                results[(defended, name, share)] = result
                print(describe(f"{name} {share}/{args.clients}", result, honest[defended]), flush=True)

    print("\nsummary: final accuracy minus the honest plan's (points), same defences")
    print(f"  {'attack':<20}" + "".join(f"{f'{share}/{args.clients} off':>12}{f'{share}/{args.clients} on':>12}"
                                         for share in shares))
    for name in attacks:
        cells = []
        for share in shares:
            for defended in (False, True):
                result = results.get((defended, name, share))
                cells.append(f"{(result.final_accuracy - honest[defended].final_accuracy) * 100:+12.2f}"
                             if result else f"{'-':>12}")
        print(f"  {name:<20}" + "".join(cells))

    if True in honest:
        print("\ngoals (defences on):")
        for name in attacks:
            for share in shares:
                result = results[(True, name, share)]
                gap = (honest[True].final_accuracy - result.final_accuracy) * 100
                allowed = 1.0 if share * 10 <= args.clients else 3.0
                met = gap <= allowed and (share * 10 > args.clients or result.ratchet_versions == 0)
                line = (f"  {name} {share}/{args.clients}: {gap:+.2f} points below honest (goal <= {allowed:g}"
                        + (", no ratchet" if share * 10 <= args.clients else "") + f"): {'met' if met else 'NOT met'}")
                if name in ("backdoor", "model_replacement") and share * 10 == args.clients:
                    line += (f"; backdoor success {result.backdoor_success:.3f} (goal <= 0.10: "
                             f"{'met' if result.backdoor_success <= 0.10 else 'NOT met'})")
                print(line)
        if False in honest:
            cost = (honest[False].final_accuracy - honest[True].final_accuracy) * 100
            print(f"  cost on the honest plan: off {honest[False].final_accuracy:.4f}, on "
                  f"{honest[True].final_accuracy:.4f}: {cost:+.2f} points (goal <= 0.5: "
                  f"{'met' if cost <= 0.5 else 'NOT met'}); server time per round off "
                  f"{honest[False].server_seconds_per_round:.3f} s, on {honest[True].server_seconds_per_round:.3f} s")
    print(f"\ntotal {time.perf_counter() - started:.0f} s; load average after: "
          f"{' '.join(f'{value:.2f}' for value in os.getloadavg())}")


if __name__ == "__main__":
    main()
