"""The per-node API load guard (kilonode.preflight.apiload) on hand-made objects: which DaemonSets'
tokens may list or watch cluster-wide, through which binding, and the cases that must not count
(a RoleBinding, no token, resourceNames, the kubelet's groups); then the diff's risk rule on two
hand-made snapshots, and the shipped DaemonSets' budgets."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from kilonode.catalog.rbac import builtin_rbac
from kilonode.k8s.cloud_provider import CNM_API_LOAD_BUDGET
from kilonode.k8s.proxy import API_LOAD_BUDGET
from kilonode.plan.wellknown import API_LOAD_BUDGET_ANNOTATION
from kilonode.preflight.apiload import (
    CLUSTER_ROLE,
    CLUSTER_ROLE_BINDING,
    DAEMONSET,
    SERVICE_ACCOUNT,
    Load,
    api_loads,
    unbudgeted,
)
from kilonode.review.compare import compare_stack
from kilonode.review.risks import HIGH, api_load
from kilonode.review.rules import Resource

ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"
ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
NS = "agents"


def daemonset(account: str | None = "agent", budget: str | None = None, **pod: Any) -> Resource:
    spec: dict[str, Any] = {"containers": [{"name": "agent", "image": "agent"}], **pod}
    if account is not None:
        spec["serviceAccountName"] = account
    metadata: dict[str, Any] = {"name": "agent", "namespace": NS}
    if budget is not None:
        metadata["annotations"] = {API_LOAD_BUDGET_ANNOTATION: budget}
    return Resource(DAEMONSET, "c-agent", {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": metadata,
                                           "spec": {"template": {"spec": spec}}})


def account(name: str = "agent", namespace: str = NS, **fields: Any) -> Resource:
    return Resource(SERVICE_ACCOUNT, f"c-{name}-sa", {"metadata": {"name": name, "namespace": namespace}, **fields})


def cluster_role(name: str, *rules: dict[str, Any], labels: dict[str, str] | None = None,
                 aggregate: list[dict[str, Any]] | None = None) -> Resource:
    props: dict[str, Any] = {"metadata": {"name": name, **({"labels": labels} if labels else {})},
                             "rules": list(rules)}
    if aggregate is not None:
        props["aggregationRule"] = {"clusterRoleSelectors": aggregate}
    return Resource(CLUSTER_ROLE, f"c-{name}", props)


def rule(resources: list[str], verbs: list[str], groups: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"apiGroups": groups if groups is not None else [""], "resources": resources, "verbs": verbs, **extra}


def binding(name: str, role: str, *subjects: dict[str, str], kind: str = CLUSTER_ROLE_BINDING,
            role_kind: str = "ClusterRole") -> Resource:
    subjects = subjects or ({"kind": "ServiceAccount", "name": "agent", "namespace": NS},)
    metadata = {"name": name, **({"namespace": NS} if kind == ROLE_BINDING else {})}
    return Resource(kind, f"c-{name}", {"metadata": metadata, "subjects": list(subjects),
                                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind,
                                                    "name": role}})


def load_of(*objects: Resource) -> Load:
    [load] = api_loads(objects)
    return load


def test_a_cluster_role_binding_with_list_and_watch_counts_naming_resource_and_binding() -> None:
    load = load_of(daemonset(), account(), cluster_role("reader", rule(["pods"], ["get", "list", "watch"])),
                   binding("read-pods", "reader"))
    assert load.flagged and load.resources() == {"pods"}
    [grant] = load.grants
    assert (grant.binding, grant.role, grant.verbs) == ("read-pods", "reader", ("list", "watch"))
    [message] = unbudgeted([daemonset(), account(), cluster_role("reader", rule(["pods"], ["list"])),
                            binding("read-pods", "reader")])
    assert message.startswith("c-agent: DaemonSet agents/agent runs as ServiceAccount agents/agent")
    assert "pods" in message and "ClusterRoleBinding read-pods -> ClusterRole reader" in message


def test_get_alone_is_no_collection_read() -> None:
    assert not load_of(daemonset(), cluster_role("getter", rule(["pods", "nodes"], ["get", "update"])),
                       binding("get", "getter")).flagged


@pytest.mark.parametrize(("rules", "expected"), [
    ([rule(["secrets"], ["*"])], {"secrets"}),  # every verb
    ([rule(["*"], ["watch"], ["apps"])], {"apps/*"}),  # every resource of a group
    ([rule(["*"], ["*"], ["*"])], {"*/*"}),  # everything
    ([rule(["endpointslices"], ["list"], ["discovery.k8s.io"])], {"discovery.k8s.io/endpointslices"}),
])
def test_wildcards_count(rules: list[dict[str, Any]], expected: set[str]) -> None:
    assert load_of(daemonset(), cluster_role("wide", *rules), binding("wide", "wide")).resources() == expected


def test_cluster_admin_a_built_in_role_counts() -> None:
    load = load_of(daemonset(), binding("agent-admin", "cluster-admin"))
    assert load.resources() == {"*/*"}
    assert load.grants[0].role == "cluster-admin"


def test_an_aggregated_cluster_role_takes_the_rules_of_the_roles_it_selects() -> None:
    label = {"example.com/aggregate-to-agent": "true"}
    objects = [daemonset(),
               cluster_role("agent-aggregate", aggregate=[{"matchLabels": label}]),
               # its own `rules` are what the controller writes: the selected roles' rules decide
               cluster_role("piece", rule(["configmaps"], ["list", "watch"]), labels=label),
               cluster_role("unselected", rule(["secrets"], ["list"]), labels={"other": "x"}),
               binding("agent", "agent-aggregate")]
    assert load_of(*objects).resources() == {"configmaps"}
    # matchExpressions too
    objects[1] = cluster_role("agent-aggregate", aggregate=[
        {"matchExpressions": [{"key": "other", "operator": "In", "values": ["x"]}]}])
    assert load_of(*objects).resources() == {"secrets"}


def test_a_stack_role_labelled_to_aggregate_into_built_in_view_widens_it() -> None:
    label = {"rbac.authorization.k8s.io/aggregate-to-view": "true"}
    plain = load_of(daemonset(), binding("agent-view", "view"))
    assert {"pods", "services"} <= plain.resources() and "example.com/widgets" not in plain.resources()
    widened = load_of(daemonset(), cluster_role("widgets", rule(["widgets"], ["list"], ["example.com"]),
                                                labels=label), binding("agent-view", "view"))
    assert "example.com/widgets" in widened.resources()


def test_a_role_binding_is_namespaced_and_does_not_count() -> None:
    objects = [daemonset(), cluster_role("reader", rule(["pods"], ["list", "watch"])),
               binding("ns-read", "reader", kind=ROLE_BINDING),
               Resource(ROLE, "c-role", {"metadata": {"name": "r", "namespace": NS},
                                         "rules": [rule(["*"], ["*"], ["*"])]}),
               binding("ns-all", "r", kind=ROLE_BINDING, role_kind="Role")]
    assert not load_of(*objects).flagged
    assert unbudgeted(objects) == []


def test_automount_false_on_the_pod_or_the_account_means_no_token_and_no_load() -> None:
    wide = [cluster_role("reader", rule(["pods"], ["list"])), binding("read", "reader")]
    assert not load_of(daemonset(automountServiceAccountToken=False), account(), *wide).flagged
    assert not load_of(daemonset(), account(automountServiceAccountToken=False), *wide).flagged
    # the pod's own field wins over the account's
    assert load_of(daemonset(automountServiceAccountToken=True), account(automountServiceAccountToken=False),
                   *wide).flagged
    # a projected token volume mounts one whatever automount says
    projected = {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}
    assert load_of(daemonset(automountServiceAccountToken=False, volumes=[projected]), *wide).flagged


def test_an_unset_account_is_the_namespaces_default() -> None:
    load = load_of(daemonset(account=None), cluster_role("reader", rule(["nodes"], ["watch"])),
                   binding("default-read", "reader", {"kind": "ServiceAccount", "name": "default", "namespace": NS}))
    assert load.account == f"{NS}/default" and load.resources() == {"nodes"}


@pytest.mark.parametrize(("subject", "counts"), [
    ({"kind": "Group", "name": "system:serviceaccounts"}, True),
    ({"kind": "Group", "name": f"system:serviceaccounts:{NS}"}, True),
    ({"kind": "Group", "name": "system:authenticated"}, True),
    ({"kind": "User", "name": f"system:serviceaccount:{NS}:agent"}, True),
    # the kubelet's groups and users are never a pod's
    ({"kind": "Group", "name": "system:nodes"}, False),
    ({"kind": "User", "name": "system:node:node-1"}, False),
    ({"kind": "Group", "name": "system:serviceaccounts:other"}, False),
    ({"kind": "ServiceAccount", "name": "agent", "namespace": "other"}, False),
    ({"kind": "ServiceAccount", "name": "agent"}, False),  # no namespace: the authorizer matches nothing
])
def test_which_subjects_are_the_pods(subject: dict[str, str], counts: bool) -> None:
    load = load_of(daemonset(), cluster_role("reader", rule(["pods"], ["list"])), binding("b", "reader", subject))
    assert load.flagged is counts


def test_resource_names_and_subresources_are_no_cluster_wide_watch() -> None:
    assert not load_of(daemonset(), cluster_role("own", rule(["configmaps"], ["list", "watch"],
                                                            resourceNames=["agent-config"])),
                       binding("own", "own")).flagged
    assert not load_of(daemonset(), cluster_role("logs", rule(["pods/log"], ["get", "list"])),
                       binding("logs", "logs")).flagged


def test_a_role_nobody_can_read_is_reported_not_ignored() -> None:
    load = load_of(daemonset(), binding("mystery", "made-elsewhere"))
    assert load.flagged and load.unreadable == ("ClusterRoleBinding mystery -> ClusterRole made-elsewhere",)
    assert "whatever made-elsewhere grants" in load.what()
    # a controller's account in kube-system: its role is the apiserver's, not kept here
    controller = daemonset(account="daemon-set-controller")
    controller.props["metadata"]["namespace"] = "kube-system"
    assert load_of(controller).flagged


def test_the_built_in_bindings_give_a_plain_account_no_cluster_wide_read() -> None:
    """Every ServiceAccount falls under system:basic-user, system:discovery, ...: none lists."""
    assert builtin_rbac().cluster_role_bindings
    assert not load_of(daemonset()).flagged
    kube_dns = daemonset(account="kube-dns")
    kube_dns.props["metadata"]["namespace"] = "kube-system"
    assert load_of(kube_dns).resources() == {"endpoints", "services"}  # system:kube-dns binds it by name


def test_a_budget_annotation_accepts_the_load_and_an_empty_one_does_not() -> None:
    wide = [cluster_role("reader", rule(["pods"], ["list"])), binding("read", "reader")]
    assert unbudgeted([daemonset(budget="pods on its own node: fieldSelector spec.nodeName"), *wide]) == []
    assert len(unbudgeted([daemonset(budget="  "), *wide])) == 1
    assert load_of(daemonset(budget="x"), *wide).budget == "x"


def test_the_shipped_budgets_say_what_each_program_watches_and_how_it_is_bounded() -> None:
    """Hand-written from the programs' sources (kilonode.k8s.proxy, .cloud_provider cite them)."""
    assert "EndpointSlices" in API_LOAD_BUDGET and "not Endpoints" in API_LOAD_BUDGET
    assert "fieldSelector metadata.name" in CNM_API_LOAD_BUDGET and "no informer resync" in CNM_API_LOAD_BUDGET


