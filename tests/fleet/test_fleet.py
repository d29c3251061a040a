"""`kilonode fleet`: the largest cluster of a stack's shape, the limit that sizes it, and the fleet
of stacks that holds a target, each planned by the real planner."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kilonode.config import load_stack
from kilonode.config.load import Stack
from kilonode.plan import plan_stack
from kilonode.plan.fleet import FleetError, cluster_value, plan_fleet, shape_of, vnet_ranges

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


@pytest.fixture(scope="module")
def research() -> Stack:
    return load_stack("research-7500")


def test_a_100000_node_fleet_of_research_7500s_shape(research: Stack) -> None:
    fleet = plan_fleet("research-7500", research.config, research.raw, research.file, nodes=100_000)
    # the binding limit: one NAT gateway's SNAT ports for the a100-ib pool (2/3 of the work nodes)
    big = fleet.largest
    assert big.work_nodes == 12_096
    [binding] = big.binding
    assert binding.startswith("nodePools[0].nodes: pool-a100-ib: 8,065 nodes x 128 SNAT ports")
    # the monitoring pool's Prometheus outgrew E16ds_v5 and E20ds_v5 on the way: lifted, and said
    assert [change.split(" (was")[0] for _, _, change in big.lifted] == [
        "pool monitoring on Standard_E20ds_v5", "pool monitoring on Standard_E32ds_v5"]
    assert len(fleet.members) == 9 and sum(m.work_nodes for m in fleet.members) == 100_000
    assert max(m.work_nodes for m in fleet.members) - min(m.work_nodes for m in fleet.members) <= 1
    assert len({m.name for m in fleet.members}) == 9
    nets = [ipaddress.ip_network(m.raw["network"]["vnetCidr"]) for m in fleet.members]
    assert all(not a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])
    # each member is a plan of the real planner, its addresses inside its own VNet
    for member, net in zip(fleet.members, nets, strict=True):
        assert member.plan.network.vnet_cidr == net
        assert all(pool.subnet is not None and pool.subnet.subnet_of(net) for pool in member.plan.node_pools)


def test_a_peered_fleet_past_azures_cap_is_refused_with_the_arithmetic(research: Stack) -> None:
    with pytest.raises(FleetError) as caught:
        plan_fleet("research-7500", research.config, research.raw, research.file, nodes=100_000, peered=True)
    message = str(caught.value)
    assert "44,518 + 44,514" in message and "> " not in message.split("=")[0]
    assert "above the 128,000" in message and "peer at most 2 of these clusters together" in message


def test_a_small_peered_fleet_is_accepted(research: Stack) -> None:
    fleet = plan_fleet("research-7500", research.config, research.raw, research.file, nodes=20_000, peered=True)
    assert len(fleet.members) == 2 and sum(m.vnet_used for m in fleet.members) <= 128_000


def test_gpus_are_turned_into_work_nodes_of_the_shape(research: Stack) -> None:
    fleet = plan_fleet("research-7500", research.config, research.raw, research.file, gpus=80_000)
    assert fleet.target_nodes == 10_000 and fleet.gpus >= 80_000 and len(fleet.members) == 1


def test_the_shape_keeps_proportions_and_the_fixed_pools(research: Stack) -> None:
    shape = shape_of(research.config, research.raw)
    assert shape.nodes == (5000, 2500) and shape.split(3) == [2, 1] and sum(shape.split(10_001)) == 10_001
    raw = cluster_value(shape, 15_000, "x-00", "10.9.0.0/16")
    assert [p["nodes"] for p in raw["nodePools"]] == [10_000, 5_000, 3, 1]
    assert "teams" not in raw and all("subnet" not in p for p in raw["nodePools"])
    assert plan_stack(load_stack("research-7500")).cluster == "research-7500"  # the input is untouched


def test_vnet_ranges_never_overlap_and_run_out_loudly() -> None:
    ranges = vnet_ranges("10.0.0.0/16", 270)  # 256 in 10/8, then 16 in 172.16/12, 1 in 192.168/16
    assert ranges[0] == "10.0.0.0/16" and ranges[256] == "172.16.0.0/16" and len(set(ranges)) == 270
    with pytest.raises(FleetError, match="hold 273 VNets of /16"):
        vnet_ranges("10.0.0.0/16", 400)


@pytest.mark.parametrize("args, message", [
    ([], "give one target"),
    (["--nodes", "10", "--gpus", "8"], "give one target"),
    (["--nodes", "0"], "at least 1"),
])
def test_unusable_input_exits_2(args: list[str], message: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "kilonode", "fleet", "research-7500", *args, "--out",
                           str(tmp_path / "f")], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and message in done.stderr
    assert not (tmp_path / "f").exists()


def test_a_folder_in_the_way_exits_2_and_keeps_it(tmp_path: Path) -> None:
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "mine.txt").write_text("keep")
    done = subprocess.run([sys.executable, "-m", "kilonode", "fleet", "research-7500", "--nodes", "10", "--out",
                           str(tmp_path / "f")], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "in the way" in done.stderr
    assert (tmp_path / "f" / "mine.txt").read_text() == "keep"


@pytest.mark.slow
def test_the_100000_node_fleet_is_written_and_every_stack_validates_and_passes_preflight(tmp_path: Path) -> None:
    out = tmp_path / "fleet"
    done = subprocess.run([sys.executable, "-m", "kilonode", "fleet", "research-7500", "--nodes", "100000",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "fleet.json").read_text())
    assert summary["clusters"] == 9 and "SNAT ports" in summary["largestCluster"]["bindingLimit"][0]
    files = sorted(out.glob("Pulumi.*.yaml"))
    assert len(files) == 9
    for file, row in zip(files, summary["members"], strict=True):
        plan = plan_stack(load_stack(str(file)))  # validates and plans as written
        assert not plan.network.unrecorded and plan.cluster == row["name"]
        assert row["preflight"]["breaks"] == [] and row["pulumiResources"] > 0
    assert "Largest single cluster of this shape: 12,096 work nodes" in (out / "fleet.md").read_text()
