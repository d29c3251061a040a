"""admission-requests: every ValidatingAdmissionPolicy of the graph admits the writes the cluster
must make, and none errors on them.

The checks beside this one read a policy's settings and text (node-writers: the node-identity
policy exists, fails closed, names each agent); none runs its CEL. A rule can read right and still
refuse every node: `object.metadata.labels['k']` on a Node without label `k` is a runtime error
("no such key"), not false, and with failurePolicy Fail an error is a denial
(kubernetes/website content/en/docs/reference/access-authn-authz/validating-admission-policy.md,
"Failure Policy": "`failurePolicy` defines how mis-configurations and CEL expressions evaluating to
error are handled ... `Fail` means that an error evaluating the policy causes the admission to fail
and the API request to be rejected"; kubernetes/apiserver pkg/admission/plugin/policy/validating/
validator.go, Validate: a validation whose evaluation returns an error is a decision of action
`policyDecisionActionForError(failurePolicy)`, ActionDeny unless Ignore). Every node lacks at
least one of the labels the node-identity policy looks up (the system label off the system pool,
the team label off a team's shards), so such a rule refuses every kubelet's registration: no node
joins.

So each policy is run here, with cel-python (the evaluator tests/k8s/test_node_agents.py already
checks these rules with), on representative requests the cluster makes for real, built from the
render and the plan (kilonode.preflight.nodes.bootstrap_nodes: the Node each pool role registers,
its labels and taints from the kubelet's flags; a name of one of its scale sets' computer-name
prefixes and 6 characters):
- each role's kubelet (system:node:<name>) creating its Node, and updating it and nodes/status;
- cloud-node-manager initialising it (providerID, the cloud's labels, the uninitialized taint
  lifted: cloud-provider-azure@v1.34.13 pkg/nodemanager/nodemanager.go initializeNode) and
  patching status.addresses, each with its pod-bound token's node-name extra;
- calico-node updating nodes/status (its annotations, the NetworkUnavailable condition:
  projectcalico/calico@v3.31.7 libcalico-go/lib/backend/k8s/resources/node.go).
A PATCH is admitted as an UPDATE (kilonode.k8s.node_agents). A policy applies to a request its
matchConstraints' resourceRules match and whose matchConditions all hold; a matchCondition or a
validation that errors under failurePolicy Fail, or a validation that is false, is a break naming
the policy, the expression and the request.

What it leaves out: requests on resources other than nodes (pods, Calico's CRDs, PodGroups: the
policies on those are tested by their own modules' tests), `authorizer` and `params` (no policy of
kilonode's uses them: a rule naming them is reported as not evaluated), and the apiserver's cost
limits (tests/k8s/test_capacity.py counts them).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import celpy
from celpy.evaluation import CELEvalError, Evaluator

from kilonode.k8s.admission import NODE_NAME_EXTRA
from kilonode.k8s.node_agents import NODE_AGENTS
from kilonode.plan import wellknown
from kilonode.preflight.model import Finding, Inputs
from kilonode.preflight.nodes import bootstrap_nodes
from kilonode.preflight.placement import UNINITIALIZED

NAME = "admission-requests"
TITLE = ("every ValidatingAdmissionPolicy admits, without an evaluation error, the Node writes each pool's kubelet, "
         "cloud-node-manager and calico-node must make")

POLICY_TYPE = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
CNM_USER = next(a.user for a in NODE_AGENTS if a.sets_provider_id)
CALICO_USER = next(a.user for a in NODE_AGENTS if not a.sets_provider_id)
# What cloud-node-manager sets when it initialises a node (nodemanager.go addCloudNodeLabel)
CLOUD_LABELS = {"node.kubernetes.io/instance-type": "standard", "topology.kubernetes.io/region": "region",
                "topology.kubernetes.io/zone": "region-1", "kubernetes.azure.com/cluster": "cluster"}
ADDRESSES = [{"type": "InternalIP", "address": "10.1.0.4"}, {"type": "Hostname", "address": "node"}]


@dataclass(frozen=True)
class Request:
    """One admission request: who writes what (resource "nodes" or "nodes/status")."""

    describe: str
    resource: str
    operation: str
    user: str
    groups: tuple[str, ...]
    extra: Mapping[str, list[str]]
    new: Mapping[str, Any]
    old: Mapping[str, Any] | None
    host: str = ""  # the pool role whose node makes it (the render's role directory)


def _node(name: str, labels: Mapping[str, str], taints: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels)},
            "spec": {"taints": [dict(t) for t in taints]} if taints else {},
            "status": {"addresses": ADDRESSES}}


def node_requests(inputs: Inputs, hosts: Collection[str] | None = None) -> list[Request]:
    """The Node writes of each pool role's first node (of the roles `hosts` names, when given), in
    the order they happen."""
    found: list[Request] = []
    for group in bootstrap_nodes(inputs):
        if hosts is not None and group.host not in hosts:
            continue
        shard = next((s for s in group.pool.shards if group.pool.role(s.team) == group.host), None)
        if shard is None:
            continue
        # a computer name: the scale set's prefix and 6 base-36 characters (kilonode.azure.node_pool)
        name = f"{shard.name.lower()}00000a"
        taints = [{"key": t.key, "effect": t.effect, **({"value": t.value} if t.value else {})}
                  for t in group.node.taints]
        # the fabric-label unit writes the node's scale set (its name less the instance's 6
        # characters) into the kubelet's --node-labels before it starts (kilonode.render.pool)
        fabric = "${" + wellknown.FABRIC_ENV_VAR + "}"
        labels = {k: v.replace(fabric, name[:-6]) for k, v in group.node.labels.items()}
        registered = _node(name, labels, taints)
        kubelet = (f"system:node:{name}", ("system:nodes", "system:authenticated"), {})
        pod = {NODE_NAME_EXTRA: [name], "authentication.kubernetes.io/pod-name": ["p"],
               "authentication.kubernetes.io/pod-uid": ["u"]}
        agent_groups = ("system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated")
        initialised = copy.deepcopy(registered)
        initialised["metadata"]["labels"].update(CLOUD_LABELS)
        initialised["spec"]["providerID"] = f"azure:///subscriptions/s/virtualMachineScaleSets/{shard.name}/0"
        kept = [t for t in taints if t["key"] != UNINITIALIZED]
        if kept:
            initialised["spec"]["taints"] = kept
        else:
            initialised["spec"].pop("taints", None)
        readdressed = copy.deepcopy(initialised)
        readdressed["status"]["addresses"] = [{"type": "InternalIP", "address": "10.1.0.5"}]
        annotated = copy.deepcopy(initialised)
        annotated["metadata"]["annotations"] = {"projectcalico.org/IPv4Address": "10.1.0.4/24"}
        annotated["status"]["conditions"] = [{"type": "NetworkUnavailable", "status": "False",
                                              "reason": "CalicoIsUp"}]
        heartbeat = copy.deepcopy(registered)
        heartbeat["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        role = f"pool role {group.host}"
        made = [
            Request(f"{role}: the kubelet registers its Node {name}", "nodes", "CREATE", *kubelet, registered, None),
            Request(f"{role}: the kubelet updates its Node's status", "nodes/status", "UPDATE", *kubelet,
                    heartbeat, registered),
            Request(f"{role}: the kubelet updates its Node", "nodes", "UPDATE", *kubelet, registered, registered),
            Request(f"{role}: cloud-node-manager initialises the Node (providerID, cloud labels, the uninitialized "
                    "taint lifted)", "nodes", "UPDATE", CNM_USER, agent_groups, pod, initialised, registered),
            Request(f"{role}: cloud-node-manager patches status.addresses", "nodes/status", "UPDATE", CNM_USER,
                    agent_groups, pod, readdressed, initialised),
            Request(f"{role}: calico-node updates nodes/status (annotations, NetworkUnavailable)", "nodes/status",
                    "UPDATE", CALICO_USER, agent_groups, pod, annotated, initialised),
        ]
        found += [dataclasses.replace(r, host=group.host) for r in made]
    return found


def matches(spec: Mapping[str, Any], request: Request) -> bool:
    """The policy's resourceRules match the request (core group; `*` and `nodes/*` as the API reads them)."""
    resource, _, sub = request.resource.partition("/")
    for rule in (spec.get("matchConstraints") or {}).get("resourceRules") or []:
        if not {"", "*"} & set(rule.get("apiGroups") or []):
            continue
        if not {request.operation, "*"} & set(rule.get("operations") or []):
            continue
        names = set(rule.get("resources") or [])
        if request.resource in names or "*" in names or (sub and f"{resource}/*" in names) or (
                sub and "*/*" in names) or (not sub and "*/*" in names):
            return True
    return False


