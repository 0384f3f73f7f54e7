"""Benchmark of the zoo build, all figures measured in this one run:

1. Once-for-All's claim on our data: supernet-extracted subnets vs the same archs trained from scratch
   with the same epochs (goal: within 1.0 accuracy point), and the zoo's cost (supernet training +
   search) vs training the zoo's subnets from scratch (goal: <= 0.5x).
2. The zoo's Pareto front vs random search at the same evaluation budget on the same supernet, both
   ranking by the same latency estimator: hypervolume of test accuracy vs measured latency (goal: ours higher).
3. The best zoo model's test accuracy on MNIST-5k (goal: >= 97%).

Usage: python bench/nas_ofa.py [--epochs N] [--scratch-models 3]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from fedzoo.cloud.executors import InProcessExecutor
from fedzoo.cloud.pipeline import BuildConfig, BuildReporter, build_zoo, search_architectures
from fedzoo.edge.benchmark import benchmark_model
from fedzoo.nas.evaluation import EvaluationContext, prepare_subnet
from fedzoo.nas.export import export_onnx
from fedzoo.nas.latency import KernelPredictedLatency, LatencyEstimator, make_latency_estimator
from fedzoo.nas.pareto import hypervolume, non_dominated_fronts, pareto_front
from fedzoo.nas.search import select_zoo
from fedzoo.nas.space import arch_key
from fedzoo.nas.subnet import build_subnet, evaluate_accuracy
from fedzoo.nas.training import train_from_scratch

DEVICE_CLASS = "cloud-x86-1t"


class PrintNotes(BuildReporter):
    def note(self, text: str) -> None:
        print(f"  [build] {text}", flush=True)


def measured_point(model: torch.nn.Module, test_x: np.ndarray, test_y: np.ndarray, folder: Path) -> tuple[float, float]:
    """(test accuracy, measured ORT latency ms at 1 thread) of a torch model."""
    accuracy, _ = evaluate_accuracy(model, test_x, test_y)
    path = folder / "model.onnx"
    export_onnx(model, (1, *test_x.shape[1:]), path)
    return accuracy, benchmark_model(path, threads=1).median_ms


def print_search_cost_parts(result, calibration_x: np.ndarray, estimator: LatencyEstimator) -> None:
    """Where one candidate evaluation's time goes, timed (CPU) on the zoo's own archs with the search's estimator."""
    validation = result.normalised["validation"]
    parts = {"extract + BN recalibration": 0.0, "validation accuracy": 0.0, f"latency ({type(estimator).__name__})": 0.0}
    for card in result.cards:
        started = time.process_time()
        subnet = prepare_subnet(result.supernet, card.arch, calibration_x)
        parts["extract + BN recalibration"] += time.process_time() - started
        started = time.process_time()
        evaluate_accuracy(subnet, validation.x, validation.y)
        parts["validation accuracy"] += time.process_time() - started
        started = time.process_time()
        estimator.latency_ms(subnet.to(memory_format=torch.contiguous_format), (1, *validation.x.shape[1:]))
        parts[f"latency ({type(estimator).__name__})"] += time.process_time() - started
    total = sum(parts.values())
    print(f"  one candidate evaluation, CPU mean over the {len(result.cards)} zoo archs: {1000 * total / len(result.cards):.0f} ms = "
          + ", ".join(f"{name} {100 * value / total:.0f}%" for name, value in parts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=None, help="supernet and from-scratch epochs (default: the preset's)")
    parser.add_argument("--scratch-models", type=int, default=3, help="zoo subnets fully retrained from scratch")
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="nas-bench-"))
    config = BuildConfig(dataset="mnist", out=work / "zoo", seed=arguments.seed, epochs=arguments.epochs, compress=False, training_graphs=False)
    print(f"zoo build: MNIST-5k, preset default, epochs {config.training.epochs} ({config.training.largest_only_epochs} largest-subnet "
          f"only, then the sandwich with {1 + config.training.sandwich_random_subnets} students), {config.search_evaluations} "
          f"evaluations ranked by {config.search_latency_source} latency, torch threads 1")

    estimator = make_latency_estimator(config.search_latency_source)
    started = time.perf_counter()
    result = build_zoo(config, PrintNotes(), estimator)
    build_seconds = time.perf_counter() - started
    seconds, cpu_seconds = result.stage_seconds, result.stage_cpu_seconds
    cards = sorted(result.cards, key=lambda card: card.latency_ms[DEVICE_CLASS].median_ms)
    test = result.normalised["test"]
    train = result.normalised["train"]
    print(f"build: {build_seconds:.1f} s total; supernet training {seconds['train']:.1f} s, search {seconds['search']:.1f} s, "
          f"cards {seconds['cards']:.1f} s (wall); CPU: training {cpu_seconds['train']:.1f} s, search {cpu_seconds['search']:.1f} s; "
          f"{len(cards)} zoo models")
    for card in cards:
        latency = card.latency_ms[DEVICE_CLASS]
        print(f"  {card.id}: test acc {card.metrics.accuracy:.4f}, {latency.median_ms:.3f} ms, {card.macs / 1e6:.2f} MMACs, {card.params} params")
    fronts = non_dominated_fronts([candidate.point for candidate in result.search.evaluated])
    on_front = {arch_key(result.search.evaluated[i].arch) for i in fronts[0]}
    print(f"  search: {len(result.search.evaluated)} evaluated; Pareto front (validation loss vs latency) {len(fronts[0])} of them, "
          f"{sum(arch_key(card.arch) in on_front for card in cards)} of the {len(cards)} zoo models on it")
    calibration_x = train.x[: config.resolved_preset().calibration_examples]
    if isinstance(estimator, KernelPredictedLatency):
        print(f"  search latency: kernel predictor summed from the per-block table, filled by exporting "
              f"{estimator.exports} of the {len(result.search.evaluated)} candidates")
    print_search_cost_parts(result, calibration_x, estimator)

    # 2. random search at the same budget, same supernet, same selection, same test-time measurement
    print(f"\n[2] random search, same supernet, same budget ({config.search_evaluations} evaluations)")
    context = EvaluationContext(result.supernet, calibration_x, result.normalised["validation"].x, result.normalised["validation"].y,
                                make_latency_estimator(config.search_latency_source))
    started = time.perf_counter()
    random_state = search_architectures(config, "random", context, InProcessExecutor(), BuildReporter(), checkpoint_name="bench-random")
    random_seconds = time.perf_counter() - started
    random_zoo = select_zoo(random_state.evaluated, config.constraints, config.zoo_min_size, config.zoo_max_size)
    random_points = []
    with tempfile.TemporaryDirectory() as folder:
        for candidate in random_zoo:
            subnet = prepare_subnet(result.supernet, candidate.arch, train.x[:2000]).to(memory_format=torch.contiguous_format)
            random_points.append(measured_point(subnet, test.x, test.y, Path(folder)))
    ours_points = [(card.metrics.accuracy, card.latency_ms[DEVICE_CLASS].median_ms) for card in cards]
    reference = (0.9, 1.1 * max(point[1] for point in ours_points + random_points))
    ours_hv, random_hv = hypervolume(ours_points, reference), hypervolume(random_points, reference)
    evolution_validation = [(c.accuracy, c.latency_ms) for c in result.search.evaluated]
    random_validation = [(c.accuracy, c.latency_ms) for c in random_state.evaluated]
    search_reference = (0.9, 1.1 * max(p[1] for p in evolution_validation + random_validation))
    evolution_search_hv = hypervolume(evolution_validation, search_reference)
    random_search_hv = hypervolume(random_validation, search_reference)
    print(f"  random search took {random_seconds:.1f} s; its zoo: {len(random_zoo)} models")
    print(f"  hypervolume (test acc vs measured ms, reference acc {reference[0]}, {reference[1]:.3f} ms):")
    print(f"    evolution zoo {ours_hv:.5f}  random zoo {random_hv:.5f}  ratio {ours_hv / random_hv:.3f}  goal > 1: "
          f"{'met' if ours_hv > random_hv else 'NOT met'}")
    print(f"  hypervolume of all evaluated candidates (validation acc vs search latency): evolution {evolution_search_hv:.5f} "
          f"random {random_search_hv:.5f} ratio {evolution_search_hv / random_search_hv:.3f}")
    print(f"  fronts: evolution {len(pareto_front(ours_points))} non-dominated of {len(ours_points)}, "
          f"random {len(pareto_front(random_points))} of {len(random_points)}")

    # 1. OFA's claim: extracted vs from scratch, and cost
    print(f"\n[1] extracted vs trained from scratch ({config.training.epochs} epochs, same schedule and data order)")
    picks = sorted(set(np.linspace(0, len(cards) - 1, arguments.scratch_models).round().astype(int).tolist()))
    scratch_cpu_seconds: dict[str, float] = {}
    scratch_wall_seconds: dict[str, float] = {}
    gaps = []

    def timed_scratch(card, training):
        torch.manual_seed(arguments.seed)
        model = build_subnet(card.arch, len(card.labels), card.input.shape[1])
        wall, cpu = time.perf_counter(), time.process_time()
        train_from_scratch(model, train.x, train.y, training, arguments.seed)
        return model, time.perf_counter() - wall, time.process_time() - cpu

    for index in picks:
        card = cards[index]
        model, scratch_wall_seconds[card.id], scratch_cpu_seconds[card.id] = timed_scratch(card, config.training)
        accuracy, _ = evaluate_accuracy(model, test.x, test.y)
        gap = 100 * (card.metrics.accuracy - accuracy)
        gaps.append(gap)
        print(f"  {card.id}: extracted {card.metrics.accuracy:.4f}  scratch {accuracy:.4f}  extracted - scratch {gap:+.2f} points "
              f"(scratch training {scratch_wall_seconds[card.id]:.1f} s wall, {scratch_cpu_seconds[card.id]:.1f} s CPU)")
    within = all(gap >= -1.0 for gap in gaps)
    print(f"  goal: extracted within 1.0 point of scratch (or better) for {len(picks)} models: {'met' if within else 'NOT met'}")
    one_epoch = replace(config.training, epochs=1)
    for card in cards:
        if card.id not in scratch_cpu_seconds:
            _, wall, cpu = timed_scratch(card, one_epoch)
            scratch_wall_seconds[card.id], scratch_cpu_seconds[card.id] = wall * config.training.epochs, cpu * config.training.epochs
    estimated = f"{len(picks)} measured in full, {len(cards) - len(picks)} from one measured epoch x {config.training.epochs}"
    for label, zoo_cost, scratch_total in (
        ("wall", seconds["train"] + seconds["search"], sum(scratch_wall_seconds.values())),
        ("CPU", cpu_seconds["train"] + cpu_seconds["search"], sum(scratch_cpu_seconds.values())),
    ):
        ratio = zoo_cost / scratch_total
        print(f"  cost ({label}): zoo (supernet training + search) {zoo_cost:.1f} s vs the {len(cards)} zoo models from scratch "
              f"{scratch_total:.1f} s ({estimated}); ratio {ratio:.3f}x  goal <= 0.5x: {'met' if ratio <= 0.5 else 'NOT met'}")
    print(f"  (train + search + cards, CPU: {sum(cpu_seconds[s] for s in ('train', 'search', 'cards')):.1f} s, ratio "
          f"{sum(cpu_seconds[s] for s in ('train', 'search', 'cards')) / sum(scratch_cpu_seconds.values()):.3f}x, though the "
          f"from-scratch models would need their test scoring, export and timing too)")

    # 3. accuracy
    best = max(cards, key=lambda card: card.metrics.accuracy)
    print(f"\n[3] best zoo model {best.id}: test accuracy {best.metrics.accuracy:.4f} on {best.metrics.num_examples} MNIST-5k test images; "
          f"goal >= 0.97: {'met' if best.metrics.accuracy >= 0.97 else 'NOT met'}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
