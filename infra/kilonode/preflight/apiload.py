"""The per-node API load guard: which DaemonSets' pods may LIST or WATCH objects cluster-wide.

The 2,500-node lesson (docs/monitoring.md): agents that list and watch the apiserver from every
node multiply their load by the node count (500 MB/s of etcd reads from per-node monitoring
agents; N^2 Endpoints watches). A DaemonSet whose ServiceAccount may list or watch a resource
cluster-wide is one such agent in waiting, whether or not today's code uses the right: RBAC is
what bounds it. One kilonode chooses to run states its budget in the annotation
`kilonode.plan.wellknown.API_LOAD_BUDGET_ANNOTATION` (what it watches, why, and how it is
bounded); a pod that watches only its own node's objects through a field selector still needs
list/watch in RBAC, so the annotation is how such a pod says so.

What counts, as the RBAC authorizer decides it (kubernetes/kubernetes plugin/pkg/auth/authorizer/
rbac/rbac.go and pkg/registry/rbac/validation/rule.go: appliesTo, VerbMatches, APIGroupMatches,
ResourceMatches, ResourceNameMatches):

- the pod's ServiceAccount: `serviceAccountName` (or the deprecated `serviceAccount`), else
  `default` in the DaemonSet's namespace. No token, no load: `automountServiceAccountToken:
  false` on the pod, or on the ServiceAccount when the pod leaves it unset (the pod's field
  wins), and no projected `serviceAccountToken` volume (which mounts one regardless);
- ClusterRoleBindings only (the stack's, and the apiserver's own, kilonode.catalog.rbac), whose
  subjects name the ServiceAccount (its namespace required), its user
  `system:serviceaccount:<ns>:<name>`, or a group every such token carries (system:serviceaccounts,
  system:serviceaccounts:<ns>, system:authenticated). RoleBindings are namespaced: a list there
  is a list of one namespace, not of the cluster. system:nodes and other users' groups are
  never a pod's;
- the bound ClusterRole's rules, aggregation included (the union of every ClusterRole whose
  labels match one of its clusterRoleSelectors, as the aggregation controller writes it);
- a rule with `list`, `watch` or `*` among its verbs, on any resource (`*` included) that is not
  a subresource; a rule restricted by resourceNames does not count (a collection request carries
  no name; a watch of one named object is not a cluster-wide watch).

A binding to a ClusterRole found neither in the stack nor among the built-in ones, and the
kube-controller-manager's per-controller accounts (kube-system/<controller>), whose roles are not
kept here, hold rights this cannot read: they are reported as such, never as nothing.

Pure: objects in (anything with `type`, `name`, `props`: kilonode.review.rules.Resource), loads out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kilonode.catalog.rbac import builtin_rbac
from kilonode.plan.wellknown import API_LOAD_BUDGET_ANNOTATION

DAEMONSET = "kubernetes:apps/v1:DaemonSet"
SERVICE_ACCOUNT = "kubernetes:core/v1:ServiceAccount"
CLUSTER_ROLE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
CLUSTER_ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"
# the verbs that read a collection: a LIST, a WATCH (informers do both), or every verb
COLLECTION_VERBS = frozenset({"list", "watch", "*"})
# the groups every ServiceAccount token carries (k8s.io/apiserver pkg/authentication/serviceaccount
# util.go MakeGroupNames, plus the authenticator's system:authenticated)
ALL_SERVICE_ACCOUNTS = "system:serviceaccounts"
AUTHENTICATED = "system:authenticated"
KUBE_SYSTEM = "kube-system"


class Obj(Protocol):
    @property
    def type(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def props(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class Grant:
    """One resource a ServiceAccount may list or watch cluster-wide, and where the right comes from."""

    resource: str  # `services`, `discovery.k8s.io/endpointslices`, `*/*` (group/resource; core: none)
    verbs: tuple[str, ...]  # of list, watch, *
    binding: str  # the ClusterRoleBinding's name
    role: str  # the ClusterRole it binds

    def via(self) -> str:
        return f"ClusterRoleBinding {self.binding} -> ClusterRole {self.role}"


@dataclass(frozen=True)
class Load:
    """One DaemonSet's cluster-wide reads: what its pods' token may list or watch."""

    resource_name: str  # the DaemonSet's logical name in the stack (its URN's tail)
    daemonset: str  # namespace/name
    account: str  # namespace/name of the pod's ServiceAccount
    grants: tuple[Grant, ...]
    unreadable: tuple[str, ...]  # "ClusterRoleBinding X -> ClusterRole Y": rights not known here
    budget: str | None

    @property
    def flagged(self) -> bool:
        return bool(self.grants or self.unreadable)

    def resources(self) -> set[str]:
        """What it may list or watch, unreadable roles as `?<role>`."""
        return {g.resource for g in self.grants} | {f"?{u.rsplit(' ', 1)[-1]}" for u in self.unreadable}

    def what(self, resources: Iterable[str] | None = None) -> str:
        shown = sorted(self.resources() if resources is None else resources)
        return ", ".join(r if not r.startswith("?") else f"whatever {r[1:]} grants (not readable here)"
                         for r in shown)

    def sources(self) -> str:
        return "; ".join(sorted({g.via() for g in self.grants} | set(self.unreadable)))


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, Sequence) and not isinstance(value, str | bytes) else []


def _strings(value: Any) -> list[str]:
    return [v for v in _list(value) if isinstance(v, str)]


def _meta(props: Mapping[str, Any]) -> Mapping[str, Any]:
    return _map(props.get("metadata"))


def _name(props: Mapping[str, Any]) -> str | None:
    name = _meta(props).get("name")
    return name if isinstance(name, str) and name else None


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """A LabelSelector (matchLabels, matchExpressions) against an object's labels; an empty
    selector matches everything (metav1.LabelSelectorAsSelector)."""
    for key, value in _map(selector.get("matchLabels")).items():
        if labels.get(key) != value:
            return False
    for expression in _list(selector.get("matchExpressions")):
        expression = _map(expression)
        key, operator, values = expression.get("key"), expression.get("operator"), _strings(expression.get("values"))
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False  # an invalid selector selects nothing (the apiserver refuses it anyway)
    return True


class Rbac:
    """The ClusterRoles and ClusterRoleBindings in force: the stack's, over the built-in ones."""

    def __init__(self, objects: Sequence[Obj]) -> None:
        builtin = builtin_rbac()
        self.roles: dict[str, Mapping[str, Any]] = {r["metadata"]["name"]: r for r in builtin.cluster_roles}
        self.roles |= {name: o.props for o in objects if o.type == CLUSTER_ROLE and (name := _name(o.props))}
        self.bindings: list[Mapping[str, Any]] = [
            *builtin.cluster_role_bindings, *(o.props for o in objects if o.type == CLUSTER_ROLE_BINDING)]
        self.controllers = frozenset(builtin.controller_service_accounts)

    def rules(self, role: str, seen: frozenset[str] = frozenset()) -> list[Mapping[str, Any]] | None:
        """A ClusterRole's effective rules (aggregation resolved), None when it is not known."""
        body = self.roles.get(role)
        if body is None:
            return None
        aggregation = _map(body.get("aggregationRule"))
        if not aggregation:
            return [_map(rule) for rule in _list(body.get("rules"))]
        found: list[Mapping[str, Any]] = []
        selectors = [_map(s) for s in _list(aggregation.get("clusterRoleSelectors"))]
        for name, other in sorted(self.roles.items()):
            labels = _map(_meta(other).get("labels"))
            if name in seen or name == role or not any(selector_matches(s, labels) for s in selectors):
                continue
            found += self.rules(name, seen | {role}) or []
        return found


