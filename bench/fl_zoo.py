"""Zoo-wide federated learning against today's per-model plans, side by side in one run.

Scenario (device-cloud): the cloud built the zoo (the tiny preset: its supernet and search saw only the first
768 training images, the small labelled set), the devices hold the rest of the training split in Dirichlet(0.5)
shards, each shard split 80/20 into the device's training and held-out data. The fleet has 4 tiers by latency
budget; each tier is served one zoo model (the 4 models of the zoo by MACs, smallest for the slowest tier:
the model each tier's lookup picks when its budget sits at that model's latency).

Arms, with equal devices, rounds and local epochs (each device trains its tier's model in torch, BatchNorm in
training mode, SGD; the same local trainer in every arm):
- A  per-model: one plan per zoo model (per tier; tiers served one arch share it), the server strategy
     `--strategy` (default FedAvg) stepping its devices' mean delta (running statistics averaged as the server
     does);
- B  zoo-wide: every device trains its tier's subnet of the supernet; deltas mapped onto the supernet
     (`fedzoo.nas.subnet_mapping`), averaged per element and stepped by the same strategy after the zoo plan's
     coverage scaling (`fedzoo.aggregation.per_element.step_supernet`, `--coverage-step-exponent`, default the
     plan's), then every zoo model re-extracted with BatchNorm recalibrated on the cloud's images (as the server
     does); also reported with the devices' averaged statistics instead (the BatchNorm measurement);
- R1 the smallest model trained by all devices (FedAvg); R2 the supernet trained centrally on all devices'
     data pooled (same epochs, each batch on a random tier's subnet), the upper bound.
Reported, mean ± sd over seeds (partition and training order; one zoo build): every zoo model's accuracy on the
test split; deployed accuracy (each device's model on its own held-out data, weighted by held-out examples, and
the worst 10% of devices); float32 bytes per device and round (model down + delta up); B's coverage; server
seconds per round. Goals (docs/zoo-federated.md): deployed B >= A + 1 point, largest model B >= A + 3 points,
no model B < A - 0.5 point, bytes B <= 1.1x A.

    .venv/bin/python bench/fl_zoo.py [--dataset digits] [--devices 16] [--rounds 4] [--seeds 0,1,2]
        [--local-epochs 1] [--out /tmp/fedzoo-bench-zoo] [--ablations] [--elasticity zoo|width|depth|kernel]
        [--strategy '{"name": "fedavg", "server_learning_rate": 1}'] [--coverage-step-exponent 1]

`--ablations` adds B with the lowest tier's devices left out of training, and with the top tier's; `--elasticity`
replaces the zoo's models by tier archs that differ in width only, depth only or kernel only (the rest largest).

The default (digits, 16 devices, 4 rounds, 3 seeds) takes a few minutes on 2 cores; `--dataset mnist` is MNIST-5k.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedzoo.aggregation.per_element import CoverageSum, coverage_report, is_statistic, step_supernet
from fedzoo.aggregation.strategies import Strategy, make_strategy
from fedzoo.cards import ModelCard, is_supernet
from fedzoo.cloud.pipeline import PRESETS, BuildConfig, build_zoo
from fedzoo.compress.zoo_extraction import SupernetSpec, read_weights_npz, subnet_module, supernet_weights
from fedzoo.datasets import dirichlet_partition, load_dataset, split_dataset
from fedzoo.nas.space import SearchSpace, arch_key
from fedzoo.nas.subnet import evaluate_accuracy, recalibrate_batchnorm
from fedzoo.nas.subnet_mapping import extract_weights, map_back
from fedzoo.server.fl.schemas import ZooSettings
from fedzoo.zoo import Zoo

TIERS = 4
# B with some tiers' devices left out of training (every tier's model is still re-extracted and measured)
ABLATIONS = {"low_tier_off": {1, 2, 3}, "top_tier_off": {0, 1, 2}}
BATCH_SIZE, LEARNING_RATE = 16, 0.05


@dataclass
class Device:
    tier: int
    x: np.ndarray
    y: np.ndarray
    held_x: np.ndarray
    held_y: np.ndarray


def normalise(x: np.ndarray, card: ModelCard) -> np.ndarray:
    mean = np.asarray(card.input.normalisation.mean, np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(card.input.normalisation.std, np.float32).reshape(1, -1, 1, 1)
    return ((x - mean) / std).astype(np.float32)


def state_of(module: nn.Module) -> dict[str, np.ndarray]:
    return {name: value.detach().numpy().copy() for name, value in module.state_dict().items()
            if value.is_floating_point()}


def load_state(module: nn.Module, state: dict[str, np.ndarray]) -> nn.Module:
    with torch.no_grad():
        for name, value in module.state_dict().items():
            if name in state:
                value.copy_(torch.from_numpy(state[name]))
    return module


def train_locally(module: nn.Module, x: np.ndarray, y: np.ndarray, epochs: int, seed: int) -> dict[str, np.ndarray]:
    """SGD on the device's data, BatchNorm in training mode; returns trained - initial of every float tensor."""
    initial = state_of(module)
    optimizer = torch.optim.SGD(module.parameters(), lr=LEARNING_RATE)
    rng = np.random.default_rng(seed)
    module.train()
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for start in range(0, len(order) - 1, BATCH_SIZE):  # a batch of 1 has no BatchNorm statistics
            batch = order[start:start + BATCH_SIZE]
            if len(batch) < 2:
                continue
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(module(torch.from_numpy(x[batch])), torch.from_numpy(y[batch]))
            loss.backward()
            optimizer.step()
    module.eval()
    return {name: value - initial[name] for name, value in state_of(module).items()}


