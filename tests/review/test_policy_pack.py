"""The policy pack (policy/__main__.py) as the Pulumi engine runs it, without the Pulumi CLI.

Each shipped stack's recorded resource graph (the `graphs` fixture) is handed to every policy
the way pulumi-policy's analyzer does for `pulumi preview --policy-pack policy`: the custom
resources only, each one's properties through a protobuf Struct, `deserialize_properties` and
`unknown_checking_proxy`, as `PolicyResource`s in one `StackValidationArgs`. Every shipped
stack passes every policy; for each policy, a broken copy of a shipped graph is rejected with
a message naming what is wrong (and the resource's URN when it is about one resource).
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from google.protobuf import json_format, struct_pb2
from pulumi.runtime import proto
from pulumi_policy import (
    EnforcementLevel,
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.deserialize import deserialize_properties
from pulumi_policy.policy import _PolicyAnalyzerServicer
from pulumi_policy.proxy import (
    UNKNOWN_ARRAY_VALUE,
    UNKNOWN_NUMBER_VALUE,
    UNKNOWN_OBJECT_VALUE,
    UNKNOWN_STRING_VALUE,
    unknown_checking_proxy,
)

from kilonode.azure.tags import ETCD_QUOTA_ACKNOWLEDGED_TAG, ETCD_QUOTA_TAG, PUBLIC_IP_ACKNOWLEDGED_TAG
from kilonode.plan.wellknown import API_LOAD_BUDGET_ANNOTATION
from kilonode.preflight import apiload
from kilonode.review import rules

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

POLICY_DIR = Path(__file__).resolve().parents[2] / "policy"
PROJECT = "kilonode"
GIB = 1 << 30


@pytest.fixture(scope="module")
def pack() -> ModuleType:
    """policy/__main__.py imported under another name: it builds its policies and serves nothing."""
    spec = importlib.util.spec_from_file_location("kilonode_policy_pack", POLICY_DIR / "__main__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Item:
    """One custom resource of a stack, to be changed by a test before the engine sees it."""

    type: str
    name: str
    props: dict[str, Any]
    protect: bool = False
    parent_types: list[str] = field(default_factory=list)  # the types of its ancestors, root first

    def urn(self, stack: str) -> str:
        return f"urn:pulumi:{stack}::{PROJECT}::{'$'.join([*self.parent_types, self.type])}::{self.name}"


def items(graph: Any) -> list[Item]:
    """A deep copy of a recorded graph's custom resources (what the policy engine sees)."""
    records = copy.deepcopy(graph.resources)
    by_name = {r.name: r for r in records}

    def ancestors(r: Any) -> list[str]:
        found = []
        while r.parent in by_name:
            r = by_name[r.parent]
            found.insert(0, r.type)
        return found

    return [Item(r.type, r.name, r.plain(), r.protect, ancestors(r)) for r in records if r.custom]


def struct(props: Mapping[str, Any]) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(props)
    return message


def as_engine_sends(props: Mapping[str, Any]) -> Mapping[str, Any]:
    """Properties as pulumi-policy's AnalyzeStack hands them to a policy: through the wire's
    Struct (numbers become floats), deserialized, behind the unknown-checking proxies."""
    return unknown_checking_proxy(deserialize_properties(json_format.MessageToDict(struct(props))))


def stack_args(stack: str, resources: Iterable[Item]) -> StackValidationArgs:
    return StackValidationArgs([
        PolicyResource(
            resource_type=r.type, props=as_engine_sends(r.props), urn=r.urn(stack), name=r.name,
            opts=PolicyResourceOptions(r.protect, [], None, [], PolicyCustomTimeouts(0, 0, 0), [], None),
            provider=None, parent=None, dependencies=[], property_dependencies={},
        )
        for r in resources
    ])


Violation = tuple[str, str | None]  # message, urn


def run(policy: StackValidationPolicy, args: StackValidationArgs) -> list[Violation]:
    found: list[Violation] = []

    def report_violation(message: str, urn: str | None = None) -> None:
        found.append((message, urn))

    assert policy.validate(args, report_violation) is None  # synchronous: nothing to await
    return found


