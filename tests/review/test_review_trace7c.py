"""The misjudgements a seventh independent trace of `kilonode diff` found on research-7500, each on the
stack's recorded snapshot changed as the pull request changes it: an ephemeral port range over the nodes'
listeners (preflight's port-range check, told by preflight-break), a removed team's join tokens and its
fleet rollout, the rollout advice of a pool without InfiniBand, a PriorityClass's immutable fields, and a
head whose stack file no longer loads."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from kilonode.config import load_stack
from kilonode.plan import plan_stack
from kilonode.problems import StackError
from kilonode.render.cluster import render_tree
from kilonode.render.pool import SYSCTL_FILE
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, MEDIUM
from kilonode.review.refs import Side
from kilonode.review.report import Review
from kilonode.review.risks import Risk, assess
from kilonode.review.snapshot import entry
from tests.graphcache import recorded
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
STACK_FILE = Path(__file__).resolve().parents[2] / "stacks" / f"Pulumi.{STACK}.yaml"
PRIORITY_CLASS = "kubernetes:scheduling.k8s.io/v1:PriorityClass"
VMSS = "azure-native:compute:VirtualMachineScaleSet"


def risks(head: dict[str, Any], base: dict[str, Any] | None = None) -> list[Risk]:
    return assess(compare_stack(STACK, base if base is not None else snapshot(STACK), head), {})


def rule(found: list[Risk], name: str) -> list[Risk]:
    return [r for r in found if r.rule == name]


def _edited(tmp: Path, edit: Any) -> Path:
    """The stack file with `edit` applied to its cluster value, in a stacks folder of its own."""
    document = yaml.safe_load(STACK_FILE.read_text())
    edit(document["config"]["kilonode:cluster"])
    folder = tmp / "stacks"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / STACK_FILE.name).write_text(yaml.safe_dump(document, sort_keys=False))
    return folder


@functools.cache
def _without_vision() -> dict[str, Any]:
    """The head's snapshot when the pull request removes team vision (as kilonode.review.snapshot
    records it: the plan, the render and the recorded graph)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        folder = _edited(Path(tmp), lambda c: c.update(teams=[t for t in c["teams"] if t["name"] != "vision"]))
        stack = load_stack(STACK, folder)
        plan = plan_stack(stack)
        files = {path: f.content for path, f in render_tree(stack.config, plan).items()}
        return entry(plan, files, recorded(stack))


def test_an_unchanged_stack_says_none_of_it() -> None:
    found = risks(snapshot(STACK))
    assert not rule(found, "preflight-break") and not rule(found, "join-token-rotated")
    assert not rule(found, "fleet-rollout") and not rule(found, "stack-invalid")


# --- 1. an ephemeral port range over the nodes' listeners -------------------------------------------------------


def test_a_port_range_from_1024_is_a_preflight_break_naming_the_listeners() -> None:
    head = snapshot(STACK)
    for path in [p for p in head["files"] if p.startswith("pool-") and p.endswith("/" + SYSCTL_FILE)]:
        head["files"][path] += "net.ipv4.ip_local_port_range = 1024 65535\n"
    breaks = [r for r in rule(risks(head), "preflight-break") if "port-range" in r.summary]
    assert breaks and all(r.level == HIGH for r in breaks)
    said = " ".join(r.summary for r in breaks)
    assert "kubelet 10250" in said and "NodePorts 30000-32767" in said and "EADDRINUSE" in said


# --- 2. and 3. a team removed -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_removing_a_team_tells_its_deleted_tokens_and_one_rollout_line() -> None:
    found = risks(copy.deepcopy(_without_vision()))
    [orphaned] = [r for r in rule(found, "join-token-rotated") if "registration group" in r.summary]
    assert orphaned.level == MEDIUM
    assert "pool-a100-ib.team-vision's join-token Secrets are deleted (2)" in orphaned.summary
    assert "10 scale set(s) remain, now pool-a100-ib" in orphaned.summary
    assert "upgrade the instances to the new model" in orphaned.summary.lower()
    assert "keep the old token until then" in orphaned.summary
    assert all("bootstrap-token-a100-ib-team-vision" in s for s in orphaned.subjects)
    [rollout] = rule(found, "fleet-rollout")
    assert "every scale set of pool-a100-ib (20; 10 of them move from team-vision to the shared group)" \
        in rollout.summary
    assert len(rollout.subjects) == len(set(rollout.subjects)) == 20 and "2,000 nodes" in rollout.summary
    assert "team-vision (10)" not in rollout.summary
    assert "one InfiniBand fabric" in rollout.summary