def fedavg(states: list[dict[str, np.ndarray]], weights: list[float]) -> dict[str, np.ndarray]:
    total = float(sum(weights))
    return {name: sum(w / total * state[name] for state, w in zip(states, weights)).astype(np.float32)
            for name in states[0]}


def server_step(strategy: Strategy, state: dict[str, np.ndarray], mean: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A per-model plan's step: the strategy on the parameters, running statistics moved by their mean delta."""
    parameters = [name for name in state if not is_statistic(name)]
    stepped = strategy.apply_mean_delta({name: state[name] for name in parameters},
                                        {name: mean[name] for name in parameters})
    return {name: stepped[name] if name in stepped else value + mean[name] for name, value in state.items()}


def deployed(models: dict[int, nn.Module], devices: list[Device]) -> tuple[float, float]:
    """(population-weighted accuracy of each device's model on its held-out data, mean of the worst 10%)."""
    accuracies, sizes = [], []
    for device in devices:
        accuracy, _ = evaluate_accuracy(models[device.tier], device.held_x, device.held_y)
        accuracies.append(accuracy)
        sizes.append(len(device.held_y))
    worst = sorted(accuracies)[: max(1, len(accuracies) // 10)]
    return float(np.average(accuracies, weights=sizes)), float(np.mean(worst))


def test_split_deployed(test_accuracy: dict[int, float], devices: list[Device]) -> float:
    """Each device's model on the test split, weighted as `deployed`: deployed minus this is how much better the
    models fit their own tier's data than the population's."""
    return float(np.average([test_accuracy[device.tier] for device in devices],
                            weights=[len(device.held_y) for device in devices]))


def zoo_wide(spec: SupernetSpec, tier_archs: list[dict], initial_weights: dict[str, np.ndarray],
             devices: list[Device], rounds: int, local_epochs: int, seed: int, cloud_x: np.ndarray,
             trained_tiers: set[int], strategy: dict, coverage_step_exponent: float,
             ) -> tuple[dict[int, nn.Module], dict[str, np.ndarray], float, dict[str, float]]:
    """Arm B: the devices of `trained_tiers` train their tier's subnet; the server maps each delta onto the supernet,
    steps per element (the zoo plan's `step_supernet`) and re-extracts every tier's model with BatchNorm
    recalibrated on the cloud's images. Returns (the tier models, the supernet weights, server seconds, the last
    round's coverage)."""
    weights, server_s, coverage, models = dict(initial_weights), 0.0, {}, {}
    step = make_strategy(strategy)
    training = [device for device in devices if device.tier in trained_tiers]
    for round_number in range(rounds):
        deltas = [train_locally(subnet_module(spec, tier_archs[device.tier], weights), device.x, device.y,
                                local_epochs, seed * 1000 + round_number * 100 + index)
                  for index, device in enumerate(training)]
        started = time.perf_counter()
        total = CoverageSum({name: value.shape for name, value in weights.items()})
        for device, delta in zip(training, deltas):
            total.add(map_back(spec.space, tier_archs[device.tier], weights, delta), len(device.y),
                      arch_key(tier_archs[device.tier]))  # one cohort per subnet, as the zoo plan keys them
        weights, released = step_supernet(step, weights, total, min_coverage=1,
                                          coverage_step_exponent=coverage_step_exponent)
        for tier in range(TIERS):
            models[tier] = subnet_module(spec, tier_archs[tier], weights)
            recalibrate_batchnorm(models[tier], cloud_x)
        server_s += time.perf_counter() - started
        report = coverage_report(total.counts, released)
        parameters = [name for name in weights if "kernel_transforms" not in name and not is_statistic(name)]
        elements = sum(report[name].elements for name in parameters)
        coverage = {"fraction_released": sum(report[name].released for name in parameters) / elements,
                    "fraction_single_device": sum(report[name].single for name in parameters) / elements}
    return models, weights, server_s, coverage


def elastic_archs(space: SearchSpace, elasticity: str) -> list[dict]:
    """Tier archs that differ in one dimension only (the rest at the largest choice), smallest tier first; with
    two choices in that dimension (the tiny space) tiers 0-1 and 2-3 are served the same arch."""
    def pick(choices: tuple[int, ...], tier: int) -> int:
        ordered = sorted(choices)
        return ordered[round(tier * (len(ordered) - 1) / (TIERS - 1))]

    stages, depth = len(space.stages), space.max_depth
    archs = []
    for tier in range(TIERS):
        depths = [pick(space.depth_choices, tier) if elasticity == "depth" else depth] * stages
        kernel = pick(space.kernel_choices, tier) if elasticity == "kernel" else space.max_kernel
        ratio = pick(space.expand_ratio_choices, tier) if elasticity == "width" else space.max_expand_ratio
        archs.append(space.make_arch(depths, [[kernel] * depth] * stages, [[ratio] * depth] * stages))
    return archs


def run_seed(zoo_dir: Path, dataset: str, num_devices: int, rounds: int, local_epochs: int, seed: int,
             ablations: bool, elasticity: str, strategy: dict, coverage_step_exponent: float) -> dict:
    zoo = Zoo(zoo_dir)
    supernet_card = next(card for card in zoo.cards() if is_supernet(card))
    spec = SupernetSpec.from_card(supernet_card)
    members = sorted((card for card in zoo.cards() if not is_supernet(card)), key=lambda card: card.macs)
    tier_cards = [members[round(index * (len(members) - 1) / (TIERS - 1))] for index in range(TIERS)]
    tier_archs = ([card.arch for card in tier_cards] if elasticity == "zoo"
                  else elastic_archs(spec.space, elasticity))
    initial_weights = read_weights_npz(zoo.blob_path(supernet_card.artifacts["supernet_weights"]).read_bytes())
    split = split_dataset(load_dataset(dataset), seed=0)
    held = PRESETS["tiny"].max_train_examples
    card = tier_cards[0]
    pool_x, pool_y = normalise(split.train.x[held:], card), split.train.y[held:]
    cloud_x = normalise(split.train.x[:held], card)
    test_x, test_y = normalise(split.test.x, card), split.test.y
    rng = np.random.default_rng(seed)
    devices = []
    for index, shard in enumerate(dirichlet_partition(pool_y, num_devices, 0.5, seed=seed)):
        shard = rng.permutation(shard)
        cut = max(1, int(len(shard) * 0.8))
        devices.append(Device(index % TIERS, pool_x[shard[:cut]], pool_y[shard[:cut]], pool_x[shard[cut:]],
                              pool_y[shard[cut:]]))
    devices = [device for device in devices if len(device.y) >= 2 and len(device.held_y) >= 1]
    torch.manual_seed(seed)

    def zoo_state(arch) -> dict[str, np.ndarray]:  # the cloud's model: extracted, BN recalibrated on its images
        module = subnet_module(spec, arch, initial_weights)
        recalibrate_batchnorm(module, cloud_x)
        return state_of(module)

    result: dict = {"bytes": {}, "server_s": {}}
    params = {tier: sum(value.size for name, value in extract_weights(spec.space, tier_archs[tier],
                                                                      initial_weights).items()
                        if not is_statistic(name)) for tier in range(TIERS)}
    per_device_bytes = float(np.mean([2 * 4 * params[device.tier] for device in devices]))

    # A: one plan per zoo model (tiers served the same arch share its plan)
    plan_of = {tier: next(first for first in range(TIERS) if arch_key(tier_archs[first]) == arch_key(tier_archs[tier]))
               for tier in range(TIERS)}
    plans = sorted(set(plan_of.values()))
    states = {tier: zoo_state(tier_archs[tier]) for tier in plans}
    result["before"] = {tier: evaluate_accuracy(load_state(subnet_module(spec, tier_archs[tier], initial_weights),
                                                           states[plan_of[tier]]), test_x, test_y)[0]
                        for tier in range(TIERS)}
    server_s, strategies = 0.0, {tier: make_strategy(strategy) for tier in plans}
    for round_number in range(rounds):
        for tier in plans:
            members_of_tier = [device for device in devices if plan_of[device.tier] == tier]
            deltas = [train_locally(load_state(subnet_module(spec, tier_archs[tier], initial_weights), states[tier]),
                                    device.x, device.y, local_epochs, seed * 1000 + round_number * 100 + index)
                      for index, device in enumerate(members_of_tier)]
            started = time.perf_counter()
            mean = fedavg(deltas, [len(device.y) for device in members_of_tier])
            states[tier] = server_step(strategies[tier], states[tier], mean)
            server_s += time.perf_counter() - started
    models_a = {tier: load_state(subnet_module(spec, tier_archs[tier], initial_weights), states[plan_of[tier]])
                for tier in range(TIERS)}
    result["A"] = {tier: evaluate_accuracy(models_a[tier], test_x, test_y)[0] for tier in range(TIERS)}
    result["A_deployed"] = deployed(models_a, devices)
    result["A_tier_fit"] = result["A_deployed"][0] - test_split_deployed(result["A"], devices)
    result["bytes"]["A"] = per_device_bytes
    result["server_s"]["A"] = server_s / rounds

    # B: zoo-wide, per element over the supernet
    models_b, weights, server_s, coverage = zoo_wide(spec, tier_archs, initial_weights, devices, rounds, local_epochs,
                                                     seed, cloud_x, set(range(TIERS)), strategy, coverage_step_exponent)
    result["B"] = {tier: evaluate_accuracy(models_b[tier], test_x, test_y)[0] for tier in range(TIERS)}
    result["B_device_statistics"] = {tier: evaluate_accuracy(subnet_module(spec, tier_archs[tier], weights),
                                                             test_x, test_y)[0] for tier in range(TIERS)}
    result["B_deployed"] = deployed(models_b, devices)
    result["B_tier_fit"] = result["B_deployed"][0] - test_split_deployed(result["B"], devices)
    result["bytes"]["B"] = per_device_bytes
    result["server_s"]["B"] = server_s / rounds
    result["coverage"] = coverage
    for name, tiers in ABLATIONS.items() if ablations else ():
        models, _, _, _ = zoo_wide(spec, tier_archs, initial_weights, devices, rounds, local_epochs, seed, cloud_x,
                                   tiers, strategy, coverage_step_exponent)
        result[f"B_{name}"] = {tier: evaluate_accuracy(models[tier], test_x, test_y)[0] for tier in range(TIERS)}

    # R1: the smallest model trained by all devices
    state, smallest_strategy = zoo_state(tier_archs[0]), make_strategy(strategy)
    for round_number in range(rounds):
        deltas = [train_locally(load_state(subnet_module(spec, tier_archs[0], initial_weights), state),
                                device.x, device.y, local_epochs, seed * 1000 + round_number * 100 + index)
                  for index, device in enumerate(devices)]
        state = server_step(smallest_strategy, state, fedavg(deltas, [len(device.y) for device in devices]))
    smallest = load_state(subnet_module(spec, tier_archs[0], initial_weights), state)
    result["R1_smallest_by_all"] = evaluate_accuracy(smallest, test_x, test_y)[0]
    result["R1_deployed"] = deployed({tier: smallest for tier in range(TIERS)}, devices)

    # R2: the supernet trained centrally on the pooled data (each batch on a random tier's subnet)
    from fedzoo.nas.supernet import Supernet

    supernet = Supernet(spec.space, spec.num_classes, spec.in_channels)
    load_state(supernet, initial_weights)
    optimizer = torch.optim.SGD(supernet.parameters(), lr=LEARNING_RATE)
    pooled_x = np.concatenate([device.x for device in devices])
    pooled_y = np.concatenate([device.y for device in devices])
    supernet.train()
    for _ in range(rounds * local_epochs):
        order = rng.permutation(len(pooled_y))
        for start in range(0, len(order) - 1, BATCH_SIZE):
            batch = order[start:start + BATCH_SIZE]
            if len(batch) < 2:
                continue
            supernet.set_active(tier_archs[int(rng.integers(TIERS))])
            optimizer.zero_grad()
            nn.functional.cross_entropy(supernet(torch.from_numpy(pooled_x[batch])),
                                        torch.from_numpy(pooled_y[batch])).backward()
            optimizer.step()
    central = supernet_weights(supernet.eval())
    models_r2 = {}
    for tier in range(TIERS):
        models_r2[tier] = subnet_module(spec, tier_archs[tier], central)
        recalibrate_batchnorm(models_r2[tier], cloud_x)
    result["R2_central"] = {tier: evaluate_accuracy(models_r2[tier], test_x, test_y)[0] for tier in range(TIERS)}
    result["R2_deployed"] = deployed(models_r2, devices)
    result["tiers"] = ([card.id for card in tier_cards] if elasticity == "zoo"
                       else [f"{elasticity}-only tier {tier}" for tier in range(TIERS)])
    result["devices"] = len(devices)
    return result


def mean_sd(values: list[float], scale: float = 100.0) -> str:
    values = [value * scale for value in values]
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):6.2f} ± {sd:4.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--devices", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", type=Path, default=Path("/tmp/fedzoo-bench-zoo"))
    parser.add_argument("--ablations", action="store_true", help="also run B with the lowest / the top tier off")
    parser.add_argument("--elasticity", choices=("zoo", "width", "depth", "kernel"), default="zoo",
                        help="the tiers' subnets: the zoo's models, or archs differing only in width, depth or kernel")
    parser.add_argument("--strategy", type=json.loads, default={"name": "fedavg"},
                        help="the server strategy of every arm as a plan names it (JSON), e.g. "
                             '\'{"name": "fedavg", "server_learning_rate": 2}\'')
    parser.add_argument("--coverage-step-exponent", type=float,
                        default=ZooSettings.model_fields["coverage_step_exponent"].default,
                        help="B's zoo.coverage_step_exponent (0: the plain per-element mean; default: the zoo plan's)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    zoo_dir = args.out / f"zoo-{args.dataset}"
    if not (zoo_dir / "zoo.json").exists():
        started = time.perf_counter()
        build_zoo(BuildConfig(dataset=args.dataset, out=zoo_dir, preset="tiny", latency_source="macs", compress=False,
                              training_graphs=False, executor="in-process", zoo_min_size=TIERS, zoo_max_size=8))
        print(f"zoo built in {time.perf_counter() - started:.0f} s (tiny preset, {PRESETS['tiny'].max_train_examples} "
              "cloud examples)")
    results = [run_seed(zoo_dir, args.dataset, args.devices, args.rounds, args.local_epochs, int(seed), args.ablations,
                        args.elasticity, args.strategy, args.coverage_step_exponent)
               for seed in args.seeds.split(",")]
    first = results[0]
    print(f"\n{args.dataset}: {first['devices']} devices in {TIERS} tiers, {args.rounds} rounds x {args.local_epochs} "
          f"local epoch(s), seeds {args.seeds}; tier models (smallest first): {', '.join(first['tiers'])}; strategy "
          f"{json.dumps(args.strategy)}; B's coverage step exponent {args.coverage_step_exponent}")
    print("\naccuracy on the test split, % (mean ± sd)")
    print(f"{'tier model':>12} {'cloud':>15} {'A per-model':>15} {'B zoo-wide':>15} {'B dev. BN':>15} {'R2 central':>15} {'B - A':>8}")
    for tier in range(TIERS):
        gap = statistics.mean([r["B"][tier] - r["A"][tier] for r in results]) * 100
        print(f"{tier:>12} {mean_sd([r['before'][tier] for r in results]):>15} {mean_sd([r['A'][tier] for r in results]):>15} "
              f"{mean_sd([r['B'][tier] for r in results]):>15} {mean_sd([r['B_device_statistics'][tier] for r in results]):>15} "
              f"{mean_sd([r['R2_central'][tier] for r in results]):>15} {gap:>+8.2f}")
    print(f"R1 smallest model trained by all devices: {mean_sd([r['R1_smallest_by_all'] for r in results])}")
    for name in ABLATIONS if args.ablations else ():
        print(f"ablation B {name}: " + ", ".join(f"tier {tier} {mean_sd([r[f'B_{name}'][tier] for r in results])}"
                                                 for tier in range(TIERS)))
    print("\ndeployed accuracy, % (population-weighted | worst 10% of devices)")
    for arm in ("A", "B", "R1", "R2"):
        print(f"  {arm:>3}: {mean_sd([r[f'{arm}_deployed'][0] for r in results])} | "
              f"{mean_sd([r[f'{arm}_deployed'][1] for r in results])}")
    print(f"  deployed minus the same models on the test split (fit to the tier's own data): "
          f"A {mean_sd([r['A_tier_fit'] for r in results])}, B {mean_sd([r['B_tier_fit'] for r in results])}")
    deployed_gap = statistics.mean([r["B_deployed"][0] - r["A_deployed"][0] for r in results]) * 100
    largest_gap = statistics.mean([r["B"][TIERS - 1] - r["A"][TIERS - 1] for r in results]) * 100
    worst_gap = min(statistics.mean([r["B"][tier] - r["A"][tier] for r in results]) * 100 for tier in range(TIERS))
    bytes_ratio = statistics.mean([r["bytes"]["B"] / r["bytes"]["A"] for r in results])
    print(f"\nbytes per device and round (float32 model down + delta up): A {first['bytes']['A'] / 1e3:.1f} kB, "
          f"B {first['bytes']['B'] / 1e3:.1f} kB (x{bytes_ratio:.2f})")
    print(f"B coverage: {mean_sd([r['coverage']['fraction_released'] for r in results])}% of supernet parameters "
          f"moved per round, {mean_sd([r['coverage']['fraction_single_device'] for r in results])}% by one device")
    print(f"server seconds per round: A {statistics.mean([r['server_s']['A'] for r in results]):.3f}, "
          f"B {statistics.mean([r['server_s']['B'] for r in results]):.3f} (B: map back, aggregate, re-extract and "
          "recalibrate every tier model)")
    print("\ngoals: deployed B >= A + 1.0: " + ("met" if deployed_gap >= 1.0 else "NOT met") + f" ({deployed_gap:+.2f}); "
          "largest B >= A + 3.0: " + ("met" if largest_gap >= 3.0 else "NOT met") + f" ({largest_gap:+.2f}); "
          "no model B < A - 0.5: " + ("met" if worst_gap >= -0.5 else "NOT met") + f" (worst {worst_gap:+.2f}); "
          "bytes B <= 1.1 A: " + ("met" if bytes_ratio <= 1.1 else "NOT met") + f" (x{bytes_ratio:.2f})")


if __name__ == "__main__":
    main()
