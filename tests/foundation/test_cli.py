"""The one `fedzoo` command: help on every subcommand, one-line errors instead of tracebacks."""

import subprocess
import sys

import click
import pytest

from fedzoo.cli import NESTED_SUBCOMMANDS, SUBCOMMANDS, cli


def all_command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    context = click.Context(group)
    paths = []
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        paths.append((*prefix, name))
        if isinstance(command, click.Group):
            paths.extend(all_command_paths(command, (*prefix, name)))
    return paths


def run_fedzoo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from fedzoo.cli import main; main()", *args],
        capture_output=True, text=True, timeout=300,
    )


def test_every_table_entry_is_listed():
    assert set(SUBCOMMANDS) <= {path[0] for path in all_command_paths(cli)}


def test_every_nested_entry_is_listed_and_imported_only_when_it_runs():
    nested = {(group, name) for group, commands in NESTED_SUBCOMMANDS.items() for name in commands}
    assert nested <= set(all_command_paths(cli))
    listing = subprocess.run(
        [sys.executable, "-c", "import sys; from fedzoo.cli import main\ntry: main(['fl', '--help'])\n"
                               "except SystemExit: pass\nprint('fedzoo.cloud' in sys.modules)"],
        capture_output=True, text=True, timeout=300)
    assert "simulate" in listing.stdout and listing.stdout.split()[-1] == "False", listing.stderr


@pytest.mark.parametrize("path", all_command_paths(cli), ids=" ".join)
def test_help_on_every_subcommand(path):
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output and "unavailable" not in result.output


def test_bad_input_is_a_message_not_a_traceback():
    result = run_fedzoo("data", "describe", "cifar")
    assert result.returncode == 1
    assert "error: unknown data set 'cifar'" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_option_is_a_usage_error():
    result = run_fedzoo("data", "describe", "--no-such-flag")
    assert result.returncode == 2
    assert "No such option" in result.stderr and "Traceback" not in result.stderr


def test_data_describe_prints_the_split():
    result = run_fedzoo("data", "describe", "digits")
    assert result.returncode == 0, result.stderr
    assert "1797 images" in result.stdout and "validation" in result.stdout


def test_table_cells_are_text_not_markup(capsys):
    from fedzoo.output import print_table

    print_table("[bold]t[/bold]", ("reason", "outcome"), [("[red]planted[/red]", {"accuracy": 0.5}), (None, 3)])
    out = capsys.readouterr().out
    assert "[red]planted[/red]" in out and "[bold]t[/bold]" in out
    assert '{"accuracy": 0.5}' in out and "│ -" in out
