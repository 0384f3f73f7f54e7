"""How every `fedzoo` command prints: `--format json` (one machine-readable document on stdout, nothing
else there) or `--format table` (rich tables for people), and byte progress bars on stderr.

Progress bars go to stderr so that stdout stays parseable, and only when stderr is a terminal and the
command was not given `--quiet`: a script or a CI log gets no bar redraws.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.markup import escape
from rich.table import Table
from rich.text import Text

FORMATS = ("table", "json")
Command = TypeVar("Command", bound=Callable[..., Any])


def format_option(command: Command) -> Command:
    """The `--format table|json` option every list and show command takes."""
    return click.option(
        "--format", "output_format", type=click.Choice(FORMATS), default="table", show_default=True,
        help="table: rich tables for people; json: one JSON document on stdout with stable keys, for scripts.",
    )(command)


def quiet_option(command: Command) -> Command:
    """The `--quiet` option of commands that move bytes: no progress bars."""
    return click.option("--quiet", "-q", is_flag=True, help="No progress bars on stderr.")(command)


def print_json(document: Any) -> None:
    """One JSON document on stdout, keys sorted so that the output is stable."""
    click.echo(json.dumps(document, indent=2, sort_keys=True, default=str))


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], caption: str | None = None) -> None:
    """A rich table on stdout; `None` cells print as '-', dicts and lists as JSON, text as it is (a server's
    text is never read as rich markup); a rich `Text` cell keeps its style."""
    table = Table(title=escape(title), caption=caption and escape(caption))
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(value) for value in row))
    Console().print(table)


def _cell(value: Any) -> Text | str:
    if isinstance(value, Text):
        return value
    if value is None:
        return "-"
    if isinstance(value, (dict, list)):
        return escape(json.dumps(value, sort_keys=True, default=str))
    return escape(str(value))


def print_fields(title: str, fields: Sequence[tuple[str, Any]]) -> None:
    """A two-column (field, value) table: how a show command prints one object."""
    print_table(title, ("field", "value"), fields)


def error_console() -> Console:
    return Console(stderr=True)


def progress_wanted(quiet: bool) -> bool:
    return not quiet and sys.stderr.isatty()


@contextmanager
def transfer_progress(quiet: bool) -> Iterator[Callable[[str, int, int | None], None] | None]:
    """A callback `(label, done_bytes, total_bytes)` that draws one byte progress bar per transfer on
    stderr (the SDK's `progress` hook), or None when bars are off."""
    if not progress_wanted(quiet):
        yield None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=error_console(), transient=True) as progress:
        tasks: dict[str, TaskID] = {}

        def update(label: str, done_bytes: int, total_bytes: int | None) -> None:
            if label not in tasks:
                tasks[label] = progress.add_task(label, total=total_bytes)
            progress.update(tasks[label], completed=done_bytes, total=total_bytes)

        yield update
