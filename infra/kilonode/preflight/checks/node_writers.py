"""node-writers: every per-node agent that may write Nodes is held to its own Node.

A DaemonSet's pods run on every node it selects; where they mount a token whose ServiceAccount
may update or patch `nodes` or `nodes/status` (RBAC as the authorizer grants it: the graph's
bindings and the apiserver's own, kilonode.preflight.apiload), root on any one of those nodes
holds a credential that writes every Node, and NodeRestriction, which governs only system:node:
users, does not stop it (issue 37). Each such account must be one the ValidatingAdmissionPolicy
`kilonode-node-identity` holds to the Node its pod runs on (kilonode.k8s.node_agents OWN_NODE_RULE:
a validation that names the account's user and the token's node-name extra), and the policy must
bite: failurePolicy Fail, nodes and nodes/status matched on UPDATE (which a PATCH is admitted as),
and a binding that denies.

Central controllers (Deployments and StatefulSets: the autoscaler, the scheduler plugins,
cloud-controller-manager) write Nodes, or pods, cluster-wide by design: their tokens may not land
beside user work. Each workload whose token may update or patch nodes, update, patch or delete
pods, or create pods/binding or pods/eviction must be held by a required node affinity (or
nodeSelector) to the plan's controller pools (ClusterPlan.controller_pools: the system pools where
there are any), every term of it: a preference is not enough, since the scheduler places a replica
on any node it tolerates once the preferred ones are full or drained (the independent trace of
issue 37, round 4: the gang scheduler's token, which binds and deletes every pod, could land on a
healthy GPU node, and from there a calico-node pod's image could be patched: root on every node).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kilonode.k8s.admission import NODE_NAME_EXTRA
from kilonode.preflight.checks.contracts import _Access, _account_of
from kilonode.preflight.model import Finding, Inputs

NAME = "node-writers"
TITLE = ("Every per-node agent that may write Nodes is held to its own Node by the node-identity policy, and every "
         "controller that may write Nodes or pods runs only on the controller pools")

POLICY = "kilonode-node-identity"
POLICY_TYPE = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
BINDING_TYPE = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"
NODE_RESOURCES = ("nodes", "nodes/status")
WRITE_VERBS = ("update", "patch")
FIX = "hold it in kilonode.k8s.node_agents NODE_AGENTS (the node-identity policy, kilonode.k8s.capacity)"


def _named(inputs: Inputs, type_: str, name: str) -> list[Mapping[str, Any]]:
    return [r.inputs for r in inputs.of_type(type_) if (r.inputs.get("metadata") or {}).get("name") == name]


def node_writers(inputs: Inputs) -> list[tuple[str, str]]:
    """(the DaemonSet, its user) for each DaemonSet whose pods' token may write Nodes."""
    found = []
    for workload in inputs.workloads():
        if workload.kind != "DaemonSet":
            continue
        namespace, account, token = _account_of(inputs, workload)
        if not token:
            continue
        access = _Access(inputs, namespace, account)
        if any(access.allows("", resource, verb, None) for resource in NODE_RESOURCES for verb in WRITE_VERBS):
            found.append((workload.describe(), f"system:serviceaccount:{namespace}:{account}"))
    return found


def _matches_updates(policy: Mapping[str, Any]) -> list[str]:
    """The node resources the policy does not match on UPDATE."""
    rules = ((policy.get("spec") or {}).get("matchConstraints") or {}).get("resourceRules") or []
    covered = set()
    for rule in rules:
        if not {"UPDATE", "*"} & set(rule.get("operations") or []):
            continue
        if not {"", "*"} & set(rule.get("apiGroups") or []):
            continue
        covered |= set(rule.get("resources") or [])
    return [r for r in NODE_RESOURCES if r not in covered and "*" not in covered
            and not (r == "nodes/status" and "nodes/*" in covered)]


def _policy_findings(inputs: Inputs, where: str) -> list[Finding]:
    """The policy's own settings: it exists, fails closed, matches UPDATEs of both, and is bound to deny."""
    policies = _named(inputs, POLICY_TYPE, POLICY)
    if not policies:
        return [Finding(NAME, "break", where, f"no ValidatingAdmissionPolicy {POLICY}: a per-node agent's token "
                        "writes every Node (taints, cordon, addresses)", FIX)]
    policy = policies[0]
    findings = []
    failure = (policy.get("spec") or {}).get("failurePolicy")
    if failure != "Fail":
        findings.append(Finding(NAME, "break", f"ValidatingAdmissionPolicy {POLICY}",
                                f"failurePolicy is {failure or 'unset'}: a rule that cannot be evaluated admits "
                                "the write",
                                "set failurePolicy Fail (kilonode.k8s.admission)"))
    missing = _matches_updates(policy)
    if missing:
        findings.append(Finding(NAME, "break", f"ValidatingAdmissionPolicy {POLICY}",
                                f"UPDATE (and PATCH, admitted as one) of {', '.join(missing)} is not matched: "
                                "those writes are never checked", "match nodes and nodes/status on UPDATE"))
    bindings = [b for r in inputs.of_type(BINDING_TYPE) if (b := r.inputs).get("spec", {}).get("policyName") == POLICY]
    if not any("Deny" in (b.get("spec") or {}).get("validationActions", []) for b in bindings):
        findings.append(Finding(NAME, "break", f"ValidatingAdmissionPolicy {POLICY}",
                                "no binding denies what it refuses: every write is admitted",
                                "bind it with validationActions [Deny] (kilonode.k8s.admission)"))
    return findings


