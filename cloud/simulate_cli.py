"""`fedzoo fl simulate`: a simulated federation from the command line (as Flower users run `flwr run`): a zoo
model fine-tuned by N virtual devices over rounds, on one of three engines over the same aggregation core
(`fedzoo.aggregation`):

- `--engine server` (the default): against the real server. It is fedzoo's own app on a fresh SQLite file
  (`LoopbackServer`): every device registers, checks in, downloads and uploads through the SDK's HTTP requests, as
  a phone would. `--transport wsgi` (the default) hands each request to the app through WSGI, without TCP: in this
  process (check-ins) and, in each device process, an instance of the app on the same data directory (a server
  worker, as gunicorn runs several on one database); `--transport tcp` serves the app over loopback TCP with
  werkzeug's threaded server in this process. The devices' work runs on the executor: `processes` (one per core,
  each keeping its devices' HTTP clients across rounds), `ray` (tasks reading the shards from Ray's object store),
  or `in-process`. The engine for testing the system.
- `--engine inprocess`: the same plan, selection, seeds, local training and aggregation without HTTP, database or
  blob store (`fedzoo.cloud.inprocess`); devices train one after another in this process unless `--executor`
  says otherwise. The engine for research sweeps over strategies and fleet sizes.
- `--engine ray`: the in-process engine with the devices' training as Ray tasks (a local Ray instance, or the
  cluster `RAY_ADDRESS` names).

Prints a progress bar on stderr and a JSON summary on stdout.
"""

from __future__ import annotations

import json
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import click

SERVER_DESCRIPTIONS = {
    "tcp": "fedzoo server in this process (werkzeug threaded, loopback TCP, SQLite)",
    "wsgi": "fedzoo server through WSGI without TCP, in this process and in each device process (server workers "
            "on one SQLite database)",
}


def _cloud_examples(card: Any, train_examples: int) -> int:
    """The examples the zoo trained on that the devices must not hold: a capped build trained on the first
    `details.build.train_examples` of the training split (an uncapped one on all of them: none can be held out)."""
    trained = int(((card.details or {}).get("build") or {}).get("train_examples", train_examples))
    return trained if trained < train_examples else 0


