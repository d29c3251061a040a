"""The optional leases cluster (etcd.leases): absent unless the stack sets it, at least three
members when it does, addresses that move nothing else, its own CA, both overrides on the
apiserver, and the main etcd's budgets without the Leases."""

from __future__ import annotations

import math

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import ValidationError

from kilonode.catalog.limits import limits
from kilonode.config import load_stack
from kilonode.config.checks import cross_field_problems
from kilonode.config.model import ClusterConfig, EtcdConfig
from kilonode.plan import ClusterPlan, pki, plan_stack, wellknown
from kilonode.plan.resolve import budgets
from kilonode.problems import StackError
from tests.conftest import StackWriter, shipped_cluster_value, with_leases
from tests.plan.test_address_stability import addresses

# required (kilonode.config.tokens): within a year of the tests' pinned now
JOIN_TOKENS = {"current": {"generation": 1, "expires": "2027-11-30T00:00:00Z"}}

K8S, ETCD = limits().kubernetes, limits().etcd
ED25519 = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.OpenSSH,
                                                                         PublicFormat.OpenSSH).decode()


def plan_of(cluster: dict, write_stack: StackWriter) -> ClusterPlan:
    return plan_stack(load_stack(str(write_stack(cluster))))


def test_no_stack_has_a_leases_cluster_unless_it_sets_one(plans: dict[str, ClusterPlan]) -> None:
    assert EtcdConfig().leases is None
    for name, plan in plans.items():
        assert plan.etcd_leases is None, name
        assert [c.role for c in plan.etcd_clusters] == ["main", "events"]
        assert "leases" not in plan.control_plane.etcd_servers_overrides
        # dumped as before the key existed: the shipped stacks' plan.yaml and config.yaml stay as they were
        assert "etcdLeases" not in plan.model_dump(by_alias=True)
        assert "leases" not in load_stack(name).config.model_dump(by_alias=True)["etcd"]


@pytest.mark.parametrize("members", [1, 2, 4, 6, 8, 9])
def test_a_leases_cluster_takes_an_odd_count_of_three_to_seven_members(members: int) -> None:
    with pytest.raises(ValidationError, match=r"etcd\.leases\.members"):
        ClusterConfig.model_validate({"name": "c", "etcd": {"leases": {"members": members}},
                                      "joinTokens": JOIN_TOKENS,
        "nodePools": [{"name": "p", "nodes": 1}]}, by_alias=True)


@pytest.mark.parametrize("members", [3, 5, 7])
def test_three_five_or_seven_leases_members_are_accepted(members: int) -> None:
    config = ClusterConfig.model_validate({"name": "c", "etcd": {"leases": {"members": members}},
                                           "joinTokens": JOIN_TOKENS,
        "nodePools": [{"name": "p", "nodes": 1}]}, by_alias=True)
    assert config.etcd.leases is not None and config.etcd.leases.members == members
    assert [role for role, _ in config.etcd.clusters()] == ["main", "events", "leases"]


def test_a_bare_leases_section_is_three_members_of_the_default_shape() -> None:
    config = ClusterConfig.model_validate(
        {"name": "c", "etcd": {"leases": {}}, "joinTokens": JOIN_TOKENS,
        "nodePools": [{"name": "p", "nodes": 1}]}, by_alias=True)
    assert config.etcd.leases is not None
    assert config.etcd.leases.members == 3 and config.etcd.leases.vm_size == config.etcd.main.vm_size


def test_naming_leases_hosts_or_groups_without_the_cluster_is_refused() -> None:
    profile = load_stack("local").sysctl_profile
    cluster = shipped_cluster_value("local") | {
        "certificateGenerations": {"etcd-leases-0": 1}, "acknowledgeRestart": ["etcd-leases"],
        "sshKeys": {"etcd-leases": [ED25519]},
    }
    problems = {p.path: p.message for p in cross_field_problems(ClusterConfig.model_validate(cluster), profile)}
    assert "no etcd-leases cluster" in problems["certificateGenerations.etcd-leases-0"]
    assert "no leases cluster" in problems["acknowledgeRestart"]
    assert "no role of this stack" in problems["sshKeys.etcd-leases"]
    with_cluster = with_leases("local") | {k: cluster[k] for k in ("certificateGenerations", "acknowledgeRestart",
                                                                     "sshKeys")}
    assert cross_field_problems(ClusterConfig.model_validate(with_cluster), profile) == []


def test_adding_the_leases_cluster_moves_no_existing_address(write_stack: StackWriter) -> None:
    for name in ("local", "research-7500"):
        before = addresses(plan_of(shipped_cluster_value(name), write_stack))
        after = addresses(plan_of(with_leases(name, members=7), write_stack))
        assert {k: after[k] for k in before} == before, name
        new = {k: v for k, v in after.items() if k not in before}
        assert sorted(new) == [f"ip:{name}-etcd-leases-{i}" for i in range(7)]
        taken = set(before.values())
        assert not taken & set(new.values())


def test_the_largest_clusters_of_each_kind_never_share_an_address(write_stack: StackWriter) -> None:
    cluster = with_leases("local", members=7)
    cluster["etcd"]["main"]["members"] = 7
    cluster["etcd"]["events"]["members"] = 7
    plan = plan_of(cluster, write_stack)
    ips = [m.ip for c in plan.etcd_clusters for m in c.members]
    assert len(ips) == len(set(ips)) == 21
    offsets = {c.role: [int(m.ip) - int(plan.network.etcd_subnet.network_address) for m in c.members]
               for c in plan.etcd_clusters}
    assert offsets == {"main": list(range(10, 17)), "events": list(range(20, 27)), "leases": list(range(30, 37))}
    assert len({c.token for c in plan.etcd_clusters}) == 3


