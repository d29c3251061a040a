"""Two security changes the rules above read as harmless (independent trace of `kilonode diff` on
research-7500, 8th, d): an RBAC grant upstream names an escalation path, and the apiserver's
audit policy logging bodies it must not.

`rbac-escalation`: a subject (a ServiceAccount, a group, a user) that holds at the head a
permission kilonode/catalog/escalations.yaml names (nodes/proxy, pods/exec, Secrets read,
workload creation in kube-system, escalate/bind/impersonate, ...: kubernetes/website
content/en/docs/concepts/security/rbac-good-practices.md) where the base did not give it to that
subject at that scope: a role gaining the permission, or a binding newly binding such a role.
What a subject holds is read from the side's Roles, ClusterRoles and their bindings (the graph's),
a roleRef the graph does not define resolved against the apiserver's own roles
(kilonode/catalog/rbac.yaml); each rule matched as the RBAC authorizer matches it (kubernetes/
kubernetes pkg/apis/rbac/v1/evaluation_helpers.go: APIGroupMatches, VerbMatches, ResourceMatches
with "*" and "*/<subresource>", ResourceNameMatches). A grant through a ClusterRoleBinding counts
cluster-wide, through a RoleBinding in that namespace only. Not read: ClusterRoles aggregated into
another by label (a stack role labelled aggregate-to-edit widens edit), and the "all of" paths
(CSR signing) across scopes: each scope is judged alone. The shipped stacks' own grants are left
alone (a change rule: new at the head), whatever they are.

`audit-secrets-logged`: the rendered audit policy (etc/kubernetes/audit-policy.yaml on each
apiserver, kilonode.render.control_plane.audit_policy) evaluated on both sides as kube-apiserver
evaluates it (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/audit/policy/checker.go: the
first rule whose users, userGroups, verbs, namespaces, resources (group, "resource/subresource",
"*", "*/sub", "resource/*", resourceNames) and nonResourceURLs all match decides; none matching is
level None). High where a request on Secrets, ConfigMaps, serviceaccounts/token or TokenReviews
is logged above Metadata and above the base's level: upstream's own policy
(kubernetes/kubernetes cluster/gce/gci/configure-helper.sh, the policy it writes: "Secrets,
ConfigMaps, TokenRequest and TokenReviews can contain sensitive & binary data, so only log at the
Metadata level") keeps them there, since at Request the body (a Secret's data) and at
RequestResponse the response too is written in plain text into every apiserver's audit log, past
the encryption at rest etcd's copy has. Medium where a cluster-wide list of nodes or pods rises to
RequestResponse (configure-helper.sh: "Get responses can be large; skip them", Request for
get/list/watch): every such list's whole response serialised into the log, at thousands of nodes
each one tens of megabytes, in apiserver CPU and memory and a log rotating away in minutes.

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from kilonode.catalog.escalations import Escalation, Permission, escalations
from kilonode.catalog.rbac import builtin_rbac
from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.lifecycle import plan_of
from kilonode.yamlio import load_yaml

RBAC_RULE = "rbac-escalation"
AUDIT_RULE = "audit-secrets-logged"
RBAC = "kubernetes:rbac.authorization.k8s.io/v1:"
CLUSTER = "cluster"
WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob", "Pod", "ReplicaSet")


# ---- rbac-escalation -------------------------------------------------------------------------

@dataclass(frozen=True)
class _Rule:
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    names: tuple[str, ...]
    via: str  # "ClusterRole x via ClusterRoleBinding y"
    resources_of: tuple[str, ...]  # the graph's resource names it comes from (the finding's subjects)


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _allows(rule: _Rule, group: str, resource: str, verb: str, name: str) -> bool:
    """evaluation_helpers.go RuleAllows: group, verb, resource (with "*/<subresource>") and name."""
    if "*" not in rule.api_groups and group not in rule.api_groups:
        return False
    if "*" not in rule.verbs and verb not in rule.verbs:
        return False
    sub = resource.split("/", 1)[1] if "/" in resource else ""
    if not any(r in ("*", resource) or (sub and r == f"*/{sub}") for r in rule.resources):
        return False
    return not rule.names or (bool(name) and name in rule.names)


def _held(permission: Permission, rules: Sequence[_Rule]) -> list[_Rule]:
    names = permission.resource_names or ("",)
    return [r for r in rules if any(_allows(r, g, res, v, n) for g in permission.api_groups
                                    for res in permission.resources for v in permission.verbs for n in names)]


def _holds(escalation: Escalation, rules: Sequence[_Rule]) -> list[_Rule]:
    """The rules that give the escalation, empty where these rules do not."""
    if escalation.wildcard:
        return [r for r in rules if "*" in r.verbs or "*" in r.resources]
    found = [_held(p, rules) for p in escalation.needs]
    if escalation.any:
        return [r for rs in found for r in rs]
    return [r for rs in found for r in rs] if found and all(found) else []


Subject = tuple[str, str, str]  # kind, namespace ("" but for a ServiceAccount), name


def _roles(entry: Mapping[str, Any] | None) -> tuple[dict[tuple[str, str, str], tuple[Mapping[str, Any], str]],
                                                     list[tuple[str, Mapping[str, Any], str]]]:
    """The side's roles by (kind, namespace, name) with their graph names, and its bindings."""
    roles: dict[tuple[str, str, str], tuple[Mapping[str, Any], str]] = {}
    bindings: list[tuple[str, Mapping[str, Any], str]] = []
    for r in (entry or {}).get("resources", []):
        kind = str(r.get("type", ""))
        if not kind.startswith(RBAC):
            continue
        kind = kind[len(RBAC):]
        inputs = r.get("inputs") or {}
        meta = inputs.get("metadata") or {}
        if kind in ("ClusterRole", "Role"):
            roles[(kind, str(meta.get("namespace") or "") if kind == "Role" else "", str(meta.get("name")))] = (
                inputs, str(r.get("name")))
        elif kind in ("ClusterRoleBinding", "RoleBinding"):
            bindings.append((kind, inputs, str(r.get("name"))))
    return roles, bindings