def peak_rss_mb(pid: int | str = "self") -> float:
    """A process's peak resident memory (this one's by default): VmHWM, the high-water mark of its own memory
    since it started its program. Not `getrusage`'s ru_maxrss, which Linux carries over from the parent's image
    through fork and exec (a bench that forks this command from a 500 MB process read 500 MB for any child)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # not Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if pid == "self" else 0.0
    kilobytes = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(kilobytes) / 1024


@click.command()
@click.option("--zoo", "zoo_dir", required=True, type=click.Path(file_okay=False, path_type=Path), help="The zoo folder.")
@click.option("--model", "model_id", required=True, help="The zoo model to fine-tune (it must carry a training graph).")
@click.option("--clients", type=click.IntRange(min=1), default=100, show_default=True, help="Virtual devices.")
@click.option("--per-round", type=click.IntRange(min=1), default=10, show_default=True, help="Devices each round aggregates.")
@click.option("--min-clients", type=click.IntRange(min=1), default=None,
              help="Fewer updates passing screening fail a round (default: --per-round).")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--engine", type=click.Choice(["server", "inprocess", "ray"]), default="server", show_default=True,
              help="server: through the real server over HTTP; inprocess: the same rounds without HTTP or database; "
                   "ray: inprocess with the devices' training on Ray.")
@click.option("--executor", type=click.Choice(["processes", "ray", "in-process"]), default=None,
              help="Where the devices' work runs (default: processes for the server engine, in-process for inprocess).")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Processes or Ray CPUs (default: all cores).")
@click.option("--transport", type=click.Choice(["wsgi", "tcp"]), default="wsgi", show_default=True,
              help="How requests reach the server: through WSGI in each process (no TCP), or loopback TCP.")
@click.option("--http-threads", type=click.IntRange(min=1), default=4, show_default=True,
              help="Threads that register devices and check them in.")
@click.option("--dataset", default=None, help="The zoo's data set (default: the model's task); its split must be the build's.")
@click.option("--alpha", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Dirichlet label skew of the shards (default: near-equal random shards).")
@click.option("--local-epochs", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--learning-rate", type=click.FloatRange(min=0, min_open=True), default=0.05, show_default=True)
@click.option("--max-accuracy-drop", type=click.FloatRange(0, 1), default=1.0, show_default=True,
              help="The server's accuracy gate per round (1.0: open).")
@click.option("--deadline-s", type=click.FloatRange(min=1), default=600, show_default=True, help="Each round's deadline.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the split (use the build's) and the shards.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def simulate(zoo_dir: Path, model_id: str, clients: int, per_round: int, min_clients: int | None, rounds: int,
             engine: str, executor: str | None,
             workers: int | None,
             transport: str, http_threads: int, dataset: str | None, alpha: float | None, local_epochs: int, batch_size: int,
             learning_rate: float, max_accuracy_drop: float, deadline_s: float, seed: int, quiet: bool) -> None:
    """Fine-tune zoo model MODEL on CLIENTS virtual devices for ROUNDS rounds of PER_ROUND devices on the chosen
    engine; prints a JSON summary (per round: state, accuracy on the test split, wall and training seconds)."""
    if per_round > clients:
        raise click.BadParameter(f"{per_round} devices per round but only {clients} clients; raise --clients", param_hint="--per-round")
    if min_clients is not None and min_clients > per_round:
        raise click.BadParameter(f"{min_clients} is more than --per-round {per_round}", param_hint="--min-clients")
    if engine == "ray" and executor not in (None, "ray"):
        raise click.BadParameter(f"the ray engine trains on Ray, not {executor!r}", param_hint="--executor")
    executor = executor or {"server": "processes", "inprocess": "in-process", "ray": "ray"}[engine]
    try:
        summary = run_simulation(zoo_dir, model_id, clients, per_round, rounds, executor, workers, http_threads, dataset, alpha,
                                 {"local_epochs": local_epochs, "batch_size": batch_size, "learning_rate": learning_rate,
                                  "max_accuracy_drop": max_accuracy_drop, "deadline_s": deadline_s,
                                  "min_clients": min_clients or per_round}, seed, quiet,
                                 transport, engine)
    except ModuleNotFoundError as error:
        raise click.ClickException(f"fedzoo fl simulate needs {error.name!r}: pip install 'fedzoo[all]'") from None
    click.echo(json.dumps(summary, indent=2))


def run_simulation(zoo_dir: Path, model_id: str, clients: int, per_round: int, rounds: int, executor: str,
                   workers: int | None, http_threads: int, dataset: str | None, alpha: float | None,
                   round_settings: dict[str, Any], seed: int, quiet: bool = True, transport: str = "wsgi",
                   engine: str = "server") -> dict[str, Any]:
    """Run the simulation `fedzoo fl simulate` describes and return its summary."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fedzoo.cloud.simulation import federation_from_zoo
    from fedzoo.datasets import load_dataset, split_dataset
    from fedzoo.output import progress_wanted
    from fedzoo.zoo import Zoo

    card = Zoo(zoo_dir).card(model_id)
    split = split_dataset(load_dataset(dataset or card.task), seed=seed)
    federation = federation_from_zoo(zoo_dir, model_id, split, num_clients=clients, alpha=alpha, seed=seed,
                                     cloud_examples=_cloud_examples(card, len(split.train)))
    config = {"min_clients": per_round, "target_clients": per_round, "over_selection": 0.0, "num_rounds": rounds,
              **round_settings}  # round_settings may lower min_clients
    started = time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True, disable=not progress_wanted(quiet)) as progress:
        bar = progress.add_task(f"rounds of {per_round} devices", total=rounds)

        def on_round(record) -> None:
            accuracy = "-" if record.accuracy is None else f"{record.accuracy:.4f}"
            progress.update(bar, advance=1, description=f"round {record.number}: {record.state}, accuracy {accuracy}")

        if engine == "server":
            records, workers, worker_peaks_mb, setup_seconds = _on_the_server(
                federation, config, executor, workers, http_threads, seed, transport, started, on_round)
        else:
            from fedzoo.cloud.inprocess import InProcessEngine

            with InProcessEngine(federation, executor, workers, seed) as simulator:
                setup_seconds = time.perf_counter() - started
                records = simulator.run(config, progress=on_round)
                workers, worker_peaks_mb = simulator.executor.workers, [
                    peak_rss_mb(pid) for pid in simulator.executor.worker_pids()]
    return {
        "model_id": model_id,
        "clients": clients,
        "per_round": per_round,
        "engine": engine,
        "executor": executor,
        "workers": workers,
        "transport": transport if engine == "server" else None,
        "server": SERVER_DESCRIPTIONS[transport] if engine == "server" else "none: the aggregation core in this process",
        "setup_seconds": setup_seconds,
        "wall_seconds": time.perf_counter() - started,
        "peak_rss_mb": peak_rss_mb(),
        "worker_peak_rss_mb": worker_peaks_mb,  # each device process's (the processes executor; Ray's are its own)
        "base_accuracy": card.metrics.accuracy,
        "rounds": [
            {"number": record.number, "state": record.state, "participants": record.participants,
             "accepted_updates": record.accepted_updates, "refused": record.refused, "accuracy": record.accuracy,
             "result_model_id": record.result_model_id, "wall_seconds": record.wall_seconds,
             "train_seconds": record.train_seconds, "check_in_seconds": record.check_in_seconds,
             "work_seconds": record.work_seconds, "upload_bytes": record.upload_bytes}
            for record in records
        ],
    }


def _on_the_server(federation: Any, config: dict[str, Any], executor: str, workers: int | None, http_threads: int,
                   seed: int, transport: str, started: float, on_round: Any) -> tuple[list, int, list[float], float]:
    """The plan through the real server (the server engine): records, device workers, their peak RSS, setup s."""
    from fedzoo.cloud.simulation import Simulation
    from fedzoo.server.testing import LoopbackServer

    with tempfile.TemporaryDirectory(prefix="fedzoo-simulate-") as folder:
        with LoopbackServer(Path(folder) / "server", transport=transport) as server:
            with Simulation(federation, server.url, executor=executor, cache_root=Path(folder) / "devices", seed=seed,
                            workers=workers, http_threads=http_threads, in_process=server.in_process) as simulation:
                simulation.publish_base_model()
                simulation.register_devices()
                setup_seconds = time.perf_counter() - started
                records = simulation.run(config, progress=on_round)
                # read before the executor's workers exit (with --transport wsgi they hold server workers too)
                worker_peaks_mb = [peak_rss_mb(pid) for pid in simulation.executor.worker_pids()]
                return records, simulation.executor.workers, worker_peaks_mb, setup_seconds
