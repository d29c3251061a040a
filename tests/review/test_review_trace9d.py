"""The misjudgements an independent trace of `kilonode diff` (9d) found on research-7500 when a pull request
onboarded team robotics with 500 nodes on the autoscaled h100-ib pool (a `teams:` entry): the review said
node-identity-denied and fleet-rollout, and missed that

- the team's 5 scale sets (000-004, shared and autoscaled before) lose `ignoreChanges: sku.capacity`
  (kilonode.azure.node_pool ignores it only for the autoscaler's node groups, and a team's shards are none),
  so `pulumi up` sets each to the plan's 100 VMs from wherever the autoscaler left it (as low as its min of
  50): up to 250 H100 VMs at once (`capacity-takes-over`);
- the 20 shared node groups' min sizes fall from 50 to 38 and 37 (the pool's floor of 1,250 now counts the
  team's fixed 500), so the autoscaler may remove 1,250 of their 2,000 nodes instead of 1,000
  (`autoscaler-floor-lowered`).

The head is recorded as kilonode.review.snapshot records it (plan, render and the mock engine's graph) from the
stack file with the team added."""

from __future__ import annotations

import copy
import functools
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from kilonode.config import load_stack
from kilonode.plan import plan_stack
from kilonode.render.cluster import render_tree
from kilonode.review import nodes
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.risks import Risk, assess
from kilonode.review.snapshot import entry
from tests.graphcache import recorded
from tests.review.snapshots import snapshot
from tests.shared import SHIPPED_STACKS

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
STACK_FILE = Path(__file__).resolve().parents[2] / "stacks" / f"Pulumi.{STACK}.yaml"
VMSS = "azure-native:compute:VirtualMachineScaleSet"
TEAM_SETS = tuple(f"{STACK}-h100-ib-{i:03d}" for i in range(5))
SHARED_SETS = tuple(f"{STACK}-h100-ib-{i:03d}" for i in range(5, 25))
GPU_THRESHOLD = "--scale-down-gpu-utilization-threshold="


def findings(head: dict[str, Any], base: dict[str, Any] | None = None) -> list[Finding]:
    """kilonode.review.nodes' findings alone (both rules are there): the whole review takes seconds a call."""
    return nodes.assess(compare_stack(STACK, base if base is not None else snapshot(STACK), head))


@functools.cache
def _onboarding_risks() -> tuple[Risk, ...]:
    """The whole review of the onboarding, once."""
    return tuple(assess(compare_stack(STACK, snapshot(STACK), robotics()), {}))


def rule(found: Sequence[Risk | Finding], name: str) -> list[Any]:
    return [r for r in found if r.rule == name]


@functools.cache
def _with_robotics() -> dict[str, Any]:
    """The head's snapshot with `teams: [..., {name: robotics, pool: h100-ib, nodes: 500}]` (firstShard left to
    the plan: the first free run, 000-004; `kilonode allocate` would record it)."""
    document = yaml.safe_load(STACK_FILE.read_text())
    document["config"]["kilonode:cluster"]["teams"].append({"name": "robotics", "pool": "h100-ib", "nodes": 500})
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "stacks"
        folder.mkdir()
        (folder / STACK_FILE.name).write_text(yaml.safe_dump(document, sort_keys=False))
        stack = load_stack(STACK, folder)
        plan = plan_stack(stack)
        files = {path: f.content for path, f in render_tree(stack.config, plan).items()}
        return entry(plan, files, recorded(stack))


def robotics() -> dict[str, Any]:
    return copy.deepcopy(_with_robotics())


