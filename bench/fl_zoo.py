"""Zoo-wide federated learning against the field's methods, every arm in one run on the same shards and draws.

Scenario (device-cloud): the cloud built the zoo with the tiny preset (its supernet and search saw only the first
768 training examples, the small labelled set; `--cloud-epochs` and `--cloud-finetune-epochs` train them longer
than the preset's 2 + 2 epochs, which leave mnist1d's subnets at ~46% whatever their size, so capacity would not
matter); the devices hold the rest of the training split in Dirichlet(alpha)
shards, each split 80/20 into the device's training and held-out data. Devices fall into 4 latency tiers with the
given shares (`skewed`: 60/25/10/5% from the slowest tier up, most devices weak; `uniform`: 25% each); the tiers'
budgets are fixed fractions of the largest subnet's MACs (`BUDGET_FRACTIONS`: 1/4, 1/2, 3/4, 1, DepthFL's
quarter-depth tiers), the same for every arm and set before the zoo is looked at. tier_alone and fedzoo serve each
tier the zoo model within its budget that is most accurate on the validation split at the start (the zoo's lookup,
on the validation split, never the test split). Each round draws
`--per-round` devices (the same draws in every arm); each trains `--local-epochs` of SGD (batch 16, BatchNorm in
training mode) on its tier's model of the arm. Arms (bench/zoo_arms.py): tier_alone (per-model FL), heterofl,
fedrolex, depthwise, everyone_largest (budgets ignored: the upper bound) and fedzoo (zoo-wide). Every other arm's
tier models are within the tier's budget (counted MACs, printed beside the budgets): the bench refuses to run one
that is not.

Fairness: every arm's server learning rate (FedAvg's, per element) is picked from `--lr-grid`, and fedzoo's
coverage step exponent from `--exponent-grid`, by the population-weighted accuracy on the validation split (carved
from the data set apart from the test split; the tuning run uses `--tuning-seed`, not a reported seed); every arm's
served models get BatchNorm recalibrated on the cloud's 768 images; bytes are summed from the float32 arrays sent
down (the subnet's state) and up (its delta); device MACs are counted on each model (`count_macs`) times the
examples trained on. Every arm starts from the same cloud work: tier_alone, everyone_largest and fedzoo from the
zoo's supernet (the sandwich epochs, then the zoo's chosen subnets' joint fine-tune), the anchors from their own tier
models trained jointly from the supernet's initialisation on the same 768 examples, batch size, optimiser and
schedule for as many epochs as the zoo's supernet and fine-tune together (`zoo_arms.warm_up`). The zoo and the
warm-ups are cached under a key of their code and settings.

Reported, mean ± sd over `--seeds` (partition, tiers, draws and training order): population-weighted deployed
accuracy (each device's tier model on its own held-out data; also before the first round), each tier's test
accuracy, the largest model against its tier alone, monotonicity (the largest tier's model at least as accurate as
every smaller one), the gap to everyone-on-largest, and the time to republish the zoo (re-extract with BatchNorm
recalibrated, export, sign).

    .venv/bin/python bench/fl_zoo.py --dataset mnist1d --devices 500 --per-round 50 --alpha 0.3 --shares skewed \
        [--cloud-epochs 20 --cloud-finetune-epochs 10 --cloud-largest-only-epochs 10] [--rounds 30] [--local-epochs 1] [--seeds 0,1,2] [--tuning-seed 1000] [--lr-grid 1,2,4,8] \
        [--exponent-grid 0,0.5,1] [--arms tier_alone,heterofl,...] [--out /tmp/fedzoo-bench-zoo]
    .venv/bin/python bench/fl_zoo.py --dataset mnist --devices 100 --per-round 10 --alpha 0.5 --shares uniform

`--private` runs the fedzoo arm three ways on the same shards, draws and seeds (bench/zoo_private.py): in the clear,
under SecAgg+ with central DP, and with distributed DP (`--private-arms`, mode:levels[:survivor fraction], the
fraction raising each cohort's survivor floor: `secure_aggregation.survivor_fraction`; `--skip-clear` leaves the
clear arm to another run on the same seeds), both DP arms at the same
noise multiplier z (the smallest spending `--epsilon` at `--delta` over the rounds, q = 1), each arm's server
learning rate, exponent and (DP) clip norm (`--clip-grid`) tuned on the validation split. Reported per arm: the
accuracies as above, the fewest devices behind any released element (per round: min and mean over rounds), the
ring's bits and the bits its sums need, the masked upload against raw int8 (one byte a coordinate), devices that sat
out (their subnet drew fewer than 3) and the epsilon charged.

    .venv/bin/python bench/fl_zoo.py --private --dataset mnist1d --devices 500 --per-round 50 --rounds 15 \
        --seeds 0,1 --lr-grid 2,4 --exponent-grid 0.5 --clip-grid 0.5,1

`--private --noise-rounds N` trains nothing: for the first N rounds' cohorts of each seed it measures the noise each
DP arm's release puts on every supernet element (released minus clear mean delta, by the subnets covering the
element) beside what the arm's calibration predicts (bench/zoo_private.py, `released_noise`; docs/privacy.md,
"Where distributed DP's extra noise comes from").
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from zoo_private import PrivateRounds, clear_coverage, released_noise, run_private  # noqa: E402
from zoo_arms import (  # noqa: E402
    Arm,
    Device,
    MacCounter,
    best_within,
    deployed_accuracy,
    make_arms,
    over_budget,
    run_arm,
    served_models,
    tier_module,
    warm_up,
)

import fedzoo  # noqa: E402
from fedzoo.cards import is_supernet  # noqa: E402
from fedzoo.datasets import Dataset, dirichlet_partition, load_dataset, split_dataset  # noqa: E402
from fedzoo.dp.accountant import epsilon_after, noise_multiplier_for  # noqa: E402
from fedzoo.cloud.pipeline import PRESETS, BuildConfig, build_zoo  # noqa: E402
from fedzoo.compress.zoo_extraction import SupernetSpec, deployable_blob, read_weights_npz  # noqa: E402
from fedzoo.compress.zoo_extraction import supernet_weights  # noqa: E402
from fedzoo.nas.space import arch_key, tiny_space  # noqa: E402
from fedzoo.nas.supernet import Supernet  # noqa: E402
from fedzoo.nas.subnet import Subnet, count_macs, evaluate_accuracy, recalibrate_batchnorm  # noqa: E402
from fedzoo.signing import CardSigningKey, sign_card  # noqa: E402
from fedzoo.zoo import Zoo  # noqa: E402

TIERS = 4
SHARES = {"skewed": (0.60, 0.25, 0.10, 0.05), "uniform": (0.25, 0.25, 0.25, 0.25)}  # slowest tier first
BUDGET_FRACTIONS = (0.25, 0.5, 0.75, 1.0)  # each tier's MACs budget over the largest subnet's, slowest tier first
HELD_OUT_FRACTION = 0.2
# the sources a zoo build depends on: the cache key hashes them with the build settings
BUILD_SOURCES = ("cloud/pipeline.py", "fedzoo/datasets.py", "compress/zoo_extraction.py", "nas")


def build_settings(dataset: str, zoo_dir: Path, budgets_macs: tuple[int, ...], cloud_epochs: int | None = None,
                   cloud_finetune_epochs: int | None = None, cloud_largest_only_epochs: int | None = None) -> BuildConfig:
    """The tiny preset's build with the default preset's search budget (160 candidates, not 16: 16 left nothing
    between the space's smallest subnet and 3/8 of the largest) and a zoo for the fleet's budgets: the best
    searched subnet within each tier's budget, so the zoo's fine-tune trains what the tiers run, as each anchor's
    warm-up trains its tier models. `cloud_epochs` and `cloud_finetune_epochs` replace the preset's 2 + 2 epochs
    on the cloud's examples (None: the preset's); the first `cloud_largest_only_epochs` of the supernet's train its
    largest subnet alone (None: the preset's 0): what the zoo does with its epochs, not how many."""
    return BuildConfig(dataset=dataset, out=zoo_dir, preset="tiny", latency_source="macs", compress=False,
                       training_graphs=False, executor="in-process", evaluations=PRESETS["default"].evaluations,
                       zoo_budgets_macs=budgets_macs, epochs=cloud_epochs, finetune_epochs=cloud_finetune_epochs,
                       largest_only_epochs=cloud_largest_only_epochs)


def tier_budgets(dataset: Dataset) -> tuple[int, ...]:
    """Each tier's MACs budget, slowest first: `BUDGET_FRACTIONS` of the tiny space's largest subnet on `dataset`'s
    images, fixed before any zoo is built and the same for every arm."""
    channels, height, _ = dataset.image_shape
    largest = Subnet(tiny_space(height).max_arch(), dataset.num_classes, channels)
    return tuple(round(fraction * count_macs(largest, (1, channels, height, height))) for fraction in BUDGET_FRACTIONS)


def cache_key(sources: tuple[Path, ...], settings: str) -> str:
    """A hash of every .py file under (or at) `sources` and the settings: what a cached result depends on."""
    digest = hashlib.sha256()
    for source in sources:
        for path in sorted(source.rglob("*.py")) if source.is_dir() else [source]:
            digest.update(path.read_bytes())
    digest.update(settings.encode())
    return digest.hexdigest()[:12]


def cached_zoo(dataset: str, budgets: tuple[int, ...], out: Path, cloud_epochs: int | None,
               cloud_finetune_epochs: int | None, cloud_largest_only_epochs: int | None) -> Path:
    """The zoo of `dataset` for the tiers' `budgets`, built unless a build with the same code and settings is
    cached."""
    root = Path(fedzoo.__file__).resolve().parent.parent
    key = cache_key(tuple(root / source for source in BUILD_SOURCES),
                    repr(build_settings(dataset, Path("-"), budgets, cloud_epochs, cloud_finetune_epochs,
                                        cloud_largest_only_epochs)))
    zoo_dir = out / f"zoo-{dataset}-{key}"
    if not (zoo_dir / "zoo.json").exists():
        started = time.perf_counter()
        build_zoo(build_settings(dataset, zoo_dir, budgets, cloud_epochs, cloud_finetune_epochs,
                                 cloud_largest_only_epochs))
        print(f"zoo built in {time.perf_counter() - started:.0f} s: {zoo_dir}")
    return zoo_dir


def cached_warm_up(arm: Arm, spec: SupernetSpec, settings: BuildConfig, zoo_dir: Path, cloud_x: np.ndarray,
                   cloud_y: np.ndarray) -> dict:
    """`warm_up` of the arm's tier models with the zoo build's training `settings` and seed, from the supernet's
    initialisation in that build; cached under the zoo (its key covers the build) and a hash of the bench's code
    and the family."""
    # the zoo's cloud budget: the supernet's epochs and the chosen subnets' fine-tune, over the same examples
    training = replace(settings.training, epochs=settings.training.epochs + settings.training.zoo_finetune_epochs)
    seed = settings.seed
    key = cache_key((Path(__file__).resolve().parent / "zoo_arms.py", Path(__file__).resolve()),
                    repr((training, seed, len(cloud_y), [arch_key(arch) for arch in arm.tier_archs])))
    path = zoo_dir.parent / f"warmup-{zoo_dir.name}-{key}.npz"
    if path.exists():
        return read_weights_npz(path.read_bytes())
    started = time.perf_counter()
    torch.manual_seed(seed)  # the build's initialisation (cloud/pipeline.py seeds the same before its supernet)
    initial = supernet_weights(Supernet(spec.space, spec.num_classes, spec.in_channels))
    weights, examples = warm_up(spec, arm.tier_archs, initial, cloud_x, cloud_y, training, seed)
    np.savez(path, **weights)
    print(f"  warmed up {arm.name}'s tier models on {examples} examples ({training.epochs} epochs of "
          f"{len(cloud_y)}, as the zoo's supernet and fine-tune: {settings.training.epochs} + "
          f"{settings.training.zoo_finetune_epochs}) in {time.perf_counter() - started:.0f} s: {path}")
    return weights


def start_accuracy(spec: SupernetSpec, arch: dict, weights: dict, cloud_x: np.ndarray, x: np.ndarray,
                   y: np.ndarray) -> float:
    """The zoo model `arch` as served before any round (BatchNorm recalibrated on the cloud's images) on (x, y)."""
    model = tier_module(spec, arch, weights)
    recalibrate_batchnorm(model, cloud_x)
    return evaluate_accuracy(model, x, y)[0]


def normalise(x: np.ndarray, mean: list[float], std: list[float]) -> np.ndarray:
    return ((x - np.asarray(mean, np.float32).reshape(1, -1, 1, 1))
            / np.asarray(std, np.float32).reshape(1, -1, 1, 1)).astype(np.float32)


def make_devices(pool_x: np.ndarray, pool_y: np.ndarray, count: int, alpha: float, shares: tuple[float, ...],
                 seed: int) -> list[Device]:
    rng = np.random.default_rng(seed)
    sizes = [round(share * count) for share in shares[:-1]]
    tiers = rng.permutation(np.repeat(np.arange(TIERS), [*sizes, count - sum(sizes)]))
    devices = []
    for tier, shard in zip(tiers, dirichlet_partition(pool_y, count, alpha, seed=seed)):
        shard = rng.permutation(shard)
        cut = int(round(len(shard) * (1 - HELD_OUT_FRACTION)))
        if cut >= 2 and len(shard) - cut >= 1:  # a device too small to train and hold out sits this benchmark out
            devices.append(Device(int(tier), pool_x[shard[:cut]], pool_y[shard[:cut]], pool_x[shard[cut:]],
                                  pool_y[shard[cut:]]))
    return devices


def republish_seconds(spec: SupernetSpec, zoo: Zoo, weights: dict, cloud_x: np.ndarray) -> float:
    """Re-extract every zoo model with BatchNorm recalibrated, export it to ONNX and sign its card."""
    key = CardSigningKey.generate()
    started = time.perf_counter()
    for card in zoo.cards():
        if not is_supernet(card) and card.parent_id is None:
            deployable_blob(spec, card.arch, weights, cloud_x)
            sign_card(card, key)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="mnist1d")
    parser.add_argument("--devices", type=int, default=500)
    parser.add_argument("--per-round", type=int, default=50)
    parser.add_argument("--alpha", type=float, default=0.3)
    parser.add_argument("--shares", choices=sorted(SHARES), default="skewed")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--tuning-seed", type=int, default=1000)
    parser.add_argument("--lr-grid", default="1,2,4,8", help="server learning rates every arm is tuned over")
    parser.add_argument("--exponent-grid", default="0,0.5,1", help="fedzoo's coverage step exponents tuned over")
    parser.add_argument("--arms", default="tier_alone,heterofl,fedrolex,depthwise,everyone_largest,fedzoo")
    parser.add_argument("--out", type=Path, default=Path("/tmp/fedzoo-bench-zoo"))
    parser.add_argument("--local-batchnorm", choices=("training", "inference"), default="training",
                        help="devices' BatchNorm in every arm: the batch's statistics, or the sent subnet's "
                             "(recalibrated on the cloud's images) with only scale and bias trained")
    parser.add_argument("--cloud-epochs", type=int, default=None,
                        help="supernet epochs on the cloud's examples (the tiny preset's 2 when not given)")
    parser.add_argument("--cloud-finetune-epochs", type=int, default=None,
                        help="the zoo's joint fine-tune epochs on the cloud's examples (the tiny preset's 2)")
    parser.add_argument("--cloud-largest-only-epochs", type=int, default=None,
                        help="of the supernet's epochs, the first this many train its largest subnet alone (the tiny "
                             "preset's 0); the anchors' warm-ups (the supernet's and fine-tune's epochs) train their "
                             "largest tier model alone for as many first")
    parser.add_argument("--private", action="store_true", help="fedzoo in the clear, with central and distributed DP")
    parser.add_argument("--private-arms", default="central:32767,distributed:127",
                        help="DP arms, mode:levels[:survivor fraction]")
    parser.add_argument("--skip-clear", action="store_true",
                        help="--private without the clear arm (another run on the same seeds measures it)")
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--clip-grid", default="0.5,1", help="clip norms the DP arms are tuned over")
    parser.add_argument("--noise-rounds", type=int, default=0,
                        help="--private: only measure the noise each DP arm releases over this many rounds' cohorts "
                             "(no training; at the first clip norm), per seed")
    args = parser.parse_args()
    if args.private:
        args.arms = "fedzoo"
    torch.set_num_threads(1)
    dataset = load_dataset(args.dataset)
    budgets = tier_budgets(dataset)
    zoo_dir = cached_zoo(args.dataset, budgets, args.out, args.cloud_epochs, args.cloud_finetune_epochs,
                         args.cloud_largest_only_epochs)
    zoo = Zoo(zoo_dir)
    supernet_card = next(card for card in zoo.cards() if is_supernet(card))
    spec = SupernetSpec.from_card(supernet_card)
    initial = read_weights_npz(zoo.blob_path(supernet_card.artifacts["supernet_weights"]).read_bytes())
    split = split_dataset(dataset, seed=0)
    mean, std = supernet_card.input.normalisation.mean, supernet_card.input.normalisation.std
    held = PRESETS["tiny"].max_train_examples
    pool_x, pool_y = normalise(split.train.x[held:], mean, std), split.train.y[held:]
    cloud_x, cloud_y = normalise(split.train.x[:held], mean, std), split.train.y[:held]
    validation_x, validation_y = normalise(split.validation.x, mean, std), split.validation.y
    test_x, test_y = normalise(split.test.x, mean, std), split.test.y

    macs = MacCounter(spec)
    members = [card.arch for card in zoo.cards() if not is_supernet(card) and card.parent_id is None]
    validation = {arch_key(arch): start_accuracy(spec, arch, initial, cloud_x, validation_x, validation_y)
                  for arch in members}
    zoo_archs = best_within(members, budgets, macs, lambda arch: validation[arch_key(arch)])
    print(f"zoo: {len(members)} models, kMACs (validation % at the start) "
          + ", ".join(f"{macs(arch) / 1e3:.0f}k ({100 * validation[arch_key(arch)]:.1f})"
                      for arch in sorted(members, key=macs)))
    arms = {name: arm for name, arm in make_arms(spec, zoo_archs, list(budgets), macs).items()
            if name in args.arms.split(",")}
    shares = SHARES[args.shares]
    settings = build_settings(args.dataset, zoo_dir, budgets, args.cloud_epochs, args.cloud_finetune_epochs,
                              args.cloud_largest_only_epochs)
    starts = {name: cached_warm_up(arm, spec, settings, zoo_dir, cloud_x, cloud_y) if arm.warmed_up
              else initial for name, arm in arms.items()}

    def run(arm, seed: int, learning_rate: float, exponent: float):
        devices = make_devices(pool_x, pool_y, args.devices, args.alpha, shares, seed)
        torch.manual_seed(seed)
        return run_arm(arm, spec, starts[arm.name], devices, cloud_x, args.rounds, args.per_round,
                       args.local_epochs, seed, learning_rate, exponent, macs, args.local_batchnorm), devices

    print(f"{args.dataset}: {args.devices} devices, Dirichlet({args.alpha}), {args.shares} tiers {shares}, "
          f"{args.per_round} per round, {args.rounds} rounds x {args.local_epochs} local epoch(s), BatchNorm in "
          f"{args.local_batchnorm} mode on devices")
    for name, arm in arms.items():
        print(f"  {name:>16}: tier MACs " + ", ".join(f"{macs(arch) / 1e3:.0f}k" for arch in arm.tier_archs)
              + f" (budgets {', '.join(f'{budget / 1e3:.0f}k' for budget in budgets)})"
              + (", budgets ignored" if arm.ignores_budgets else "")
              + f"; channels (stem, stages, head) {channels(arm.tier_archs)}")
        over = over_budget(arm, list(budgets), macs)
        if over and not arm.ignores_budgets:
            sys.exit(f"refusing to report {name}: tiers {over} are over their budgets")

    if args.private:
        compare_private(args, arms["fedzoo"], spec, starts["fedzoo"], cloud_x, (validation_x, validation_y),
                        (test_x, test_y), shares, macs,
                        lambda seed: make_devices(pool_x, pool_y, args.devices, args.alpha, shares, seed))
        return

    # tuning: on the validation split, with the tuning seed's shards and draws
    chosen = {}
    for name, arm in arms.items():
        exponents = [float(value) for value in args.exponent_grid.split(",")] if arm.tuned_exponent else [0.0]
        scores = {}
        for learning_rate in (float(value) for value in args.lr_grid.split(",")):
            for exponent in exponents:
                result, _ = run(arm, args.tuning_seed, learning_rate, exponent)
                scores[(learning_rate, exponent)] = sum(
                    share * evaluate_accuracy(result.models[tier], validation_x, validation_y)[0]
                    for tier, share in enumerate(shares))
        chosen[name] = max(scores, key=scores.get)
        print(f"  tuned {name}: server lr {chosen[name][0]}, exponent {chosen[name][1]} "
              f"(validation: {', '.join(f'{key}: {100 * value:.2f}' for key, value in scores.items())})")

    # reported seeds
    results: dict[str, list[dict]] = {name: [] for name in arms}
    republish = []
    for seed in (int(value) for value in args.seeds.split(",")):
        for name, arm in arms.items():
            started = time.perf_counter()
            result, devices = run(arm, seed, *chosen[name])
            seconds = time.perf_counter() - started
            initial_models = served_models(arm, spec, {key: starts[name] for key in (None, *range(TIERS))}, cloud_x)
            results[name].append({
                "start": deployed_accuracy(initial_models, devices),
                "deployed": deployed_accuracy(result.models, devices),
                "tiers": [evaluate_accuracy(result.models[tier], test_x, test_y)[0] for tier in range(TIERS)],
                "bytes": result.bytes_per_device_round, "macs": result.forward_macs_per_device_round,
                "refused": result.refused_updates, "seconds": seconds})
            if name == "fedzoo":
                republish.append(republish_seconds(spec, zoo, result.supernets[None], cloud_x))
    report(results, republish, {name: [macs(arch) for arch in arm.tier_archs] for name, arm in arms.items()},
           list(budgets), args)


