"""Teams' scale sets and the autoscaler's node groups (kilonode.plan.capacity): whole shards
per team, labelled and tainted in the kubelet's own registration on exactly those scale sets;
over-allocations refused with the arithmetic; recorded runs that never move; the autoscaler's
bounds, never below half a pool."""

from __future__ import annotations

import base64
import email
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from kilonode.azure.graph import Graph
from kilonode.cli import app
from kilonode.config import load_stack
from kilonode.plan import ClusterPlan, plan_stack
from kilonode.problems import StackError
from kilonode.render import render_cluster
from kilonode.render.pool import KUBELET_CONFIG
from tests import shared
from tests.conftest import StackWriter, shipped_cluster_value

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

runner = CliRunner()
TEAM = "kilonode.io/team"


def two_teams(write_stack: StackWriter, language: int = 3000, vision: int = 1000, **team_extra: Any) -> Path:
    cluster = shipped_cluster_value("research-7500")
    cluster["teams"] = [
        {"name": "language", "pool": "a100-ib", "nodes": language, **team_extra},
        {"name": "vision", "pool": "a100-ib", "nodes": vision},
    ]
    return write_stack(cluster)


def plan_of(path: Path) -> ClusterPlan:
    return plan_stack(load_stack(str(path)))


def problems_of(path: Path) -> str:
    with pytest.raises(StackError) as caught:
        plan_of(path)
    return str(caught.value)


def kubelet_registration(files: dict[str, Any]) -> tuple[set[str], list[dict[str, str]]]:
    unit = files["etc/systemd/system/kubelet.service"].content
    labels = re.search(r"--node-labels=(\S+)", unit)
    assert labels, unit
    config = yaml.safe_load(files[KUBELET_CONFIG].content)
    return set(labels.group(1).split(",")), config.get("registerWithTaints", [])


def test_two_teams_on_one_pool_get_whole_contiguous_shards(write_stack: StackWriter) -> None:
    plan = plan_of(two_teams(write_stack))
    language, vision = plan.teams
    assert (language.first_shard, len(language.shards), language.nodes) == (0, 30, 3000)
    assert (vision.first_shard, len(vision.shards), vision.nodes) == (30, 10, 1000)
    [pool] = [p for p in plan.node_pools if p.name == "a100-ib"]
    owners = [s.team for s in pool.shards]
    assert owners == ["language"] * 30 + ["vision"] * 10 + [None] * 10
    assert pool.teams == ("language", "vision")


def test_team_shards_register_with_the_teams_label_and_taint_and_shared_ones_without(
    write_stack: StackWriter,
) -> None:
    plan = plan_of(two_teams(write_stack))
    rendered = render_cluster(plan)
    assert {"pool-a100-ib", "pool-a100-ib.team-language", "pool-a100-ib.team-vision"} <= set(rendered)
    for team in ("language", "vision"):
        labels, taints = kubelet_registration(rendered[f"pool-a100-ib.team-{team}"])
        assert f"{TEAM}={team}" in labels and "kilonode.io/pool=a100-ib" in labels
        assert {"key": TEAM, "value": team, "effect": "NoSchedule"} in taints
    labels, taints = kubelet_registration(rendered["pool-a100-ib"])
    assert not any(label.startswith(TEAM) for label in labels)
    assert not any(t["key"] == TEAM for t in taints)
    # only the kubelet's registration differs between a team's files and the shared ones
    shared, language = rendered["pool-a100-ib"], rendered["pool-a100-ib.team-language"]
    differ = {path for path in shared if shared[path].content != language[path].content}
    # and, on InfiniBand pools, which scale sets' names the fabric label accepts
    assert differ == {"etc/systemd/system/kubelet.service", KUBELET_CONFIG, "user-data",
                      "usr/local/lib/kilonode/fabric-label"}


def _kubelet_unit_in(custom_data: str) -> str:
    """The kubelet unit cloud-init writes, out of a scale set's (base64, MIME) custom data."""
    message = email.message_from_bytes(base64.b64decode(custom_data))
    for part in message.walk():
        payload = part.get_payload(decode=True)
        if payload and b"write_files" in payload:
            document = shared.load_yaml(payload)
            for entry in document["write_files"]:
                if entry["path"] == "/etc/systemd/system/kubelet.service":
                    return str(entry["content"])
    raise AssertionError("no kubelet unit in the custom data")


