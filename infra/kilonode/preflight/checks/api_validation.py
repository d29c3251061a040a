"""api-validation: every object the program creates passes the apiserver's own validation beyond
the OpenAPI schema, the rules no schema check (Pulumi's, kubectl's) sees.

The apiserver validates an object's fields after decoding it (the registry strategy's Validate,
then the in-tree admission plugins), and refuses a create that breaks a rule with 422 Invalid or
403 Forbidden; `pulumi up` stops at that resource, and everything that depends on it (the pods
naming a PriorityClass, in kilonode's graph) is never created. Read from the recorded graph's
objects against the catalogue (kilonode.catalog api_validation.yaml: each rule and its upstream
source, kubernetes/kubernetes pkg/apis/scheduling/validation/validation.go ValidatePriorityClass
and plugin/pkg/admission/priority/admission.go). Each is a break:
- a PriorityClass whose name lacks the `system-` prefix and whose value is above 1,000,000,000
  (HighestUserDefinablePriority: "maximum allowed value of a user defined priority is 1000000000");
- a PriorityClass named with the `system-` prefix: reserved for the built-in system-node-critical
  and system-cluster-critical (any other name, or their name with another value or globalDefault,
  is Forbidden), and those the apiserver creates itself at start (a create is AlreadyExists);
- a preemptionPolicy other than PreemptLowerPriority or Never;
- more than one PriorityClass with globalDefault true (the Priority admission plugin refuses the
  second: "Only one default can exist"), and which one is second depends on `pulumi up`'s order.

Not judged: classes the cluster holds that the graph does not (a user's own global default); a
value change on update (ValidatePriorityClassUpdate: value and preemptionPolicy are immutable),
which a one-sided preflight cannot see. Only the rules listed in the catalogue: add a rule there,
with its source, as a kilonode object comes to reach another.
"""

from __future__ import annotations

from kilonode.catalog.api_validation import catalogue
from kilonode.preflight.model import Finding, Inputs, Resource

NAME = "api-validation"
TITLE = "every object passes the apiserver's validation beyond the schema (PriorityClass bounds, reserved names)"

STOPS = "`pulumi up` stops at this resource: the apiserver refuses it"


def _name(resource: Resource) -> str:
    return str((resource.inputs.get("metadata") or {}).get("name") or resource.name)


def _int(value: object) -> int | None:
    try:
        return int(value)  # type: ignore[call-overload,no-any-return]
    except (TypeError, ValueError):
        return None


def check(inputs: Inputs) -> list[Finding]:
    rules = catalogue().priority_class
    classes = [r for r in inputs.kubernetes() if r.kind == "PriorityClass"]
    findings: list[Finding] = []
    for resource in classes:
        name, spec = _name(resource), resource.inputs
        value = _int(spec.get("value"))
        where = resource.describe()
        if name.startswith(rules.system_prefix):
            system = next((c for c in rules.system_classes if c.name == name), None)
            if system is None or (value, bool(spec.get("globalDefault"))) != (system.value, system.global_default):
                why = ("metadata.name: Forbidden: priority class names with 'system-' prefix are reserved for system "
                       "use only" + (f" ({name} is not a known system priority class)" if system is None else
                                     f" (value of {name} must be {system.value}, globalDefault false)"))
            else:
                why = (f"{name} is built in: the apiserver creates it at start (AddSystemPriorityClasses), so "
                       "the create is AlreadyExists")
            findings.append(Finding(NAME, "break", where, (
                f"{STOPS} ({why}; kubernetes pkg/apis/scheduling/validation/validation.go ValidatePriorityClass), and "
                f"the pods "
                f"naming {name} are never created"),
                f"rename it without the `{rules.system_prefix}` prefix (kilonode.k8s.capacity PRIORITIES), or name "
                f"the built-in class from the pods instead of creating it"))
        elif value is not None and value > rules.highest_user_definable:
            findings.append(Finding(NAME, "break", where, (
                f"{STOPS}: value {value:,} is above {rules.highest_user_definable:,}, the highest a class not "
                f"named system-* may hold (\"value: Forbidden: maximum allowed value of a user defined priority is "
                f"{rules.highest_user_definable}\", kubernetes pkg/apis/scheduling/validation/validation.go "
                f"ValidatePriorityClass); the pods naming {name} are never created"),
                f"lower its value to at most {rules.highest_user_definable:,} (kilonode.plan.defaults priorities; "
                "values above it are the built-in system-node-critical and system-cluster-critical's: give a pod "
                "that must outrank every user class one of those instead)"))
        policy = spec.get("preemptionPolicy")
        if policy is not None and policy not in rules.preemption_policies:
            findings.append(Finding(NAME, "break", where, (
                f"{STOPS}: preemptionPolicy {policy!r} is not one of {', '.join(rules.preemption_policies)} "
                "(ValidatePreemptionPolicy: Unsupported value)"),
                f"set preemptionPolicy to {' or '.join(rules.preemption_policies)}"))
    defaults = sorted(_name(r) for r in classes if r.inputs.get("globalDefault") is True)
    if len(defaults) > 1:
        findings.append(Finding(NAME, "break", f"PriorityClass {', '.join(defaults)}", (
            f"{STOPS}: {len(defaults)} classes have globalDefault true, and the Priority admission plugin refuses "
            "each created while another default exists (\"PriorityClass X is already marked as default. Only one "
            "default can exist\", plugin/pkg/admission/priority/admission.go); which one `pulumi up` creates "
            "second depends on its order"),
            "keep globalDefault true on one class (kilonode.k8s.capacity PRIORITIES)"))
    return findings
