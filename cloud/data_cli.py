"""`fedzoo data ...`: look at a data set, its split and a federated partition before building on it."""

from __future__ import annotations

import click
import numpy as np

from fedzoo.datasets import dirichlet_partition, load_dataset, split_dataset
from fedzoo.output import format_option, print_json, print_table


@click.group()
def data() -> None:
    """Inspect data sets, splits and federated partitions."""


@data.command()
@click.argument("dataset")
@click.option("--seed", default=0, show_default=True, help="Seed of the train/validation/test split.")
@format_option
def describe(dataset: str, seed: int, output_format: str) -> None:
    """Show DATASET (mnist, digits or a path to an .npz with x and y) and its seeded split."""
    loaded = load_dataset(dataset)
    split = split_dataset(loaded, seed=seed)
    parts = {name: np.bincount(getattr(split, name).y, minlength=loaded.num_classes).tolist()
             for name in ("train", "validation", "test")}
    if output_format == "json":
        print_json({"dataset": loaded.name, "images": len(loaded), "image_shape": list(loaded.image_shape),
                    "classes": loaded.num_classes, "seed": seed,
                    "parts": {name: {"examples": sum(counts), "per_class": counts} for name, counts in parts.items()}})
        return
    print_table(f"{loaded.name}: {len(loaded)} images of shape {loaded.image_shape}, {loaded.num_classes} classes",
                ("part", "examples", "per-class counts"),
                [(name, sum(counts), " ".join(map(str, counts))) for name, counts in parts.items()])


@data.command()
@click.argument("dataset")
@click.option("--clients", "num_clients", default=20, show_default=True, help="Number of federated clients.")
@click.option("--alpha", default=0.5, show_default=True, help="Dirichlet concentration (smaller = more skew).")
@click.option("--seed", default=0, show_default=True)
@format_option
def partition(dataset: str, num_clients: int, alpha: float, seed: int, output_format: str) -> None:
    """Show a Dirichlet(alpha) label-skew partition of DATASET's train split over clients."""
    loaded = load_dataset(dataset)
    train = split_dataset(loaded, seed=seed).train
    shards = dirichlet_partition(train.y, num_clients, alpha, seed=seed)
    per_client = [np.bincount(train.y[indices], minlength=loaded.num_classes).tolist() for indices in shards]
    if output_format == "json":
        print_json({"dataset": loaded.name, "alpha": alpha, "seed": seed,
                    "clients": [{"client": client, "examples": sum(counts), "per_class": counts}
                                for client, counts in enumerate(per_client)]})
        return
    print_table(f"Dirichlet(alpha={alpha}) over {num_clients} clients", ("client", "examples", "per-class counts"),
                [(client, sum(counts), " ".join(map(str, counts))) for client, counts in enumerate(per_client)])
