"""Address stability: once a subnet, static IP or LB address is recorded, no change to another
pool or role moves it, growth within a pool's declared room included.

The property test drives random sequences of grow, shrink, append, remove and pin through
the same steps a user takes (edit the stack, validate, record with `kilonode allocate`),
on the config objects (the allocate command's file write is tested below it, on files).
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kilonode.cli import app
from kilonode.config import load_stack
from kilonode.config.checks import cross_field_problems
from kilonode.config.model import ClusterConfig, NodePoolConfig
from kilonode.plan import ClusterPlan, resolve
from kilonode.plan.resolve import pool_capacity
from kilonode.problems import PlanError, undotted
from tests.conftest import StackWriter

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

# required (kilonode.config.tokens): within a year of the tests' pinned now
JOIN_TOKENS = {"current": {"generation": 1, "expires": "2027-11-30T00:00:00Z"}}

PROFILE = load_stack("local").sysctl_profile
runner = CliRunner()


def validate(config: ClusterConfig) -> ClusterPlan | None:
    """What `kilonode validate` decides: a plan, or None when the stack is refused."""
    if cross_field_problems(config, PROFILE):
        return None
    try:
        return resolve(config, PROFILE)
    except PlanError:
        return None


def record(config: ClusterConfig, plan: ClusterPlan) -> ClusterConfig:
    """What `kilonode allocate` writes: every placed subnet becomes an input."""
    net = config.network.model_dump(by_alias=False)
    pools = [pool.model_dump(by_alias=False) for pool in config.node_pools]
    for entry in plan.network.unrecorded:
        loc = undotted(entry.field)
        if loc[0] == "network":
            net[{"controlPlaneSubnet": "control_plane_subnet", "etcdSubnet": "etcd_subnet"}[str(loc[1])]] = entry.subnet
        else:
            pools[int(loc[1])]["subnet"] = entry.subnet
    return ClusterConfig.model_validate({**config.model_dump(by_alias=False), "network": net, "node_pools": pools})


def addresses(plan: ClusterPlan) -> dict[str, object]:
    """Every address Azure would hold on to, keyed by what owns it."""
    out: dict[str, object] = {
        "subnet:control-plane": plan.network.control_plane_subnet,
        "subnet:etcd": plan.network.etcd_subnet,
        "lb": plan.control_plane.load_balancer_ip,
    }
    out.update({f"ip:{m.vm_name}": m.ip for c in plan.etcd_clusters for m in c.members})
    out.update({f"ip:{i.vm_name}": i.ip for i in plan.control_plane.instances})
    out.update({f"subnet:pool:{p.name}": p.subnet for p in plan.node_pools})
    return out


def base(pools: list[dict[str, object]]) -> ClusterConfig:
    return ClusterConfig.model_validate({
        "name": "prop", "etcd": {"main": {"members": 5}, "events": {"members": 3}},
        "apiserver": {"replicas": 3}, "joinTokens": JOIN_TOKENS, "nodePools": pools,
    })


POOL_NAMES = [f"p{i}" for i in range(8)]
pool_spec = st.fixed_dictionaries({
    "nodes": st.integers(1, 3000),
    "podsPerNode": st.sampled_from([0, 1, 3, 8]),
    "room": st.sampled_from([None, 0, 100, 2000]),  # maxNodes = nodes + room
})
operation = st.one_of(
    st.tuples(st.just("grow"), st.integers(0, 7), st.integers(1, 4000)),
    st.tuples(st.just("shrink"), st.integers(0, 7), st.integers(1, 4000)),
    st.tuples(st.just("append"), pool_spec),
    st.tuples(st.just("remove"), st.integers(0, 7)),
    st.tuples(st.just("pin"), st.integers(0, 7)),
    st.tuples(st.just("grow-within-room"), st.integers(0, 7), st.floats(0, 1)),
)


def pool_of(name: str, spec: dict[str, int | None]) -> dict[str, object]:
    nodes = int(spec["nodes"] or 1)
    pool: dict[str, object] = {"name": name, "nodes": nodes, "podsPerNode": spec["podsPerNode"],
                               "vmSize": "Standard_D4ds_v5", "gpusPerNode": 0}
    if spec["room"] is not None:
        pool["maxNodes"] = nodes + int(spec["room"])
    return pool


def apply(config: ClusterConfig, plan: ClusterPlan, op: tuple, fresh: list[str]) -> ClusterConfig | None:
    """The edited config, or None when the operation does not apply to this state."""
    pools = [p.model_dump(by_alias=True) for p in config.node_pools]
    kind = op[0]
    if kind == "append":
        if not fresh:
            return None
        pools.append(pool_of(fresh.pop(0), op[1]))
    elif not pools:
        return None
    else:
        i = op[1] % len(pools)
        pool = pools[i]
        if kind == "grow":
            pool["nodes"] = pool["nodes"] + op[2]
            if pool["maxNodes"] is not None and pool["nodes"] > pool["maxNodes"]:
                pool["maxNodes"] = pool["nodes"]  # a user raising both
        elif kind == "grow-within-room":
            room = min(pool["maxNodes"] or pool["nodes"],
                       pool_capacity(config.node_pools[i], plan.node_pools[i].subnet))
            pool["nodes"] = pool["nodes"] + int((room - pool["nodes"]) * op[2])
        elif kind == "shrink":
            pool["nodes"] = max(1, pool["nodes"] - op[2])
        elif kind == "remove":
            if len(pools) == 1:
                return None
            pools.pop(i)
        elif kind == "pin":
            # a user moving this pool on purpose, to the last free block of its size
            own = plan.node_pools[i].subnet
            others = [s for k, s in addresses(plan).items() if k.startswith("subnet:") and s != own]
            candidates = [b for b in config.network.vnet_cidr.subnets(new_prefix=own.prefixlen)
                          if not any(b.overlaps(o) for o in others) and b != own]
            if not candidates:
                return None
            pool["subnet"] = str(candidates[-1])
    return ClusterConfig.model_validate({**config.model_dump(by_alias=True), "nodePools": pools})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=pool_spec, second=pool_spec, ops=st.lists(operation, max_size=10))
def test_no_recorded_address_moves_under_changes_to_others(first: dict, second: dict, ops: list[tuple]) -> None:
    config = base([pool_of("p0", first), pool_of("p1", second)])
    plan = validate(config)
    if plan is None:
        return  # two pools the VNet cannot hold: nothing was ever created
    config = record(config, plan)
    plan = validate(config)
    assert plan is not None and plan.network.unrecorded == ()
    fresh = POOL_NAMES[2:]
    for op in ops:
        edited = apply(config, plan, op, fresh)
        if edited is None:
            continue
        new_plan = validate(edited)
        if op[0] == "grow-within-room":
            assert new_plan is not None, f"growth within the declared room was refused: {op}"
        if new_plan is None:
            continue  # refused: the user keeps the last good stack, nothing moved
        before, after = addresses(plan), addresses(new_plan)
        touched = {f"subnet:pool:{config.node_pools[op[1] % len(config.node_pools)].name}"} if op[0] == "pin" else set()
        for owner, address in before.items():
            if owner in after and owner not in touched:
                assert after[owner] == address, f"{op}: {owner} moved {address} -> {after[owner]}"
        subnets = [s for k, s in after.items() if k.startswith("subnet:")]
        for j, subnet in enumerate(subnets):
            assert isinstance(subnet, IPv4Network) and subnet.subnet_of(edited.network.vnet_cidr)
            assert not any(subnet.overlaps(o) for o in subnets[:j])
        config, plan = record(edited, new_plan), new_plan


# --- the example, through the files and commands a user runs ----------------------

def two_pools(write_stack: StackWriter, a: int, b: int) -> Path:
    pools = [{"name": n, "nodes": c, "podsPerNode": 4, "vmSize": "Standard_D4ds_v5", "gpusPerNode": 0}
             for n, c in (("a", a), ("b", b))]
    return write_stack({"name": "two", "joinTokens": JOIN_TOKENS, "nodePools": pools})


def subnets_of(path: Path) -> dict[str, str]:
    stack = load_stack(str(path))
    return {p.name: str(p.subnet) for p in stack.config.node_pools} | {
        "etcd": str(stack.config.network.etcd_subnet), "control-plane": str(stack.config.network.control_plane_subnet)}


def test_growing_one_pool_never_moves_another_once_recorded(write_stack: StackWriter) -> None:
    path = two_pools(write_stack, 40, 40)
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0 and "addresses not recorded in the stack file" in result.output
    result = runner.invoke(app, ["allocate", str(path)])
    assert result.exit_code == 0, result.output
    recorded = subnets_of(path)
    assert recorded == {"a": "10.0.2.0/24", "b": "10.0.3.0/24", "etcd": "10.0.1.0/24", "control-plane": "10.0.0.0/24"}
    assert "not recorded" not in runner.invoke(app, ["validate", str(path)]).output
    # a second allocate writes nothing
    text = path.read_text()
    assert "nothing written" in runner.invoke(app, ["allocate", str(path)]).output and path.read_text() == text
    # grow a within its /24 (251 usable ÷ 5 = 50 nodes): valid, nothing moves
    path.write_text(text.replace("nodes: 40\n", "nodes: 50\n", 1))
    assert runner.invoke(app, ["validate", str(path)]).exit_code == 0
    assert subnets_of(path) == recorded
    # grow a to 80 (today's bug moved b): refused, naming the address that would move
    path.write_text(text.replace("nodes: 40\n", "nodes: 80\n", 1))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert "nodePools[0].subnet: 10.0.2.0/24 holds at most 50 nodes" in result.output
    assert "moves this pool's subnet 10.0.2.0/24 → 10.0.4.0/23" in result.output


def test_allocate_keeps_comments_and_sizes_for_max_nodes(write_stack: StackWriter) -> None:
    path = two_pools(write_stack, 40, 40)
    document = yaml.safe_load(path.read_text())
    document["config"]["kilonode:cluster"]["nodePools"][0]["maxNodes"] = 200
    path.write_text("# my cluster, my comment\n" + yaml.safe_dump(document, sort_keys=False))
    assert runner.invoke(app, ["allocate", str(path)]).exit_code == 0
    text = path.read_text()
    assert text.startswith("# my cluster, my comment\n")
    assert "subnet: 10.0.4.0/22  # recorded by `kilonode allocate`" in text  # 200 × 5 + 5 → /22
    # growing a up to its declared room: nothing moves
    grown = text.replace("nodes: 40\n", "nodes: 200\n", 1)
    path.write_text(grown)
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert subnets_of(path)["b"] == "10.0.2.0/24"


def test_pinning_a_pool_moves_no_static_ip(write_stack: StackWriter) -> None:
    path = two_pools(write_stack, 40, 40)
    assert runner.invoke(app, ["allocate", str(path)]).exit_code == 0
    before = load_stack(str(path))
    text = path.read_text().replace("subnet: 10.0.3.0/24", "subnet: 10.0.200.0/24")
    path.write_text(text)
    after = load_stack(str(path))
    plan_before, plan_after = resolve(before.config, PROFILE), resolve(after.config, PROFILE)
    assert [m.ip for c in plan_after.etcd_clusters for m in c.members] == [
        m.ip for c in plan_before.etcd_clusters for m in c.members]
    assert plan_after.control_plane.load_balancer_ip == plan_before.control_plane.load_balancer_ip
    assert plan_after.control_plane.load_balancer_ip == IPv4Address("10.0.0.4")


def test_pool_config_accepts_max_nodes_only_at_or_above_nodes() -> None:
    assert NodePoolConfig(name="x", nodes=10, maxNodes=10).max_nodes == 10
    config = base([{"name": "x", "nodes": 20, "maxNodes": 10}])
    [problem] = cross_field_problems(config, PROFILE)
    assert problem.path == "nodePools[0].nodes" and "above this pool's maxNodes 10" in problem.message
