"""`kilonode`: a thin command line over config -> plan -> render, the Azure program and the
node image. One registry of commands (COMMANDS: the plain commands and the `image` and
`local` groups); the command modules share kilonode.cli.common and never import each other
or this package.

The registry names each command's module and attribute, and a command's module is imported
only when that command runs or its help is shown: `kilonode validate` loads the stack
commands alone, never the review, the image build or Pulumi.

Every command takes STACK: a stack name in stacks/ (`research-7500`) or a path to a stack
file. A stack with problems exits 2 and prints one line per problem: file:line, field,
what is wrong and what to do; nothing is written.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Annotated

import typer
import typer.core
import typer.main
import typer.models

from kilonode.cli.common import out, reflow_help, run
from kilonode.exit_codes import ExitCode

# The registry: command name -> "module:attribute" under kilonode.cli, in the order `--help`
# lists them. The attribute is a function (a command) or a typer.Typer (a group of them).
COMMANDS: dict[str, str] = {
    "validate": "stack:validate",
    "allocate": "stack:allocate",
    "render": "stack:render",
    "explain": "stack:explain",
    "plan": "plan:plan_command",
    "preflight": "preflight:preflight",
    "diff": "diff:diff",
    "fleet": "fleet:fleet",
    "new": "project:new",
    "schema": "project:schema",
    "gpu-health": "gpu:gpu_health",
    "gpu": "gpu:gpu_app",
    "image": "image:image_app",
    "rollout": "rollout:rollout_app",
    "upgrade": "upgrade:upgrade",
    "local": "local:local_app",
}


def _version() -> str:
    try:
        return package_version("kilonode")
    except PackageNotFoundError:  # a source checkout that was never installed
        return "0+unknown"


class LazyCommands(typer.core.TyperGroup):
    """The root group: lists COMMANDS without importing them and builds a command (its module
    imported, its help reflowed) the first time it is asked for."""

    def list_commands(self, ctx: typer.core.click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: typer.core.click.Context, cmd_name: str) -> typer.core.click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self.commands[cmd_name] = _load(cmd_name)
        return self.commands.get(cmd_name)


def _load(name: str) -> typer.core.click.Command:
    """The click command for a registry entry, built as `app.command(name)` or
    `app.add_typer(group, name=name)` would have built it."""
    module, attribute = COMMANDS[name].split(":")
    target = getattr(import_module(f"{__name__}.{module}"), attribute)
    settings = {"pretty_exceptions_short": app.pretty_exceptions_short, "rich_markup_mode": app.rich_markup_mode}
    command: typer.core.click.Command
    if isinstance(target, typer.Typer):
        command = typer.main.get_group_from_info(
            typer.models.TyperInfo(target, name=name), suggest_commands=app.suggest_commands, **settings
        )
    else:
        command = typer.main.get_command_from_info(typer.models.CommandInfo(name=name, callback=target), **settings)
    reflow_help(command)
    return command


app = typer.Typer(
    name="kilonode",
    cls=LazyCommands,
    help=(
        "Stand up and tune very large GPU Kubernetes clusters on Azure. "
        "One stack file (stacks/Pulumi.<stack>.yaml) describes one cluster; kilonode validates "
        "it, resolves the plan (names, static IPs, subnets, scale-set shards, budgets against "
        "Azure and etcd limits), records its addresses, renders every node's artefacts, shows the "
        "Azure resource graph and builds and verifies node images."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        out.print(f"kilonode {_version()}")
        raise typer.Exit(code=ExitCode.OK)


@app.callback()
def _root(
    _show_version: Annotated[
        bool,
        typer.Option("--version", help="Print kilonode's version and exit.", is_eager=True, callback=_print_version),
    ] = False,
) -> None:
    """Stand up and tune very large GPU Kubernetes clusters on Azure."""


def main() -> None:
    """The console entry point (through kilonode.entry)."""
    run(app)
