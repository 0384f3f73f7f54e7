"""The one `fedzoo` command. Each area owns its subcommands; they are imported only when used, so
device-side commands never import torch or flask."""

from __future__ import annotations

import importlib
import sys

import click
from click.shell_completion import get_completion_class

from fedzoo import __version__
from fedzoo.errors import FedzooError

# subcommand name -> "module:attribute" of a click command, and its one-line help
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "data": ("fedzoo.cloud.data_cli:data", "Inspect data sets, splits and federated partitions."),
    "zoo": ("fedzoo.cloud.zoo_cli:zoo", "Build, compress and inspect model zoos."),
    "serve": ("fedzoo.server.cli:serve", "Run the model server (production WSGI)."),
    "enrollment": ("fedzoo.admin.enrollment_cli:enrollment", "Operators: enrollment tokens and device revocation."),
    "client": ("fedzoo.clients.cli:client", "Device-side client: register, look up, download, run, train."),
    "models": ("fedzoo.admin.operator_cli:models", "The server's model registry: cards, lineage, latency per class."),
    "devices": ("fedzoo.admin.operator_cli:devices", "The fleet: registered devices."),
    "fl": ("fedzoo.admin.operator_cli:fl", "Federated learning: list, show and watch rounds."),
    "demo": ("fedzoo.cloud.demo:demo", "Run the whole system end to end on MNIST-5k."),
    "keys": ("fedzoo.keys_cli:keys", "Card-signing keys: generate, list, export the public key set, retire."),
    "completion": ("fedzoo.cli:completion", "Print the shell completion script for bash, zsh or fish."),
}
# group name -> its subcommands that live in a higher area, imported only when used as above: `fl` is the operator
# tools' group (fedzoo.admin), and `fl simulate` runs the cloud's simulator, which admin must not import
NESTED_SUBCOMMANDS: dict[str, dict[str, tuple[str, str]]] = {
    "fl": {"simulate": ("fedzoo.cloud.simulate_cli:simulate",
                        "Simulate a federation: virtual devices fine-tune a zoo model.")},
}
PROG_NAME = "fedzoo"
COMPLETE_VAR = "_FEDZOO_COMPLETE"  # click's variable for `fedzoo`; the printed scripts set it


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        target, short_help = SUBCOMMANDS[name]
        command = _import_command(name, target, short_help)
        if isinstance(command, click.Group):  # not the stand-in of an area whose packages are absent
            for nested_name, (nested_target, nested_help) in NESTED_SUBCOMMANDS.get(name, {}).items():
                command.add_command(LazyCommand(nested_name, nested_target, nested_help))
        return command


class LazyCommand(click.Command):
    """Stands in for a nested subcommand: the group lists it with the table's help line, and the command is
    imported when it runs (or shows its own help)."""

    def __init__(self, name: str, target: str, short_help: str) -> None:
        super().__init__(name, short_help=short_help)
        self.target = target

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: object) -> click.Context:
        # the context belongs to the imported command, so click invokes that one
        command = _import_command(self.name or "", self.target, self.short_help or "")
        return command.make_context(info_name, args, parent, **extra)


def _import_command(name: str, target: str, short_help: str) -> click.Command:
    """The click command `target` ("module:attribute") names, or a stand-in when its area's packages are absent."""
    module_name, attribute = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and error.name.split(".")[0] == "fedzoo":
            raise
        return _missing_command(name, short_help, error)
    command = getattr(module, attribute)
    command.short_help = command.short_help or short_help
    return command


def _missing_command(name: str, short_help: str, error: ModuleNotFoundError) -> click.Command:
    """A stand-in that explains which extra to install when an area's dependencies are absent."""

    @click.command(name=name, short_help=f"{short_help} (unavailable: {error.name} is not installed)")
    def unavailable() -> None:
        raise click.ClickException(
            f"'fedzoo {name}' needs the package {error.name!r}, which is not installed; "
            "install the matching extra, e.g. pip install 'fedzoo[all]'"
        )

    return unavailable


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fedzoo")
def cli() -> None:
    """fedzoo: build a model zoo, serve each device the best model it can afford, improve it by FL."""


@click.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the completion script for SHELL; e.g. add `eval "$(fedzoo completion bash)"` to ~/.bashrc,
    or `fedzoo completion fish > ~/.config/fish/completions/fedzoo.fish`."""
    script_class = get_completion_class(shell)
    assert script_class is not None  # click knows all three shells
    click.echo(script_class(cli, {}, PROG_NAME, COMPLETE_VAR).source())


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turning fedzoo's own errors into one-line messages instead of tracebacks."""
    try:
        cli.main(args=argv, prog_name=PROG_NAME, complete_var=COMPLETE_VAR, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except FedzooError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)