def run_all(pack: ModuleType, stack: str, resources: Iterable[Item]) -> dict[str, list[Violation]]:
    args = stack_args(stack, resources)
    found = {policy.name: run(policy, args) for policy in pack.POLICIES}
    return {name: violations for name, violations in found.items() if violations}


def policy(pack: ModuleType, name: str) -> StackValidationPolicy:
    [found] = [p for p in pack.POLICIES if p.name == name]
    return found


def violations_of(pack: ModuleType, name: str, stack: str, resources: Iterable[Item]) -> list[Violation]:
    return run(policy(pack, name), stack_args(stack, resources))


def role(item: Item) -> str | None:
    return (item.props.get("tags") or {}).get(rules.ROLE_TAG)


def etcd_vms(resources: Iterable[Item], group: str) -> list[Item]:
    return [r for r in resources if r.type == rules.VM and role(r) == group]


# --- the pack itself ---------------------------------------------------------------------


def test_one_mandatory_stack_policy_per_invariant(pack: ModuleType) -> None:
    assert [p.name for p in pack.POLICIES] == [inv.name for inv in rules.INVARIANTS]
    for p, inv in zip(pack.POLICIES, rules.INVARIANTS, strict=True):
        assert isinstance(p, StackValidationPolicy)
        assert p.description == inv.description
        assert p.enforcement_level == EnforcementLevel.MANDATORY


def test_pack_files() -> None:
    project = yaml.safe_load((POLICY_DIR / "PulumiPolicy.yaml").read_text())
    assert project["runtime"]["name"] == "python"
    venv = (POLICY_DIR / project["runtime"]["options"]["virtualenv"]).resolve()
    assert venv == (POLICY_DIR.parent / ".venv").resolve()
    assert project["description"]
    lines = [line.strip() for line in (POLICY_DIR / "requirements.txt").read_text().splitlines()]
    assert "pulumi-policy>=1.21,<2" in lines and "-e .." in lines


# --- every shipped stack passes ------------------------------------------------------------


@pytest.mark.parametrize("stack", ["local", "research-2500", "research-7500"])
def test_shipped_stacks_pass_every_policy(pack: ModuleType, graphs: dict[str, Any], stack: str) -> None:
    resources = items(graphs[stack])
    assert etcd_vms(resources, rules.ETCD_MAIN) and etcd_vms(resources, rules.ETCD_EVENTS)
    assert run_all(pack, stack, resources) == {}


# --- each policy rejects a broken graph ----------------------------------------------------


def test_events_cluster_removed(pack: ModuleType, graphs: dict[str, Any]) -> None:
    resources = [r for r in items(graphs["research-7500"]) if role(r) != rules.ETCD_EVENTS]
    [(message, urn)] = violations_of(pack, "etcd-events-cluster", "research-7500", resources)
    assert message.startswith("no etcd-events VMs") and urn is None


def test_even_member_count(pack: ModuleType, graphs: dict[str, Any]) -> None:
    resources = items(graphs["local"])
    main = etcd_vms(resources, rules.ETCD_MAIN)
    assert len(main) == 3
    extra = copy.deepcopy(main[-1])
    extra.name = "local-etcd-main-3"
    resources.append(extra)
    [(message, urn)] = violations_of(pack, "etcd-member-counts", "local", resources)
    assert message.startswith("etcd-main has 4 members") and urn is None
    # and the other policies do not mind the fourth member (same quota, protected)
    assert set(run_all(pack, "local", resources)) == {"etcd-member-counts"}


def test_no_dedicated_etcd(pack: ModuleType, graphs: dict[str, Any]) -> None:
    resources = [r for r in items(graphs["local"]) if role(r) != rules.ETCD_MAIN]
    [(message, _)] = violations_of(pack, "etcd-member-counts", "local", resources)
    assert message.startswith("no etcd-main VMs")


