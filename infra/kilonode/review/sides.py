"""Each side of a stack's change as preflight reads it: the rules that judge a change with
preflight's own models (where a workload can run, which NSG rule decides a connection) build
kilonode.preflight.model.Inputs from the side's snapshot (its plan.yaml, rendered files and
recorded resources) and run preflight's code on it, so that the review and preflight never
disagree about the same artefacts.

A side whose plan.yaml this kilonode cannot read (a base from before a change to the plan's
schema) has no inputs; the rules that need them say what they could not judge (`why_not`).
Built once per side and kept on the StackDiff (both rules read them).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ValidationError

from kilonode.plan.model import ClusterPlan
from kilonode.preflight.load import from_parts
from kilonode.preflight.model import InputError, Inputs
from kilonode.review.compare import StackDiff
from kilonode.review.lifecycle import plan_of

Which = Literal["base", "head"]


def inputs(diff: StackDiff, side: Which) -> Inputs | None:
    """The side's preflight inputs, or None (the stack is absent there, does not load, or its
    plan does not read as this kilonode's ClusterPlan: `why_not` says which)."""
    key = f"inputs:{side}"
    if key not in diff.derived:
        diff.derived[key] = _build(diff, side)
    built, _ = diff.derived[key]
    return built


def why_not(diff: StackDiff, side: Which) -> str | None:
    inputs(diff, side)
    _, why = diff.derived[f"inputs:{side}"]
    return why


def _build(diff: StackDiff, side: Which) -> tuple[Inputs | None, str | None]:
    entry = diff.base if side == "base" else diff.head
    if not entry or "error" in entry:
        return None, f"the stack does not load at the {side}"
    files = entry.get("files") or {}
    if not files.get("plan.yaml"):
        return None, f"the {side} recorded no plan.yaml"
    try:
        plan = ClusterPlan.model_validate(plan_of(entry))
        built = from_parts(plan, files, {"resources": entry.get("resources") or [], "outputs": entry.get("outputs")},
                           source=f"{diff.stack} at the {side}")
    except (ValidationError, InputError, ValueError) as error:
        first = str(error).splitlines()[0]
        return None, f"the {side}'s plan.yaml does not read as this kilonode's plan ({first})"
    return built, None
