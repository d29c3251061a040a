"""Commands for a platform team's own infrastructure repository: `new` and `schema`."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Annotated

import typer

from kilonode.cli.common import die, out

PROGRAM = '''"""Pulumi program: one cluster per stack (stacks/Pulumi.<stack>.yaml), built by kilonode."""

from kilonode.azure.program import main

main()
'''

GITIGNORE = "venv/\nout/\nbuild/\n__pycache__/\n"


def _pyproject_version() -> str:
    try:
        return package_version("kilonode")
    except PackageNotFoundError:  # a source checkout that was never installed
        return "0.1.0"


def _project_yaml(name: str) -> str:
    return (
        f"name: {name}\n"
        "description: GPU Kubernetes clusters on Azure, one stack per cluster (stacks/), built by kilonode\n"
        "runtime:\n"
        "  name: python\n"
        "  options:\n"
        "    virtualenv: venv\n"
        "# the program is __main__.py in this folder; the stack files live in stacks/\n"
        "stackConfigDir: stacks\n"
    )


def new(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="A new or empty directory for the project.")],
    stack: Annotated[str, typer.Option("--stack", help="The first stack's name (stacks/Pulumi.<stack>.yaml).")] = "dev",
    name: Annotated[
        str | None,
        typer.Option("--name", help="The cluster's name (default: DIR's name, lowercased; it prefixes Azure names)."),
    ] = None,
) -> None:
    """Scaffold a Pulumi project for your clusters in your own repository, pinned to this kilonode.

    Writes Pulumi.yaml (stackConfigDir: stacks), __main__.py (a few lines that call kilonode),
    requirements.txt (kilonode pinned to this version), .gitignore, and stacks/Pulumi.<stack>.yaml:
    the required keys set and every other key commented with its default and why. Then:
    `cd DIR && kilonode validate <stack>`; STACK names resolve in the current project's stacks.
    """
    # imported here: the model and its reference are the bulk of `--help`'s import time otherwise
    from kilonode.config.model import NAME_PATTERN
    from kilonode.config.reference import starter_stack

    cluster = name or re.sub(r"[^a-z0-9-]+", "-", directory.resolve().name.lower()).strip("-")
    if not re.fullmatch(NAME_PATTERN, cluster):
        die(f"{cluster!r} is not a valid cluster name (1-32 of a-z, 0-9 and '-', starting with a letter); "
            "pass --name")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", stack):
        die(f"{stack!r} is not a valid stack name (letters, digits, '_', '.', '-'); pass another --stack")
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        die(f"{directory} exists and is not an empty directory; choose a new one")
    files = {
        "Pulumi.yaml": _project_yaml(cluster),
        "__main__.py": PROGRAM,
        "requirements.txt": f"# the kilonode this project's stacks were written for; raise it deliberately\n"
                            f"kilonode=={_pyproject_version()}\n",
        ".gitignore": GITIGNORE,
        f"stacks/Pulumi.{stack}.yaml": starter_stack(cluster, stack),
    }
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
        for rel, text in files.items():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_text(text, encoding="utf-8")
        os.chmod(staging, 0o755)
        if directory.exists():
            directory.rmdir()  # empty, checked above
        os.rename(staging, directory)
    except OSError as error:
        shutil.rmtree(locals().get("staging", directory / ".nothing"), ignore_errors=True)
        die(f"cannot create {directory}: {error.strerror or error}; nothing was written")
    for rel in files:
        out.print(f"  wrote {directory / rel}")
    out.print(f"[green]✓[/] project for cluster '{cluster}' in {directory}. Next: cd {directory} && "
              f"kilonode validate {stack}")


def schema() -> None:
    """Print the stack file's JSON Schema (from kilonode's own model, with every key's reason).

    Point your editor at it for completion and checks, for example with the YAML language
    server: `# yaml-language-server: $schema=./kilonode-stack.schema.json` at the top of a stack
    file after `kilonode schema > kilonode-stack.schema.json`.
    """
    from kilonode.config.reference import stack_file_schema

    sys.stdout.write(json.dumps(stack_file_schema(), indent=2) + "\n")
