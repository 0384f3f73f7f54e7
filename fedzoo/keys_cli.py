"""`fedzoo keys`: the operator's card-signing keys. Private keys stay in the key directory; only key ids,
paths and public keys are ever printed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from fedzoo.privacy_terms import sign_privacy_terms
from fedzoo.errors import InvalidInputError
from fedzoo.keyring import KeyDirectory, default_keys_dir
from fedzoo.revocation import sign_revocation_list
from fedzoo.signing import CardSigningKey

KEYS_DIR_OPTION = click.option(
    "--keys-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Key directory (default $FEDZOO_KEYS_DIR or ~/.fedzoo/keys).")


@click.group()
def keys() -> None:
    """Card-signing keys: generate, list, export the public key set, retire, sign a revocation list."""


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


@keys.command()
@click.option("--signing-key", type=click.Path(dir_okay=False, exists=True, path_type=Path), required=True,
              help="The operator's PEM key (an active key of `fedzoo keys list`) the devices pin.")
@click.option("--version", "list_version", type=click.IntRange(min=1), required=True,
              help="The list's version: higher than every list published before (devices refuse an older one).")
@click.option("--card-id", "card_ids", multiple=True, help="A card id to revoke (repeatable).")
@click.option("--card-sha256", "card_sha256s", multiple=True, help="A model blob sha256 to revoke (repeatable).")
@click.option("--device-key", "device_keys", multiple=True,
              help="A device signing key to revoke, by its fingerprint (hex sha256 of the raw key, as "
                   "`GET /v1/devices/signing-keys` lists it; repeatable).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the signed list (upload it with POST /v1/revocations).")
def revoke(signing_key: Path, list_version: int, card_ids: tuple[str, ...], card_sha256s: tuple[str, ...],
           device_keys: tuple[str, ...], out: Path) -> None:
    """Sign the operator's revocation list: every card, model and device key still revoked, under a new version.
    Each list replaces the one before, so list everything revoked so far again (`fedzoo devices revoke-keys` adds
    device keys to the served list instead)."""
    try:
        document = sign_revocation_list(CardSigningKey.load(signing_key), list_version, list(card_ids),
                                        list(card_sha256s), list(device_keys))
    except InvalidInputError as error:
        raise click.ClickException(str(error)) from None
    out.write_text(json.dumps(document, indent=2) + "\n")
    click.echo(f"wrote revocation list version {list_version} ({len(set(card_ids))} card ids, "
               f"{len(set(card_sha256s))} model sha256s, {len(set(device_keys))} device keys) to {out}")


@keys.command(name="sign-privacy-terms")
@click.option("--signing-key", type=click.Path(dir_okay=False, exists=True, path_type=Path), required=True,
              help="The operator's PEM key (an active key of `fedzoo keys list`) the devices pin.")
@click.option("--version", "terms_version", type=click.IntRange(min=1), required=True,
              help="The terms' version: higher than every version published before (devices refuse an older one).")
@click.option("--line", "lines", multiple=True, required=True, metavar="LINE=Z_MIN",
              help="A model line (its first card's id, or '*' for every line not named) that devices train on only "
                   "under distributed DP with a noise multiplier of at least Z_MIN (repeatable).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the signed terms (upload them with POST /v1/privacy-terms).")
def sign_privacy_terms_command(signing_key: Path, terms_version: int, lines: tuple[str, ...], out: Path) -> None:
    """Sign the operator's privacy terms: every line devices train on only under distributed DP, and the least
    noise multiplier they accept there. Each version replaces the one before, so name every covered line again."""
    terms: dict[str, dict[str, Any]] = {}
    for entry in lines:
        line, _, floor = entry.partition("=")
        try:
            terms[line] = {"mode": "distributed", "minimum_noise_multiplier": float(floor)}
        except ValueError:
            raise click.ClickException(f"--line {entry!r}: expected LINE=Z_MIN, e.g. '*=1.0'") from None
    try:
        document = sign_privacy_terms(CardSigningKey.load(signing_key), terms_version, terms)
    except InvalidInputError as error:
        raise click.ClickException(str(error)) from None
    out.write_text(json.dumps(document, indent=2) + "\n")
    click.echo(f"wrote privacy terms version {terms_version} ({len(terms)} lines: {', '.join(sorted(terms))}) to {out}")
