"""`fedzoo models | devices | fl`: an operator's read-only view of a running server, for people and scripts.

Every command reads the server URL from `--server` or `$FEDZOO_SERVER` (default http://127.0.0.1:8000)
and a token from `--token`, else `$FEDZOO_VIEWER_TOKEN`, else `$FEDZOO_ADMIN_TOKEN` (the environment is
better: other users see a command line in `ps`). `--format json` prints one JSON document with the
server's own keys; `fedzoo fl rounds watch` prints one JSON object per line (JSON Lines) as it goes.

    fedzoo models list --task mnist --precision int8
    fedzoo fl rounds list --state closed --format json | jq '.rounds[].id'
    fedzoo fl rounds watch 12 || echo "round 12 failed"
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import click
from rich.text import Text

from fedzoo.card_views import card_fields
from fedzoo.clients.device_certification import certify_devices, revoke_device_keys
from fedzoo.clients.http import FedzooHTTP, RetryPolicy
from fedzoo.output import format_option, print_fields, print_json, print_table
from fedzoo.signing import CardSigningKey

DEFAULT_SERVER = "http://127.0.0.1:8000"
PAGE_LIMIT_MAX = 200  # the server's largest page
FINAL_STATES = frozenset({"closed", "failed"})
EXIT_ROUND_FAILED = 1
EXIT_WATCH_TIMEOUT = 3


def _server_url(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise click.BadParameter(f"must be an http:// or https:// URL, got {value!r}")
    return value


def _connected(command: Callable[..., Any], token_variables: tuple[str, ...], token_help: str) -> Callable[..., Any]:
    @functools.wraps(command)
    def with_api(server: str, token: str | None, **options: Any) -> Any:
        token = token or next((os.environ[name] for name in token_variables if os.environ.get(name)), None)
        with FedzooHTTP(server, token=token, retry=RetryPolicy(max_attempts=3)) as api:
            return command(api=api, **options)

    with_api = click.option("--token", default=None, help=token_help)(with_api)
    return click.option("--server", envvar="FEDZOO_SERVER", default=DEFAULT_SERVER, show_default=True,
                        callback=_server_url, help="server URL (or $FEDZOO_SERVER)")(with_api)


def server_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--server` and `--token`, turned into one `api` argument: a connection to the server."""
    return _connected(command, ("FEDZOO_VIEWER_TOKEN", "FEDZOO_ADMIN_TOKEN"),
                      "viewer or admin token (default: $FEDZOO_VIEWER_TOKEN, else $FEDZOO_ADMIN_TOKEN)")


def admin_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`server_options` for the commands that change something: the admin token."""
    return _connected(command, ("FEDZOO_ADMIN_TOKEN",), "admin token (default: $FEDZOO_ADMIN_TOKEN)")


def page_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--limit`, `--offset` and `--all` of every list command."""
    command = click.option("--all", "all_pages", is_flag=True, help="fetch every page (ignores --limit/--offset)")(command)
    command = click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True)(command)
    command = click.option("--limit", type=click.IntRange(1, PAGE_LIMIT_MAX), default=50, show_default=True,
                           help="items per page")(command)
    return command


def fetch_list(api: FedzooHTTP, path: str, key: str, filters: dict[str, Any], limit: int, offset: int,
               all_pages: bool) -> dict[str, Any]:
    """One page of a list endpoint, or with `all_pages` every item in one page-shaped document."""
    params = {name: value for name, value in filters.items() if value is not None}
    if not all_pages:
        return api.get_json(path, params={**params, "limit": limit, "offset": offset})
    items: list[Any] = []
    next_offset: int | None = 0
    while next_offset is not None:
        page = api.get_json(path, params={**params, "limit": PAGE_LIMIT_MAX, "offset": next_offset})
        items.extend(page[key])
        next_offset = page["next_offset"]
    return {key: items, "total": len(items), "limit": len(items), "offset": 0, "next_offset": None}


def page_caption(page: dict[str, Any], key: str) -> str:
    shown = len(page[key])
    first = page["offset"] + 1 if shown else 0
    more = f"; next page: --offset {page['next_offset']}" if page.get("next_offset") is not None else ""
    return f"{first}-{page['offset'] + shown} of {page['total']}{more}"


def _when(timestamp: str | None) -> str | None:
    """An ISO timestamp as 'YYYY-MM-DD HH:MM:SS' (UTC), for tables."""
    if not timestamp:
        return None
    return _parse_time(timestamp).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _fraction(value: float | None) -> str | None:
    return None if value is None else f"{value:.4f}"