def test_the_overrides_flag_sends_events_and_every_lease_to_their_own_clusters(write_stack: StackWriter) -> None:
    plan = plan_of(with_leases("research-7500"), write_stack)
    assert plan.etcd_leases is not None
    events = ";".join(f"https://{m.ip}:2379" for m in plan.etcd_events.members)
    leases = ";".join(f"https://{m.ip}:2379" for m in plan.etcd_leases.members)
    # kube-apiserver: comma-separated entries, each group/resource#servers with servers semicolon separated;
    # Events are the core group's (empty group), Leases coordination.k8s.io's
    assert plan.control_plane.etcd_servers_overrides == f"/events#{events},coordination.k8s.io/leases#{leases}"
    assert leases == "https://10.0.1.30:2379;https://10.0.1.31:2379;https://10.0.1.32:2379"
    assert wellknown.ETCD_OVERRIDE_RESOURCES["leases"] == "coordination.k8s.io/leases"
    # --etcd-servers stays main's alone
    assert plan.control_plane.etcd_servers == ",".join(plan.etcd_main.client_endpoints)


def test_the_leases_cluster_has_its_own_ca_and_the_apiservers_trust_all_three(write_stack: StackWriter) -> None:
    plan = plan_of(with_leases("local"), write_stack)
    layout = pki.pki_layout(plan)
    assert [a.name for a in layout.authorities] == ["etcd-main-ca", "etcd-events-ca", "etcd-leases-ca",
                                                    "kubernetes-ca", "front-proxy-ca"]
    for member in plan.etcd_leases.members if plan.etcd_leases else ():
        files = {f.path: f.content for f in layout.hosts[member.name]}
        assert layout.leaf(f"{member.name}-peer").ca == "etcd-leases-ca"
        assert files[wellknown.ETCD_CA] == pki.Cert("etcd-leases-ca")
        # the apiservers' client certificates are the main CA's; its own CA for etcdctl
        assert files[wellknown.ETCD_CLIENT_CA] == pki.Bundle(("etcd-main-ca", "etcd-leases-ca"))
    apiserver = {f.path: f.content for f in layout.hosts["apiserver-0"]}
    assert apiserver[wellknown.APISERVER_ETCD_CA_BUNDLE] == pki.Bundle(("etcd-main-ca", "etcd-events-ca",
                                                                        "etcd-leases-ca"))
    # the layout without the cluster is the one it always was
    assert pki.pki_layout(plan_of(shipped_cluster_value("local"), write_stack)).authorities == tuple(
        a for a in layout.authorities if a.name != "etcd-leases-ca")


def _budget(plan: ClusterPlan, name: str) -> int:
    return next(b.used for b in plan.budgets if b.name == name)


def test_the_main_etcd_estimate_drops_by_the_leases_share(write_stack: StackWriter) -> None:
    shared, split = plan_of(shipped_cluster_value("research-7500"), write_stack), plan_of(
        with_leases("research-7500"), write_stack)
    nodes = shared.most_nodes
    lease = ETCD.lease_object_bytes.value
    renewals = K8S.compaction_interval_seconds.value // K8S.lease_renew_seconds.value  # 30 in 5 min
    share = nodes * lease * (1 + renewals)  # live Leases and their revisions since the last compaction
    assert share == budgets.etcd_leases_bytes(nodes)
    main = "main etcd database (bytes)"
    assert _budget(shared, main) - _budget(split, main) == share
    writes = "main etcd writes/s from nodes"
    assert _budget(shared, writes) == math.ceil(nodes / 10 + nodes / 300)
    assert _budget(split, writes) == math.ceil(nodes / 300)
    assert _budget(split, "leases etcd database (bytes)") == share
    assert _budget(split, "leases etcd writes/s from nodes") == math.ceil(nodes / 10)
    assert not any(b.name.startswith("leases etcd") for b in shared.budgets)
    [line] = [b for b in split.budgets if b.name == "leases etcd database (bytes)"]
    assert split.etcd_leases is not None
    assert line.hard and line.limit == split.etcd_leases.quota_backend_bytes


def test_a_main_etcd_past_its_quota_fits_once_the_leases_have_their_own_cluster(write_stack: StackWriter) -> None:
    # research-7500's main etcd needs ~590 MB, of which the Leases ~183 MB: 512 MiB is too little with
    # them and enough without
    shared = shipped_cluster_value("research-7500")
    shared["etcd"]["main"]["quotaBackendBytes"] = 512 * 1024**2
    with pytest.raises(StackError) as caught:
        plan_of(shared, write_stack)
    [problem] = [p for p in caught.value.problems if p.path == "etcd.main.quotaBackendBytes"]
    assert "split leases to their own etcd cluster (etcd.leases)" in problem.message
    split = with_leases("research-7500")
    split["etcd"]["main"]["quotaBackendBytes"] = 512 * 1024**2
    plan = plan_of(split, write_stack)
    assert _budget(plan, "main etcd database (bytes)") < 512 * 1024**2


def test_a_leases_cluster_past_its_quota_is_refused_with_its_arithmetic(write_stack: StackWriter) -> None:
    cluster = with_leases("research-7500")
    cluster["etcd"]["leases"]["quotaBackendBytes"] = 128 * 1024**2  # the Leases need ~183 MB
    with pytest.raises(StackError) as caught:
        plan_of(cluster, write_stack)
    [problem] = [p for p in caught.value.problems if p.path == "etcd.leases.quotaBackendBytes"]
    assert "node Leases x 787 B and 30 renewals" in problem.message and "NOSPACE" in problem.message
