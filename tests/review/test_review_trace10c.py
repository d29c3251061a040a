"""The misjudgements a tenth independent trace of `kilonode diff` found on research-7500, each on the
stack's recorded snapshot changed as the pull request changes it (kilonode.review.inert):

1. too harsh: growing an InfiniBand pool (a100-ib 5,000 -> 5,200) gave the shared group's ten existing
   scale sets a fleet-rollout, where their custom data changes only by the fabric-label script's case
   arm for the new scale sets: nothing a running instance does changes (custom-data-inert); any other
   change to the group's rendered files still gives fleet-rollout;
2. too lenient: a pool's new SSH key said nothing, where it reaches no running node
   (ssh-keys-not-on-running-nodes)."""

from __future__ import annotations

import copy
import functools
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kilonode.config import load_stack
from kilonode.plan import plan_stack
from kilonode.render.cluster import render_tree
from kilonode.render.pool import FABRIC_SCRIPT, SYSCTL_FILE
from kilonode.review.compare import compare_stack
from kilonode.review.finding import MEDIUM
from kilonode.review.risks import Risk, assess
from kilonode.review.snapshot import entry
from tests.graphcache import recorded
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
STACK_FILE = Path(__file__).resolve().parents[2] / "stacks" / f"Pulumi.{STACK}.yaml"
SHARED = "pool-a100-ib"
OLD_SHARED = [f"{STACK}-a100-ib-{i:03d}" for i in range(40, 50)]
ONCALL_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIF7/gvcdgZ/qELRRjMVjXCsKG5QDZZEZp47fScSVuYAz oncall@example.com"


def risks(head: dict[str, Any], base: dict[str, Any] | None = None) -> list[Risk]:
    return assess(compare_stack(STACK, base if base is not None else snapshot(STACK), head), {})


def rule(found: list[Risk], name: str) -> list[Risk]:
    return [r for r in found if r.rule == name]


def _pool(cluster: dict[str, Any], name: str) -> dict[str, Any]:
    [pool] = [p for p in cluster["nodePools"] if p["name"] == name]
    return pool