def test_each_scale_set_carries_its_own_teams_registration(graphs: dict[str, Graph]) -> None:
    """The Azure side: a team's scale sets get the team's custom data, shared ones the pool's
    (research-7500's two teams on a100-ib, as two_teams() places them)."""
    graph = graphs["research-7500"]
    expected = {**{f"{i:03d}": "language" for i in range(30)}, **{f"{i:03d}": "vision" for i in range(30, 40)}}
    seen: dict[str, str | None] = {}
    for vmss in graph.of_type("azure-native:compute:VirtualMachineScaleSet"):
        name = vmss.plain()["vmScaleSetName"]
        if "-a100-ib-" not in name:
            continue
        unit = _kubelet_unit_in(vmss.plain()["virtualMachineProfile"]["osProfile"]["customData"])
        found = re.search(rf"{re.escape(TEAM)}=([a-z0-9-]+)", unit)
        seen[name.rsplit("-", 1)[1]] = found.group(1) if found else None
        assert vmss.plain()["tags"]["kilonode-role"] == (
            f"pool-a100-ib.team-{found.group(1)}" if found else "pool-a100-ib")
    assert seen == {f"{i:03d}": expected.get(f"{i:03d}") for i in range(50)}


def test_an_over_allocation_is_refused_with_the_arithmetic(write_stack: StackWriter) -> None:
    message = problems_of(two_teams(write_stack, language=3000, vision=2500))
    assert "teams[1].nodes" in message
    assert ("team vision: 2,500 nodes need 25 whole scale sets of pool a100-ib (100 nodes each); it has 50 "
            "(5,000 nodes), of which teams hold 30 (language 30), leaving 20 free (longest free run 20)") in message


def test_a_team_that_runs_past_the_pools_end_is_refused(write_stack: StackWriter) -> None:
    message = problems_of(two_teams(write_stack, language=600, firstShard=45))
    assert "teams[0].nodes" in message and "shards 45-49 hold 500" in message


def test_rounding_up_to_whole_scale_sets_is_said(write_stack: StackWriter) -> None:
    plan = plan_of(two_teams(write_stack, language=2950))
    assert plan.teams[0].nodes == 3000 and plan.teams[0].requested == 2950
    assert any("team language: asked for 2,950 nodes, gets 3,000 (30 whole scale set(s)" in w for w in plan.warnings)