def compare_private(args: argparse.Namespace, arm: Arm, spec: SupernetSpec, start: dict, cloud_x: np.ndarray,
                    validation: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                    shares: tuple[float, ...], macs: MacCounter, devices_for) -> None:
    """The fedzoo arm in the clear and under SecAgg+ with each DP mode (`--private`), tuned and reported alike."""
    z = noise_multiplier_for(args.epsilon, args.delta, args.rounds, 1.0)
    dp_arms = (item.split(":") for item in args.private_arms.split(","))  # mode:levels[:survivor fraction]
    variants = {**({} if args.skip_clear else {"clear": None}),
                **{"-".join(fields): (fields[0], int(fields[1]), float(fields[2]) if fields[2:] else None)
                   for fields in dp_arms}}
    print(f"private: z = {z:.4f} for epsilon {args.epsilon} at delta {args.delta} over {args.rounds} rounds (q = 1), "
          f"charged {epsilon_after(args.rounds, z, 1.0, args.delta, 'rdp'):.3f}")
    if args.noise_rounds:
        print_released_noise(args, arm, spec, start, devices_for, z,
                             {name: variant for name, variant in variants.items() if variant is not None})
        return

    def run(name: str, seed: int, learning_rate: float, exponent: float, clip_norm: float | None):
        devices = devices_for(seed)
        torch.manual_seed(seed)
        if variants[name] is None:
            clear = run_arm(arm, spec, start, devices, cloud_x, args.rounds, args.per_round, args.local_epochs, seed,
                            learning_rate, exponent, macs, args.local_batchnorm)
            released = PrivateRounds(clear.models, clear_coverage(arm, spec, start, devices, args.rounds,
                                                                  args.per_round, seed), [32], [32], [4.0])
        else:
            mode, levels, survivor_fraction = variants[name]
            released = run_private(mode, arm, spec, start, devices, cloud_x, args.rounds, args.per_round,
                                   args.local_epochs, seed, learning_rate, exponent, z, clip_norm, levels,
                                   survivor_fraction, args.local_batchnorm)
        return released, devices

    chosen = {}
    for name, variant in variants.items():
        scores = {}
        for learning_rate in (float(value) for value in args.lr_grid.split(",")):
            for exponent in (float(value) for value in args.exponent_grid.split(",")):
                for clip_norm in ([None] if variant is None else [float(value) for value in args.clip_grid.split(",")]):
                    released, _ = run(name, args.tuning_seed, learning_rate, exponent, clip_norm)
                    scores[(learning_rate, exponent, clip_norm)] = sum(
                        share * evaluate_accuracy(released.models[tier], *validation)[0]
                        for tier, share in enumerate(shares))
        chosen[name] = max(scores, key=scores.get)
        print(f"  tuned {name}: server lr, exponent, clip norm {chosen[name]} (validation: "
              + ", ".join(f"{key}: {100 * value:.2f}" for key, value in scores.items()) + ")", flush=True)
    rows: dict[str, list[dict]] = {name: [] for name in variants}
    for seed in (int(value) for value in args.seeds.split(",")):
        for name in variants:
            started = time.perf_counter()
            released, devices = run(name, seed, *chosen[name])
            rows[name].append({
                "deployed": deployed_accuracy(released.models, devices),
                "tiers": [evaluate_accuracy(released.models[tier], *test)[0] for tier in range(TIERS)],
                "min_coverage": min(released.min_device_coverage),
                "mean_min_coverage": statistics.mean(released.min_device_coverage),
                "ring_bits": max(released.ring_bits), "bits_needed": max(released.bits_needed),
                "upload_vs_int8": statistics.mean(released.upload_vs_int8),
                "sat_out": released.sat_out / args.rounds, "seconds": time.perf_counter() - started})
    print(f"\naccuracy, % (mean ± sd over seeds {args.seeds}); coverage: the fewest devices behind any released "
          "element of a round (min over rounds / mean over rounds)")
    print(f"{'arm':>18} {'deployed':>15} " + " ".join(f"{'tier ' + str(tier):>15}" for tier in range(TIERS))
          + f" {'coverage':>12} {'ring bits':>9} {'needed':>6} {'up/int8':>7} {'sat out/rnd':>11} {'s/run':>6}")
    for name, runs in rows.items():
        print(f"{name:>18} {mean_sd([run['deployed'] for run in runs]):>15} "
              + " ".join(f"{mean_sd([run['tiers'][tier] for run in runs]):>15}" for tier in range(TIERS))
              + f" {min(run['min_coverage'] for run in runs):>5} / "
              f"{statistics.mean(run['mean_min_coverage'] for run in runs):>4.1f}"
              f" {max(run['ring_bits'] for run in runs):>9} {max(run['bits_needed'] for run in runs):>6}"
              f" {statistics.mean(run['upload_vs_int8'] for run in runs):>7.2f}"
              f" {statistics.mean(run['sat_out'] for run in runs):>11.1f}"
              f" {statistics.mean(run['seconds'] for run in runs):>6.0f}")


