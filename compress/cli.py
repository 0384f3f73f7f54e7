"""`fedzoo zoo compress ZOO_DIR`: add pruned and INT8 variants to a zoo, publishing only what the gate accepts."""

from __future__ import annotations

import logging

import click
import torch
from rich.console import Console
from rich.table import Table

from fedzoo.cards import is_supernet
from fedzoo.compress.finetune import FineTuning
from fedzoo.compress.pipeline import REPORT_NAME, CompressionReport, compress_zoo
from fedzoo.compress.pruning import IMPORTANCE_CRITERIA, SCOPES
from fedzoo.compress.quantize import CALIBRATION_METHODS, DEFAULT_INT8_RECIPES, INT8_RECIPES
from fedzoo.datasets import load_dataset, split_dataset
from fedzoo.edge.device_profile import usable_cores
from fedzoo.errors import InvalidInputError
from fedzoo.nas.devices import device_option
from fedzoo.zoo import Zoo


def _dataset_of(zoo: Zoo) -> str:
    tasks = sorted({card.task for card in zoo.cards() if card.parent_id is None and not is_supernet(card)})
    if len(tasks) != 1:
        raise InvalidInputError(f"the zoo's root cards have tasks {tasks}; name the data set with --dataset", field="dataset")
    return tasks[0]


def print_report(report: CompressionReport, console: Console) -> None:
    table = Table(title=f"compression (accuracy tolerance {report.accuracy_tolerance_points:g} points)")
    for column in ("variant", "parent", "kind", "verdict", "accuracy", "latency ms", "size bytes", "why"):
        table.add_column(column)
    for outcome in report.accepted + report.rejected:
        measured = outcome.measurement or {}
        table.add_row(
            outcome.variant_id, outcome.parent_id, outcome.kind, "accepted" if outcome.accepted else "rejected",
            f"{measured['accuracy']:.2%}" if measured else "-",
            f"{measured['latency_median_ms']:.3f}" if measured else "-",
            str(measured.get("size_bytes", "-")),
            "; ".join(outcome.reasons or outcome.notes),
        )  # fmt: skip
    console.print(table)
    if report.skipped:
        console.print(f"already in the zoo, skipped: {', '.join(report.skipped)}")


@click.command()
@click.argument("zoo_dir", type=click.Path(file_okay=False))
@click.option("--dataset", default=None, help="mnist, digits or an .npz; default: the task named by the cards.")
@click.option("--tolerance", default=1.0, show_default=True, help="Largest accuracy drop (points) a variant may have.")
@click.option("--seed", default=0, show_default=True, help="Seed of the train/test split (use the zoo build's).")
@click.option("--ratio", "ratios", multiple=True, type=float, default=(0.5, 0.3), show_default=True,
              help="Channel pruning ratios to try, largest first (repeat the option).")  # fmt: skip
@click.option("--method", type=click.Choice(sorted(IMPORTANCE_CRITERIA)), default="l1", show_default=True)
@click.option("--scope", type=click.Choice(SCOPES), default="layer", show_default=True)
@click.option("--epochs", default=FineTuning().epochs, show_default=True, help="Fine-tuning epochs after pruning.")
@click.option("--calibration", type=click.Choice(sorted(CALIBRATION_METHODS)), default="minmax", show_default=True)
@click.option("--int8-recipe", "int8_recipes", multiple=True, type=click.Choice(list(INT8_RECIPES)),
              default=DEFAULT_INT8_RECIPES, show_default=True,
              help="INT8 forms to try (repeat the option); the fastest measured, then the smallest, is gated.")  # fmt: skip
@click.option("--threads", "torch_threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="Torch threads for the fine-tuning after pruning.")  # fmt: skip
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Processes fine-tuning and quantizing at once (default: one per core).")
@device_option
def compress(
    zoo_dir: str, dataset: str | None, tolerance: float, seed: int, ratios: tuple[float, ...], method: str, scope: str,
    epochs: int, calibration: str, int8_recipes: tuple[str, ...], torch_threads: int, workers: int | None, device: str,
) -> None:
    """Prune, quantize and gate every root fp32 model in ZOO_DIR; accepted variants become new cards."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    torch.set_num_threads(torch_threads)  # as `zoo build --threads`: one per core oversubscribes a busy machine
    zoo = Zoo(zoo_dir)
    split = split_dataset(load_dataset(dataset or _dataset_of(zoo)), seed=seed)
    report = compress_zoo(
        zoo_dir, split, accuracy_tolerance_points=tolerance, pruning_ratios=ratios, pruning_method=method,
        pruning_scope=scope, fine_tuning=FineTuning(epochs=epochs, seed=seed), calibration=calibration,
        int8_recipes=int8_recipes, workers=workers or usable_cores(), device=device,
    )  # fmt: skip
    console = Console()
    print_report(report, console)
    console.print(f"{len(report.accepted)} accepted, {len(report.rejected)} rejected; report in {zoo.root / REPORT_NAME}")