# What a central controller's token may do that must keep it on the controller pools.
CONTROLLER_WRITES = (("nodes", ("update", "patch")), ("pods", ("update", "patch", "delete")),
                     ("pods/binding", ("create",)), ("pods/eviction", ("create",)))
SYSTEM_LABEL = "kilonode.io/system"
POOL_LABEL = "kilonode.io/pool"


def _held_to(spec: Mapping[str, Any], pools: set[str], system: bool) -> bool:
    """The pod spec may run only on `pools` (a required term each of whose alternatives names only
    them, or kilonode.io/system=true where `system`; or a nodeSelector that does)."""
    selector = spec.get("nodeSelector") or {}
    if selector.get(POOL_LABEL) in pools or (system and selector.get(SYSTEM_LABEL) == "true"):
        return True
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []

    def holds(term: Mapping[str, Any]) -> bool:
        for e in term.get("matchExpressions") or []:
            values = set(e.get("values") or [])
            if e.get("operator") == "In" and e.get("key") == POOL_LABEL and values and values <= pools:
                return True
            if system and e.get("operator") == "In" and e.get("key") == SYSTEM_LABEL and values == {"true"}:
                return True
        return False
    return bool(terms) and all(holds(t) for t in terms)


def _controllers(inputs: Inputs) -> list[Finding]:
    pools = {p.name for p in inputs.plan.controller_pools}
    system = bool(inputs.plan.system_pools)
    findings = []
    for workload in inputs.workloads():
        if workload.kind == "DaemonSet":
            continue
        namespace, account, token = _account_of(inputs, workload)
        if not token:
            continue
        access = _Access(inputs, namespace, account)
        may = [f"{verb} {resource}" for resource, verbs in CONTROLLER_WRITES for verb in verbs
               if access.allows("", resource, verb, None)]
        spec = ((workload.inputs.get("spec") or {}).get("template") or {}).get("spec") or {}
        if may and not _held_to(spec, pools, system):
            findings.append(Finding(
                NAME, "break", workload.describe(),
                f"its token (system:serviceaccount:{namespace}:{account}) may {', '.join(may)} cluster-wide, and "
                f"nothing requires its pods on the controller pools ({', '.join(sorted(pools))}): a replica placed "
                "on a user's node hands that token to whoever owns the node",
                "require the controller pools (kilonode.k8s.pods.on_pools with ClusterPlan.controller_pools)"))
    return findings


def _no_system_pool(inputs: Inputs) -> list[Finding]:
    """Without a system pool the controller pools are the untainted shared pools (ClusterPlan.
    controller_pools), where users' pods run too: the controllers' tokens and the cloud identities
    on those scale sets share nodes with them. Accepted for a stack of one pool without GPUs (the
    shipped `local`); a break for any other shape (the independent trace of issue 37, round 9: a
    2,504-node stack with a plain CPU pool in place of its system pool passed), and always once the
    stack has autoscaled pools (the autoscaler's identity may
    write their scale sets: root on every new GPU instance) or teams (whose pods the gang scheduler's
    token places), as the independent trace of issue 37, round 6, found for research-7500 without
    its system pool."""
    plan = inputs.plan
    # the one exemption: the shape of the shipped `local` (one pool, no GPUs, no autoscaling, no teams);
    # any second pool is a cluster whose users' pods the controllers' pool may take (round 9, finding 1)
    small = len(plan.node_pools) == 1 and not plan.gpu_pools
    if plan.system_pools or (small and not (plan.autoscaled_pools or plan.teams)):
        return []
    pools = ", ".join(p.name for p in plan.controller_pools) or "none"
    why = ("autoscaled pools (the autoscaler's identity writes their scale sets)" if plan.autoscaled_pools
           else "teams" if plan.teams else f"{len(plan.node_pools)} pools" + (" with GPUs" if plan.gpu_pools else ""))
    return [Finding(
        NAME, "break", "stack: nodePools",
        f"no pool is a system pool, and the stack has {why}: the controllers (cloud-controller-manager, the "
        f"autoscaler, the gang scheduler, the serving-certificate approver) and the cloud identities run on the "
        f"shared pool(s) {pools}, beside users' pods; root gained in any pod there holds them",
        "add a small pool with `system: true` (3 nodes, one per zone; kilonode explain says what it holds)")]


def check(inputs: Inputs) -> list[Finding]:
    return _agents(inputs) + _controllers(inputs) + _no_system_pool(inputs)


def _agents(inputs: Inputs) -> list[Finding]:
    writers = node_writers(inputs)
    if not writers:
        return []
    findings = _policy_findings(inputs, writers[0][0])
    policies = _named(inputs, POLICY_TYPE, POLICY)
    expressions = [str(v.get("expression") or "") for p in policies
                   for v in (p.get("spec") or {}).get("validations") or []]
    for where, user in writers:
        if not any(repr(user) in e and repr(NODE_NAME_EXTRA) in e for e in expressions):
            findings.append(Finding(
                NAME, "break", where,
                f"its pods run on every node it selects with a token ({user}) that may update or patch nodes or "
                f"nodes/status, and {POLICY} does not hold it to its own Node: root on one node writes every Node "
                "(NoExecute taints, cordons, status.addresses)",
                f"{FIX}, or take the write out of its role"))
    return findings