def print_released_noise(args: argparse.Namespace, arm: Arm, spec: SupernetSpec, start: dict, devices_for, z: float,
                         variants: dict[str, tuple[str, int, float | None]]) -> None:
    """`--noise-rounds`: the standard deviation of released - clear mean delta per element, in clip norms, by
    coverage pattern (which subnets cover the element, slowest tier first), per DP arm, and each arm's against the
    first arm's."""
    clip_norm = float(args.clip_grid.split(",")[0])
    for seed in (int(value) for value in args.seeds.split(",")):
        measured = released_noise(arm, spec, start, devices_for(seed), args.noise_rounds, args.per_round, seed, z,
                                  clip_norm, variants)
        first = next(iter(measured.values()))
        print(f"\nseed {seed}, {args.noise_rounds} rounds' cohorts, clip {clip_norm}: noise on the mean delta per "
              "element (sd, clip norms; x the first arm's), by the subnets covering it")
        print(f"{'pattern':>8} " + " ".join(f"{name + ' (predicted)':>40}" for name in measured))
        for label in first:
            print(f"{label:>8} " + " ".join(f"{values[label][0]:>10.3e} ({values[label][1]:.3e}) "
                                             f"x{values[label][0] / first[label][0]:.3f} "
                                             f"({values[label][1] / first[label][1]:.3f})"
                                             for values in measured.values()))