def _scale_set(side: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [r for r in side["resources"] if r["type"] == VMSS and r["name"] == name]
    return found


def _autoscaler_args(side: dict[str, Any]) -> list[str]:
    [deployment] = [r for r in side["resources"] if r["type"] == "kubernetes:apps/v1:Deployment"
                    and r["inputs"]["metadata"]["name"] == "cluster-autoscaler"]
    [container] = deployment["inputs"]["spec"]["template"]["spec"]["containers"]
    lists = [container.get(key) or [] for key in ("command", "args")]
    [args] = [words for words in lists if any(str(w).startswith("--nodes=") for w in words)]
    found: list[str] = args
    return found  # the list itself: a test edits the flags in place


# --- what the recorded head holds -------------------------------------------------------------------------------


def test_the_recorded_head_drops_the_capacity_ignore_on_the_teams_scale_sets_only() -> None:
    base, head = snapshot(STACK), robotics()
    for name in TEAM_SETS:
        assert _scale_set(base, name)["ignoreChanges"] == ["sku.capacity"]
        assert _scale_set(head, name)["ignoreChanges"] == []
        assert _scale_set(head, name)["inputs"]["sku"]["capacity"] == 100
    assert all(_scale_set(head, name)["ignoreChanges"] == ["sku.capacity"] for name in SHARED_SETS)
    nodes_flags = [a for a in _autoscaler_args(head) if a.startswith("--nodes=")]
    assert len(nodes_flags) == 20 and not any(name + "\n" in "\n".join(nodes_flags) + "\n" for name in TEAM_SETS)
    assert f"--nodes=38:100:{STACK}-h100-ib-005" in nodes_flags and f"--nodes=37:100:{STACK}-h100-ib-024" in nodes_flags


# --- the onboarding -----------------------------------------------------------------------------------------------


def test_onboarding_a_team_on_an_autoscaled_gpu_pool_says_the_capacity_takes_over() -> None:
    found = _onboarding_risks()
    assert rule(found, "node-identity-denied") and rule(found, "fleet-rollout")  # what the review said already
    [taken] = rule(found, "capacity-takes-over")
    assert taken.level == HIGH and taken.subjects == TEAM_SETS
    said = taken.summary
    assert said.startswith("pool h100-ib: 5 scale set(s) go from autoscaler-owned to program-owned capacity")
    assert "they become team robotics's and leave the autoscaler's node groups" in said
    assert "h100-ib-000 100 (autoscaler 50:100: up to 50 created)" in said
    assert "h100-ib-004 100 (autoscaler 50:100: up to 50 created)" in said
    assert "up to 250 Standard_ND96isr_H100_v5 VMs created at once (2,000 GPUs, 24,000 vCPUs" in said
    assert "deleted" not in said  # the autoscaler's max was the plan's 100: none can be above it
    assert "PUTs a scale set's whole model" in said and "whatever the autoscaler left it at" in said
    assert "`az vmss scale --new-capacity`" in said and "onboard the team's nodes in steps" in said
    assert "keep the pool's shards autoscaled" in said


def test_onboarding_a_team_on_an_autoscaled_pool_says_the_shared_floor_falls() -> None:
    [lowered] = rule(_onboarding_risks(), "autoscaler-floor-lowered")
    assert lowered.level == MEDIUM and lowered.subjects == SHARED_SETS
    said = lowered.summary
    assert said.startswith("pool h100-ib: the cluster autoscaler's min size falls on 20 node group(s) "
                           "(50 -> 37, 50 -> 38; --nodes=min:max:set)")
    assert "it may remove up to 1,250 of their 2,000 nodes, was 1,000: 250 more (down to 750)" in said
    assert "no running job is drained" in said  # kilonode's GPU threshold: only nodes without a GPU pod go
    assert "autoscaling.minNodes 1,250 -> 1,500" in said


def test_a_gpu_threshold_that_drains_running_nodes_makes_the_lowered_floor_high() -> None:
    head = robotics()
    args = _autoscaler_args(head)
    [at] = [i for i, a in enumerate(args) if a.startswith(GPU_THRESHOLD)]
    args[at] = GPU_THRESHOLD + "0.5"
    [lowered] = rule(findings(head), "autoscaler-floor-lowered")
    assert lowered.level == HIGH and "stops the whole job" in lowered.summary


def test_a_scale_set_the_autoscaler_may_hold_above_the_plan_says_the_vms_deleted() -> None:
    head = robotics()
    _scale_set(head, TEAM_SETS[0])["inputs"]["sku"]["capacity"] = 80
    [taken] = rule(findings(head), "capacity-takes-over")
    assert "h100-ib-000 80 (autoscaler 50:100: up to 30 created, or up to 20 deleted)" in taken.summary
    assert "up to 230 Standard_ND96isr_H100_v5 VMs created" in taken.summary
    assert "up to 20 VMs deleted in all" in taken.summary and "no cordon and no drain" in taken.summary


def test_a_pool_no_longer_autoscaled_says_so() -> None:
    head = snapshot(STACK)
    for name in (*TEAM_SETS, *SHARED_SETS):
        _scale_set(head, name)["ignoreChanges"] = []
    [taken] = rule(findings(head), "capacity-takes-over")
    assert taken.level == HIGH and len(taken.subjects) == 25 and "the pool is no longer autoscaled" in taken.summary
    assert "up to 1,250 Standard_ND96isr_H100_v5 VMs created at once" in taken.summary
    assert "more than the 327 joins a minute the apiservers are sized for" in taken.summary


# --- what says nothing ------------------------------------------------------------------------------------------


def test_removing_the_team_again_says_neither() -> None:
    # the scale sets go back to the autoscaler (ignored again) and the floors rise: no capacity or floor finding
    found = findings(snapshot(STACK), base=robotics())
    assert not rule(found, "capacity-takes-over") and not rule(found, "autoscaler-floor-lowered")


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_a_shipped_stack_unchanged_says_neither(stack: str) -> None:
    diff = compare_stack(stack, snapshot(stack), snapshot(stack))
    assert nodes.capacity_takes_over(diff) == [] and nodes.floors_lowered(diff) == []