class _Unevaluable(Exception):
    """An expression names what preflight cannot give it (authorizer, params)."""


def _program(env: celpy.Environment, expression: str) -> Any:
    if "authorizer" in expression or "params" in expression:
        raise _Unevaluable(expression)
    return _compiled(expression)


class _ShortCircuitEvaluator(Evaluator):  # type: ignore[misc]
    """cel-python 0.5's interpreter, with `||` and `&&` evaluating their right side only where the
    left does not decide: its own conditionalor and conditionaland visit both sides and then
    combine them (celtypes.logical_or, logical_and), so a guard such as `!(agent) || (rule)`
    still walked the whole rule for every request: most of preflight's time at research-7500.

    The answers are CEL's, and cel-python's own: `true || x` is true and `false && x` is false
    whatever x is, an error included (github.com/google/cel-spec doc/langdef.md, "Logical
    Operators": commutative, errors absorbed by a deciding operand), and celtypes.logical_or /
    logical_and return exactly that where the left is that BoolType. Anything else (the left
    false, true, an error or not a bool) visits the right and combines the two as the library
    does. tests/preflight/test_admission_requests.py compares both evaluators on every policy and
    request of the shipped stacks and on error-absorbing cases."""

    def _decided(self, tree: Any, decides: bool) -> Any:
        if len(tree.children) != 2:
            return None
        left = self.visit(tree.children[0])
        if isinstance(left, celpy.celtypes.BoolType) and bool(left) is decides:
            return left
        return left, self.visit(tree.children[1])

    def conditionalor(self, tree: Any) -> Any:
        return self._combined(tree, True, "_||_", super().conditionalor)

    def conditionaland(self, tree: Any) -> Any:
        return self._combined(tree, False, "_&&_", super().conditionaland)

    def _combined(self, tree: Any, decides: bool, name: str, library: Any) -> Any:
        decided = self._decided(tree, decides)
        if decided is None:
            return library(tree)  # one child: the library's path
        if not isinstance(decided, tuple):
            return decided
        left, right = decided
        try:
            return self.activation.resolve_function(name)(left, right)
        except TypeError as error:  # as the library's: no overload is an error value, not a raise
            value = CELEvalError(f"found no matching overload for {name} applied to '({type(left)}, "
                                 f"{type(right)})'", error.__class__, error.args, tree=tree)
            value.__cause__ = error
            return value