def test_unprotected_etcd_vm(pack: ModuleType, graphs: dict[str, Any]) -> None:
    resources = items(graphs["research-2500"])
    vm = etcd_vms(resources, rules.ETCD_EVENTS)[1]
    vm.protect = False
    [(message, urn)] = violations_of(pack, "etcd-protected", "research-2500", resources)
    assert message.startswith(f"{vm.name}: etcd VM without `protect`")
    assert urn == vm.urn("research-2500") and urn.endswith(f"azure-native:compute:VirtualMachine::{vm.name}")


def test_quota_at_etcd_default(pack: ModuleType, graphs: dict[str, Any]) -> None:
    resources = items(graphs["local"])
    vm = etcd_vms(resources, rules.ETCD_MAIN)[0]
    vm.props["tags"][ETCD_QUOTA_TAG] = str(2 * GIB)  # 2147483648: not above the default
    found = violations_of(pack, "etcd-quota", "local", resources)
    assert (f"{vm.name}: quota 2,147,483,648 bytes is not above etcd's 2 GiB default" in found[0][0]
            and found[0][1] == vm.urn("local"))
    assert any(message.startswith("etcd-main members disagree") and urn is None for message, urn in found)


def test_quota_above_suggested_maximum_needs_acknowledging(pack: ModuleType, graphs: dict[str, Any]) -> None:
    resources = items(graphs["local"])
    members = etcd_vms(resources, rules.ETCD_EVENTS)
    for vm in members:
        vm.props["tags"][ETCD_QUOTA_TAG] = str(16 * GIB)
        vm.props["tags"].pop(ETCD_QUOTA_ACKNOWLEDGED_TAG, None)
    found = violations_of(pack, "etcd-quota", "local", resources)
    assert [urn for _, urn in found] == [vm.urn("local") for vm in sorted(members, key=lambda vm: vm.name)]
    assert all("above etcd's suggested maximum of 8 GiB" in message for message, _ in found)

    for vm in members:
        vm.props["tags"][ETCD_QUOTA_ACKNOWLEDGED_TAG] = "true"
    assert violations_of(pack, "etcd-quota", "local", resources) == []


def test_quota_tag_missing(pack: ModuleType, graphs: dict[str, Any]) -> None:
    resources = items(graphs["local"])
    vm = etcd_vms(resources, rules.ETCD_MAIN)[2]
    del vm.props["tags"][ETCD_QUOTA_TAG]
    [(message, urn)] = violations_of(pack, "etcd-quota", "local", resources)
    assert message.startswith(f"{vm.name}: no {ETCD_QUOTA_TAG} tag") and urn == vm.urn("local")


def etcd_subnet_prefix(resources: Iterable[Item]) -> str:
    [prefix] = [r.props["addressPrefix"] for r in resources
                if r.type == rules.SUBNET and r.props.get("subnetName") == "etcd"]
    return prefix


@pytest.mark.parametrize("source", ["10.0.0.0/16", "*", "Internet"])
@pytest.mark.parametrize("stack", ["local", "research-7500"])
def test_etcd_client_port_opened(pack: ModuleType, graphs: dict[str, Any], stack: str, source: str) -> None:
    resources = items(graphs[stack])
    [nsg] = [r for r in resources if r.type == rules.NSG and r.name.endswith("-etcd-nsg")]
    nsg.props["securityRules"].append({
        "name": "debug-etcd", "priority": 4000, "direction": "Inbound", "access": "Allow", "protocol": "Tcp",
        "sourceAddressPrefix": source, "sourcePortRange": "*",
        "destinationAddressPrefix": etcd_subnet_prefix(resources), "destinationPortRange": "2379",
    })
    [(message, urn)] = violations_of(pack, "etcd-ports", stack, resources)
    assert message.startswith(f"{nsg.name} rule 'debug-etcd' admits etcd's client port 2379 from {source}:")
    assert urn == nsg.urn(stack)


