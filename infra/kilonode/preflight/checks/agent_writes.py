"""agent-writes: whatever else a per-node agent's token may write cluster-wide is held by an
admission policy that names it.

A DaemonSet's pods run on every node it selects; the token they mount is readable by root on any of
those nodes. Where its ServiceAccount may create, update or patch objects cluster-wide (RBAC as the
authorizer grants it: the graph's bindings and the apiserver's own, kilonode.preflight.apiload), one
node's compromise writes them for the whole cluster: calico-node's ClusterInformation (datastoreReady
false stops every Felix), its default FelixConfiguration and Tiers (NetworkPolicy off), a pod's status
(the addresses Services send to). RBAC cannot say "only as the startup writes it" nor name an
object on create, so each such write must be matched by a ValidatingAdmissionPolicy that fails
closed (failurePolicy Fail), is bound to deny, matches the kind on the operation (CREATE for create,
UPDATE for update and patch: a PATCH is admitted as an UPDATE) and names the account's user in a
validation or variable (kilonode.k8s.calico NODE_WRITES_POLICY for calico-node). A delete, or a
wildcard, granted to such a token is a break in itself: no agent here needs one.

Not judged here: Nodes (`node-writers` holds those to the agent's own Node); Events (a record that
nothing here acts on; kube-proxy's built-in system:node-proxier writes them); the review APIs
(selfsubjectaccessreviews and the like create nothing that stays). Central controllers
(Deployments) write cluster-wide by design from the system pool, not beside user work.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from kilonode.preflight.checks.contracts import _Access, _account_of
from kilonode.preflight.model import Finding, Inputs

NAME = "agent-writes"
TITLE = "What a per-node agent's token may write cluster-wide is held by an admission policy that names it"

POLICY_TYPE = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
BINDING_TYPE = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"
OPERATIONS = {"create": "CREATE", "update": "UPDATE", "patch": "UPDATE"}
DELETES = ("delete", "deletecollection")
# (group, resource) this check leaves to another or judges harmless, and why (the module's docstring).
NOT_JUDGED = {
    ("", "nodes"), ("", "nodes/status"),  # node-writers
    ("", "events"), ("events.k8s.io", "events"),
    *(("authorization.k8s.io", r) for r in ("selfsubjectaccessreviews", "selfsubjectrulesreviews",
                                             "subjectaccessreviews", "localsubjectaccessreviews")),
    *(("authentication.k8s.io", r) for r in ("tokenreviews", "selfsubjectreviews")),
}
FIX = ("take the write out of its role, or hold it with a ValidatingAdmissionPolicy that names the account "
       "(kilonode.k8s.admission; kilonode.k8s.calico NODE_WRITES_POLICY is one)")


def _writes(access: _Access) -> Iterator[tuple[str, str, str]]:
    """(group, resource, verb) of every write the account is granted cluster-wide."""
    for scope, rules in access.grants:
        if scope is not None:
            continue
        for rule in rules:
            verbs = rule.get("verbs") or []
            for verb in ("*", *OPERATIONS, *DELETES):
                if verb not in verbs:
                    continue
                for group in rule.get("apiGroups") or []:
                    for resource in rule.get("resources") or []:
                        yield group, resource, verb


def _text(policy: Mapping[str, Any]) -> str:
    spec = policy.get("spec") or {}
    parts = [*(v.get("expression") for v in spec.get("validations") or []),
             *(v.get("expression") for v in spec.get("variables") or [])]
    return "\n".join(str(p or "") for p in parts)


def _holds(policy: Mapping[str, Any], group: str, resource: str, operation: str) -> bool:
    rules = ((policy.get("spec") or {}).get("matchConstraints") or {}).get("resourceRules") or []
    return any({operation, "*"} & set(r.get("operations") or []) and {group, "*"} & set(r.get("apiGroups") or [])
               and {resource, "*"} & set(r.get("resources") or []) for r in rules)


def _biting(inputs: Inputs) -> dict[str, Mapping[str, Any]]:
    """The policies that fail closed and are bound to deny, by name."""
    denied = {(b.inputs.get("spec") or {}).get("policyName") for b in inputs.of_type(BINDING_TYPE)
              if "Deny" in ((b.inputs.get("spec") or {}).get("validationActions") or [])}
    return {name: r.inputs for r in inputs.of_type(POLICY_TYPE)
            if (name := str((r.inputs.get("metadata") or {}).get("name"))) in denied
            and (r.inputs.get("spec") or {}).get("failurePolicy") == "Fail"}


def check(inputs: Inputs) -> list[Finding]:
    policies = _biting(inputs)
    findings = []
    for workload in inputs.workloads():
        if workload.kind != "DaemonSet":
            continue
        namespace, account, token = _account_of(inputs, workload)
        if not token:
            continue
        user = f"system:serviceaccount:{namespace}:{account}"
        unheld = []
        for group, resource, verb in sorted(set(_writes(_Access(inputs, namespace, account)))):
            if (group, resource) in NOT_JUDGED:
                continue
            what = f"{verb} {group}/{resource}" if group else f"{verb} {resource}"
            if "*" in (group, resource, verb) or verb in DELETES:
                findings.append(Finding(
                    NAME, "break", workload.describe(),
                    f"its pods' token ({user}), on every node it runs on, may {what} cluster-wide: a "
                    f"{'wildcard' if '*' in (group, resource, verb) else 'delete'} no admission policy here holds",
                    "take it out of the account's role"))
                continue
            if not any(_holds(p, group, resource, OPERATIONS[verb]) and repr(user) in _text(p)
                       for p in policies.values()):
                unheld.append(what)
        if unheld:
            findings.append(Finding(
                NAME, "break", workload.describe(),
                f"its pods' token ({user}), on every node it runs on, may {', '.join(unheld)} cluster-wide, and no "
                "ValidatingAdmissionPolicy that fails closed, is bound to deny and names the account holds those "
                "writes: root on one node writes them for the whole cluster", FIX))
    return findings
