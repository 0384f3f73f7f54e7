"""`fedzoo keys`: the operator's card-signing keys. Private keys stay in the key directory; only key ids,
paths and public keys are ever printed."""

from __future__ import annotations

import json
from pathlib import Path

import click

from fedzoo.keyring import KeyDirectory, default_keys_dir

KEYS_DIR_OPTION = click.option(
    "--keys-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Key directory (default $FEDZOO_KEYS_DIR or ~/.fedzoo/keys).")


@click.group()
def keys() -> None:
    """Card-signing keys: generate, list, export the public key set, retire."""


@keys.command()
@KEYS_DIR_OPTION
def generate(keys_dir: Path | None) -> None:
    """Create a new ed25519 signing key (PEM, mode 0600) and print its id and path."""
    stored = KeyDirectory(keys_dir or default_keys_dir()).generate()
    click.echo(f"generated key {stored.key_id}: {stored.path}")


@keys.command(name="list")
@KEYS_DIR_OPTION
def list_keys(keys_dir: Path | None) -> None:
    """List the keys: id, active or retired, creation time, file."""
    directory = KeyDirectory(keys_dir or default_keys_dir())
    stored = directory.keys()
    if not stored:
        click.echo(f"no keys in {directory.root}; create one with: fedzoo keys generate")
    for key in stored:
        state = "retired" if key.retired else "active"
        click.echo(f"{key.key_id}  {state:7}  {key.created_at:%Y-%m-%dT%H:%M:%SZ}  {key.path}")


@keys.command(name="export-public")
@KEYS_DIR_OPTION
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the key set here instead of printing it.")
def export_public(keys_dir: Path | None, out: Path | None) -> None:
    """Print the active keys' public key set, {"keys": [{key_id, algorithm, public_key}]}: what servers
    (FEDZOO_TRUSTED_KEYS) and devices (--trusted-keys, CardVerifier.fromJson) pin."""
    directory = KeyDirectory(keys_dir or default_keys_dir())
    key_set = directory.active_public_keys()
    if not key_set.key_ids:
        raise click.ClickException(f"no active key in {directory.root}; create one with: fedzoo keys generate")
    text = json.dumps(key_set.to_json(), indent=2) + "\n"
    if out is None:
        click.echo(text, nl=False)
    else:
        out.write_text(text)
        click.echo(f"wrote {len(key_set.key_ids)} public keys to {out}", err=True)


@keys.command()
@click.argument("key_id")
@KEYS_DIR_OPTION
def retire(key_id: str, keys_dir: Path | None) -> None:
    """Drop KEY_ID from the exported key set (its file moves to retired/)."""
    stored = KeyDirectory(keys_dir or default_keys_dir()).retire(key_id)
    click.echo(f"retired key {stored.key_id}: {stored.path}; re-export the public key set and re-pin it")
