"""What every command shares: the consoles, STACK, loading a stack, and the one mapping from
error types to messages and exit codes (kilonode.exit_codes: STOPPED, 2, a command stopped;
FAILED, 1, checks ran and failed, which the command itself reports). Command modules import this, never each other."""

from __future__ import annotations

import inspect
import subprocess
import sys
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
import typer.main
from rich.console import Console
from rich.markup import escape

from kilonode.exit_codes import ExitCode
from kilonode.problems import StackError, shown_lines

if TYPE_CHECKING:
    from kilonode.config import Stack
    from kilonode.plan import ClusterPlan

out = Console(highlight=False)
if not out.is_terminal:
    # piped or in CI: rich would assume 80 columns and wrap every table row
    out = Console(width=160, highlight=False)
err = Console(stderr=True, soft_wrap=True, highlight=False)  # an error stays one line, whatever the width

StackArg = Annotated[
    str,
    typer.Argument(
        metavar="STACK",
        help="A stack name in stacks/ (e.g. local, research-7500) or a path to a stack file.",
        show_default=False,
    ),
]


def load_and_plan(ref: str) -> tuple[Stack, ClusterPlan]:
    """Load, validate and plan a stack, or print its problems and exit 2: every command that takes
    STACK comes through here (the Pulumi program through the same loader and checked_plan)."""
    # imported here: `--help` and the commands that take no stack never pay for them
    from kilonode.azure.custom_data_size import refuse_oversized, user_data
    from kilonode.config import load_stack
    from kilonode.plan import checked_plan
    from kilonode.render import render_cluster

    try:
        stack = load_stack(ref)
        plan = checked_plan(stack)
        refuse_oversized(stack, plan, user_data(render_cluster(plan)))
        return stack, plan
    except StackError as error:
        fail(error)


def fail(error: StackError) -> NoReturn:
    """A stack's problems: a header, then one plain line per problem (at most
    kilonode.problems.MAX_PROBLEM_BYTES of them, then how many more); exit 2."""
    fail_lines(error.file, [problem.format(error.file) for problem in error.problems])


def fail_lines(file: str, lines: list[str]) -> NoReturn:
    """fail() for problems already formatted (`kilonode diff` reads them from a snapshot)."""
    count = len(lines)
    err.print(f"[bold red]kilonode:[/] {count} problem{'s' * (count != 1)} in {escape(file)}; nothing was written")
    shown, hidden = shown_lines(lines)
    for line in shown:
        # plain print: a problem line must stay one line, whatever the terminal width
        print(line, file=sys.stderr)
    if hidden:
        err.print(f"[bold red]kilonode:[/] {hidden} more not shown; fix these and run again")
    raise typer.Exit(code=ExitCode.STOPPED)


def die(message: str, command: str = "kilonode") -> NoReturn:
    """One line, exit 2: the command could not do its job (bad input, an unusable path, a tool)."""
    err.print(f"[bold red]{command}:[/] {message}")
    raise typer.Exit(code=ExitCode.STOPPED)


def describe(error: BaseException) -> str | None:
    """The one line for an expected failure, or None for a bug (which keeps its traceback)."""
    if isinstance(error, subprocess.CalledProcessError):
        command = " ".join(map(str, error.cmd)) if isinstance(error.cmd, list | tuple) else str(error.cmd)
        detail = error.stderr or error.output or b""
        text = detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
        last = text.strip().splitlines()[-1:] or [""]
        return f"`{command[:200]}` failed with exit status {error.returncode}" + (f": {last[0]}" if last[0] else "")
    if isinstance(error, subprocess.TimeoutExpired):
        return f"`{' '.join(map(str, error.cmd))[:200]}` did not finish within {error.timeout:.0f} s"
    if isinstance(error, OSError):
        where = f"{error.filename}: " if error.filename else ""
        return f"{where}{error.strerror or error}"
    if isinstance(error, RuntimeError):
        text = str(error).strip()
        return text.splitlines()[0] if text else type(error).__name__
    return None


def reflow(text: str) -> str:
    """A docstring's paragraphs as single lines: the source wraps them at 100 columns, and
    typer's rich help would keep each of those line breaks inside the terminal's own wrapping.
    Lists (lines starting with "-") and indented blocks keep their lines."""
    paragraphs = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        lines = paragraph.splitlines()
        if any(line.lstrip().startswith("- ") or line.startswith(" ") for line in lines):
            paragraphs.append(paragraph)
        else:
            paragraphs.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(paragraphs)


def reflow_help(command: Any) -> None:  # a click command of typer's (typer bundles click)
    """`reflow` the help of `command` and of every subcommand it has built."""
    if command.help:
        command.help = reflow(command.help)
    for sub in getattr(command, "commands", {}).values():
        reflow_help(sub)


def run(app: typer.Typer) -> None:
    """Run `app`; every expected failure ends as one line per problem and exit 2."""
    try:
        if isinstance(app, typer.Typer):
            command = typer.main.get_command(app)
            reflow_help(command)  # the root; the registry reflows each command as it loads it
            command()
        else:  # a plain callable (the tests stand one in for the app)
            app()
    except StackError as error:
        try:
            fail(error)
        except typer.Exit as done:
            sys.exit(done.exit_code)
    except Exception as error:
        message = describe(error)
        if message is None:
            raise
        err.print(f"[bold red]kilonode:[/] {message}")
        sys.exit(ExitCode.STOPPED)