def _builtin(kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
    """The apiserver's own role of that name (catalog/rbac.yaml), where the graph has none."""
    catalog = builtin_rbac()
    found = catalog.cluster_roles if kind == "ClusterRole" else catalog.roles
    for role in found:
        meta = role.get("metadata") or {}
        if meta.get("name") == name and (kind == "ClusterRole" or meta.get("namespace") == namespace):
            return role
    return None


def _subject_rules(entry: Mapping[str, Any] | None) -> dict[tuple[Subject, str], list[_Rule]]:
    """(subject, scope) -> the rules it holds there: scope "cluster" (a ClusterRoleBinding) or the
    RoleBinding's namespace."""
    roles, bindings = _roles(entry)
    held: dict[tuple[Subject, str], list[_Rule]] = {}
    for kind, inputs, graph_name in bindings:
        meta = inputs.get("metadata") or {}
        ref = inputs.get("roleRef") or {}
        namespace = str(meta.get("namespace") or "")
        scope = CLUSTER if kind == "ClusterRoleBinding" else namespace
        ref_kind, ref_name = str(ref.get("kind", "ClusterRole")), str(ref.get("name", ""))
        key = (ref_kind, namespace if ref_kind == "Role" else "", ref_name)
        role, role_graph = roles.get(key, (None, ""))
        if role is None:
            role = _builtin(*key)
        if role is None:
            continue  # a role neither side's graph nor the apiserver defines grants nothing yet
        via = f"{ref_kind} {ref_name} through {kind} {meta.get('name')}"
        owners = tuple(n for n in (role_graph, graph_name) if n)
        rules = [_Rule(_strs(r.get("apiGroups")), _strs(r.get("resources")), _strs(r.get("verbs")),
                       _strs(r.get("resourceNames")), via, owners)
                 for r in role.get("rules") or [] if isinstance(r, Mapping) and r.get("resources")]
        for s in inputs.get("subjects") or []:
            s_kind = str(s.get("kind", ""))
            subject = (s_kind, str(s.get("namespace") or namespace) if s_kind == "ServiceAccount" else "",
                       str(s.get("name", "")))
            held.setdefault((subject, scope), []).extend(rules)
    return held


def grants(entry: Mapping[str, Any] | None) -> dict[tuple[Subject, str, str], list[_Rule]]:
    """(subject, escalation id, scope) -> the rules giving it, for every escalation the side grants."""
    found: dict[tuple[Subject, str, str], list[_Rule]] = {}
    for (subject, scope), rules in _subject_rules(entry).items():
        for e in escalations().escalations:
            if "*" in e.scopes or scope in e.scopes:
                giving = _holds(e, rules)
                if giving:
                    found[(subject, e.id, scope)] = giving
    return found


def _workloads(entry: Mapping[str, Any] | None) -> dict[tuple[str, str], list[str]]:
    """(namespace, ServiceAccount) -> the workloads whose pods run as it ("DaemonSet kube-system/x")."""
    found: dict[tuple[str, str], list[str]] = {}
    for r in (entry or {}).get("resources", []):
        kind = str(r.get("type", "")).rsplit(":", 1)[-1]
        if kind not in WORKLOAD_KINDS or not str(r.get("type", "")).startswith("kubernetes:"):
            continue
        inputs = r.get("inputs") or {}
        meta = inputs.get("metadata") or {}
        spec = inputs.get("spec") or {}
        if kind == "CronJob":
            spec = ((spec.get("jobTemplate") or {}).get("spec") or {})
        pod = spec if kind == "Pod" else ((spec.get("template") or {}).get("spec") or {})
        account = pod.get("serviceAccountName") or pod.get("serviceAccount") or "default"
        namespace = str(meta.get("namespace") or "default")
        found.setdefault((namespace, str(account)), []).append(f"{kind} {namespace}/{meta.get('name')}")
    return found


def _who(subject: Subject, workloads: Mapping[tuple[str, str], list[str]]) -> str:
    kind, namespace, name = subject
    if kind == "ServiceAccount":
        runs = workloads.get((namespace, name)) or []
        by = f"run by {', '.join(runs)}" if runs else "no workload of this stack runs as it"
        return f"ServiceAccount {namespace}/{name} ({by})"
    if kind == "Group" and name in ("system:serviceaccounts", "system:authenticated"):
        return f"Group {name} (every pod's token)"
    if kind == "Group" and name.startswith("system:serviceaccounts:"):
        return f"Group {name} (every pod's token in namespace {name.rsplit(':', 1)[-1]})"
    return f"{kind} {name}"


def _reach(subject: Subject, workloads: Mapping[tuple[str, str], list[str]], nodes: int) -> str:
    """How far one stolen token goes: a DaemonSet's is on every node it runs on."""
    runs = (workloads.get((subject[1], subject[2])) or []) if subject[0] == "ServiceAccount" else []
    fleet = f"{nodes:,} nodes" if nodes else "every node"
    if any(w.startswith("DaemonSet ") for w in runs):
        return f"its token is on every node the DaemonSet runs on (up to {fleet}): one compromised pod is enough"
    if subject[0] == "Group":
        return "every pod's token in that group carries it"
    return "one compromised pod's token is enough"


def _nodes(entry: Mapping[str, Any] | None) -> int:
    return sum(int(p.get("nodes") or 0) for p in plan_of(entry).get("nodePools") or [] if isinstance(p, Mapping))


def _rbac_changed(diff: StackDiff) -> bool:
    return any(c.type.startswith(RBAC) for c in diff.resources)


def rbac_escalations(diff: StackDiff) -> list[Finding]:
    """One finding per subject that holds at the head an escalation the base did not give it there."""
    if not _rbac_changed(diff) or diff.head is None:
        return []
    base, head = grants(diff.base), grants(diff.head)
    catalog = {e.id: e for e in escalations().escalations}
    new: dict[Subject, list[tuple[Escalation, str, list[_Rule]]]] = {}
    for (subject, eid, scope), rules in head.items():
        if (subject, eid, scope) not in base:
            new.setdefault(subject, []).append((catalog[eid], scope, rules))
    if not new:
        return []
    workloads, nodes = _workloads(diff.head), _nodes(diff.head)
    found = []
    for subject, items in sorted(new.items()):
        parts, owners = [], []
        for e, scope, rules in items:
            where = "cluster-wide" if scope == CLUSTER else f"in namespace {scope}"
            via = "; ".join(dict.fromkeys(r.via for r in rules))
            blast = (f": on every one of the {nodes:,} nodes" if e.id == "nodes-proxy" and nodes else "")
            parts.append(f"{e.title} {where} (from {via}): {e.does}{blast}. Fix: {e.fix} ({e.source.split(',')[0]})")
            owners += [n for r in rules for n in r.resources_of]
        level = HIGH if any(e.level == HIGH for e, _, _ in items) else MEDIUM
        summary = (f"{_who(subject, workloads)} newly holds a permission upstream names a privilege-escalation path "
                   f"(rbac-good-practices), {_reach(subject, workloads, nodes)}: " + " | ".join(parts))
        found.append(Finding(level, RBAC_RULE, summary, tuple(dict.fromkeys(owners))))
    return found


# ---- audit-secrets-logged --------------------------------------------------------------------

AUDIT_POLICY = "etc/kubernetes/audit-policy.yaml"
LEVELS = ("None", "Metadata", "Request", "RequestResponse")
WRITE_VERBS = ("create", "update", "patch", "delete")


@dataclass(frozen=True)
class _Request:
    what: str  # how the finding names it
    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""


SENSITIVE = (
    *(_Request(r, v, "", r, "", ns) for r in ("secrets", "configmaps")
      for v in ("get", "list", "watch", *WRITE_VERBS) for ns in ("kube-system", "default", "")),
    _Request("serviceaccounts/token", "create", "", "serviceaccounts", "token", "kube-system"),
    _Request("serviceaccounts/token", "create", "", "serviceaccounts", "token", "default"),
    _Request("tokenreviews", "create", "authentication.k8s.io", "tokenreviews"),
)
LARGE_LISTS = (_Request("nodes (cluster-wide)", "list", "", "nodes"),
               _Request("pods (cluster-wide)", "list", "", "pods"))
# the identities a request is asked for: a pod's token, a node, an admin; and every user and group a
# policy names (a rule scoped to them must be able to match)
_SA_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated")
_USERS = (("system:serviceaccount:kube-system:probe", _SA_GROUPS),
          ("system:node:probe", ("system:nodes", "system:authenticated")),
          ("probe-admin", ("system:authenticated",)))


def _policy(text: str | None) -> list[Mapping[str, Any]] | None:
    if text is None:
        return None
    try:
        doc = load_yaml(text)
    except yaml.YAMLError:
        return None
    rules = doc.get("rules") if isinstance(doc, Mapping) else None
    return [r for r in rules if isinstance(r, Mapping)] if isinstance(rules, list) else None


def _rule_matches(rule: Mapping[str, Any], req: _Request, user: str, groups: Iterable[str]) -> bool:
    """checker.go ruleMatches and ruleMatchesResource, for a resource request."""
    if rule.get("users") and user not in _strs(rule.get("users")):
        return False
    if rule.get("userGroups") and not set(groups) & set(_strs(rule.get("userGroups"))):
        return False
    if rule.get("verbs") and req.verb not in _strs(rule.get("verbs")):
        return False
    namespaces, resources = _strs(rule.get("namespaces")), rule.get("resources") or []
    if not namespaces and not resources:
        return not rule.get("nonResourceURLs")  # a non-resource rule never matches a resource request
    if namespaces and req.namespace not in namespaces:
        return False
    if not resources:
        return True
    combined = f"{req.resource}/{req.subresource}" if req.subresource else req.resource
    for gr in resources:
        if not isinstance(gr, Mapping) or str(gr.get("group") or "") != req.group:
            continue
        names = _strs(gr.get("resources"))
        if not names:
            return True
        if gr.get("resourceNames"):
            continue  # the probes ask for no single object's name
        for res in names:
            if res in (combined, "*") or (req.subresource and res == f"*/{req.subresource}") \
                    or (res.endswith("/*") and req.resource == res[:-2]):
                return True
    return False


def _level(rules: Sequence[Mapping[str, Any]], req: _Request) -> tuple[int, int]:
    """The highest level any identity's request gets, and the (first) rule deciding it (-1: none)."""
    users = list(_USERS)
    for rule in rules:
        users += [(u, ("system:authenticated",)) for u in _strs(rule.get("users"))]
        users += [("probe-member", (g, "system:authenticated")) for g in _strs(rule.get("userGroups"))]
    best = (0, -1)
    for user, groups in users:
        for i, rule in enumerate(rules):
            if _rule_matches(rule, req, user, groups):
                level = LEVELS.index(str(rule.get("level"))) if rule.get("level") in LEVELS else 0
                best = max(best, (level, i))
                break
    return best


def _audit_files(entry: Mapping[str, Any] | None) -> dict[str, str]:
    return {p: t for p, t in ((entry or {}).get("files") or {}).items() if p.endswith("/" + AUDIT_POLICY)}


def audit_logged(diff: StackDiff) -> list[Finding]:
    changed = [f.path for f in diff.files if f.path.endswith("/" + AUDIT_POLICY) and f.status != "removed"]
    if not changed:
        return []
    base_files, head_files = _audit_files(diff.base), _audit_files(diff.head)
    groups: dict[tuple[str | None, str], list[str]] = {}
    for path in changed:
        groups.setdefault((base_files.get(path), head_files[path]), []).append(path)
    path_of = str((plan_of(diff.head).get("controlPlane") or {}).get("auditLog", {}).get("path") or "the audit log")
    found = []
    for (base_text, head_text), paths in groups.items():
        head_rules, base_rules = _policy(head_text), _policy(base_text) if base_text is not None else []
        if head_rules is None or base_rules is None:
            diff.note(f"{AUDIT_RULE}: an audit policy did not parse ({paths[0]}); its levels were not judged")
            continue
        hosts = sorted(p.split("/", 1)[0] for p in paths)
        on = f"on {len(hosts)} apiserver(s) ({', '.join(hosts)})"
        sensitive = _rises(base_rules, head_rules, SENSITIVE, LEVELS.index("Metadata"))
        if sensitive:
            found.append(Finding(HIGH, AUDIT_RULE, (
                f"the audit policy {on} logs {sensitive}, above Metadata: at Request the body and at "
                f"RequestResponse the response too, each Secret's data and every issued token in plain text in "
                f"every apiserver's audit log ({path_of}), past the encryption at rest of etcd's copy, for anyone "
                "who reads the log or its backups. Upstream's own policy (kubernetes cluster/gce/gci/"
                "configure-helper.sh) keeps Secrets, ConfigMaps, TokenRequest and TokenReviews at Metadata: put a "
                "Metadata rule for them before the wider rule"), tuple(paths)))
        lists = _rises(base_rules, head_rules, LARGE_LISTS, LEVELS.index("Request"))
        if lists:
            found.append(Finding(MEDIUM, AUDIT_RULE, (
                f"the audit policy {on} logs {lists}: every such list's whole response serialised into the "
                f"audit log ({path_of}); at {_nodes(diff.head):,} nodes each is tens of megabytes, in apiserver CPU "
                "and memory and a log rotating away in minutes. Upstream's policy (configure-helper.sh: \"Get "
                "responses can be large; skip them\") logs get/list/watch at Request"), tuple(paths)))
    return found


def _rises(base: Sequence[Mapping[str, Any]], head: Sequence[Mapping[str, Any]], probes: Iterable[_Request],
           floor: int) -> str:
    """The probes whose level rises above `floor` and above the base's, named with both levels."""
    rose: dict[tuple[str, str, int], dict[str, list[str]]] = {}
    for req in probes:
        (after, rule), (before, _) = _level(head, req), _level(base, req)
        if after > max(before, floor):
            verbs = rose.setdefault((LEVELS[after], LEVELS[before], rule + 1), {}).setdefault(req.what, [])
            if req.verb not in verbs:
                verbs.append(req.verb)
    return "; ".join(", ".join(f"{what} {'/'.join(verbs)}" for what, verbs in whats.items())
                     + f" at {after} (was {before}; the head policy's rule {rule})"
                     for (after, before, rule), whats in rose.items())


def assess(diff: StackDiff) -> list[Finding]:
    return [*rbac_escalations(diff), *audit_logged(diff)]
