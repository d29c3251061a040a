"""`kilonode preflight`: a stack's bring-up traced offline across components."""

from __future__ import annotations

import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kilonode.cli.common import die, load_and_plan
from kilonode.exit_codes import ExitCode

if TYPE_CHECKING:
    from kilonode.preflight import Inputs


class PreflightFormat(StrEnum):
    text = "text"
    json = "json"


def preflight(
    stack: Annotated[
        str | None,
        typer.Argument(metavar="[STACK]", show_default=False,
                       help="A stack name in stacks/ or a path to a stack file: rendered and recorded here. Leave "
                       "it out to check saved artefacts (--render and --graph)."),
    ] = None,
    render: Annotated[
        Path | None, typer.Option("--render", metavar="DIR", help="A directory `kilonode render STACK --out DIR` "
                                  "wrote (with --graph, instead of STACK).")
    ] = None,
    graph: Annotated[
        Path | None, typer.Option("--graph", metavar="FILE", help="The saved output of `kilonode plan STACK "
                                  "--format json` (with --render).")
    ] = None,
    images: Annotated[
        Path | None, typer.Option("--images", metavar="DIR", help="Built images (`kilonode image build --out`): "
                                  "their manifests say what each image really holds.")
    ] = None,
    check: Annotated[
        list[str] | None, typer.Option("--check", metavar="NAME", help="Run only this check (repeatable).")
    ] = None,
    output_format: Annotated[
        PreflightFormat, typer.Option("--format", help="text (readable) or json (a list of findings).")
    ] = PreflightFormat.text,
    at: Annotated[
        str | None, typer.Option("--at", metavar="TIME", help="Judge expiries (the join tokens) as of this time, "
                                 "RFC 3339 with a zone (2027-01-31T00:00:00Z), not now: check a stack for a planned "
                                 "bring-up date. Default: now, or KILONODE_NOW when set.")
    ] = None,
) -> None:
    """Trace a stack's bring-up offline and name the first break of each chain; exit 1 on one.

    From what kilonode produces for the stack (the resolved plan and every host's files, the
    Pulumi program's recorded resource graph, built images' manifests when given), follow
    each role from power-on to a running workload across components: that the machine running
    `pulumi up` reaches what the program calls (deployer-path), that every program a unit or
    conflist names is in the image at a compatible version (binaries), what resolvers pods get
    (pod-dns), that every workload the program creates can be placed on the nodes that exist at
    bootstrap (scheduling), disk room for each writer (disks), names Azure wants unique and the
    quota and rights the deployment needs (azure-names, quota), and the registry pulls before
    nodes run their pods (boot-pulls).

    Each finding: the check, its level (break: bring-up stops there; warn: it works at a cost),
    where, what happens on a running cluster, and the fix. Exit 0 without breaks, 1 with one, 2
    when the input cannot be read. `pulumi up` runs the same checks and refuses on a break.
    """
    from kilonode.preflight import CHECKS, InputError, breaks, run
    from kilonode.preflight.model import NOW_ENV, parse_time
    from kilonode.preflight.report import format_json, format_text

    unknown = sorted(set(check or ()) - {c.name for c in CHECKS})
    if unknown:  # before the stack is rendered and recorded: that takes seconds
        die(f"no check named {', '.join(unknown)} (checks: {', '.join(c.name for c in CHECKS)})", "kilonode preflight")
    try:
        if at is not None:  # one clock for the whole run, the Pulumi program's recording included
            os.environ[NOW_ENV] = parse_time(at, "--at").isoformat()
        inputs = _inputs(stack, render, graph, images)
        findings = run(inputs, check or ())
    except (InputError, ValueError) as error:
        die(str(error), "kilonode preflight")
    formatter = format_json(findings) if output_format is PreflightFormat.json else \
        format_text(findings, inputs.source, check or ())
    sys.stdout.write(formatter)
    raise typer.Exit(ExitCode.FAILED if breaks(findings) else ExitCode.OK)


def _inputs(stack: str | None, render: Path | None, graph: Path | None, images: Path | None) -> Inputs:
    from kilonode.preflight.load import from_directories, images_from_dir

    if stack is not None:
        if render or graph:
            die("give STACK, or --render and --graph, not both", "kilonode preflight")
        return stack_inputs(stack, images_from_dir(images) if images else None)
    if render is None or graph is None:
        die("give STACK, or both --render DIR and --graph FILE (see --help)", "kilonode preflight")
    return from_directories(render, graph, images)


def stack_inputs(ref: str, images: dict | None = None) -> Inputs:  # type: ignore[type-arg]
    """A stack rendered and recorded here (the render and the mock engine's graph in memory)."""
    # Imported here: Pulumi's mock engine costs ~0.5 s to import
    from kilonode.azure.mockplan import run_plan
    from kilonode.preflight.load import from_parts
    from kilonode.render.cluster import render_tree

    loaded, plan = load_and_plan(ref)
    files = {path: file.content for path, file in render_tree(loaded.config, plan).items()}
    return from_parts(plan, files, run_plan(loaded).to_json(), images, source=f"stack {loaded.name} ({loaded.file})")
