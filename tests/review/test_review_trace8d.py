"""The two security changes an independent trace of `kilonode diff` on research-7500 found reviewed
as harmless (trace 8d), each on the stack's recorded snapshot changed by hand as the pull request
changes it: Prometheus's ClusterRole given `nodes/proxy` get (the kubelet API, exec included, of
every node: `rbac-escalation`), and the apiserver audit policy raised from Metadata to
RequestResponse (Secrets' plain text in every apiserver's audit log, every cluster-wide list of
nodes and pods serialised into it: `audit-secrets-logged`)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kilonode.review import security
from kilonode.review.compare import FileChange, StackDiff, compare_stack
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.risks import Risk, assess
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
BINDING = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"
ROLE_NS = "kubernetes:rbac.authorization.k8s.io/v1:Role"
BINDING_NS = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"


def risks(head: dict[str, Any], rule: str) -> list[Risk]:
    return [r for r in assess(compare_stack(STACK, snapshot(STACK), head), {}) if r.rule == rule]


def found(head: dict[str, Any]) -> list[Finding]:
    return security.assess(compare_stack(STACK, snapshot(STACK), head))


def cluster_role(entry: dict[str, Any], name: str) -> dict[str, Any]:
    [inputs] = [r["inputs"] for r in entry["resources"]
                if r["type"] == ROLE and r["inputs"]["metadata"]["name"] == name]
    return inputs


def add(entry: dict[str, Any], kind: str, name: str, inputs: dict[str, Any]) -> None:
    """A new RBAC object in the graph, shaped as the recorded ones."""
    [template] = [r for r in entry["resources"] if r["type"] == BINDING][:1]
    entry["resources"].append({**copy.deepcopy(template), "type": kind, "name": name, "inputs": inputs})


def sa(name: str, namespace: str = "kube-system") -> dict[str, str]:
    return {"kind": "ServiceAccount", "name": name, "namespace": namespace}


def test_an_unchanged_stack_says_neither_rule() -> None:
    assert found(snapshot(STACK)) == []
    assert not [r for r in assess(compare_stack(STACK, snapshot(STACK), snapshot(STACK)), {})
                if r.rule in (security.RBAC_RULE, security.AUDIT_RULE)]


# --- 1. RBAC escalation paths ---------------------------------------------------------------------------------------


def test_prometheus_given_nodes_proxy_is_a_high_escalation_naming_its_workload_and_the_fix() -> None:
    head = snapshot(STACK)
    cluster_role(head, "kilonode:prometheus")["rules"].append(
        {"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]})
    [line] = risks(head, security.RBAC_RULE)
    assert line.level == HIGH
    assert "ServiceAccount monitoring/prometheus" in line.summary
    assert "StatefulSet monitoring/prometheus" in line.summary
    assert "nodes/proxy cluster-wide" in line.summary and "command execution in every pod" in line.summary
    assert "nodes/metrics get" in line.summary and "7,504 nodes" in line.summary
    assert "research-7500-k8s-monitoring-prometheus-role" in line.subjects


def test_a_wildcard_resource_is_every_path_at_once() -> None:
    head = snapshot(STACK)
    cluster_role(head, "kilonode:prometheus")["rules"].append({"apiGroups": [""], "resources": ["*"], "verbs": ["get"]})
    [line] = found(head)
    for title in ("nodes/proxy", "Secrets get/list/watch", "a wildcard verb or resource"):
        assert title in line.summary


def test_a_new_binding_of_cluster_admin_to_a_service_account_is_reported_with_its_daemonset() -> None:
    head = snapshot(STACK)
    add(head, BINDING, "calico-admin", {
        "metadata": {"name": "calico-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [sa("calico-node")]})
    [line] = found(head)
    assert line.level == HIGH and "ServiceAccount kube-system/calico-node" in line.summary
    assert "DaemonSet kube-system/calico-node" in line.summary and "every node the DaemonSet runs on" in line.summary
    assert "ClusterRole cluster-admin through ClusterRoleBinding calico-admin" in line.summary
    assert "calico-admin" in line.subjects


def test_workload_creation_counts_in_kube_system_and_cluster_wide_not_in_another_namespace() -> None:
    def with_role(namespace: str) -> dict[str, Any]:
        head = snapshot(STACK)
        rule = {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["create"]}
        add(head, ROLE_NS, "r", {"metadata": {"name": "deployer", "namespace": namespace}, "rules": [rule]})
        add(head, BINDING_NS, "rb", {
            "metadata": {"name": "deployer", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "deployer"},
            "subjects": [sa("prometheus", "monitoring")]})
        return head

    [line] = found(with_role("kube-system"))
    assert "workload creation in namespace kube-system" in line.summary
    assert found(with_role("monitoring")) == []


def test_a_signer_restricted_to_the_kubelet_client_signer_is_no_escalation() -> None:
    """kilonode's approvers approve kube-apiserver-client-kubelet only: the page's path is the
    kube-apiserver-client signer, with CSR create; all three are needed."""
    head = snapshot(STACK)
    role = cluster_role(head, "kilonode:kubelet-csr-approver")
    role["rules"].append({"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"],
                          "verbs": ["create"]})
    assert found(head) == []
    role["rules"].append({"apiGroups": ["certificates.k8s.io"], "resources": ["signers"], "verbs": ["approve"],
                          "resourceNames": ["kubernetes.io/kube-apiserver-client"]})
    [line] = found(head)
    assert "kube-apiserver-client signer" in line.summary and "kube-system/kubelet-csr-approver" in line.summary


def test_a_grant_the_base_already_gave_is_not_new() -> None:
    """cloud-node-manager patches Nodes in the shipped stack: a second role giving the same is no change."""
    head = snapshot(STACK)
    add(head, ROLE, "extra", {"metadata": {"name": "extra"},
                              "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]})
    add(head, BINDING, "extra-binding", {
        "metadata": {"name": "extra"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "extra"},
        "subjects": [sa("cloud-node-manager")]})
    assert found(head) == []


def test_every_escalation_names_a_source_and_a_fix() -> None:
    from kilonode.catalog.escalations import escalations

    rows = escalations().escalations
    assert {"nodes-proxy", "pods-exec", "secrets-read", "workload-create", "wildcard"} <= {e.id for e in rows}
    assert all(e.source and e.fix and e.does and (e.needs or e.wildcard) for e in rows)


# --- 2. the audit policy ------------------------------------------------------------------------------------------


POLICY = "etc/kubernetes/audit-policy.yaml"
SENSITIVE_FIRST = """\
apiVersion: audit.k8s.io/v1
kind: Policy
rules:
- level: None
  resources: [{group: "", resources: [events]}]