def test_etcd_peer_port_range_opened(pack: ModuleType, graphs: dict[str, Any]) -> None:
    resources = items(graphs["local"])
    [nsg] = [r for r in resources if r.type == rules.NSG and r.name.endswith("-etcd-nsg")]
    nsg.props["securityRules"].append({
        "name": "wide", "priority": 4001, "direction": "Inbound", "access": "Allow", "protocol": "*",
        "sourceAddressPrefixes": ["10.0.0.0/24", "10.0.2.0/27"], "destinationAddressPrefix": "*",
        "destinationPortRanges": ["2370-2390"],
    })
    found = violations_of(pack, "etcd-ports", "local", resources)
    assert [m.split(" from ")[0] for m, _ in found] == [
        f"{nsg.name} rule 'wide' admits etcd's client port 2379",
        f"{nsg.name} rule 'wide' admits etcd's peer port 2380",
    ]
    assert all(m.split(" from ")[1].startswith("10.0.2.0/27:") for m, _ in found)


def public_ip(name: str, group: str, **tags: str) -> Item:
    return Item(rules.PUBLIC_IP, name, {
        "publicIPAddressName": name, "publicIPAllocationMethod": "Static", "sku": {"name": "Standard"},
        "tags": {"kilonode-cluster": "local", rules.ROLE_TAG: group, **tags},
    })


def test_public_ip_on_etcd(pack: ModuleType, graphs: dict[str, Any]) -> None:
    resources = items(graphs["local"])
    pip = public_ip("local-etcd-main-0-pip", rules.ETCD_MAIN)
    [(message, urn)] = violations_of(pack, "no-public-ip-on-control-plane", "local", [*resources, pip])
    assert message.startswith(f"{pip.name}: a public IP on a etcd-main machine") and urn == pip.urn("local")

    acknowledged = public_ip("local-etcd-main-0-pip", rules.ETCD_MAIN, **{PUBLIC_IP_ACKNOWLEDGED_TAG: "true"})
    assert violations_of(pack, "no-public-ip-on-control-plane", "local", [*resources, acknowledged]) == []
    # a public IP on a pool's machine is none of this policy's business
    assert violations_of(pack, "no-public-ip-on-control-plane", "local",
                         [*resources, public_ip("local-cpu-pip", "pool")]) == []


def test_infiniband_scale_set_over_a_placement_group(pack: ModuleType, graphs: dict[str, Any]) -> None:
    resources = items(graphs["research-7500"])
    scale_set = next(r for r in resources if r.type == rules.VMSS and r.props["sku"]["name"] == "Standard_ND96asr_v4")
    assert scale_set.props["sku"]["capacity"] == 100
    assert violations_of(pack, "infiniband-scale-set-size", "research-7500", resources) == []

    scale_set.props["sku"]["capacity"] = 101
    [(message, urn)] = violations_of(pack, "infiniband-scale-set-size", "research-7500", resources)
    assert message.startswith(f"{scale_set.name}: 101 Standard_ND96asr_v4 VMs in one InfiniBand scale set")
    assert urn == scale_set.urn("research-7500")


def daemonset(resources: Iterable[Item], name: str) -> Item:
    return next(r for r in resources if r.type == apiload.DAEMONSET and r.props["metadata"]["name"] == name)


def test_daemonset_listing_cluster_wide_without_a_budget(pack: ModuleType, graphs: dict[str, Any]) -> None:
    resources = items(graphs["research-7500"])
    proxy = daemonset(resources, "kube-proxy")
    assert API_LOAD_BUDGET_ANNOTATION in proxy.props["metadata"]["annotations"]
    assert violations_of(pack, "daemonset-api-load", "research-7500", resources) == []

    del proxy.props["metadata"]["annotations"][API_LOAD_BUDGET_ANNOTATION]
    [(message, urn)] = violations_of(pack, "daemonset-api-load", "research-7500", resources)
    assert message.startswith(f"{proxy.name}: DaemonSet kube-system/kube-proxy runs as ServiceAccount "
                              "kube-system/kube-proxy, which may list or watch ")
    # through the built-in role kubeadm-like setups bind it to (kilonode.catalog.rbac)
    assert "discovery.k8s.io/endpointslices" in message and "services" in message
    assert "ClusterRoleBinding kilonode:node-proxier -> ClusterRole system:node-proxier" in message
    assert urn == proxy.urn("research-7500")