def test_a_team_whose_scale_sets_go_with_its_tokens_says_nothing_of_them() -> None:
    head = snapshot(STACK)
    head["resources"] = [r for r in head["resources"]
                         if "team-vision" not in r["name"] and not ("a100-ib-03" in r["name"] and r["type"] == VMSS)]
    assert not [r for r in rule(risks(head), "join-token-rotated") if "registration group" in r.summary]


# --- 4. the rollout's unit by pool ------------------------------------------------------------------------------


def _new_custom_data(head: dict[str, Any], role: str) -> None:
    for r in head["resources"]:
        if r["type"] == VMSS and r["inputs"]["tags"].get("kilonode-role") == role:
            r["inputs"]["virtualMachineProfile"]["osProfile"]["customData"] = "[secret sha256:new]"


def test_a_pool_without_infiniband_is_rolled_a_scale_set_or_a_batch_at_a_time() -> None:
    head = snapshot(STACK)
    _new_custom_data(head, "pool-system")
    [rollout] = rule(risks(head), "fleet-rollout")
    assert "pool-system" in rollout.summary and "InfiniBand" not in rollout.summary
    assert "one scale set (or a batch of its instances) at a time" in rollout.summary
    ib = snapshot(STACK)
    _new_custom_data(ib, "pool-h100-ib")
    [rollout] = rule(risks(ib), "fleet-rollout")
    assert "one scale set (one InfiniBand fabric) at a time" in rollout.summary


# --- 5. a PriorityClass's immutable fields ----------------------------------------------------------------------


@pytest.mark.parametrize(("field", "value"), [("preemptionPolicy", "Never"), ("value", 200000)])
def test_an_in_use_priority_class_is_told_a_new_class_not_a_recreation(field: str, value: object) -> None:
    head = snapshot(STACK)
    [infra] = [r for r in head["resources"] if r["type"] == PRIORITY_CLASS
               and r["inputs"]["metadata"]["name"] == "kilonode-infrastructure"]
    infra["inputs"][field] = value
    [refused] = [r for r in rule(risks(head), "update-refused") if r.cause == field]
    assert refused.level == HIGH and f"the {field} is immutable" in refused.summary
    assert "every pod naming it" in refused.summary and "refused at admission" in refused.summary
    assert "new class under a new name" in refused.summary and "drop the old class in a later change" \
        in refused.summary
    assert "recreate them deliberately" not in refused.summary


# --- 6. a head that no longer loads -----------------------------------------------------------------------------


def _loader_error(tmp_path: Path) -> str:
    def panic_zero(cluster: dict[str, Any]) -> None:
        cluster.setdefault("sysctl", {}).setdefault("overrides", {})["kernel.panic"] = 0
    try:
        load_stack(STACK, _edited(tmp_path, panic_zero))
    except StackError as error:
        return str(error)  # what kilonode.review.snapshot records for a side that does not load
    raise AssertionError("the loader took kernel.panic: 0")


def _review(base: dict[str, Any], head: dict[str, Any]) -> Review:
    diff = compare_stack(STACK, base, head)
    return Review(Side("base", "main", "a" * 40), Side("head", "HEAD", "b" * 40), [STACK], "test", [diff],
                  assess(diff, {}))


def test_a_head_the_loader_refuses_is_refused_as_validate_would_whatever_fail_on_says(tmp_path: Path) -> None:
    """A stack file the change leaves unloadable ends the review with exit 2 and its problem lines
    (a CI step fails on it, and a hostile file's text never reaches a report: issue 37); the risk
    the assessment gives it is high, for a caller that reads the risks without the CLI."""
    from kilonode.cli.diff import _refuse_invalid_heads

    message = _loader_error(tmp_path)
    assert "kernel.panic" in message
    result = _review(snapshot(STACK), {"error": message})
    [invalid] = result.risks
    assert (invalid.level, invalid.rule) == (HIGH, "stack-invalid") and "kernel.panic" in invalid.summary
    with pytest.raises(typer.Exit) as stopped:
        _refuse_invalid_heads(result)
    assert stopped.value.exit_code == 2


def test_a_stack_that_loads_at_neither_ref_is_refused_with_exit_2(tmp_path: Path) -> None:
    from kilonode.cli.diff import _refuse_invalid_heads

    message = _loader_error(tmp_path)
    with pytest.raises(typer.Exit) as stopped:
        _refuse_invalid_heads(_review({"error": message}, {"error": message}))
    assert stopped.value.exit_code == 2
