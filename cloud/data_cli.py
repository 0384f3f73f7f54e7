"""`fedzoo data ...`: look at a data set, its split and a federated partition before building on it."""

from __future__ import annotations

import click
import numpy as np
from rich.console import Console
from rich.table import Table

from fedzoo.cloud.data import dirichlet_partition, load_dataset, split_dataset


@click.group()
def data() -> None:
    """Inspect data sets, splits and federated partitions."""


@data.command()
@click.argument("dataset")
@click.option("--seed", default=0, show_default=True, help="Seed of the train/validation/test split.")
def describe(dataset: str, seed: int) -> None:
    """Show DATASET (mnist, digits or a path to an .npz with x and y) and its seeded split."""
    loaded = load_dataset(dataset)
    split = split_dataset(loaded, seed=seed)
    table = Table(title=f"{loaded.name}: {len(loaded)} images of shape {loaded.image_shape}, {loaded.num_classes} classes")
    for column in ("part", "examples", "per-class counts"):
        table.add_column(column)
    for name in ("train", "validation", "test"):
        part = getattr(split, name)
        counts = np.bincount(part.y, minlength=loaded.num_classes)
        table.add_row(name, str(len(part)), " ".join(str(c) for c in counts))
    Console().print(table)


@data.command()
@click.argument("dataset")
@click.option("--clients", "num_clients", default=20, show_default=True, help="Number of federated clients.")
@click.option("--alpha", default=0.5, show_default=True, help="Dirichlet concentration (smaller = more skew).")
@click.option("--seed", default=0, show_default=True)
def partition(dataset: str, num_clients: int, alpha: float, seed: int) -> None:
    """Show a Dirichlet(alpha) label-skew partition of DATASET's train split over clients."""
    loaded = load_dataset(dataset)
    train = split_dataset(loaded, seed=seed).train
    shards = dirichlet_partition(train.y, num_clients, alpha, seed=seed)
    table = Table(title=f"Dirichlet(alpha={alpha}) over {num_clients} clients")
    for column in ("client", "examples", "per-class counts"):
        table.add_column(column)
    for client, indices in enumerate(shards):
        counts = np.bincount(train.y[indices], minlength=loaded.num_classes)
        table.add_row(str(client), str(len(indices)), " ".join(str(c) for c in counts))
    Console().print(table)