def _milliseconds(value: float | None) -> str | None:
    return None if value is None else f"{value:.3f}"


def _parse_time(timestamp: str) -> datetime:
    moment = datetime.fromisoformat(timestamp)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def elapsed_text(seconds: float) -> str:
    """'3 m 15 s', '2 h 05 m', '41 s': how long, readable at a glance."""
    seconds = int(max(0.0, seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} m {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} m"


def round_elapsed(round_view: dict[str, Any]) -> str:
    end = _parse_time(round_view["finished_at"]) if round_view.get("finished_at") else datetime.now(timezone.utc)
    return elapsed_text((end - _parse_time(round_view["created_at"])).total_seconds())


STATE_STYLES = {"open": "cyan", "collecting": "blue", "aggregating": "yellow", "closed": "green", "failed": "red"}


def styled_state(state: str) -> Text:
    return Text(state, style=STATE_STYLES.get(state, ""))


# models ------------------------------------------------------------------------------------------


@click.group()
def models() -> None:
    """The server's model registry: model cards, their lineage and their latency per device class."""


@models.command(name="list")
@click.option("--task", default=None, help="only this task")
@click.option("--precision", type=click.Choice(["fp32", "int8"]), default=None, help="only this precision")
@page_options
@format_option
@server_options
def list_models(api: FedzooHTTP, task: str | None, precision: str | None, limit: int, offset: int, all_pages: bool,
                output_format: str) -> None:
    """List the published model cards, a page at a time."""
    page = fetch_list(api, "/v1/models", "models", {"task": task, "precision": precision}, limit, offset, all_pages)
    if output_format == "json":
        print_json(page)
        return
    rows = [(card["id"], card["family"], card["version"], card["task"], card["precision"],
             f"{card['metrics']['accuracy']:.4f}", f"{card['size_bytes'] / 1024:.1f}", card["params"], card.get("parent_id"))
            for card in page["models"]]
    print_table("models", ("id", "family", "version", "task", "precision", "accuracy", "size KB", "params", "parent"),
                rows, caption=page_caption(page, "models"))


@models.command(name="show")
@click.argument("model_id")
@format_option
@server_options
def show_model(api: FedzooHTTP, model_id: str, output_format: str) -> None:
    """Show one model card: provenance, metrics, cost and latency per device class."""
    card = api.get_json(f"/v1/models/{model_id}")
    if output_format == "json":
        print_json(card)
        return
    print_fields(f"model {card['id']}", card_fields(card))


@models.command(name="lineage")
@click.argument("model_id")
@format_option
@server_options
def model_lineage(api: FedzooHTTP, model_id: str, output_format: str) -> None:
    """Show a model's ancestors and descendants: base, pruned, INT8 and federated versions (viewer token)."""
    lineage = api.get_json(f"/v1/models/{model_id}/lineage")
    if output_format == "json":
        print_json(lineage)
        return
    nodes = [(node, "ancestor") for node in lineage["ancestors"]] + [(lineage["model"], "this model")]
    nodes += [(node, "descendant") for node in lineage["descendants"]]
    rows = [(node["id"], relation, node["stage"], node["version"], node["precision"], _fraction(node["accuracy"]),
             node["parent_id"], _when(node["published_at"])) for node, relation in nodes]
    print_table(f"lineage of {model_id}", ("id", "relation", "stage", "version", "precision", "accuracy", "parent",
                                           "published (UTC)"), rows)


@models.command(name="latency")
@click.argument("model_id")
@format_option
@server_options
def model_latency(api: FedzooHTTP, model_id: str, output_format: str) -> None:
    """Show a model's latency per device class: the card's, the server's prediction and devices' measurements
    (viewer token)."""
    latency = api.get_json(f"/v1/models/{model_id}/latency")
    if output_format == "json":
        print_json(latency)
        return
    rows = [(row["device_class"], _milliseconds(row["card_ms"]), row["card_source"], _milliseconds(row["predicted_ms"]),
             _milliseconds(row["measured_ms"]), row["devices_measured"], row["reports"])
            for row in latency["device_classes"]]
    factor = latency.get("fleet_latency_factor")
    title = f"latency of {model_id}" + (
        f" (fleet latency factor x{factor:.3f} from {latency['fleet_factor_devices']} devices)" if factor else "")
    print_table(title, ("device class", "card ms", "card source", "predicted ms", "measured ms", "devices measured",
                        "reports"), rows)


# devices -----------------------------------------------------------------------------------------


@click.group()
def devices() -> None:
    """The fleet: registered devices (viewer or admin token); certify their keys (admin token, operator key)."""


DEVICE_COLUMNS = ("device_id", "device_class", "platform", "runtime", "runtime_threads", "memory_mb", "registered_at",
                  "last_seen_at")


@devices.command(name="list")
@click.option("--device-class", default=None, help="only this device class")
@page_options
@format_option
@server_options
def list_devices(api: FedzooHTTP, device_class: str | None, limit: int, offset: int, all_pages: bool,
                 output_format: str) -> None:
    """List registered devices: class, platform, runtime, memory, registered and last seen."""
    page = fetch_list(api, "/v1/devices", "devices", {"device_class": device_class}, limit, offset, all_pages)
    if output_format == "json":
        print_json(page)
        return
    rows = [tuple(_when(device.get(column)) if column.endswith("_at") else device.get(column)
                  for column in DEVICE_COLUMNS) for device in page["devices"]]
    print_table("devices", DEVICE_COLUMNS, rows, caption=page_caption(page, "devices"))


@devices.command(name="classes")
@format_option
@server_options
def device_classes(api: FedzooHTTP, output_format: str) -> None:
    """How many devices each class has, and when one of them was last seen."""
    counts = api.get_json("/v1/devices/classes")
    if output_format == "json":
        print_json(counts)
        return
    rows = [(row["device_class"], row["devices"], _when(row["last_seen_at"])) for row in counts["device_classes"]]
    print_table("device classes", ("device class", "devices", "last seen (UTC)"), rows,
                caption=f"{counts['total']} devices")


SIGNING_KEY_OPTION = click.option(
    "--signing-key", "signing_key_path", envvar="FEDZOO_SIGNING_KEY", required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="the operator's private key (PEM, `fedzoo keys generate`), read here and never sent (or $FEDZOO_SIGNING_KEY)")


@devices.command(name="certify")
@SIGNING_KEY_OPTION
@click.option("--lifetime-days", type=click.IntRange(1, 3660), default=365, show_default=True,
              help="how long each certificate is valid")
@click.option("--device", "device_ids", multiple=True, help="only this device (repeatable; default: every one "
              "awaiting a certificate)")
@admin_options
def certify(api: FedzooHTTP, signing_key_path: Path, lifetime_days: int, device_ids: tuple[str, ...]) -> None:
    """Certify the signing keys of devices that have no certificate yet (admin token): the server lists them,
    this machine signs each with the operator key, the server stores the certificates for SecAgg+ rounds."""
    key = CardSigningKey.load(signing_key_path)
    receipts = certify_devices(api, key, timedelta(days=lifetime_days), set(device_ids) or None)
    for receipt in receipts:
        click.echo(f"certified {receipt['device_id']} with key {receipt['key_id']} until "
                   f"{_when(receipt['expires_at'])} UTC")
    click.echo(f"{len(receipts)} devices certified")


@devices.command(name="revoke-keys")
@click.argument("device_ids", nargs=-1, required=True)
@SIGNING_KEY_OPTION
@admin_options
def revoke_keys(api: FedzooHTTP, signing_key_path: Path, device_ids: tuple[str, ...]) -> None:
    """Publish the next version of the operator's revocation list, adding DEVICE_IDS' signing keys to the served
    list (admin token): devices refuse these keys as SecAgg+ neighbours from the next round on."""
    revocations = revoke_device_keys(api, CardSigningKey.load(signing_key_path), set(device_ids))
    click.echo(f"published revocation list version {revocations.version}: "
               f"{len(revocations.device_key_fingerprints)} device keys, {len(revocations.card_ids)} card ids, "
               f"{len(revocations.card_sha256s)} model sha256s revoked")


# federated rounds --------------------------------------------------------------------------------


@click.group()
def fl() -> None:
    """Federated learning: rounds and their participants."""


@fl.group()
def rounds() -> None:
    """List, show and watch federated rounds."""


@rounds.command(name="list")
@click.option("--state", type=click.Choice(sorted(STATE_STYLES)), default=None, help="only rounds in this state")
@click.option("--task", default=None, help="only rounds of this task")
@click.option("--plan-id", type=click.IntRange(min=1), default=None, help="only the rounds of this plan")
@page_options
@format_option
@server_options
def list_rounds(api: FedzooHTTP, state: str | None, task: str | None, plan_id: int | None, limit: int, offset: int,
                all_pages: bool, output_format: str) -> None:
    """List federated rounds, newest first."""
    filters = {"state": state, "task": task, "plan_id": plan_id}
    page = fetch_list(api, "/v1/fl/rounds", "rounds", filters, limit, offset, all_pages)
    if output_format == "json":
        print_json(page)
        return
    rows = [(view["id"], view["plan_id"], view["number"], styled_state(view["state"]), view["task"],
             view["base_model_id"], view["selected_devices"], view["accepted_updates"], view["rejected_updates"],
             view["late_updates"], _when(view["deadline_at"]), elapsed_text(view["elapsed_s"]),
             view["result_model_id"] or view["failure_reason"], _fraction(view["accuracy"]))
            for view in page["rounds"]]
    print_table("rounds", ("id", "plan", "number", "state", "task", "base model", "selected", "accepted", "rejected",
                           "late", "deadline (UTC)", "elapsed", "result", "accuracy"),
                rows, caption=page_caption(page, "rounds"))


@rounds.command(name="show")
@click.argument("round_id", type=click.IntRange(min=1))
@format_option
@server_options
def show_round(api: FedzooHTTP, round_id: int, output_format: str) -> None:
    """Show one round (state, configuration, counts, bytes, outcome) and its participants: whether each
    selected device's update was accepted, clipped, rejected or late, and why (viewer or admin token)."""
    view = api.get_json(f"/v1/fl/rounds/{round_id}")
    participants = api.get_json(f"/v1/fl/rounds/{round_id}/participants")["participants"]
    if output_format == "json":
        print_json({"round": view, "participants": participants})
        return
    fields = [(name, view.get(name)) for name in ("id", "number", "rounds_remaining", "task", "family",
                                                  "base_model_id", "base_version")]
    fields += [("state", styled_state(view["state"])), ("elapsed", round_elapsed(view))]
    fields += [(name, _when(view.get(name))) for name in ("created_at", "deadline_at", "finished_at")]
    fields += [(name, view.get(name)) for name in ("selected_devices", "accepted_updates", "upload_bytes",
                                                   "result_model_id", "next_round_id")]
    fields += [(f"config.{name}", value) for name, value in sorted(view["config"].items())]
    fields += [(f"outcome.{name}", value) for name, value in sorted((view.get("outcome") or {}).items())]
    fields += [(f"publication.{name}", value) for name, value in (view.get("publication") or {}).items()]
    print_fields(f"round {view['id']}", fields)
    rows = [(row["device_id"] + (" (quarantined)" if row["quarantined"] else ""), row["device_class"],
             _when(row["selected_at"]), row["status"], row["reason"], row["num_examples"], _number(row["delta_norm"]),
             _number(row["aggregation_weight"]), _number(row["root_cosine"]), row["upload_bytes"],
             _when(row["uploaded_at"])) for row in participants]
    print_table(f"participants of round {view['id']}", ("device", "class", "selected (UTC)", "status", "reason",
                                                         "examples", "delta norm", "weight", "root cosine", "bytes",
                                                         "uploaded (UTC)"), rows)


def _number(value: float | None) -> str | None:
    return None if value is None else f"{value:.4g}"


def poll_round(api: FedzooHTTP, round_id: int, interval_s: float, timeout_s: float | None,
               sleep: Callable[[float], None] = time.sleep) -> Iterator[dict[str, Any]]:
    """The round's view each time its state or accepted count changes, until it is closed or failed;
    TimeoutError after `timeout_s`."""
    started = time.monotonic()
    last: tuple[str, int] | None = None
    while True:
        view = api.get_json(f"/v1/fl/rounds/{round_id}")
        seen = (view["state"], view["accepted_updates"])
        if seen != last:
            last = seen
            yield view
        if view["state"] in FINAL_STATES:
            return
        if timeout_s is not None and time.monotonic() - started >= timeout_s:
            raise TimeoutError(f"round {round_id} is still {view['state']} after {timeout_s:g} s")
        sleep(interval_s)


@rounds.command(name="watch")
@click.argument("round_id", type=click.IntRange(min=1))
@click.option("--interval-s", type=click.FloatRange(min=0.1), default=2.0, show_default=True, help="seconds between polls")
@click.option("--timeout-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help=f"give up after this long (exit code {EXIT_WATCH_TIMEOUT})")
@format_option
@server_options
def watch_round(api: FedzooHTTP, round_id: int, interval_s: float, timeout_s: float | None, output_format: str) -> None:
    """Follow a round until it is closed or failed, printing each change of state or accepted updates.

    Exit code 0 when the round closed, 1 when it failed, 3 on --timeout-s. With --format json, one JSON
    object per change (JSON Lines)."""
    try:
        for view in poll_round(api, round_id, interval_s, timeout_s):
            change = {"round_id": view["id"], "state": view["state"], "selected_devices": view["selected_devices"],
                      "accepted_updates": view["accepted_updates"], "observed_at": datetime.now(timezone.utc).isoformat()}
            if output_format == "json":
                click.echo(json.dumps(change, sort_keys=True))
            else:
                click.echo(f"{datetime.now().strftime('%H:%M:%S')} round {view['id']}: {view['state']}, "
                           f"{view['selected_devices']} selected, {view['accepted_updates']} accepted, "
                           f"elapsed {round_elapsed(view)}")
    except TimeoutError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(EXIT_WATCH_TIMEOUT)
    if view["state"] == "failed":
        reason = (view.get("outcome") or {}).get("failure", "no reason recorded")
        click.echo(f"error: round {round_id} failed: {reason}", err=True)
        sys.exit(EXIT_ROUND_FAILED)
    if output_format == "table":
        metrics = (view.get("outcome") or {}).get("metrics", {})
        details = ", ".join(f"{name} {value:.4f}" for name, value in metrics.items() if isinstance(value, float))
        click.echo(f"round {round_id} closed: new model {view.get('result_model_id')}{f' ({details})' if details else ''}")



# quarantine --------------------------------------------------------------------------------------


@fl.group()
def quarantine() -> None:
    """Devices no longer selected because their updates kept being left out: list, release or revoke."""


@quarantine.command(name="list")
@page_options
@format_option
@server_options
def list_quarantined(api: FedzooHTTP, limit: int, offset: int, all_pages: bool, output_format: str) -> None:
    """List quarantined devices, each with its latest updates and why aggregation left them out."""
    page = fetch_list(api, "/v1/fl/quarantine", "devices", {}, limit, offset, all_pages)
    if output_format == "json":
        print_json(page)
        return
    rows = [(device["device_id"], device["device_class"], _when(device["quarantined_at"]), device["round_id"],
             "revoked" if device["revoked_at"] else "quarantined", device["reason"]) for device in page["devices"]]
    print_table("quarantined devices", ("device", "class", "quarantined (UTC)", "round", "state", "reason"), rows,
                caption=page_caption(page, "devices"))
    for device in page["devices"]:
        history = [(item["round_id"], _when(item["received_at"]), item["status"], _number(item["aggregation_weight"]),
                    _number(item["root_cosine"]), item["reason"]) for item in device["history"]]
        print_table(f"latest updates of {device['device_id']}", ("round", "received (UTC)", "status", "weight",
                                                                 "root cosine", "reason"), history)


@quarantine.command(name="release")
@click.argument("device_id")
@admin_options
def release_device(api: FedzooHTTP, device_id: str) -> None:
    """Release a quarantined device: it may be selected again (admin token)."""
    answer = api.post_json(f"/v1/fl/quarantine/{device_id}/release", None, expected=(200,))
    click.echo(f"released {answer['device_id']} at {_when(answer['released_at'])} UTC")


@quarantine.command(name="revoke")
@click.argument("device_id")
@admin_options
def revoke_device(api: FedzooHTTP, device_id: str) -> None:
    """Revoke a (quarantined) device for good: every token refused from now on (admin token)."""
    answer = api.post_json(f"/v1/devices/{device_id}/revoke", None, expected=(200,))
    click.echo(f"revoked {answer['device_id']} at {_when(answer['revoked_at'])} UTC")


@fl.group()
def zoo() -> None:
    """Zoo-wide plans: every device trains its tier's subnet, every zoo model improves (docs/zoo-federated.md)."""


@zoo.command(name="start")
@click.argument("config_file", type=click.File("r"))
@click.option("--admin-token", envvar="FEDZOO_ADMIN_TOKEN", required=True, help="admin token (or $FEDZOO_ADMIN_TOKEN)")
@click.option("--server", envvar="FEDZOO_SERVER", default=DEFAULT_SERVER, show_default=True, callback=_server_url,
              help="server URL (or $FEDZOO_SERVER)")
@format_option
def start_zoo_plan(config_file, admin_token: str, server: str, output_format: str) -> None:
    """Start a zoo-wide plan from a JSON file: a round configuration whose `model_id` is the zoo's supernet card,
    with `zoo` settings (latency_budget_ms, latency_budget_ms_by_class, calibration_sha256, min_coverage,
    coverage_step_exponent)."""
    try:
        config = json.load(config_file)
    except json.JSONDecodeError as error:
        raise click.BadParameter(f"{config_file.name} is not JSON: {error}", param_hint="CONFIG_FILE") from None
    with FedzooHTTP(server, token=admin_token, retry=RetryPolicy(max_attempts=1)) as api:
        view = api.request("POST", "/v1/fl/zoo-rounds", json=config, expected=(201,)).json()
    if output_format == "json":
        print_json(view)
        return
    click.echo(f"zoo-wide plan started: round {view['id']} on supernet {view['base_model_id']} "
               f"({view['rounds_remaining']} round(s)); follow it with `fedzoo fl rounds watch {view['id']}`")


def zoo_round_report(view: dict[str, Any]) -> dict[str, Any]:
    """The operator's view of a zoo-wide round: coverage per layer, each model's accuracy before and after, bytes."""
    zoo_outcome = (view.get("outcome") or {}).get("zoo")
    if zoo_outcome is None:
        progress = view.get("publication") or {}
        raise click.ClickException(f"round {view['id']} is {view['state']} and has no zoo-wide outcome "
                                   + (f"yet: its publication is at {progress.get('stage')!r} "
                                      f"({progress.get('zoo_models_done', 0)} of {progress.get('zoo_models_total')} "
                                      "zoo models)" if progress else "(not a zoo-wide round, or not aggregated yet)"))
    return {"round_id": view["id"], "state": view["state"], "supernet_id": zoo_outcome["supernet_id"],
            "new_supernet_id": view.get("result_model_id"), "new_versions": zoo_outcome.get("new_versions", 0),
            "devices_per_zoo_model": zoo_outcome["devices_per_zoo_model"], "coverage": zoo_outcome["coverage"],
            "models": zoo_outcome.get("models", []), "bytes": zoo_outcome.get("bytes", {}),
            "retired_from_lookup": zoo_outcome.get("retired_from_lookup", []),
            "server_seconds": {"aggregation": zoo_outcome.get("aggregation_s"),
                               "publication": zoo_outcome.get("publication_s")}}


@zoo.command(name="show")
@click.argument("round_id", type=click.IntRange(min=1))
@format_option
@server_options
def show_zoo_round(api: FedzooHTTP, round_id: int, output_format: str) -> None:
    """Coverage per supernet layer, each zoo model's accuracy before and after, and bytes of a zoo-wide round."""
    report = zoo_round_report(api.get_json(f"/v1/fl/rounds/{round_id}"))
    if output_format == "json":
        print_json(report)
        return
    coverage = report["coverage"]
    print_fields(f"zoo-wide round {round_id}", [
        ("state", styled_state(report["state"])), ("supernet", report["supernet_id"]),
        ("new supernet", report["new_supernet_id"]), ("new model versions", report["new_versions"]),
        ("retired from lookup", ", ".join(report["retired_from_lookup"]) or "none"),
        ("parameters", coverage["parameters"]), ("released", coverage["released"]),
        ("uncovered", coverage["uncovered"]), ("covered by one device", coverage["single_device"]),
        *[(f"bytes.{name}", value) for name, value in report["bytes"].items()],
        *[(f"server seconds.{name}", value) for name, value in report["server_seconds"].items()]])
    print_table("coverage per layer", ("layer", "elements", "released", "uncovered", "single", "min", "mean", "max"),
                [(layer, row["elements"], row["released"], row["uncovered"], row["single"], row["min_count"],
                  row["mean_count"], row["max_count"]) for layer, row in coverage["by_layer"].items()])
    print_table("zoo models", ("model", "devices", "accuracy before", "after", "with device BN stats", "published",
                               "new version"),
                [(model["model_id"], report["devices_per_zoo_model"].get(model["model_id"], 0),
                  _fraction(model["accuracy_before"]), _fraction(model["accuracy_after"]),
                  _fraction(model["accuracy_with_device_statistics"]), model["published"], model.get("new_model_id"))
                 for model in report["models"]])
