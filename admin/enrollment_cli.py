"""`fedzoo enrollment ...`: an operator's commands for enrollment tokens and device revocation, over REST
with the admin token (needs only httpx, not the server's own packages).

    export FEDZOO_SERVER=https://fedzoo.example.org FEDZOO_ADMIN_TOKEN=...
    fedzoo enrollment create --uses 50 --expires-in 7d --label "warehouse scanners" --device-class scanner
    fedzoo enrollment list
    fedzoo enrollment revoke enr_0123456789abcdef
    fedzoo enrollment revoke-device scanner-17
"""

from __future__ import annotations

import re
from typing import Any

import click

from fedzoo.clients.http import FedzooHTTP

DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
SECONDS_PER_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class Duration(click.ParamType):
    """A duration such as 3600, 90s, 30m, 12h or 7d, as whole seconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = DURATION.match(str(value))
        if match is None:
            self.fail(f"{value!r} is not a duration like 3600, 30m, 12h or 7d", param, ctx)
        return int(match.group(1)) * SECONDS_PER_UNIT[match.group(2)]


def _admin(ctx: click.Context) -> FedzooHTTP:
    options = ctx.obj
    if not options["admin_token"]:
        raise click.UsageError("no admin token: pass --admin-token or set FEDZOO_ADMIN_TOKEN")
    return FedzooHTTP(options["server"], token=options["admin_token"])


@click.group()
@click.option("--server", envvar="FEDZOO_SERVER", default="http://127.0.0.1:8000", show_default=True,
              help="the server's URL")
@click.option("--admin-token", envvar="FEDZOO_ADMIN_TOKEN", help="the server's admin token (or FEDZOO_ADMIN_TOKEN)")
@click.pass_context
def enrollment(ctx: click.Context, server: str, admin_token: str | None) -> None:
    """Operators: create, list and revoke enrollment tokens; revoke devices."""
    ctx.obj = {"server": server, "admin_token": admin_token}


@enrollment.command()
@click.option("--uses", "max_uses", type=click.IntRange(1, 1_000_000), default=1, show_default=True,
              help="how many devices the token may enroll")
@click.option("--expires-in", "expires_in_s", type=Duration(), default="7d", show_default=True,
              help="how long it may be used, e.g. 12h or 30d")
@click.option("--label", default=None, help="a note for operators, e.g. where the devices are")
@click.option("--device-class", default=None, help="enroll only devices registering with this device class")
@click.pass_context
def create(ctx: click.Context, max_uses: int, expires_in_s: int, label: str | None, device_class: str | None) -> None:
    """Create an enrollment token; it is printed once and cannot be shown again."""
    body = {key: value for key, value in {"max_uses": max_uses, "expires_in_s": expires_in_s, "label": label,
                                          "device_class": device_class}.items() if value is not None}
    with _admin(ctx) as admin:
        issued = admin.post_json("/v1/enrollment-tokens", body, expected=(201,))
    click.echo(f"created {issued['id']}: enrolls up to {issued['max_uses']} device(s) until {issued['expires_at']}"
               + (f", class {issued['device_class']}" if issued["device_class"] else ""))
    click.echo("enrollment token (shown only now; give it to the devices' installer):", err=True)
    click.echo(issued["token"])


@enrollment.command(name="list")
@click.option("--limit", type=click.IntRange(1, 200), default=50, show_default=True)
@click.option("--offset", type=click.IntRange(0), default=0, show_default=True)
@click.pass_context
def list_tokens(ctx: click.Context, limit: int, offset: int) -> None:
    """List enrollment tokens, newest first (never the tokens themselves)."""
    with _admin(ctx) as admin:
        page = admin.get_json("/v1/enrollment-tokens", params={"limit": limit, "offset": offset})
    click.echo(f"{'id':<21} {'state':<8} {'uses':>11}  {'expires_at':<32} {'class':<16} label")
    for token in page["enrollment_tokens"]:
        click.echo(f"{token['id']:<21} {token['state']:<8} {token['uses']:>5}/{token['max_uses']:<5}  "
                   f"{token['expires_at']:<32} {token['device_class'] or '-':<16} {token['label'] or ''}")
    click.echo(f"{len(page['enrollment_tokens'])} of {page['total']}"
               + (f"; more with --offset {page['next_offset']}" if page["next_offset"] is not None else ""))


@enrollment.command()
@click.argument("token_id")
@click.pass_context
def revoke(ctx: click.Context, token_id: str) -> None:
    """Revoke an enrollment token (devices it enrolled stay registered)."""
    with _admin(ctx) as admin:
        token = admin.post_json(f"/v1/enrollment-tokens/{token_id}/revoke", None, expected=(200,))
    click.echo(f"revoked {token['id']} ({token['uses']} of {token['max_uses']} uses taken)")


@enrollment.command(name="revoke-device")
@click.argument("device_id")
@click.pass_context
def revoke_device(ctx: click.Context, device_id: str) -> None:
    """Revoke a device: its tokens stop working on the next request; its pending round updates are not counted."""
    with _admin(ctx) as admin:
        answer = admin.post_json(f"/v1/devices/{device_id}/revoke", None, expected=(200,))
    click.echo(f"revoked device {answer['device_id']} at {answer['revoked_at']}")