class _ShortCircuitRunner(celpy.InterpretedRunner):  # type: ignore[misc]
    def evaluate(self, context: Any) -> Any:
        return _ShortCircuitEvaluator(ast=self.ast, activation=self.new_activation()).evaluate(context)


@functools.lru_cache(maxsize=4096)
def _compiled(expression: str, short_circuit: bool = True) -> Any:
    """One compiled program per expression, reused for every request (cel-python's parse and
    compile are most of an evaluation's cost: 17 s for research-7500's 36 requests without it);
    `short_circuit=False`: cel-python's own evaluator (the tests compare the two)."""
    env = celpy.Environment(runner_class=_ShortCircuitRunner if short_circuit else celpy.InterpretedRunner)
    return env.program(env.compile(expression))


def evaluate(spec: Mapping[str, Any], request: Request) -> tuple[str, str, str] | None:
    """None where the policy admits the request; else (verdict, expression, detail): verdict
    "error" (an evaluation error, a denial under Fail), "denied" (a validation false) or
    "unevaluated"."""
    env = celpy.Environment()
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(request.new),
        "oldObject": celpy.json_to_cel(request.old),
        "request": celpy.json_to_cel({
            "operation": request.operation, "kind": {"group": "", "version": "v1", "kind": "Node"},
            "resource": {"group": "", "version": "v1", "resource": request.resource.partition("/")[0]},
            "subResource": request.resource.partition("/")[2], "name": request.new["metadata"]["name"],
            "namespace": "", "userInfo": {"username": request.user, "groups": list(request.groups),
                                          "extra": dict(request.extra)}}),
        "namespaceObject": celpy.json_to_cel(None),
    }
    fail = (spec.get("failurePolicy") or "Fail") == "Fail"  # Fail is the API's default
    try:
        # variables in order, each seeing those before it (the apiserver evaluates them lazily:
        # one that errors matters only to a rule that reads it, which then errors too)
        variables: dict[str, Any] = {}
        broken: dict[str, str] = {}
        for variable in spec.get("variables") or []:
            try:
                variables[variable["name"]] = _program(env, variable["expression"]).evaluate(
                    {**activation, "variables": celpy.json_to_cel({}) if not variables else _cel_map(variables)})
            except celpy.CELEvalError as error:
                broken[variable["name"]] = f"variable {variable['name']}: {error.args[0] if error.args else error}"
        activation["variables"] = _cel_map(variables)
        for condition in spec.get("matchConditions") or []:
            expression = str(condition.get("expression") or "")
            try:
                if not bool(_program(env, expression).evaluate(activation)):
                    return None  # the policy does not apply
            except celpy.CELEvalError as error:
                if fail:
                    return "error", expression, str(error.args[0] if error.args else error)
                return None
        for validation in spec.get("validations") or []:
            expression = str(validation.get("expression") or "")
            uses = [why for name, why in broken.items() if f"variables.{name}" in expression]
            if uses:
                if fail:
                    return "error", expression, uses[0]
                continue
            try:
                if not bool(_program(env, expression).evaluate(activation)):
                    return "denied", expression, str(validation.get("message") or "")
            except celpy.CELEvalError as error:
                if fail:
                    return "error", expression, str(error.args[0] if error.args else error)
    except _Unevaluable as unevaluable:
        return "unevaluated", str(unevaluable), "it reads authorizer or params, which preflight does not model"
    except celpy.CELParseError as error:
        return "error", "", f"does not compile: {error}"
    return None