def _applies(subject: Mapping[str, Any], namespace: str, account: str) -> bool:
    """Whether a binding's subject is this ServiceAccount (rule.go appliesToUser)."""
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "ServiceAccount":
        return bool(subject.get("namespace")) and subject.get("namespace") == namespace and name == account
    if kind == "User":
        return name == f"system:serviceaccount:{namespace}:{account}"
    if kind == "Group":
        return name in (ALL_SERVICE_ACCOUNTS, f"{ALL_SERVICE_ACCOUNTS}:{namespace}", AUTHENTICATED)
    return False


def _collection_grants(rule: Mapping[str, Any], binding: str, role: str) -> list[Grant]:
    verbs = tuple(sorted(set(_strings(rule.get("verbs"))) & COLLECTION_VERBS))
    if not verbs or _strings(rule.get("resourceNames")):
        return []
    found = []
    for group in _strings(rule.get("apiGroups")):
        for resource in _strings(rule.get("resources")):
            if "/" in resource:
                continue  # a subresource: not a collection of objects
            found.append(Grant(resource if group == "" else f"{group}/{resource}", verbs, binding, role))
    return found


def _token_mounted(pod: Mapping[str, Any], account: Mapping[str, Any] | None) -> bool:
    """Whether the pod's containers get a token for the apiserver: the pod's
    automountServiceAccountToken, else the ServiceAccount's, else true; or a projected
    serviceAccountToken volume, which mounts one whatever automount says."""
    for volume in _list(pod.get("volumes")):
        for source in _list(_map(_map(volume).get("projected")).get("sources")):
            if _map(source).get("serviceAccountToken") is not None:
                return True
    for holder in (pod, account or {}):
        value = holder.get("automountServiceAccountToken")
        if isinstance(value, bool):
            return value
    return True


