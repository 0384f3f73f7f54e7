"""`fedzoo zoo`: build a model zoo from one supernet training run, and inspect zoos."""

from __future__ import annotations

import os
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedzoo.card_views import card_fields
from fedzoo.compress.cli import compress
from fedzoo.nas.devices import device_option
from fedzoo.output import format_option, print_fields, print_json
from fedzoo.signing import CardSigningKey
from fedzoo.zoo import Zoo

SIGNING_KEY_OPTION = click.option(
    "--signing-key", type=click.Path(dir_okay=False, path_type=Path), envvar="FEDZOO_SIGNING_KEY",
    help="The operator's private key (PEM, from `fedzoo keys generate`) that signs every card "
         "(default $FEDZOO_SIGNING_KEY).")


class RichReporter:
    """Shows the build's stages as rich progress bars and its notes as lines above them."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task = None

    def start_stage(self, name: str, total: int | None = None) -> None:
        if self.task is not None:
            self.progress.update(self.task, visible=False)
        self.task = self.progress.add_task(name, total=total)

    def advance(self, completed: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=completed)

    def note(self, text: str) -> None:
        self.progress.console.print(text)


@click.group()
def zoo() -> None:
    """Build, compress and inspect model zoos."""


@zoo.command()
@click.option("--dataset", required=True, help="mnist, digits, mnist1d (generated locally), or a path to an .npz with x and y.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Folder to write the zoo to (created if missing).")
@click.option("--preset", type=click.Choice(["default", "tiny"]), default="default", show_default=True,
              help="Size of the build: default (~10 min on 2 cores) or tiny (seconds, for smoke tests).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the split, initialisation, sampling and search.")
@click.option("--epochs", type=click.IntRange(min=1), default=None, help="Supernet training epochs (default: the preset's).")
@click.option("--finetune-epochs", type=click.IntRange(min=0), default=None,
              help="Epochs of the zoo's chosen subnets' joint fine-tune after the search, 0 for none (default: the preset's).")
@click.option("--largest-only-epochs", type=click.IntRange(min=0), default=None,
              help="Of the supernet's epochs, the first this many train its largest subnet alone before the sandwich "
                   "rule distils from it (default: the preset's, 2 for default, 0 for tiny).")
@click.option("--evaluations", type=click.IntRange(min=1), default=None, help="Search budget: subnets evaluated (default: the preset's).")
@click.option("--population", "population_size", type=click.IntRange(min=2), default=None, help="Evolution population / batch per generation.")
@click.option("--strategy", type=click.Choice(["evolution", "random"]), default="evolution", show_default=True, help="Search strategy.")
@click.option("--latency-budget-ms", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Only keep subnets at most this slow on this machine (cloud-x86-1t).")
@click.option("--max-params", type=click.IntRange(min=1), default=None, help="Only keep subnets with at most this many parameters.")
@click.option("--budget-macs", "zoo_budgets_macs", type=click.IntRange(min=1), multiple=True,
              help="A device tier's budget in MACs per inference (repeatable): the zoo is then the most accurate "
                   "searched subnet within each budget, not the Pareto front.")
@click.option("--latency-source", type=click.Choice(["measured", "predicted", "macs"]), default=None,
              help="Latency the search ranks by: measured ONNX Runtime time, the kernel-level predictor, or a "
                   "deterministic MACs model (default: the preset's, predicted for default, measured for tiny). "
                   "Cards always carry measured latency.")
@click.option("--executor", type=click.Choice(["processes", "in-process", "ray"]), default="processes", show_default=True,
              help="Where candidate evaluations run: one process per worker on this machine, this process, or Ray (needs the 'ray' extra).")
@click.option("--workers", "num_workers", type=click.IntRange(min=1), default=None,
              help="Processes for parallel work: data-parallel supernet training (default: 1), the search's processes or Ray "
                   "CPUs, and the compress stage's fine-tuning and quantizing processes (default: all cores). Under torchrun, "
                   "torchrun's --nproc-per-node sets the training workers instead.")
@click.option("--threads", "torch_threads", type=click.IntRange(min=1), default=1, show_default=True, help="Torch threads for training (per worker).")
@device_option
@click.option("--mixed-precision", is_flag=True, help="Train the supernet's forward passes in bfloat16 (torch.autocast).")
@click.option("--sync-batchnorm", is_flag=True,
              help="With several training workers, normalise over the global batch (one all-reduce per BatchNorm layer "
                   "and pass) instead of each worker's slice.")
@click.option("--no-compress", is_flag=True, help="Skip the compression stage (pruning, INT8).")
@click.option("--no-training-graphs", is_flag=True, help="Skip attaching on-device training graphs.")
@SIGNING_KEY_OPTION
@click.option("--unsigned", is_flag=True, help="Write unsigned cards (a lab zoo no device that pins keys accepts).")
@click.option("--stop-after-epoch", type=click.IntRange(min=1), default=None, hidden=True)
@click.option("--stop-after-generation", type=click.IntRange(min=1), default=None, hidden=True)
def build(no_compress: bool, no_training_graphs: bool, signing_key: Path | None, unsigned: bool, **options) -> None:
    """Train a once-for-all supernet, search it under the constraints and write the Pareto-optimal
    subnets to OUT as ONNX models with model cards, signed with --signing-key (or explicitly --unsigned).
    Re-running the same command resumes."""
    from fedzoo.cloud.pipeline import BuildConfig, build_zoo, train_supernet_worker
    from fedzoo.nas.distributed import launched_as_worker

    key = _signing_key(signing_key, unsigned)  # before the build: a missing key must not cost a training run
    # under torchrun its workers train (the build report records their number); else --workers local ones
    training_workers = int(os.environ["WORLD_SIZE"]) if launched_as_worker() else options["num_workers"] or 1
    config = BuildConfig(compress=not no_compress, training_graphs=not no_training_graphs, training_workers=training_workers, **options)
    console = Console(stderr=True)
    if launched_as_worker():  # one of torchrun's workers: all train together, the first goes on to write the zoo
        epochs, rank = train_supernet_worker(config), os.environ["RANK"]
        if rank != "0" or epochs < config.training.epochs:
            then = "worker 0 writes the zoo" if epochs == config.training.epochs else "run the same command again to resume"
            console.print(f"worker {rank}: the supernet has trained {epochs} of {config.training.epochs} epochs; {then}")
            return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        result = build_zoo(config, RichReporter(progress))
    if key is not None:
        result.zoo.sign_cards(key)
        console.print(f"signed {len(result.zoo)} cards with key {key.key_id}")
    _print_cards(result.cards, title=f"zoo {config.out}: {len(result.cards)} models")
    stages = ", ".join(f"{stage} {seconds:.0f}" for stage, seconds in result.stage_seconds.items())
    console.print(f"stage times, wall s: {stages}; total {sum(result.stage_seconds.values()):.0f}")


def _signing_key(path: Path | None, unsigned: bool) -> CardSigningKey | None:
    """The key cards are signed with; refusing to guess: no key and no --unsigned is an error."""
    if path is not None and unsigned:
        raise click.UsageError("--signing-key and --unsigned contradict each other; give one")
    if path is None and not unsigned:
        raise click.UsageError("cards must be signed: pass --signing-key PATH (see `fedzoo keys generate`) "
                               "or --unsigned for a lab zoo no device pinning keys will accept")
    return None if path is None else CardSigningKey.load(path)


def _print_cards(cards, title: str) -> None:
    table = Table(title=title)
    table.add_column("id", no_wrap=True)
    for column in ("test acc", "latency ms (cloud-x86-1t)", "MMACs", "params", "size KB", "precision"):
        table.add_column(column)
    for card in cards:
        latency = card.latency_ms.get("cloud-x86-1t")
        table.add_row(
            card.id,
            f"{card.metrics.accuracy:.4f}",
            f"{latency.median_ms:.3f}" if latency else "-",
            f"{card.macs / 1e6:.2f}",
            str(card.params),
            f"{card.size_bytes / 1024:.1f}",
            card.precision,
        )
    Console().print(table)


@zoo.command(name="list")
@click.option("--zoo", "zoo_dir", required=True, type=click.Path(path_type=Path), help="The zoo folder.")
@format_option
def list_cards(zoo_dir: Path, output_format: str) -> None:
    """List the models of a zoo, fastest first."""
    cards = Zoo(zoo_dir).cards()
    cards.sort(key=lambda card: card.latency_ms["cloud-x86-1t"].median_ms if "cloud-x86-1t" in card.latency_ms else float("inf"))
    if output_format == "json":
        print_json({"models": [card.model_dump(mode="json") for card in cards], "total": len(cards)})
        return
    _print_cards(cards, title=f"zoo {zoo_dir}: {len(cards)} models")


@zoo.command()
@click.argument("card_id")
@click.option("--zoo", "zoo_dir", required=True, type=click.Path(path_type=Path), help="The zoo folder.")
@format_option
def show(card_id: str, zoo_dir: Path, output_format: str) -> None:
    """Show one model card (--format json: the card itself)."""
    card = Zoo(zoo_dir).card(card_id).model_dump(mode="json")
    if output_format == "json":
        print_json(card)
        return
    print_fields(f"model {card_id}", card_fields(card))


@zoo.command()
@click.option("--zoo", "zoo_dir", required=True, type=click.Path(path_type=Path), help="The zoo folder.")
@SIGNING_KEY_OPTION
def sign(zoo_dir: Path, signing_key: Path | None) -> None:
    """Sign (or re-sign) every card of a zoo: after `zoo compress` added cards, or to move a zoo to a new
    key before the old one is retired."""
    if signing_key is None:
        raise click.UsageError("pass --signing-key PATH (or set FEDZOO_SIGNING_KEY)")
    key = CardSigningKey.load(signing_key)
    signed = Zoo(zoo_dir).sign_cards(key)
    click.echo(f"signed {len(signed)} cards of {zoo_dir} with key {key.key_id}")


zoo.add_command(compress)
