"""A ValidatingAdmissionPolicy that denies less at the head than at the base (`admission-weakened`,
high): the guards kilonode.k8s.admission writes (a policy and a binding that denies) are what
keeps a node's token, a user's pod or a gang from doing what the cluster forbids, and nothing else
stops those requests once they are gone. What weakens one:

- its binding's `validationActions` lose Deny (["Warn", "Audit"], say): Deny is the only action
  that refuses a request; Warn returns a warning to the client and Audit records the failure in the
  audit event's annotations, and the request goes through (Kubernetes docs, Validating Admission
  Policy, "Validation actions"; admissionregistration.k8s.io/v1 ValidatingAdmissionPolicyBinding
  validationActions);
- the policy or its binding deleted: a policy without a binding is never evaluated (the same page:
  "a policy ... is not effective without a binding");
- the binding's or policy's `matchResources` / `matchConstraints` narrowed (a namespaceSelector
  or objectSelector added, an exclusion added, resource rules or operations dropped): the requests
  left out are no longer judged;
- the policy's `failurePolicy` Fail -> Ignore: an expression that errors (a field absent, a
  type mismatch) admits the request.

Each line names the policy and what it protects (POLICIES: read from the modules that create them;
a policy this module does not know is named alone). Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, Finding

RULE = "admission-weakened"
POLICY = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
BINDING = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"

# What each of kilonode's policies protects, from the module that creates it.
POLICIES = {
    "kilonode-node-identity": (
        "node identity (kilonode.k8s.capacity node_identity_rules): a node's kubelet may not set another pool's, "
        "the system pools' or another topology's placement labels, nor choose its team; without it root on any "
        "node can label its Node a system node or another team's and draw their pods and tokens"),
    "kilonode-reserved-pools": (
        "the reserved pools (kilonode.k8s.reserved_pools): outside the system namespaces, no pod that tolerates the "
        "system or Prometheus pools' taints or names one of their nodes; without it a user's pod can sit beside the "
        "controllers' tokens or take the scraper's subnet addresses, which the NSGs and node firewalls trust"),
    "kilonode-team-borrowing": (
        "priorities (kilonode.k8s.capacity, borrowing): a pod that tolerates another team's taint must carry the "
        "borrowable class so that team can preempt it; without it a team's work squats on another's nodes"),
    "kilonode-gang-fabric": (
        "gang placement (kilonode.k8s.scheduling): a gang's pods keep to one InfiniBand fabric; without it a gang "
        "can be split across fabrics whose RDMA never reaches each other, and its NCCL job hangs"),
    "kilonode-gang-size": (
        "gang placement (kilonode.k8s.scheduling): a PodGroup no larger than the largest fabric; without it a gang "
        "that can never fit one fabric waits forever, holding what it was granted"),
    "kilonode-calico-node-writes": (
        "Calico (kilonode.k8s.calico NODE_WRITES_POLICY): calico-node's token, on every node, writes Calico's "
        "cluster-wide objects only as its startup does; without it root on any node can rewrite Felix's "
        "configuration or the policy tiers for the whole cluster"),
}
DOCS = ("Deny is the only validationAction that refuses a request: Warn returns a warning to the client and Audit "
        "records it in the audit event, and the request is admitted (Kubernetes docs: Validating Admission Policy, "
        "validation actions)")


def _by_name(entry: Mapping[str, Any] | None, type_: str) -> dict[str, Mapping[str, Any]]:
    return {str((r["inputs"].get("metadata") or {}).get("name") or r["name"]): r["inputs"]
            for r in (entry or {}).get("resources") or [] if r["type"] == type_}


def _policy_of(binding: Mapping[str, Any], name: str) -> str:
    return str((binding.get("spec") or {}).get("policyName") or name)


def _purpose(policy: str) -> str:
    return POLICIES.get(policy, "a policy this review does not know the purpose of: read its rules")


def _narrowed(before: Any, after: Any) -> list[str]:
    """How a match block admits fewer requests: selectors or exclusions added, rules or operations dropped."""
    before, after = before or {}, after or {}
    found = []
    for key in ("namespaceSelector", "objectSelector"):
        if (after.get(key) or {}) != (before.get(key) or {}) and after.get(key):
            found.append(f"{key} {after.get(key)}")
    if len(after.get("excludeResourceRules") or []) > len(before.get("excludeResourceRules") or []) or (
            after.get("excludeResourceRules") and after.get("excludeResourceRules") != before.get(
                "excludeResourceRules")):
        found.append("excludeResourceRules added")

    def covered(block: Mapping[str, Any]) -> set[tuple[str, str, str]]:
        return {(group, resource, operation) for rule in block.get("resourceRules") or []
                for group in rule.get("apiGroups") or [""] for resource in rule.get("resources") or []
                for operation in rule.get("operations") or []}

    lost = covered(before) - covered(after)
    if before.get("resourceRules") is not None and lost:
        found.append("no longer matches " + ", ".join(sorted(f"{op} {res}" for _, res, op in lost)))
    return found


def assess(diff: StackDiff) -> list[Finding]:
    if diff.base is None or diff.head is None or not any(c.type in (POLICY, BINDING) for c in diff.resources):
        return []
    policies = (_by_name(diff.base, POLICY), _by_name(diff.head, POLICY))
    bindings = (_by_name(diff.base, BINDING), _by_name(diff.head, BINDING))
    weakened: dict[str, list[str]] = {}

    def say(policy: str, what: str) -> None:
        weakened.setdefault(policy, []).append(what)

    for name, was in bindings[0].items():
        policy = _policy_of(was, name)
        now = bindings[1].get(name)
        if now is None:
            say(policy, f"binding {name} deleted: the policy is no longer evaluated")
            continue
        before = set((was.get("spec") or {}).get("validationActions") or [])
        after = set((now.get("spec") or {}).get("validationActions") or [])
        if "Deny" in before and "Deny" not in after:
            say(policy, f"binding {name}'s validationActions {sorted(before)} -> {sorted(after)}: nothing is denied")
        narrowed = _narrowed((was.get("spec") or {}).get("matchResources"), (now.get("spec") or {}).get(
            "matchResources"))
        if narrowed:
            say(policy, f"binding {name}'s matchResources narrowed ({'; '.join(narrowed)})")
    for name, was in policies[0].items():
        now = policies[1].get(name)
        if now is None:
            say(name, f"policy {name} deleted")
            continue
        spec_was, spec_now = was.get("spec") or {}, now.get("spec") or {}
        if str(spec_was.get("failurePolicy") or "Fail") == "Fail" and spec_now.get("failurePolicy") == "Ignore":
            say(name, "failurePolicy Fail -> Ignore: a rule that errors admits the request")
        narrowed = _narrowed(spec_was.get("matchConstraints"), spec_now.get("matchConstraints"))
        if narrowed:
            say(name, f"matchConstraints narrowed ({'; '.join(narrowed)})")
    if not weakened:
        return []
    lines = "; ".join(f"{policy}: {', '.join(whats)}. It protects {_purpose(policy)}"
                      for policy, whats in sorted(weakened.items()))
    return [Finding(HIGH, RULE, (
        f"{len(weakened)} admission polic{'y denies' if len(weakened) == 1 else 'ies deny'} less at the head: {lines}. "
        f"{DOCS}; a deleted binding leaves its policy unevaluated. Keep validationActions [\"Deny\"] and the match "
        "blocks as kilonode.k8s.admission writes them; to trial a stricter rule, add a second binding with Warn "
        "or Audit beside the denying one"), tuple(sorted(weakened)))]