def channels(archs: tuple[dict, ...]) -> str:
    """Each arch's stem / stage outputs / head channels, as the bench prints them."""
    return ", ".join(f"{arch['stem_channels']}/{'-'.join(str(stage['out_channels']) for stage in arch['stages'])}"
                     f"/{arch['head_channels']}" for arch in archs)


def mean_sd(values: list[float], scale: float = 100.0) -> str:
    values = [value * scale for value in values]
    return f"{statistics.mean(values):6.2f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:4.2f}"


def report(results: dict[str, list[dict]], republish: list[float], tier_macs: dict[str, list[int]],
           budgets: list[int], args: argparse.Namespace) -> None:
    print(f"\naccuracy, % (mean ± sd over seeds {args.seeds}); deployed = each device's tier model on its own "
          "held-out data (start: before the first round, the mean); tiers on the test split, slowest first")
    print(f"{'arm':>16} {'start':>6} {'deployed':>15} "
          + " ".join(f"{'tier ' + str(tier):>15}" for tier in range(TIERS))
          + f" {'monotone':>9} {'kB/dev/round':>12} {'MMAC/dev/round':>14} {'refused':>7} {'s/run':>6}  tier kMACs (budgets "
          + "/".join(f"{budget / 1e3:.0f}" for budget in budgets) + ")")
    for name, runs in results.items():
        monotone = sum(all(run["tiers"][-1] >= value for value in run["tiers"][:-1]) for run in runs)
        print(f"{name:>16} {statistics.mean(run['start'] for run in runs) * 100:>6.2f} "
              f"{mean_sd([run['deployed'] for run in runs]):>15} "
              + " ".join(f"{mean_sd([run['tiers'][tier] for run in runs]):>15}" for tier in range(TIERS))
              + f" {f'{monotone}/{len(runs)}':>9} {statistics.mean(run['bytes'] for run in runs) / 1e3:>12.1f} "
              f"{statistics.mean(run['macs'] for run in runs) / 1e6:>14.2f} "
              f"{sum(run['refused'] for run in runs):>7} {statistics.mean(run['seconds'] for run in runs):>6.0f}  "
              + "/".join(f"{value / 1e3:.0f}" for value in tier_macs[name]))
    if "fedzoo" not in results:
        return
    fedzoo = results["fedzoo"]

    def gap(other: str, key=lambda run: run["deployed"]) -> float:
        return statistics.mean(key(a) - key(b) for a, b in zip(fedzoo, results[other])) * 100

    anchors = [name for name in ("heterofl", "fedrolex", "depthwise") if name in results]
    lines = []
    if anchors:
        best = max(anchors, key=lambda name: statistics.mean(run["deployed"] for run in results[name]))
        lines.append(f"deployed fedzoo >= best anchor ({best}) + 1.0: {gap(best):+.2f}")
    if "tier_alone" in results:
        lines.append(f"largest fedzoo >= tier alone + 3.0: {gap('tier_alone', lambda run: run['tiers'][-1]):+.2f}")
        worst = min(gap("tier_alone", lambda run, tier=tier: run["tiers"][tier]) for tier in range(TIERS))
        lines.append(f"no tier below its tier-alone model by more than 0.5: worst {worst:+.2f}")
    monotone = sum(all(run["tiers"][-1] >= value for value in run["tiers"][:-1]) for run in fedzoo)
    lines.append(f"fedzoo monotone: {monotone}/{len(fedzoo)} seeds")
    if "everyone_largest" in results:
        lines.append(f"within 1.0 of everyone-on-largest (deployed): {gap('everyone_largest'):+.2f}")
    if republish:
        lines.append(f"republish the zoo (re-extract, recalibrate, export, sign) <= 60 s: "
                     f"{statistics.mean(republish):.1f} s")
    print("\ngoals (fedzoo against the others, points):\n  " + "\n  ".join(lines))


if __name__ == "__main__":
    main()