def _cel_map(values: Mapping[str, Any]) -> Any:
    return celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in values.items()})


def _short(expression: str) -> str:
    return expression if len(expression) <= 240 else expression[:237] + "..."


def check(inputs: Inputs) -> list[Finding]:
    return check_scoped(inputs, None, None)


def check_hosts(inputs: Inputs, hosts: Collection[str] | None) -> list[Finding]:
    """The check on the Node writes of the pool roles `hosts` names (every role when None)."""
    return check_scoped(inputs, hosts, None)


def check_scoped(inputs: Inputs, hosts: Collection[str] | None, policies: Collection[str] | None) -> list[Finding]:
    """The check on part of the requests, as a review needs it (kilonode.review.preflight_break): every
    policy on the Node writes of the pool roles `hosts` names, and the policies `policies` names on
    every role's. With both None, every policy on every role's writes (preflight's whole check). What
    neither names is the same on both sides of the change."""
    everything = node_requests(inputs)
    findings: list[Finding] = []
    for resource in inputs.of_type(POLICY_TYPE):
        spec = resource.inputs.get("spec") or {}
        name = (resource.inputs.get("metadata") or {}).get("name")
        whole = (hosts is None and policies is None) or (policies is not None and name in policies)
        requests = everything if whole else [r for r in everything if hosts is not None and r.host in hosts]
        # one finding per (policy, expression, verdict): the first request it refuses, and how many
        refused: dict[tuple[str, str], list[tuple[Request, str]]] = {}
        for request in requests:
            if not matches(spec, request):
                continue
            verdict = evaluate(spec, request)
            if verdict is not None:
                refused.setdefault((verdict[0], verdict[1]), []).append((request, verdict[2]))
        for (verdict, expression), cases in refused.items():
            request, detail = cases[0]
            more = f" (and {len(cases) - 1} more of the {len(requests)} requests traced)" if len(cases) > 1 else ""
            if verdict == "unevaluated":
                findings.append(Finding(NAME, "warn", f"ValidatingAdmissionPolicy {name}",
                                        f"not evaluated: {detail}: {_short(expression)}",
                                        "check it against the Node writes by hand"))
                continue
            what = ("errors (" + detail + "), and under failurePolicy Fail an error is a denial"
                    if verdict == "error" else f"is false (message: {detail})")
            findings.append(Finding(
                NAME, "break", f"ValidatingAdmissionPolicy {name}",
                f"on {request.describe} ({request.operation} {request.resource} as {request.user}){more}, the "
                f"validation `{_short(expression)}` {what}: the write is refused"
                + (", so no node of that pool registers" if request.operation == "CREATE" else ""),
                "guard every lookup of a key that may be absent (has(), `'k' in map ? map['k'] : ''`) and admit "
                "the writes each node's kubelet and agents make (kilonode.k8s.capacity node_identity_rules)"))
    return findings