def _budget(props: Mapping[str, Any]) -> str | None:
    value = _map(_meta(props).get("annotations")).get(API_LOAD_BUDGET_ANNOTATION)
    return value.strip() if isinstance(value, str) and value.strip() else None


def _grants_of(rbac: Rbac, namespace: str, account: str) -> tuple[list[Grant], list[str]]:
    grants: list[Grant] = []
    unreadable: list[str] = []
    if namespace == KUBE_SYSTEM and account in rbac.controllers:
        unreadable.append(f"ClusterRoleBinding system:controller:{account} -> ClusterRole "
                          f"system:controller:{account}")
    for binding in rbac.bindings:
        if not any(_applies(_map(s), namespace, account) for s in _list(binding.get("subjects"))):
            continue
        ref = _map(binding.get("roleRef"))
        role, name = ref.get("name"), _name(binding) or "(unnamed)"
        if ref.get("kind") != "ClusterRole" or not isinstance(role, str):
            continue  # not known yet (a preview's unknown), or not a ClusterRole: nothing to read
        rules = rbac.rules(role)
        if rules is None:
            unreadable.append(f"ClusterRoleBinding {name} -> ClusterRole {role}")
            continue
        for rule in rules:
            grants += _collection_grants(rule, name, role)
    return grants, unreadable


def api_loads(objects: Iterable[Obj]) -> list[Load]:
    """Every DaemonSet's cluster-wide list/watch rights (an empty Load where it has none)."""
    objects = list(objects)
    rbac = Rbac(objects)
    accounts = {(str(_meta(o.props).get("namespace") or "default"), name): o.props
                for o in objects if o.type == SERVICE_ACCOUNT and (name := _name(o.props))}
    found = []
    for o in objects:
        if o.type != DAEMONSET:
            continue
        namespace = str(_meta(o.props).get("namespace") or "default")
        pod = _map(_map(_map(o.props.get("spec")).get("template")).get("spec"))
        account = pod.get("serviceAccountName") or pod.get("serviceAccount") or "default"
        account = account if isinstance(account, str) else "default"
        grants: list[Grant] = []
        unreadable: list[str] = []
        if _token_mounted(pod, accounts.get((namespace, account))):
            grants, unreadable = _grants_of(rbac, namespace, account)
        found.append(Load(o.name, f"{namespace}/{_name(o.props) or o.name}", f"{namespace}/{account}",
                          tuple(sorted(set(grants), key=lambda g: (g.resource, g.binding))),
                          tuple(sorted(set(unreadable))), _budget(o.props)))
    return found


def unbudgeted(objects: Iterable[Obj]) -> list[str]:
    """The policy's violations: a DaemonSet that may list or watch cluster-wide and states no budget."""
    return [f"{load.resource_name}: DaemonSet {load.daemonset} runs as ServiceAccount {load.account}, which may "
            f"list or watch {load.what()} cluster-wide ({load.sources()}): one watch per node on the apiservers, "
            "the 2,500-node lesson; narrow its RBAC, turn its token off (automountServiceAccountToken: false), or "
            f"state its budget in the {API_LOAD_BUDGET_ANNOTATION} annotation (what it watches, why, how it is "
            "bounded)"
            for load in api_loads(objects) if load.flagged and load.budget is None]