def _built(edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The head's snapshot when the pull request edits the stack file's cluster value (as
    kilonode.review.snapshot records it: the plan, the render and the recorded graph)."""
    document = yaml.safe_load(STACK_FILE.read_text())
    edit(document["config"]["kilonode:cluster"])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "stacks"
        folder.mkdir()
        (folder / STACK_FILE.name).write_text(yaml.safe_dump(document, sort_keys=False))
        stack = load_stack(STACK, folder)
        plan = plan_stack(stack)
        files = {path: f.content for path, f in render_tree(stack.config, plan).items()}
        return entry(plan, files, recorded(stack))


@functools.cache
def _grown() -> dict[str, Any]:
    return _built(lambda c: _pool(c, "a100-ib").update(nodes=5200))


@functools.cache
def _keyed() -> dict[str, Any]:
    return _built(lambda c: c.setdefault("sshKeys", {}).update({"a100-ib": [ONCALL_KEY]}))


def grown() -> dict[str, Any]:
    return copy.deepcopy(_grown())


def _edit_script(head: dict[str, Any], old: str, new: str) -> None:
    """The same text edit in the shared group's fabric-label script and in its user-data's copy."""
    script = f"{SHARED}/{FABRIC_SCRIPT}"
    assert old in head["files"][script]
    head["files"][script] = head["files"][script].replace(old, new)
    head["files"][f"{SHARED}/user-data"] = head["files"][f"{SHARED}/user-data"].replace(old, new)


def test_shipped_stacks_unchanged_say_neither() -> None:
    found = risks(snapshot(STACK))
    assert not rule(found, "custom-data-inert") and not rule(found, "ssh-keys-not-on-running-nodes")
    assert not rule(found, "fleet-rollout")


# --- 1. a pool grown: the old scale sets' custom data changes by the new arms only --------------------------------


def test_growth_is_no_fleet_rollout_but_an_inert_custom_data_line() -> None:
    head = grown()
    assert "research-7500-a100-ib-05[0-1]) ;;" in head["files"][f"{SHARED}/{FABRIC_SCRIPT}"]
    found = risks(head)
    assert not rule(found, "fleet-rollout")
    [inert] = rule(found, "custom-data-inert")
    assert inert.level == MEDIUM and list(inert.subjects) == OLD_SHARED
    assert "pool-a100-ib (10, 1,000 nodes)" in inert.summary
    assert "`research-7500-a100-ib-05[0-1]`" in inert.summary
    assert "do not roll the pool for this" in inert.summary and "drain" not in inert.summary


def test_a_real_custom_data_change_in_the_grown_group_is_still_a_fleet_rollout() -> None:
    head = grown()
    head["files"][f"{SHARED}/{SYSCTL_FILE}"] += "net.core.somaxconn = 8192\n"
    found = risks(head)
    [rollout] = rule(found, "fleet-rollout")
    assert "pool-a100-ib (10)" in rollout.summary and "cordon and drain" in rollout.summary
    assert not rule(found, "custom-data-inert")


@pytest.mark.parametrize(("old", "new"), [
    # the script's other lines: its behaviour, not its arms
    ("exit 1", "exit 0"),
    # an arm that lets in an existing scale set of another group (team vision's 030-039)
    ("research-7500-a100-ib-05[0-1]) ;;", "research-7500-a100-ib-05[0-1]) ;;\n    research-7500-a100-ib-03[0-9]) ;;"),
    # an arm with a body: it does something
    ("research-7500-a100-ib-05[0-1]) ;;", "research-7500-a100-ib-05[0-1]) exit 1 ;;"),
    # an arm that is no plain glob
    ("research-7500-a100-ib-05[0-1]) ;;", "research-7500-a100-ib-05*) ;;"),
])
def test_any_other_script_change_keeps_the_fleet_rollout(old: str, new: str) -> None:
    head = grown()
    _edit_script(head, old, new)
    found = risks(head)
    assert rule(found, "fleet-rollout") and not rule(found, "custom-data-inert")


def test_a_user_data_that_differs_beyond_the_script_keeps_the_fleet_rollout() -> None:
    head = grown()
    head["files"][f"{SHARED}/user-data"] = head["files"][f"{SHARED}/user-data"].replace(
        "ssh_pwauth: false", "ssh_pwauth: true")
    found = risks(head)
    assert rule(found, "fleet-rollout") and not rule(found, "custom-data-inert")


def test_a_moved_join_token_keeps_the_fleet_rollout() -> None:
    head = grown()
    plan = yaml.safe_load(head["files"]["plan.yaml"])
    for token in plan["joinTokens"]:
        if token["pool"] == "a100-ib":
            token["generation"] = int(token.get("generation") or 0) + 1
    head["files"]["plan.yaml"] = yaml.safe_dump(plan)
    assert not rule(risks(head), "custom-data-inert")


# --- 2. a pool's SSH keys --------------------------------------------------------------------------------------


def test_a_pools_new_ssh_key_is_said_to_reach_no_running_node() -> None:
    found = risks(copy.deepcopy(_keyed()))
    [keys] = rule(found, "ssh-keys-not-on-running-nodes")
    assert keys.level == MEDIUM and len(keys.subjects) == 50
    assert "pool-a100-ib's SSH keys change (added: oncall@example.com" in keys.summary
    assert "none of its 5,000 running nodes" in keys.summary
    assert "az vmss run-command invoke" in keys.summary and "Getting a shell on a machine" in keys.summary
    assert "new instances at once" in keys.summary
    # the generated key it replaces has no private half anywhere: no offboarding warning for it
    assert "offboarding" not in keys.summary
    assert not rule(found, "fleet-rollout")


def test_a_removed_operator_key_is_said_to_keep_working() -> None:
    keyed = copy.deepcopy(_keyed())
    found = risks(snapshot(STACK), base=keyed)  # the reverse change: the on-call key removed
    [keys] = rule(found, "ssh-keys-not-on-running-nodes")
    assert "removed: oncall@example.com" in keys.summary and "offboarding" in keys.summary