def test_recorded_runs_never_move_when_another_team_changes(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("research-7500")  # both teams recorded: language 0, vision 30
    before = plan_of(write_stack(cluster))
    cluster["teams"][0]["nodes"] = 2000  # language shrinks: vision stays where it is
    after = plan_of(write_stack(cluster))
    assert after.teams[1].shards == before.teams[1].shards
    assert after.teams[0].shards == before.teams[0].shards[:20]
    # unrecorded, the same change would have moved vision: the plan says so until recorded
    for team in cluster["teams"]:
        team.pop("firstShard")
    unrecorded = plan_of(write_stack(cluster))
    assert unrecorded.teams[1].first_shard == 20
    assert any("teams[1].firstShard: team vision placed at shard 20" in w for w in unrecorded.warnings)


def test_overlapping_recorded_runs_are_refused(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("research-7500")
    cluster["teams"][0]["nodes"] = 3500  # language now needs shards 0-34, vision holds 30-39
    message = problems_of(write_stack(cluster))
    # the later run in the stack is the one refused, naming the earlier one's shards
    assert ("teams[1].firstShard: team vision: shards 30-39 of pool a100-ib for 1,000 nodes overlap: team language "
            "(teams[0]) holds shards 0-34") in message


def test_a_node_selector_must_pick_exactly_one_pool(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("research-7500")
    cluster["teams"] = [{"name": "rl", "nodeSelector": {"kilonode.io/nccl-topology": "ndv5"}, "nodes": 500}]
    plan = plan_of(write_stack(cluster))
    assert plan.teams[0].pool == "h100-ib"
    cluster["teams"] = [{"name": "rl", "nodeSelector": {"kilonode.io/pool": "nope"}, "nodes": 500}]
    assert "teams[0].nodeSelector: no pool carries kilonode.io/pool=nope" in problems_of(write_stack(cluster))
    for pool in cluster["nodePools"][:2]:  # the GPU pools, not the system pool
        pool["labels"] = {"example.com/gpu": "yes"}
    cluster["teams"] = [{"name": "rl", "nodeSelector": {"example.com/gpu": "yes"}, "nodes": 500}]
    assert "matches 2 pools (a100-ib, h100-ib)" in problems_of(write_stack(cluster))
    cluster["teams"] = [{"name": "rl", "nodes": 500}]
    with pytest.raises(StackError, match="give exactly one of pool or nodeSelector"):
        plan_of(write_stack(cluster))


def test_allocate_records_team_shards_once(write_stack: StackWriter) -> None:
    path = two_teams(write_stack)
    result = runner.invoke(app, ["allocate", str(path)])
    assert result.exit_code == 0, result.output
    assert "recorded teams[1].firstShard: 30" in result.output
    teams = yaml.safe_load(path.read_text())["config"]["kilonode:cluster"]["teams"]
    assert [t["firstShard"] for t in teams] == [0, 30]
    assert "re-registers the team's nodes" in path.read_text()
    text = path.read_text()
    assert "nothing written" in runner.invoke(app, ["allocate", str(path)]).output and path.read_text() == text
    assert all(team.recorded for team in plan_of(path).teams)


# --- the autoscaler ----------------------------------------------------------------------


def test_research_7500s_autoscaled_pool_never_goes_below_half() -> None:
    plan = plan_stack(load_stack("research-7500"))
    [pool] = plan.autoscaled_pools
    scaling = pool.autoscaling
    assert pool.name == "h100-ib" and scaling is not None
    assert [g.shard for g in scaling.node_groups] == [s.name for s in pool.shards]
    assert {(g.min_size, g.max_size) for g in scaling.node_groups} == {(50, 100)}
    assert sum(g.min_size for g in scaling.node_groups) == scaling.min_nodes == 1250
    assert scaling.warm_nodes == 20 and scaling.balloon_requests == {"nvidia.com/gpu": "8"}


def test_team_shards_are_never_node_groups(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("research-7500")
    cluster["nodePools"][0]["autoscaling"] = {"minNodes": 4500}
    plan = plan_of(write_stack(cluster))
    pool = plan.node_pools[0]
    assert pool.autoscaling is not None
    groups = pool.autoscaling.node_groups
    assert [g.shard for g in groups] == [s.name for s in pool.shards if s.team is None]
    assert len(groups) == 10
    # 4,500 of which 4,000 in the teams' fixed scale sets: the shared ten keep 500
    assert sum(g.min_size for g in groups) == 500 and sum(g.max_size for g in groups) == 1000


def test_a_floor_below_half_the_pool_is_refused(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("research-7500")
    cluster["nodePools"][1]["autoscaling"] = {"minNodes": 1000}
    message = problems_of(write_stack(cluster))
    assert "nodePools[1].autoscaling.minNodes" in message
    assert "more than half of pool h100-ib (2,500 nodes; the floor is 1,250)" in message


def test_growth_room_adds_scale_sets_the_autoscaler_can_fill(write_stack: StackWriter) -> None:
    """The autoscaler resizes scale sets but never creates one: maxNodes is planned as shards."""
    cluster = shipped_cluster_value("research-7500")
    cluster["nodePools"][1]["maxNodes"] = 3000
    pool = plan_of(write_stack(cluster)).node_pools[1]
    assert len(pool.shards) == 30 and sum(s.capacity for s in pool.shards) == 2500
    assert pool.autoscaling is not None and sum(g.max_size for g in pool.autoscaling.node_groups) == 3000


def test_more_balloons_than_the_pool_can_hold_are_refused(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("research-7500")
    cluster["nodePools"][1]["autoscaling"] = {"warmNodes": 2600}
    assert "2,600 balloon nodes do not fit in the 2,500 shared nodes" in problems_of(write_stack(cluster))


def test_the_autoscaled_scale_sets_leave_capacity_to_the_autoscaler(graphs: dict[str, Any]) -> None:
    sets = graphs["research-7500"].of_type("azure-native:compute:VirtualMachineScaleSet")
    ignored = {r.plain()["vmScaleSetName"]: r.ignore_changes for r in sets}
    assert {name for name, paths in ignored.items() if paths} == {
        f"research-7500-h100-ib-{i:03d}" for i in range(25)}
    assert {paths for paths in ignored.values() if paths} == {("sku.capacity",)}