- level: Metadata
  resources:
  - {group: "", resources: [secrets, configmaps, serviceaccounts/token]}
  - {group: authentication.k8s.io, resources: [tokenreviews]}
- level: Request
  verbs: [get, list, watch]
- level: RequestResponse
"""


def with_policy(entry: dict[str, Any], text: str) -> dict[str, Any]:
    for path in entry["files"]:
        if path.endswith(POLICY):
            entry["files"][path] = text
    return entry


def test_metadata_to_request_response_is_high_for_secrets_and_medium_for_the_fleets_lists() -> None:
    head = snapshot(STACK)
    for path in head["files"]:
        if path.endswith(POLICY):
            head["files"][path] = head["files"][path].replace("- level: Metadata", "- level: RequestResponse")
    high, medium = sorted(risks(head, security.AUDIT_RULE), key=lambda r: r.level != HIGH)
    assert high.level == HIGH and medium.level == MEDIUM
    assert "secrets get/list/watch" in high.summary and "tokenreviews create" in high.summary
    assert "at RequestResponse (was Metadata" in high.summary and "configure-helper.sh" in high.summary
    assert "on 5 apiserver(s)" in high.summary and len(high.subjects) == 5
    assert "nodes (cluster-wide) list" in medium.summary and "7,504 nodes" in medium.summary


def test_secrets_kept_at_metadata_before_the_wider_rule_is_no_finding() -> None:
    """First match decides (checker.go): the Metadata rule for the sensitive kinds shadows the later
    RequestResponse, and get/list/watch stop at Request."""
    assert found(with_policy(snapshot(STACK), SENSITIVE_FIRST)) == []


def test_a_rule_scoped_to_a_group_still_counts() -> None:
    """A RequestResponse rule for system:nodes' Secret reads: the nodes' requests are logged so."""
    text = SENSITIVE_FIRST.replace("- level: None\n", "- level: RequestResponse\n  userGroups: [system:nodes]\n"
                                   "  resources: [{group: \"\", resources: [secrets]}]\n- level: None\n", 1)
    [line] = found(with_policy(snapshot(STACK), text))
    assert line.level == HIGH and "secrets get/list/watch" in line.summary and "configmaps" not in line.summary


def test_a_hand_built_diff_of_the_policy_file_alone() -> None:
    """Only the files: a StackDiff of FileChange entries, no graph."""
    base = {"files": {f"apiserver-0/{POLICY}": "rules:\n- level: Metadata\n"}, "resources": []}
    head = {"files": {f"apiserver-0/{POLICY}": "rules:\n- level: Request\n"}, "resources": []}
    change = FileChange(f"apiserver-0/{POLICY}", "modified", "")
    [line] = security.assess(StackDiff(STACK, base, head, files=[change]))
    assert line.level == HIGH and "at Request (was Metadata" in line.summary
    assert "nodes (cluster-wide)" not in line.summary  # a list at Request logs no response
    broken = {"files": {f"apiserver-0/{POLICY}": "rules: [\n"}, "resources": []}
    diff = StackDiff(STACK, base, broken, files=[change])
    assert security.assess(diff) == [] and any("did not parse" in n for n in diff.notes)


def test_configmap_writes_in_kube_system_are_an_escalation() -> None:
    """Trace 10: Prometheus's ClusterRole given configmaps update/patch: the Corefile is a ConfigMap
    CoreDNS reloads in every replica."""
    head = snapshot(STACK)
    [role] = [r["inputs"] for r in head["resources"] if r["type"].endswith(":ClusterRole")
              and "prometheus" in r["inputs"]["metadata"]["name"]]
    role["rules"].append({"apiGroups": [""], "resources": ["configmaps"],
                          "verbs": ["get", "list", "watch", "update", "patch"]})
    found = [f for f in security.assess(compare_stack(STACK, snapshot(STACK), head)) if f.rule == "rbac-escalation"]
    assert any("ConfigMap writes in kube-system" in f.summary and "Corefile" in f.summary for f in found)
