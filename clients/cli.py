"""`fedzoo client ...`: the device side from a shell. numpy + onnxruntime + httpx; never torch.

The server URL and this device's token (and its expiry: it is rotated before it runs out) are remembered
in a small JSON state file after `register` (default `~/.config/fedzoo/client.json`, or `--state`), so
later commands need neither. So are the fleet's public keys once given with `--trusted-keys FILE` (a key set
from `GET /v1/keys` or `fedzoo keys export-public`, fetched out of band): from then on every card must be
signed by one of them, and the newest version accepted per model line is kept there too, so no later card
can roll the device back.

    fedzoo client register --server http://127.0.0.1:8000 --device-id phone-17 --enrollment-token T
    fedzoo client lookup --task mnist --latency-budget-ms 5
    fedzoo client download mnist-ofa-3
    fedzoo client run mnist-ofa-3 images.npz --report-latency
    fedzoo client participate --task mnist --data my_shard.npz --rounds 3 --encoding int8
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import click
import numpy as np

from fedzoo.clients.device_state import load_state, update_state
from fedzoo.errors import InvalidInputError
from fedzoo.output import format_option, print_json, quiet_option, transfer_progress

DEFAULT_STATE = Path(os.environ.get("FEDZOO_CLIENT_STATE") or Path.home() / ".config" / "fedzoo" / "client.json")


def _client(ctx: click.Context, progress: Callable[[str, int, int | None], None] | None = None):
    """A FedzooClient for the server and token of the options or the state file; `progress` draws transfers."""
    from fedzoo.clients.client import FedzooClient
    from fedzoo.signing import TrustedKeys

    options = ctx.obj
    server = options["server"] or load_state(options["state"]).get("server")
    if not server:
        raise click.UsageError("no server given: pass --server URL (or register first)")
    if options["trusted_keys"] is not None:  # pin them: kept in the state file for every later command
        update_state(options["state"], {"trusted_keys": TrustedKeys.load(options["trusted_keys"]).to_json()})
    if options["operator_keys"] is not None:  # pinned the same way, for SecAgg+ neighbours' certificates
        update_state(options["state"], {"operator_keys": TrustedKeys.load(options["operator_keys"]).to_json()})
    state = load_state(options["state"])
    trusted = TrustedKeys.from_json(state["trusted_keys"]) if "trusted_keys" in state else None
    operator = TrustedKeys.from_json(state["operator_keys"]) if "operator_keys" in state else None
    return FedzooClient(server, token=options["token"], cache_dir=options["cache_dir"], state_file=options["state"],
                        trusted_keys=trusted, progress=progress, operator_keys=operator)


def _read_npz(path: Path, need_labels: bool) -> tuple[np.ndarray, np.ndarray | None]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            if "x" not in archive.files or (need_labels and "y" not in archive.files):
                wanted = "'x' and 'y'" if need_labels else "'x'"
                raise InvalidInputError(f"{path} must hold {wanted}; it holds {sorted(archive.files)}", field="data")
            return archive["x"].astype(np.float32), archive["y"].astype(np.int64) if "y" in archive.files else None
    except (OSError, ValueError) as error:
        raise InvalidInputError(f"{path} is not a readable .npz file: {error}", field="data") from None


@click.group()
@click.option("--server", envvar="FEDZOO_SERVER", help="server URL, e.g. http://127.0.0.1:8000")
@click.option("--token", envvar="FEDZOO_TOKEN", help="device token (default: from the state file)")
@click.option("--state", type=click.Path(path_type=Path), default=DEFAULT_STATE, show_default=True,
              help="where register keeps the server URL and token")
@click.option("--cache-dir", type=click.Path(path_type=Path), envvar="FEDZOO_CACHE_DIR",
              help="download cache (default ~/.cache/fedzoo)")
@click.option("--trusted-keys", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="pin this key set (JSON from GET /v1/keys or `fedzoo keys export-public`, obtained out of band); "
                   "kept in the state file: every card must then be signed by one of its keys")
@click.option("--operator-keys", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="pin the operator's key set (`fedzoo keys export-public`, never GET /v1/keys), kept in the state "
                   "file: SecAgg+ neighbours count only with its certificate; without it SecAgg+ rounds are declined")
@click.pass_context
def client(ctx: click.Context, server: str | None, token: str | None, state: Path, cache_dir: Path | None,
           trusted_keys: Path | None, operator_keys: Path | None) -> None:
    """Device-side client: register, look up, download, run, train."""
    ctx.obj = {"server": server, "token": token, "state": state, "cache_dir": cache_dir, "trusted_keys": trusted_keys,
               "operator_keys": operator_keys}


@client.command()
@click.option("--device-id", required=True, help="this device's id (letters, digits, . _ -)")
@click.option("--device-class", default=None, help="fleet class, if known")
@click.option("--threads", type=int, default=1, show_default=True)
@click.option("--calibrate/--no-calibrate", default=True, show_default=True,
              help="time the calibration models so the server can predict latencies for this device")
@click.option("--enrollment-token", envvar="FEDZOO_ENROLLMENT_TOKEN",
              help="from the fleet's operator (fedzoo enrollment create); not needed only with open enrollment")
@click.pass_context
def register(ctx: click.Context, device_id: str, device_class: str | None, threads: int, calibrate: bool,
             enrollment_token: str | None) -> None:
    """Register this device and remember its token (and when it expires) in the state file."""
    from fedzoo.edge.device_profile import collect_device_profile

    profile = collect_device_profile(device_id, threads=threads, device_class=device_class, run_calibration=calibrate)
    with _client(ctx) as api:
        registration = api.register(profile, enrollment_token)
    state_path: Path = ctx.obj["state"]
    details = ", ".join(f"{key} {value}" for key, value in registration.items() if key not in ("token", "device_id"))
    click.echo(f"registered {device_id} ({details}); token saved to {state_path}")


@client.command()
@click.option("--task", required=True)
@click.option("--latency-budget-ms", type=float, required=True)
@click.option("--memory-budget-mb", type=float, default=None)
@click.option("--min-accuracy", type=float, default=None)
@format_option
@click.pass_context
def lookup(ctx: click.Context, task: str, latency_budget_ms: float, memory_budget_mb: float | None,
           min_accuracy: float | None, output_format: str) -> None:
    """Ask the server for the best model this device can afford (--format json: the server's answer)."""
    with _client(ctx) as api:
        answer = api.lookup(task, latency_budget_ms, memory_budget_mb, min_accuracy)
    if output_format == "json":
        print_json(answer)
        return
    model = answer["model"]
    click.echo(f"{model['id']}: accuracy {model['metrics']['accuracy']:.4f}, {answer['latency_ms']:.2f} ms "
               f"({answer['latency_source']}), {answer['memory_mb']:.1f} MB")
    click.echo(f"why: {answer['reason']}")
    if answer.get("runner_up"):
        runner_up = answer["runner_up"]
        click.echo(f"runner-up: {runner_up['model_id']} (accuracy {runner_up['accuracy']:.4f}, "
                   f"{runner_up['latency_ms']:.2f} ms)")


@client.command()
@click.argument("model_id")
@quiet_option
@click.pass_context
def download(ctx: click.Context, model_id: str, quiet: bool) -> None:
    """Download a model's ONNX file into the cache (resumable, sha256-checked)."""
    with transfer_progress(quiet) as progress, _client(ctx, progress) as api:
        card = api.card(model_id)
        path = api.download_model(card)
        click.echo(f"{path} ({card.size_bytes} bytes, sha256 {card.sha256}, {api.downloaded_bytes} bytes transferred)")


@client.command()
@click.argument("model_id")
@click.argument("inputs", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--threads", type=int, default=1, show_default=True)
@click.option("--report-latency/--no-report-latency", default=False, help="benchmark and send the latency to the server")
@quiet_option
@click.pass_context
def run(ctx: click.Context, model_id: str, inputs: Path, threads: int, report_latency: bool, quiet: bool) -> None:
    """Run a model on the images in INPUTS (.npz with x in [0, 1], and optionally labels y)."""
    from fedzoo.edge.benchmark import benchmark_model

    x, y = _read_npz(inputs, need_labels=False)
    with transfer_progress(quiet) as progress, _client(ctx, progress) as api:
        card = api.card(model_id)
        session = api.session(card, threads=threads)
        predictions = np.argmax(session.run(x), axis=-1)
        click.echo(f"predictions for {len(x)} inputs: {[card.labels[i] for i in predictions[:20]]}"
                   f"{' ...' if len(x) > 20 else ''}")
        if y is not None:
            click.echo(f"accuracy {float((predictions == y).mean()):.4f} on {len(y)} labelled inputs")
        if report_latency:
            measured = benchmark_model(api.download_model(card), threads=threads)
            api.report_latency(model_id, measured.median_ms, measured.p90_ms, threads)
            click.echo(f"latency median {measured.median_ms:.3f} ms, p90 {measured.p90_ms:.3f} ms: reported")


@client.command()
@click.option("--task", required=True, help="the task this device has data for")
@click.option("--data", "data_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help=".npz with the device's own x (N,C,H,W in [0,1]) and y; it never leaves the device")
@click.option("--rounds", type=int, default=1, show_default=True, help="rounds to take part in")
@click.option("--max-idle-s", type=float, default=300.0, show_default=True, help="give up after this long without work")
@click.option("--encoding", type=click.Choice(["fp32", "int8"]), default="fp32", show_default=True)
@click.option("--family", default=None, help="only rounds of this model family")
@quiet_option
@click.pass_context
def participate(ctx: click.Context, task: str, data_path: Path, rounds: int, max_idle_s: float, encoding: str,
                family: str | None, quiet: bool) -> None:
    """Take part in federated rounds: train locally, upload only the weight delta."""
    from fedzoo.clients.participation import LocalData, participation_loop

    x, y = _read_npz(data_path, need_labels=True)
    with transfer_progress(quiet) as progress, _client(ctx, progress) as api:
        results = participation_loop(api, task, LocalData(x, y), rounds, max_idle_s, encoding, family)
    for result in results:
        click.echo(f"round {result.round_id}: {result.outcome}, {result.upload_bytes} bytes uploaded, "
                   f"local loss {result.metrics.get('loss', float('nan')):.4f}, "
                   f"accuracy {result.metrics.get('accuracy', float('nan')):.4f}")
    if not results:
        click.echo(f"no round for task {task!r} within {max_idle_s:.0f} s")
