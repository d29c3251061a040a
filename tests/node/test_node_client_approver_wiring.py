"""The approver's constants, held twice (a node program imports nothing of kilonode), agree with
the project's; its RBAC is what it calls; its pool table round-trips; every apiserver runs it."""

from __future__ import annotations

import ast

import pytest

from kilonode.k8s import bootstrap
from kilonode.node import ship
from kilonode.node.node_client_approver import rules
from kilonode.plan import defaults
from kilonode.render import render_cluster
from tests import shared


def test_the_approver_and_the_tokens_name_the_same_groups_and_signer() -> None:
    assert rules.POOL_GROUP_PREFIX == defaults.POOL_BOOTSTRAP_GROUP_PREFIX
    assert rules.SIGNER == bootstrap.KUBELET_CLIENT_SIGNER
    plan = shared.plan("research-7500")
    groups = {rules.pool_group(p.name) for p in plan.node_pools} | {
        rules.pool_group(f"{p.name}:team:{team}") for p in plan.node_pools for team in p.teams}
    assert {t.group for t in plan.join_tokens} == groups
    assert rules.pool_group("a100-ib:team:vision") in groups


def test_the_pool_table_gives_each_registration_group_its_own_scale_sets() -> None:
    """A token per registration group (the pool's shared shards, each team's): independent trace of
    issue 37, round 5, finding 2: with one token per pool, root on a shared node could register a
    Node under a team's unused name and receive that team's pods."""
    plan = shared.plan("research-7500")
    table = rules.pools_from_json(bootstrap.pool_table(plan.join_tokens))
    expected = {}
    for pool in plan.node_pools:
        for team in (None, *pool.teams):
            names = tuple(s.name for s in pool.shards if s.team == team)
            if names:
                expected[pool.name if team is None else f"{pool.name}:team:{team}"] = names
    assert {p.name: tuple(p.prefixes) for p in table} == expected
    # every scale set is in exactly one group
    assert sorted(n for names in expected.values() for n in names) == sorted(
        s.name for pool in plan.node_pools for s in pool.shards)
    # a shared node's token cannot get a name of the team's shards
    shared_pool = next(p for p in table if p.name == "a100-ib")
    vision = next(p for p in table if p.name == "a100-ib:team:vision")
    name = f"{vision.prefixes[0]}00002d"
    assert rules.name_pool(name, table) == ["a100-ib:team:vision"]
    assert shared_pool.name not in rules.name_pool(name, table)


def test_its_role_allows_exactly_the_calls_it_makes() -> None:
    """Every client method main.py calls, mapped to the request it sends (the Kubernetes client's
    own names), against the ClusterRole and kube-system Role kilonode.k8s.bootstrap grants."""
    source = (ship.NODE_DIR / "node_client_approver" / "main.py").read_text()
    called = {n.attr for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute)
              and n.attr.startswith(("list_", "read_", "replace_", "create_", "patch_", "delete_"))}
    requests = {
        "list_certificate_signing_request": ("certificates.k8s.io", "certificatesigningrequests", "list"),
        "replace_certificate_signing_request_approval": (
            "certificates.k8s.io", "certificatesigningrequests/approval", "update"),
        "read_node": ("", "nodes", "get"),
        "read_namespaced_config_map": ("", "configmaps", "get"),
    }
    assert called == set(requests)
    granted = {(g, r, v) for g, r, verbs, _ in bootstrap.NODE_CLIENT_APPROVER_RULES for v in verbs}
    granted.add(("", "configmaps", "get"))  # the kube-system Role, on its one ConfigMap
    assert {requests[c] for c in called} <= granted
    # watch comes with list (watch.Watch().stream on list_certificate_signing_request)
    assert ("certificates.k8s.io", "certificatesigningrequests", "watch") in granted
    # and no more than those, plus `approve` on the one signer the admission plugin checks
    extra = granted - {requests[c] for c in called} - {
        ("certificates.k8s.io", "certificatesigningrequests", "watch"),
        ("certificates.k8s.io", "certificatesigningrequests", "get"),
        ("certificates.k8s.io", "signers", "approve")}
    assert extra == set()
    [signers] = [n for _, r, _, n in bootstrap.NODE_CLIENT_APPROVER_RULES if r == "signers"]
    assert signers == (rules.SIGNER,)


@pytest.mark.parametrize("stack", shared.SHIPPED_STACKS)
def test_every_apiserver_runs_the_approver_from_the_control_plane_image(stack: str) -> None:
    plan = shared.plan(stack)
    rendered = render_cluster(plan)
    for instance in plan.control_plane.instances:
        unit = rendered[instance.name]["etc/systemd/system/kilonode-node-client-approver.service"].content
        assert f"-m {ship.NODE_CLIENT_APPROVER.module}.main" in unit
        assert f"PYTHONPATH={ship.NODE_CLIENT_APPROVER.pythonpath}" in unit
