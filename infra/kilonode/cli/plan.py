"""`kilonode plan STACK`: the Pulumi program's resource graph, from Pulumi's mock engine."""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import Annotated

import typer

from kilonode.cli.common import StackArg, load_and_plan


class PlanFormat(StrEnum):
    text = "text"
    json = "json"
    md = "md"


def plan_command(
    stack: StackArg,
    output_format: Annotated[
        PlanFormat, typer.Option("--format", help="text (readable), json (for tools and diffs) or md.")
    ] = PlanFormat.text,
) -> None:
    """Show every Azure resource `pulumi up` would create for a stack, without Azure.

    Runs the Pulumi program under Pulumi's mock engine and prints each resource's type,
    name, parent and inputs in a stable order (secrets as [secret], no key material),
    then the count per type. Nothing is sent to Azure; no credentials are needed.
    """
    # Imported here: Pulumi costs ~0.5 s to import, which no other command should pay.
    # Validation and planning run first so a bad stack exits 2 with its problems.
    from kilonode.azure.graph import format_json, format_markdown, format_text
    from kilonode.azure.mockplan import run_plan
    from kilonode.k8s.gpu import describe

    loaded, plan = load_and_plan(stack)
    for warning in plan.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    graph = run_plan(loaded)
    # Who acts on GPU nodes and with which rights: the agent has no object of its own to show.
    graph.notes["GPU access"] = describe(plan)
    formatter = {PlanFormat.text: format_text, PlanFormat.json: format_json, PlanFormat.md: format_markdown}
    sys.stdout.write(formatter[output_format](graph))
