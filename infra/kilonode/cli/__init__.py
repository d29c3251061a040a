"""`kilonode`: a thin command line over config -> plan -> render, the Azure program and the
node image. One registry of commands (COMMANDS, and `image` as a group); the command modules
share kilonode.cli.common and never import each other or this package.

Every command takes STACK: a stack name in stacks/ (`research-7500`) or a path to a stack
file. A stack with problems exits 2 and prints one line per problem: file:line, field,
what is wrong and what to do; nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Annotated, Any

import typer

from kilonode.cli import diff, gpu, image, local, plan, project, stack
from kilonode.cli.common import out, run


def _version() -> str:
    try:
        return package_version("kilonode")
    except PackageNotFoundError:  # a source checkout that was never installed
        return "0+unknown"


app = typer.Typer(
    name="kilonode",
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
        raise typer.Exit()


@app.callback()
def _root(
    _show_version: Annotated[
        bool,
        typer.Option("--version", help="Print kilonode's version and exit.", is_eager=True, callback=_print_version),
    ] = False,
) -> None:
    """Stand up and tune very large GPU Kubernetes clusters on Azure."""


# The registry: (name, function) in the order `--help` lists them.
COMMANDS: list[tuple[str, Callable[..., Any]]] = [
    ("validate", stack.validate),
    ("allocate", stack.allocate),
    ("render", stack.render),
    ("explain", stack.explain),
    ("plan", plan.plan_command),
    ("diff", diff.diff),
    ("new", project.new),
    ("schema", project.schema),
    ("gpu-health", gpu.gpu_health),
]
for _name, _function in COMMANDS:
    app.command(_name)(_function)
app.add_typer(image.image_app, name="image")
app.add_typer(local.local_app, name="local")


def main() -> None:
    """The console entry point (through kilonode.entry)."""
    run(app)
