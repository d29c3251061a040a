"""calico-node's token is on every node; what it may write cluster-wide is held to what its startup
writes (kilonode.k8s.calico NODE_WRITES_POLICY): the policy's CEL evaluated with cel-python, its
variables first as the apiserver evaluates them, on the writes read from upstream at v3.31.7
(node/pkg/lifecycle/startup/startup.go:1223-1358, libcalico-go/lib/clientv3/client.go:259-456) and on
the writes a node's root could make with the token."""

from __future__ import annotations

from typing import Any

import celpy
import pytest
from celpy import celtypes

from kilonode.k8s.admission import NODE_NAME_EXTRA
from kilonode.k8s.calico import NODE_RULES, NODE_USER, NODE_WRITE_VARIABLES, NODE_WRITES, node_write_rules

ENV = celpy.Environment()
VARIABLES = {name: ENV.program(ENV.compile(text)) for name, text in NODE_WRITE_VARIABLES.items()}
RULES = [ENV.program(ENV.compile(text)) for text, _ in node_write_rules()]
GUID = "6d1f4c1e2a3b4c5d6e7f8091a2b3c4d5"
INFO = {"calicoVersion": "v3.31.7", "clusterType": "k8s,kdd", "clusterGUID": GUID, "datastoreReady": True}


def admitted(resource: str, name: str, new: dict[str, Any] | None, old: dict[str, Any] | None = None,
             user: str = NODE_USER, on: str | None = "gpu-a") -> bool:
    """Every validation admits the write (`new`/`old`: the specs; old None: a create)."""
    extra = {NODE_NAME_EXTRA: [on], "authentication.kubernetes.io/pod-name": ["calico-node-x"]} if on else {}
    obj = {"apiVersion": "crd.projectcalico.org/v1", "metadata": {"name": name}, **({"spec": new} if new else {})}
    prior = None if old is None else {**obj, "spec": old}
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(prior),
        "request": celpy.json_to_cel({"operation": "CREATE" if old is None else "UPDATE",
                                      "resource": {"group": "crd.projectcalico.org", "resource": resource},
                                      "userInfo": {"username": user, "extra": extra}})}
    variables = celtypes.MapType()
    for key, program in VARIABLES.items():  # in order: a later one may read an earlier one
        variables[celtypes.StringType(key)] = program.evaluate({**activation, "variables": variables})
    activation["variables"] = variables
    results = [rule.evaluate(activation) for rule in RULES]
    return all(isinstance(r, celtypes.BoolType) and bool(r) for r in results)


def test_the_startup_creates_and_updates_as_upstream_does() -> None:
    # a first node: ClusterInformation, the default FelixConfiguration, the three Tiers (client.go:273-289)
    assert admitted("clusterinformations", "default", INFO)
    assert admitted("felixconfigurations", "default", {"reportingInterval": "0s", "logSeverityScreen": "Info"})
    assert admitted("tiers", "default", {"order": 1000000, "defaultAction": "Deny"})
    assert admitted("tiers", "default", {"order": 1000000.0, "defaultAction": "Deny"})
    assert admitted("tiers", "adminnetworkpolicy", {"order": 1000, "defaultAction": "Pass"})
    assert admitted("tiers", "baselineadminnetworkpolicy", {"order": 10000000, "defaultAction": "Pass"})
    # an upgrade: the new version and a cluster type added (client.go:357-410)
    assert admitted("clusterinformations", "default", {**INFO, "calicoVersion": "v3.32.0", "clusterType": "k8s,kdd,x"},
                    INFO)
    # a GUID and datastoreReady set where unset
    assert admitted("clusterinformations", "default", INFO, {"calicoVersion": "v3.31.7"})
    # the FelixConfiguration's unset defaults filled, every other field kept (startup.go:1284-1309)
    kept = {"logSeverityScreen": "Warning", "bpfEnabled": False}
    assert admitted("felixconfigurations", "default", {**kept, "reportingInterval": "0s"}, kept)
    # Felix's status report on its own node's CalicoNodeStatus
    status = {"node": "gpu-a", "classes": ["Agent"]}
    assert admitted("caliconodestatuses", "gpu-a-status", status, status)


@pytest.mark.parametrize(("resource", "name", "new", "old"), [
    ("clusterinformations", "default", {**INFO, "datastoreReady": False}, INFO),  # every Felix stops
    ("clusterinformations", "default", {k: v for k, v in INFO.items() if k != "datastoreReady"}, INFO),
    ("clusterinformations", "default", {**INFO, "clusterGUID": "0" * 32}, INFO),
    ("clusterinformations", "default", {**INFO, "variant": "TigeraSecureEnterprise"}, INFO),
    ("clusterinformations", "default", {**INFO, "datastoreReady": False}, None),  # first, and wrong
    ("clusterinformations", "other", INFO, None),
    ("felixconfigurations", "default", {"reportingInterval": "0s", "logSeverityScreen": "Info",
                                        "chainInsertMode": "Append"}, None),
    ("felixconfigurations", "default", {"logSeverityScreen": "Info", "policySyncPathPrefix": "/x"},
     {"logSeverityScreen": "Info"}),
    ("felixconfigurations", "default", {"logSeverityScreen": "Debug"}, {"logSeverityScreen": "Info"}),
    ("felixconfigurations", "default", {"reportingInterval": "1ms"}, {}),
    ("felixconfigurations", "default", {}, {"defaultEndpointToHostAction": "Drop"}),  # a setting removed
    ("felixconfigurations", "node.gpu-b", {"defaultEndpointToHostAction": "Accept"}, None),
    ("tiers", "default", {"order": 1000000, "defaultAction": "Pass"}, None),  # isolation off
    ("tiers", "default", {"order": 1, "defaultAction": "Deny"}, None),
    ("tiers", "default", None, None),
    ("tiers", "platform", {"order": 1, "defaultAction": "Pass"}, None),
    ("tiers", "default", {"order": 1000000, "defaultAction": "Deny"}, {"order": 1000000, "defaultAction": "Deny"}),
    ("caliconodestatuses", "gpu-b-status", {"node": "gpu-b"}, {"node": "gpu-b"}),
    ("caliconodestatuses", "gpu-b-status", {"node": "gpu-a"}, {"node": "gpu-b"}),
])
def test_what_root_on_a_node_could_write_with_the_token_is_refused(
        resource: str, name: str, new: dict[str, Any] | None, old: dict[str, Any] | None) -> None:
    assert not admitted(resource, name, new, old)
    # the policy judges calico-node's account alone
    assert admitted(resource, name, new, old, user="system:serviceaccount:kube-system:someone-else")


def test_a_token_bound_to_no_pod_writes_no_node_status() -> None:
    status = {"node": "gpu-a"}
    assert not admitted("caliconodestatuses", "gpu-a-status", status, status, on=None)


def test_the_policy_covers_every_calico_kind_the_role_may_write() -> None:
    written = {resource for rule in NODE_RULES if set(rule["verbs"]) & {"create", "update", "patch"}
               and rule["api_groups"] == ["crd.projectcalico.org"] for resource in rule["resources"]}
    assert written == set(NODE_WRITES)