def _snapshot(objects: list[Resource], nodes: int = 7500) -> dict[str, Any]:
    return {"files": {"plan.yaml": yaml.safe_dump({"nodePools": [{"name": "gpu", "nodes": nodes}]})},
            "outputs": {}, "resources": [{"type": o.type, "name": o.name, "parent": None, "protect": False,
                                          "custom": True, "replaceOnChanges": [], "ignoreChanges": [],
                                          "inputs": copy.deepcopy(dict(o.props))} for o in objects]}


def test_the_diff_flags_a_new_or_widened_daemonset_with_the_node_count() -> None:
    reader = cluster_role("reader", rule(["nodes"], ["list", "watch"]))
    base = _snapshot([daemonset(budget="its own Node"), reader, binding("read", "reader")])
    same = api_load(compare_stack("c", base, copy.deepcopy(base)))
    assert same == []
    wider = cluster_role("reader", rule(["nodes"], ["list", "watch"]), rule(["pods"], ["watch"]))
    head = _snapshot([daemonset(budget="its own Node"), wider, binding("read", "reader")])
    [risk] = api_load(compare_stack("c", base, head))
    assert (risk.level, risk.rule, risk.subjects) == (HIGH, "daemonset-api-load", ("c-agent",))
    assert risk.summary.startswith("7,500 nodes x a watch of pods on the apiservers: the 2,500-node lesson")
    assert "its stated budget" in risk.summary
    # a new DaemonSet without a budget: the story says the policy refuses it
    [new] = api_load(compare_stack("c", _snapshot([reader]), _snapshot([daemonset(), reader,
                                                                         binding("read", "reader")])))
    assert "new DaemonSet" in new.summary and "pulumi preview` refuses it" in new.summary