def test_a_daemonset_whose_default_account_gets_cluster_admin(pack: ModuleType, graphs: dict[str, Any]) -> None:
    """The device plugin runs as kube-system/default and needs no API, so it mounts no token.
    Binding that account to cluster-admin (a debugging shortcut) is harmless while it does; once
    its token is mounted again it is a per-node agent that may watch everything."""
    resources = items(graphs["research-7500"])
    plugin = daemonset(resources, "nvidia-device-plugin-daemonset")
    pod = plugin.props["spec"]["template"]["spec"]
    assert "serviceAccountName" not in pod and pod["automountServiceAccountToken"] is False
    shortcut = Item(apiload.CLUSTER_ROLE_BINDING, "research-7500-debug-admin", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "debug-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "kube-system"}]})
    # no token mounted by either plugin on kube-system/default: nothing to flag
    assert violations_of(pack, "daemonset-api-load", "research-7500", [*resources, shortcut]) == []

    del pod["automountServiceAccountToken"]
    found = violations_of(pack, "daemonset-api-load", "research-7500", [*resources, shortcut])
    # the RDMA plugin runs as the same account but still mounts no token: only the device plugin
    assert [urn for _, urn in found] == [plugin.urn("research-7500")]
    assert "*/* cluster-wide (ClusterRoleBinding debug-admin -> ClusterRole cluster-admin)" in found[0][0]


# --- values not known at preview -----------------------------------------------------------


def unknown_everywhere(resources: list[Item], keep_known: Callable[[Item], bool] = lambda r: False) -> None:
    """Puts the engine's unknown sentinels where a preview may have them: whole values, a
    list's item, a nested value."""
    for r in resources:
        if keep_known(r):
            continue
        if r.type == rules.NSG:
            r.props["securityRules"].insert(0, UNKNOWN_OBJECT_VALUE)
            r.props["securityRules"][1]["sourcePortRange"] = UNKNOWN_STRING_VALUE
            r.props["securityRules"][1]["etag"] = UNKNOWN_STRING_VALUE
        elif r.type == rules.SUBNET:
            r.props["id"] = UNKNOWN_STRING_VALUE
        elif r.type == rules.VMSS:
            r.props["sku"]["capacity"] = UNKNOWN_NUMBER_VALUE
        elif r.type == rules.VM:
            r.props["networkProfile"] = UNKNOWN_OBJECT_VALUE
            r.props["tags"]["kilonode-cluster"] = UNKNOWN_STRING_VALUE
        r.props["unknownAtPreview"] = UNKNOWN_STRING_VALUE


@pytest.mark.parametrize("stack", ["local", "research-7500"])
def test_unknown_values_are_read_as_absent(pack: ModuleType, graphs: dict[str, Any], stack: str) -> None:
    """Nothing raises (pulumi-policy would skip the policy for the whole stack with an advisory
    "can't run policy during preview"), and an unknown value is not taken for a violation."""
    resources = items(graphs[stack])
    unknown_everywhere(resources)
    assert run_all(pack, stack, resources) == {}


def test_unknown_values_do_not_hide_known_violations(pack: ModuleType, graphs: dict[str, Any]) -> None:
    resources = items(graphs["research-7500"])
    unknown_everywhere(resources)
    vm = etcd_vms(resources, rules.ETCD_MAIN)[0]
    vm.protect = False
    scale_set = next(r for r in resources if r.type == rules.VMSS and r.props["sku"]["name"] == "Standard_ND96asr_v4")
    scale_set.props["sku"]["capacity"] = 250
    found = run_all(pack, "research-7500", resources)
    assert {name: [urn for _, urn in v] for name, v in found.items()} == {
        "etcd-protected": [vm.urn("research-7500")],
        "infiniband-scale-set-size": [scale_set.urn("research-7500")],
    }


def test_unknown_sources_read_as_any_source(pack: ModuleType, graphs: dict[str, Any]) -> None:
    """An absent source is any source to the rule, so a rule to etcd's ports whose sources are
    not known at preview is reported: the pack fails closed there (the program's sources are
    the plan's subnets, known at preview)."""
    resources = items(graphs["local"])
    [nsg] = [r for r in resources if r.type == rules.NSG and r.name.endswith("-etcd-nsg")]
    [client] = [rule for rule in nsg.props["securityRules"] if rule["name"] == "allow-etcd-client-from-apiservers"]
    client["sourceAddressPrefixes"] = UNKNOWN_ARRAY_VALUE
    [(message, urn)] = violations_of(pack, "etcd-ports", "local", resources)
    assert message.startswith(f"{nsg.name} rule {client['name']!r} admits etcd's client port 2379 from *:")
    assert urn == nsg.urn("local")


def test_a_whole_unknown_tag_map_reads_as_untagged(pack: ModuleType, graphs: dict[str, Any]) -> None:
    """Tags the program sets are known at preview; if an etcd VM's were not, it would read as
    an untagged VM (not an etcd member), which the member-count policy then reports."""
    resources = items(graphs["local"])
    for vm in etcd_vms(resources, rules.ETCD_MAIN)[:1]:
        vm.props["tags"] = UNKNOWN_OBJECT_VALUE
    found = run_all(pack, "local", resources)
    assert [m for m, _ in found.pop("etcd-member-counts")] == [
        "etcd-main has 2 members: use 3, 5 or 7 (an odd count of at least 3 tolerates (n-1)/2 down; "
        "the 7,500-node clusters ran 5 for the main store)"]
    assert found == {}


# --- through pulumi-policy's own analyzer service ------------------------------------------


def test_through_the_analyzer_service(pack: ModuleType, graphs: dict[str, Any]) -> None:
    """The request the engine sends (AnalyzeStack) answered by pulumi-policy's servicer: the
    violations come back mandatory, with the resource's URN, and no policy is skipped as
    "can't run during preview" although the request carries unknown values."""
    resources = items(graphs["local"])
    unknown_everywhere(resources)
    vm = etcd_vms(resources, rules.ETCD_MAIN)[1]
    vm.protect = False
    request = proto.AnalyzeStackRequest(resources=[
        proto.AnalyzerResource(type=r.type, name=r.name, urn=r.urn("local"), properties=struct(r.props),
                               options=proto.AnalyzerResourceOptions(protect=r.protect))
        for r in resources
    ])
    servicer = _PolicyAnalyzerServicer(pack.PACK_NAME, "0.1.0", pack.POLICIES, EnforcementLevel.MANDATORY)
    response = servicer.AnalyzeStack(request, None)
    assert [(d.policyName, d.urn, d.enforcementLevel) for d in response.diagnostics] == [
        ("etcd-protected", vm.urn("local"), proto.MANDATORY)]
    [diagnostic] = response.diagnostics
    assert diagnostic.message.startswith(f"Every etcd VM is protected from deletion.\n{vm.name}: etcd VM without")
    assert not response.not_applicable


# --- what AnalyzeStack really carries: outputs ---------------------------------------------


def test_etcd_ports_with_subnets_as_outputs(pack: ModuleType, graphs: dict[str, Any]) -> None:
    resources = items(graphs["local"])
    for r in resources:
        if r.type == rules.SUBNET:
            r.props["name"] = r.props.pop("subnetName")  # the output carries the Azure name as `name`
    [nsg] = [r for r in resources if r.type == rules.NSG and r.name.endswith("-etcd-nsg")]
    nsg.props["securityRules"].append({
        "name": "debug-etcd", "priority": 4000, "direction": "Inbound", "access": "Allow", "protocol": "Tcp",
        "sourceAddressPrefix": "*", "destinationAddressPrefix": "*", "destinationPortRange": "2379",
    })
    assert violations_of(pack, "etcd-ports", "local", resources)
