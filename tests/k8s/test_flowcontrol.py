"""API Priority and Fairness (kilonode.k8s.flowcontrol) and the apiservers' concurrency flags.

The objects are checked against the OpenAPI schema of every supported minor; where requests
land is decided by a port of the apiserver's own matching (kubernetes/apiserver
kubernetes-1.34.2, pkg/util/flowcontrol/rule.go and apf_controller.go startRequest) over
upstream's built-in FlowSchemas, written here by hand from pkg/apis/flowcontrol/bootstrap/
default.go at each minor; the seats each level gets come from the apiserver's formula
(apf_controller.go finishQueueSetReconfigsLocked), fed with the limits the rendered units pass.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import kubernetes_validate
import pytest

from kilonode.azure.graph import Graph
from kilonode.k8s.flowcontrol import describe
from kilonode.plan import ClusterPlan
from kilonode.render.control_plane import render_apiserver
from tests import shared
from tests.conftest import SHIPPED_STACKS
from tests.render.test_upstream_flags import exec_start

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

SUPPORTED_MINORS = (32, 33, 34, 35)
FLOW_SCHEMA = "kubernetes:flowcontrol.apiserver.k8s.io/v1:FlowSchema"
PRIORITY_LEVEL = "kubernetes:flowcontrol.apiserver.k8s.io/v1:PriorityLevelConfiguration"
NODE_AGENTS, MONITORING = "kilonode-node-agents", "kilonode-monitoring"
BOOTSTRAP = "kilonode-node-bootstrap"
OURS = (NODE_AGENTS, MONITORING, BOOTSTRAP)
# The hook as the brief for it names it (not read from the module under test).
MONITORING_NAMESPACE, MONITORING_GROUP = "monitoring", "kilonode:monitoring-agents"

# ---------------------------------------------------------------- upstream, by hand

# kubernetes/apiserver kubernetes-1.34.2 pkg/authentication/user/user.go l.71-83 and
# pkg/authentication/serviceaccount/util.go l.29-32.
MASTERS, NODES = "system:masters", "system:nodes"
# kubernetes/cluster-bootstrap token/api/types.go l.87-91 at kubernetes-1.34.0: a bootstrap
# token's user is system:bootstrap:<token id>, always in group system:bootstrappers
# (util/secrets/secrets.go GetGroups l.94); kilonode's token adds the group its Secret names
# (auth-extra-groups), and the apiserver adds system:authenticated.
BOOTSTRAPPERS = "system:bootstrappers"
AUTHENTICATED, UNAUTHENTICATED = "system:authenticated", "system:unauthenticated"
KCM, SCHEDULER = "system:kube-controller-manager", "system:kube-scheduler"
SERVICE_ACCOUNTS = "system:serviceaccounts"


def group(name: str) -> dict[str, Any]:
    return {"kind": "Group", "group": {"name": name}}


def user(name: str) -> dict[str, Any]:
    return {"kind": "User", "user": {"name": name}}


def account(namespace: str, name: str) -> dict[str, Any]:
    return {"kind": "ServiceAccount", "serviceAccount": {"namespace": namespace, "name": name}}


def rule(verbs: Sequence[str], groups: Sequence[str], resources: Sequence[str], cluster: bool) -> dict[str, Any]:
    return {"verbs": list(verbs), "apiGroups": list(groups), "resources": list(resources), "namespaces": ["*"],
            "clusterScope": cluster}


def schema(name: str, level: str, precedence: int, subjects: list[dict[str, Any]],
           resources: Sequence[dict[str, Any]] = (), urls: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "priorityLevelConfiguration": {"name": level}, "matchingPrecedence": precedence,
        "rules": [{"subjects": subjects, "resourceRules": list(resources), "nonResourceRules": list(urls)}]}}


EVERYTHING = rule(["*"], ["*"], ["*"], True)
EVERY_URL = {"verbs": ["*"], "nonResourceURLs": ["*"]}
WRITE_ELECTION = ["get", "create", "update"]
# default.go at kubernetes-1.34.2 (l.114-163 mandatory, l.282-439 suggested); identical at
# kubernetes-1.35.0 (git diff is empty).
BUILTIN_SCHEMAS_134 = [
    schema("exempt", "exempt", 1, [group(MASTERS)], [EVERYTHING], [EVERY_URL]),
    schema("probes", "exempt", 2, [group(UNAUTHENTICATED), group(AUTHENTICATED)], [],
           [{"verbs": ["get"], "nonResourceURLs": ["/healthz", "/readyz", "/livez"]}]),
    schema("system-leader-election", "leader-election", 100,
           [user(KCM), user(SCHEDULER), account("kube-system", "*")],
           [rule(WRITE_ELECTION, ["coordination.k8s.io"], ["leases"], False)]),
    schema("system-node-high", "node-high", 400, [group(NODES)],
           [rule(["*"], [""], ["nodes", "nodes/status"], True),
            rule(["*"], ["coordination.k8s.io"], ["leases"], False)]),
    schema("system-nodes", "system", 500, [group(NODES)], [EVERYTHING], [EVERY_URL]),
    schema("kube-controller-manager", "workload-high", 800, [user(KCM)], [EVERYTHING], [EVERY_URL]),
    schema("kube-scheduler", "workload-high", 800, [user(SCHEDULER)], [EVERYTHING], [EVERY_URL]),
    schema("kube-system-service-accounts", "workload-high", 900, [account("kube-system", "*")],
           [EVERYTHING], [EVERY_URL]),
    schema("service-accounts", "workload-low", 9000, [group(SERVICE_ACCOUNTS)], [EVERYTHING], [EVERY_URL]),
    schema("global-default", "global-default", 9900, [group(UNAUTHENTICATED), group(AUTHENTICATED)],
           [EVERYTHING], [EVERY_URL]),
    schema("catch-all", "catch-all", 10000, [group(UNAUTHENTICATED), group(AUTHENTICATED)], [EVERYTHING], [EVERY_URL]),
]
# kubernetes-1.32.0 and kubernetes-1.33.0 also have these two (default.go l.319-358 at 1.33.0),
# removed in 1.34.
BUILTIN_SCHEMAS_132 = [*BUILTIN_SCHEMAS_134,
                       schema("endpoint-controller", "workload-high", 150,
                              [user(KCM), account("kube-system", "endpoint-controller"),
                               account("kube-system", "endpointslicemirroring-controller")],
                              [rule(WRITE_ELECTION, [""], ["endpoints"], False)]),
                       schema("workload-leader-election", "leader-election", 200, [account("kube-system", "*")],
                              [rule(WRITE_ELECTION, [""], ["endpoints", "configmaps"], False),
                               rule(WRITE_ELECTION, ["coordination.k8s.io"], ["leases"], False)])]
BUILTIN_SCHEMAS = {32: BUILTIN_SCHEMAS_132, 33: BUILTIN_SCHEMAS_132, 34: BUILTIN_SCHEMAS_134, 35: BUILTIN_SCHEMAS_134}


def limited(shares: int, lendable: int, queuing: tuple[int, int, int] | None) -> dict[str, Any]:
    response: dict[str, Any] = {"type": "Reject"}
    if queuing:
        response = {"type": "Queue", "queuing": dict(zip(("queues", "handSize", "queueLengthLimit"), queuing,
                                                          strict=True))}
    return {"type": "Limited", "limited": {"nominalConcurrencyShares": shares, "lendablePercent": lendable,
                                           "limitResponse": response}}


# default.go l.84-107 and l.166-275 at kubernetes-1.34.2; the same at 1.32.0, 1.33.0, 1.35.0.
BUILTIN_LEVELS = {
    "exempt": {"type": "Exempt", "exempt": {"nominalConcurrencyShares": 0, "lendablePercent": 0}},
    "catch-all": limited(5, 0, None),
    "system": limited(30, 33, (64, 6, 50)),
    "node-high": limited(40, 25, (64, 6, 50)),
    "leader-election": limited(10, 0, (16, 4, 50)),
    "workload-high": limited(40, 50, (128, 6, 50)),
    "workload-low": limited(100, 90, (128, 6, 50)),
    "global-default": limited(20, 50, (128, 6, 50)),
}
CONTROL_PLANE_LEVELS = ("system", "node-high", "leader-election", "workload-high")
# The apiserver's defaults: --max-requests-inflight 400, --max-mutating-requests-inflight 200
# (pkg/server/config.go l.442-443 at kubernetes-1.34.2).
DEFAULT_SERVER_LIMIT = 600


# ---------------------------------------------------------------- the apiserver's matching, ported

@dataclass(frozen=True)
class Request:
    """A request as APF sees it (RequestDigest: the user and the RequestInfo)."""

    user: str
    groups: tuple[str, ...]
    verb: str
    resource: str = ""  # "" for a non-resource request (then path says what)
    api_group: str = ""
    subresource: str = ""
    namespace: str = ""
    path: str = ""


def as_account(namespace: str, name: str) -> tuple[str, tuple[str, ...]]:
    """A ServiceAccount token's user and groups (serviceaccount/util.go MakeUsername, MakeGroupNames)."""
    return (f"system:serviceaccount:{namespace}:{name}",
            (SERVICE_ACCOUNTS, f"system:serviceaccounts:{namespace}", AUTHENTICATED))


def contains(x: str, values: Sequence[str], wildcard: str) -> bool:  # rule.go l.193-203
    return (len(values) == 1 and values[0] == wildcard) or x in values


def matches_subject(request: Request, subject: dict[str, Any]) -> bool:  # rule.go l.58-108
    kind = subject["kind"]
    if kind == "User":
        return subject["user"]["name"] in ("*", request.user)
    if kind == "Group":
        return subject["group"]["name"] == "*" or subject["group"]["name"] in request.groups
    if kind == "ServiceAccount":
        namespace, name = subject["serviceAccount"]["namespace"], subject["serviceAccount"]["name"]
        prefix = "system:serviceaccount:"
        if not request.user.startswith(prefix):
            return False
        rest = request.user[len(prefix):]
        if not rest.startswith(namespace):
            return False
        rest = rest[len(namespace):]
        if not rest.startswith(":"):
            return False
        return name == "*" or rest[1:] == name
    return False


def matches_resource_rule(request: Request, policy: dict[str, Any]) -> bool:  # rule.go l.119-133
    resource = f"{request.resource}/{request.subresource}" if request.subresource else request.resource
    if not (contains(request.verb, policy["verbs"], "*") and contains(resource, policy["resources"], "*")
            and contains(request.api_group, policy["apiGroups"], "*")):
        return False
    if not request.namespace:
        return bool(policy.get("clusterScope", False))
    return contains(request.namespace, policy.get("namespaces", []), "*")


def matches_url(path: str, urls: Sequence[str]) -> bool:  # rule.go l.155-169
    for rule_path in urls:
        if rule_path in ("*", path):
            return True
        prefix = rule_path.removesuffix("*")
        if not prefix.endswith("/"):
            prefix += "/"
        if path.startswith(prefix):
            return True
    return False


def matches_schema(request: Request, flow_schema: dict[str, Any]) -> bool:  # rule.go l.30-47
    for policy in flow_schema["spec"].get("rules", []):
        if not any(matches_subject(request, s) for s in policy["subjects"]):
            continue
        if request.resource:
            if any(matches_resource_rule(request, r) for r in policy.get("resourceRules", [])):
                return True
        elif any(contains(request.verb, r["verbs"], "*") and matches_url(request.path, r["nonResourceURLs"])
                 for r in policy.get("nonResourceRules", [])):
            return True
    return False


def classify(request: Request, schemas: Sequence[dict[str, Any]], levels: Sequence[str]) -> dict[str, Any]:
    """The FlowSchema the apiserver picks: schemas naming a missing level are ignored, the rest
    ordered by matchingPrecedence then name (apihelpers FlowSchemaSequence.Less), first match wins
    (apf_controller.go digestFlowSchemasLocked, startRequest)."""
    usable = [fs for fs in schemas if fs["spec"]["priorityLevelConfiguration"]["name"] in levels]
    for flow_schema in sorted(usable, key=lambda fs: (fs["spec"]["matchingPrecedence"], fs["metadata"]["name"])):
        if matches_schema(request, flow_schema):
            return flow_schema
    raise AssertionError(f"no schema matches {request}")


# ---------------------------------------------------------------- the apiserver's seats, ported

@dataclass(frozen=True)
class Seats:
    nominal: int
    least: int  # minCL: nominal less what it lends
    most: int  # maxCL: nominal plus what it may borrow
    # the most seats one request may take (queuing levels only): the work estimator charges a
    # LIST at most this (request/list_work_estimator.go: the level's maxSeats, itself capped by
    # MaximumListSeatsLimit, 100 with SizeBasedListCostEstimate, beta and on in 1.34)
    widest: int | None


def go_round(x: float) -> int:
    """Go's math.Round for x >= 0: halves away from zero (Python's round() goes to even)."""
    return math.floor(x + 0.5)


def seats(server_limit: int, levels: dict[str, dict[str, Any]]) -> dict[str, Seats]:
    """apf_controller.go l.857-893 at kubernetes-1.34.2: shares over the sum of every level's
    shares (l.742/847), lending and borrowing rounded, and the widest request (l.892,
    priorityLevelMaxSeatsPercent 0.15 at l.63)."""

    def commons(spec: dict[str, Any]) -> tuple[int, int | None, int | None]:
        body = spec["limited"] if spec["type"] == "Limited" else spec["exempt"]
        return body["nominalConcurrencyShares"], body.get("lendablePercent"), body.get("borrowingLimitPercent")

    share_sum = float(sum(commons(spec)[0] for spec in levels.values()))
    result = {}
    for name, spec in levels.items():
        shares, lendable, borrowing = commons(spec)
        nominal = math.ceil(float(server_limit) * float(shares) / share_sum)
        lent = go_round(nominal * lendable / 100) if lendable is not None else 0
        borrow = go_round(nominal * borrowing / 100) if borrowing is not None else server_limit
        widest = None
        queuing = spec.get("limited", {}).get("limitResponse", {}).get("queuing")
        if queuing:
            widest = max(1, min(math.ceil(nominal * 0.15), nominal // queuing["handSize"]))
        result[name] = Seats(nominal, nominal - lent, nominal + borrow, widest)
    return result


def kube_up_limit(nodes_per_apiserver: int) -> int:
    """Upstream's sizing for large clusters (kubernetes/kubernetes cluster/gce/gci/
    configure-kubeapiserver.sh start-kube-apiserver, at 0214969e): 3000+1000 past 3,000 nodes,
    1500+500 past 500, else the apiserver's defaults."""
    if nodes_per_apiserver > 3000:
        return 3000 + 1000
    return 1500 + 500 if nodes_per_apiserver > 500 else DEFAULT_SERVER_LIMIT


# ---------------------------------------------------------------- the recorded objects

def ours(graph: Graph, type_: str) -> list[dict[str, Any]]:
    parents = {r.name for r in graph.resources if r.type == "kilonode:k8s:ApiProtection"}
    return [r.plain() for r in graph.resources if r.type == type_ and r.parent in parents]


def our_levels(graph: Graph) -> dict[str, dict[str, Any]]:
    return {pl["metadata"]["name"]: pl["spec"] for pl in ours(graph, PRIORITY_LEVEL)}


def all_schemas(graph: Graph, minor: int) -> list[dict[str, Any]]:
    return [*BUILTIN_SCHEMAS[minor], *ours(graph, FLOW_SCHEMA)]


def all_levels(graph: Graph) -> dict[str, dict[str, Any]]:
    return {**BUILTIN_LEVELS, **our_levels(graph)}


@pytest.fixture(scope="module")
def graph(graphs: dict[str, Graph]) -> Graph:
    return graphs["research-7500"]


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_object_validates_strictly_at_every_supported_minor(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    objects = ours(graphs[stack], FLOW_SCHEMA) + ours(graphs[stack], PRIORITY_LEVEL)
    # three levels, a FlowSchema for each, whatever the stack
    assert sorted(o["kind"] for o in objects) == ["FlowSchema"] * 3 + ["PriorityLevelConfiguration"] * 3
    assert plans[stack].kubernetes_minor in SUPPORTED_MINORS
    for obj in objects:
        for minor in SUPPORTED_MINORS:
            shared.validate_object(obj, f"1.{minor}.0")


def test_the_schema_check_catches_a_misspelt_field(graph: Graph) -> None:
    [level] = [pl for pl in ours(graph, PRIORITY_LEVEL) if pl["metadata"]["name"] == NODE_AGENTS]
    broken = copy.deepcopy(level)
    broken["spec"]["limited"]["nominalConcurencyShares"] = broken["spec"]["limited"].pop("nominalConcurrencyShares")
    with pytest.raises(kubernetes_validate.ValidationError, match="nominalConcurencyShares"):
        kubernetes_validate.validate(broken, "1.34.0", strict=True)


def queuing_problems(spec: dict[str, Any]) -> list[str]:
    """What the apiserver's validation refuses beyond the schema: handSize <= queues, the
    shuffle-sharding entropy ceil(log2(queues)) x handSize <= 60 (kubernetes/kubernetes
    pkg/apis/flowcontrol/validation ValidatePriorityLevelQueuingConfiguration; kubernetes/apiserver
    pkg/util/shufflesharding/shufflesharding.go l.24-36), positive lengths, percentages 0-100."""
    body = spec["limited"]
    queuing = body["limitResponse"]["queuing"]
    queues, hand, length = queuing["queues"], queuing["handSize"], queuing["queueLengthLimit"]
    problems = []
    if not 0 < hand <= queues:
        problems.append(f"handSize {hand} not in 1..queues {queues}")
    elif math.ceil(math.log2(queues) * hand) > 60:
        problems.append(f"queues {queues} x handSize {hand} need more than 60 bits of entropy")
    if length <= 0 or body["nominalConcurrencyShares"] <= 0:
        problems.append("queueLengthLimit and nominalConcurrencyShares must be positive")
    if not all(0 <= body[k] <= 100 for k in ("lendablePercent",)) or body["borrowingLimitPercent"] < 0:
        problems.append("lendablePercent 0-100, borrowingLimitPercent >= 0")
    return problems


def test_queuing_is_what_the_apiserver_accepts_and_a_bad_one_is_caught(graph: Graph) -> None:
    for name, spec in our_levels(graph).items():
        assert spec["type"] == "Limited" and spec["limited"]["limitResponse"]["type"] == "Queue", name
        assert queuing_problems(spec) == [], name
    bad = copy.deepcopy(our_levels(graph)[NODE_AGENTS])
    bad["limited"]["limitResponse"]["queuing"].update(queues=4096, handSize=8)  # 12 bits x 8
    assert queuing_problems(bad) == ["queues 4096 x handSize 8 need more than 60 bits of entropy"]


def test_nothing_is_mistaken_for_the_apiservers_own_configuration(graph: Graph) -> None:
    objects = ours(graph, FLOW_SCHEMA) + ours(graph, PRIORITY_LEVEL)
    builtin_names = {fs["metadata"]["name"] for fs in BUILTIN_SCHEMAS_132} | set(BUILTIN_LEVELS)
    for obj in objects:
        # the apiserver deletes autoupdate-annotated objects it does not know (kubernetes/kubernetes
        # pkg/registry/flowcontrol/ensurer/strategy.go getRemoveCandidate)
        assert "apf.kubernetes.io/autoupdate-spec" not in obj["metadata"].get("annotations", {})
        assert obj["metadata"]["name"] not in builtin_names
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kilonode"
    [hook] = [fs for fs in ours(graph, FLOW_SCHEMA) if fs["metadata"]["labels"].get("kilonode.io/hook")]
    assert hook["metadata"]["name"] == MONITORING
    assert hook["metadata"]["labels"]["kilonode.io/hook"] == "monitoring-agents"
    how = hook["metadata"]["annotations"]["kilonode.io/how-to-join"]
    assert f"namespace {MONITORING_NAMESPACE}" in how and MONITORING_GROUP in how
    # every schema names a level that exists (a dangling one is ignored by the apiserver), and is
    # created after it
    assert {fs["spec"]["priorityLevelConfiguration"]["name"] for fs in ours(graph, FLOW_SCHEMA)} == set(
        our_levels(graph))
    for record in graph.of_type(FLOW_SCHEMA):
        level = record.plain()["spec"]["priorityLevelConfiguration"]["name"]
        [made] = [r.name for r in graph.of_type(PRIORITY_LEVEL) if r.plain()["metadata"]["name"] == level]
        assert made in record.depends_on


# ---------------------------------------------------------------- where requests land

KUBE_PROXY = as_account("kube-system", "kube-proxy")
NODE_MANAGER = as_account("kube-system", "cloud-node-manager")
AGENT = as_account(MONITORING_NAMESPACE, "log-shipper")
KUBELET = ("system:node:research-7500-a100-ib-000abc123", (NODES, AUTHENTICATED))
JOINING = ("system:bootstrap:abcdef", (BOOTSTRAPPERS, "system:bootstrappers:kilonode:nodes", AUTHENTICATED))
CASES: dict[str, tuple[Request, str, str]] = {  # request -> (FlowSchema, priority level)
    "kube-proxy LISTs nodes": (Request(*KUBE_PROXY, "list", "nodes"), NODE_AGENTS, NODE_AGENTS),
    "kube-proxy WATCHes EndpointSlices everywhere": (
        Request(*KUBE_PROXY, "watch", "endpointslices", "discovery.k8s.io"), NODE_AGENTS, NODE_AGENTS),
    "kube-proxy records an Event": (
        Request(*KUBE_PROXY, "create", "events", "events.k8s.io", namespace="default"), NODE_AGENTS, NODE_AGENTS),
    "kube-proxy reads discovery": (Request(*KUBE_PROXY, "get", path="/apis"), NODE_AGENTS, NODE_AGENTS),
    "kube-proxy's health check stays exempt": (Request(*KUBE_PROXY, "get", path="/healthz"), "probes", "exempt"),
    "cloud-node-manager patches its Node's status": (
        Request(*NODE_MANAGER, "patch", "nodes", subresource="status"), NODE_AGENTS, NODE_AGENTS),
    "a monitoring agent WATCHes pods": (Request(*AGENT, "watch", "pods"), MONITORING, MONITORING),
    "a monitoring agent LISTs pods of one namespace": (
        Request(*AGENT, "list", "pods", namespace="team-a"), MONITORING, MONITORING),
    "an agent in the monitoring group LISTs nodes": (
        Request("fluentd:node-0042", (MONITORING_GROUP, AUTHENTICATED), "list", "nodes"), MONITORING, MONITORING),
    "a ServiceAccount of namespace monitoring-tools is not in the hook": (
        Request(*as_account("monitoring-tools", "x"), "list", "pods"), "service-accounts", "workload-low"),
    # a joining node: the bootstrap token's CSR (client-go util/certificate/csr/csr.go: create,
    # then LIST and WATCH by name), then the new kubelet's Node and Lease as any kubelet's
    "a joining node creates its client CSR": (
        Request(*JOINING, "create", "certificatesigningrequests", "certificates.k8s.io"), BOOTSTRAP, BOOTSTRAP),
    "a joining node WATCHes its CSR": (
        Request(*JOINING, "watch", "certificatesigningrequests", "certificates.k8s.io"), BOOTSTRAP, BOOTSTRAP),
    "a joining node reads discovery": (Request(*JOINING, "get", path="/apis"), BOOTSTRAP, BOOTSTRAP),
    "a new node's kubelet registers its Node": (Request(*KUBELET, "create", "nodes"), "system-node-high", "node-high"),
    "a new node's kubelet LISTs its pods": (Request(*KUBELET, "list", "pods"), "system-nodes", "system"),
    "a kubelet updates its Node's status": (
        Request(*KUBELET, "patch", "nodes", subresource="status"), "system-node-high", "node-high"),
    "a kubelet renews its lease": (
        Request(*KUBELET, "update", "leases", "coordination.k8s.io", namespace="kube-node-lease"),
        "system-node-high", "node-high"),
    "a kubelet reads a pod's Secret": (
        Request(*KUBELET, "get", "secrets", namespace="team-a"), "system-nodes", "system"),
    # the GPU health agent is the node (kilonode.gpu.kubeapi: GET/PATCH its Node, POST Events,
    # LIST pods with a field selector)
    "the GPU health agent reports its condition": (
        Request(*KUBELET, "patch", "nodes", subresource="status"), "system-node-high", "node-high"),
    "the GPU health agent reads its Node": (Request(*KUBELET, "get", "nodes"), "system-node-high", "node-high"),
    "the GPU health agent lists its node's pods": (Request(*KUBELET, "list", "pods"), "system-nodes", "system"),
    "the GPU health agent creates an Event": (
        Request(*KUBELET, "create", "events", namespace="default"), "system-nodes", "system"),
    "kube-controller-manager LISTs pods": (
        Request(KCM, (AUTHENTICATED,), "list", "pods"), "kube-controller-manager", "workload-high"),
    "kube-controller-manager renews its leader lease": (
        Request(KCM, (AUTHENTICATED,), "update", "leases", "coordination.k8s.io", namespace="kube-system"),
        "system-leader-election", "leader-election"),
    "kube-scheduler binds a pod": (
        Request(SCHEDULER, (AUTHENTICATED,), "create", "pods", subresource="binding", namespace="team-a"),
        "kube-scheduler", "workload-high"),
    "CoreDNS WATCHes Services": (
        Request(*as_account("kube-system", "coredns"), "watch", "services"),
        "kube-system-service-accounts", "workload-high"),
    "cloud-controller-manager's leader lease": (
        Request(*as_account("kube-system", "cloud-controller-manager"), "get", "leases", "coordination.k8s.io",
                namespace="kube-system"), "system-leader-election", "leader-election"),
    "a workload's ServiceAccount": (
        Request(*as_account("team-a", "trainer"), "get", "configmaps", namespace="team-a"),
        "service-accounts", "workload-low"),
    "a cluster admin LISTs pods": (
        Request("alice", ("kilonode:cluster-admins", AUTHENTICATED), "list", "pods"), "global-default",
        "global-default"),
    "the GPU health controller WATCHes nodes": (
        Request("kilonode:gpu-health-controller", (AUTHENTICATED,), "watch", "nodes"), "global-default",
        "global-default"),
    "the program's super-admin": (Request("kilonode", (MASTERS, AUTHENTICATED), "delete", "pods",
                                          namespace="team-a"), "exempt", "exempt"),
    "the load balancer's probe": (
        Request("system:anonymous", (UNAUTHENTICATED,), "get", path="/readyz"), "probes", "exempt"),
}


@pytest.mark.parametrize("minor", SUPPORTED_MINORS)
@pytest.mark.parametrize("case", CASES)
def test_requests_land_in_the_intended_level(graph: Graph, minor: int, case: str) -> None:
    request, expected_schema, expected_level = CASES[case]
    chosen = classify(request, all_schemas(graph, minor), list(all_levels(graph)))
    assert (chosen["metadata"]["name"], chosen["spec"]["priorityLevelConfiguration"]["name"]) == (
        expected_schema, expected_level)


# Requests whose schema kilonode must not change: the control plane's, the probes', the
# admins', the workloads'.
UNTOUCHED = [case for case, (_, schema_name, _) in CASES.items() if schema_name not in OURS]


def rerouted(schemas: list[dict[str, Any]], minor: int, levels: list[str]) -> list[str]:
    return [case for case in UNTOUCHED
            if classify(CASES[case][0], schemas, levels)["metadata"]["name"]
            != classify(CASES[case][0], BUILTIN_SCHEMAS[minor], levels)["metadata"]["name"]]


@pytest.mark.parametrize("minor", SUPPORTED_MINORS)
def test_kilonodes_schemas_take_no_request_from_a_builtin_schema(graph: Graph, minor: int) -> None:
    assert rerouted(all_schemas(graph, minor), minor, list(all_levels(graph))) == []


def test_a_schema_that_would_shadow_the_kubelets_is_caught(graph: Graph) -> None:
    greedy = copy.deepcopy(next(fs for fs in ours(graph, FLOW_SCHEMA) if fs["metadata"]["name"] == NODE_AGENTS))
    greedy["spec"]["matchingPrecedence"] = 350
    greedy["spec"]["rules"][0]["subjects"].append(group(NODES))
    schemas = [*BUILTIN_SCHEMAS[34], greedy]
    assert "a kubelet updates its Node's status" in rerouted(schemas, 34, list(all_levels(graph)))


def test_after_kube_system_service_accounts_kube_proxy_would_share_workload_high(graph: Graph) -> None:
    late = copy.deepcopy(next(fs for fs in ours(graph, FLOW_SCHEMA) if fs["metadata"]["name"] == NODE_AGENTS))
    late["spec"]["matchingPrecedence"] = 950
    chosen = classify(CASES["kube-proxy LISTs nodes"][0], [*BUILTIN_SCHEMAS[34], late], list(all_levels(graph)))
    assert chosen["spec"]["priorityLevelConfiguration"]["name"] == "workload-high"
    # ... and a schema naming a level that does not exist is ignored, as the apiserver does
    dangling = copy.deepcopy(late)
    dangling["spec"]["matchingPrecedence"] = 850
    chosen = classify(CASES["kube-proxy LISTs nodes"][0], [*BUILTIN_SCHEMAS[34], dangling], list(BUILTIN_LEVELS))
    assert chosen["metadata"]["name"] == "kube-system-service-accounts"


# DaemonSets that run a pod on every node but never call the apiserver, and why.
NO_API_CLIENT = {
    # NVIDIA/k8s-device-plugin v0.17.4 (fd56a747): cmd/nvidia-device-plugin imports no
    # Kubernetes client, only the kubelet's device-plugin gRPC API
    ("kube-system", "nvidia-device-plugin-daemonset"),
}


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_daemonset_that_talks_to_the_apiserver_is_in_a_kilonode_level(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    graph_ = graphs[stack]
    daemonsets = [r.plain() for r in graph_.of_type("kubernetes:apps/v1:DaemonSet")]
    assert daemonsets
    for ds in daemonsets:
        namespace, name = ds["metadata"].get("namespace", "default"), ds["metadata"]["name"]
        pod = ds["spec"]["template"]["spec"]
        if (namespace, name) in NO_API_CLIENT or pod.get("automountServiceAccountToken") is False:
            continue
        identity = as_account(namespace, pod.get("serviceAccountName") or "default")
        for request in (Request(*identity, "list", "nodes"), Request(*identity, "watch", "pods")):
            chosen = classify(request, all_schemas(graph_, plans[stack].kubernetes_minor), list(all_levels(graph_)))
            assert chosen["spec"]["priorityLevelConfiguration"]["name"] in (NODE_AGENTS, MONITORING), (name, request)


# ---------------------------------------------------------------- seats per apiserver

@pytest.fixture(scope="module")
def apiserver_units(plans: dict[str, ClusterPlan]) -> dict[str, list[dict[str, str]]]:
    """{stack: the kube-apiserver flags of each apiserver's rendered unit}."""
    units = {}
    for stack in SHIPPED_STACKS:
        plan = plans[stack]
        units[stack] = []
        for instance in plan.control_plane.instances:
            program, flags = exec_start(
                render_apiserver(plan, instance)["etc/systemd/system/kube-apiserver.service"].content)
            assert program == "kube-apiserver"
            units[stack].append(flags)
    return units


def server_limit(flags: dict[str, str]) -> int:
    assert flags["enable-priority-and-fairness"] == "true"  # else the two are separate limits
    return int(flags["max-requests-inflight"]) + int(flags["max-mutating-requests-inflight"])


def seat_problems(limit: int, nodes_per_apiserver: int, levels: dict[str, dict[str, Any]]) -> list[str]:
    """The bounds kilonode promises for one apiserver."""
    got = seats(limit, levels)
    upstream = seats(kube_up_limit(nodes_per_apiserver), BUILTIN_LEVELS)
    out_of_the_box = seats(DEFAULT_SERVER_LIMIT, BUILTIN_LEVELS)
    ours_ = [name for name in levels if name not in BUILTIN_LEVELS]
    problems = []
    # every built-in level keeps at least what upstream's sizing alone gives it
    problems += [f"{name}: {got[name].nominal} seats < {upstream[name].nominal} upstream's sizing gives it"
                 for name in BUILTIN_LEVELS if got[name].nominal < upstream[name].nominal]
    # the control plane's guaranteed seats never fall below an out-of-the-box apiserver's
    problems += [f"{name}: guaranteed {got[name].least} < {out_of_the_box[name].least}"
                 for name in CONTROL_PLANE_LEVELS if got[name].least < out_of_the_box[name].least]
    # kilonode's levels never hold more than their nominal seats: together their shares' part of
    # the limit (40 / 285, 14.0%), plus at most one seat each from rounding up
    problems += [f"{name} may borrow up to {got[name].most} > {got[name].nominal}"
                 for name in ours_ if got[name].most > got[name].nominal]
    held = sum(got[name].most for name in ours_)
    if held > 0.141 * limit + len(ours_):
        problems.append(f"kilonode's levels may hold {held} of {limit} seats")
    # the widest request of a node agent (a cluster-wide LIST) fits in its guaranteed seats
    if got[NODE_AGENTS].widest is None or got[NODE_AGENTS].widest > got[NODE_AGENTS].least:
        problems.append(f"{NODE_AGENTS}: widest request {got[NODE_AGENTS].widest} > {got[NODE_AGENTS].least}")
    return problems


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_kilonodes_levels_leave_the_builtin_levels_their_seats(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], apiserver_units: dict[str, list[dict[str, str]]],
    stack: str,
) -> None:
    plan = plans[stack]
    per_apiserver = math.ceil(plan.most_nodes / max(1, len(plan.control_plane.instances) - 1))
    for flags in apiserver_units[stack]:
        assert seat_problems(server_limit(flags), per_apiserver, all_levels(graphs[stack])) == []


def test_the_seats_of_the_7500_node_shape(graph: Graph, apiserver_units: dict[str, list[dict[str, str]]]) -> None:
    limit = server_limit(apiserver_units["research-7500"][0])
    assert limit == 2327  # 1500 + 500 (kube-up past 500 nodes: 7,500 / 4) x (245 + 40) / 245, rounded up
    got = seats(limit, all_levels(graph))
    assert got[NODE_AGENTS] == Seats(nominal=164, least=82, most=164, widest=20)  # 2327 x 20 / 285
    assert got[MONITORING] == Seats(nominal=82, least=8, most=82, widest=13)  # 2327 x 10 / 285, lends 74
    # 2327 x 10 / 285, lends 74; a request takes at most 82 // handSize 8 = 10 seats
    assert got[BOOTSTRAP] == Seats(nominal=82, least=8, most=82, widest=10)
    assert (got["system"].nominal, got["node-high"].nominal, got["workload-high"].nominal) == (245, 327, 327)


def test_the_seat_bounds_catch_an_agent_level_that_borrows(graph: Graph) -> None:
    levels = copy.deepcopy(all_levels(graph))
    del levels[MONITORING]["limited"]["borrowingLimitPercent"]  # nil: borrow up to the server limit
    assert seat_problems(2327, 1875, levels)[0] == f"{MONITORING} may borrow up to {82 + 2327} > 82"
    # ... and one whose shares would eat into the built-in levels
    levels = copy.deepcopy(all_levels(graph))
    levels[NODE_AGENTS]["limited"]["nominalConcurrencyShares"] = 200
    assert any(p.startswith("system:") for p in seat_problems(2327, 1875, levels))


# ---------------------------------------------------------------- the apiserver flags

# By hand: (nodes per apiserver with one down -> kube-up's limits) plus kilonode's 40 shares'
# worth: ceil(total x 40 / 245) on the read limit.
EXPECTED_INFLIGHT = {
    "local": (498, 200),  # 2 nodes, 1 apiserver: 400/200 + ceil(600 x 40 / 245) = 98
    "research-2500": (1827, 500),  # 2,500 / 2 = 1,250 > 500: 1500/500 + ceil(2000 x 40 / 245) = 327
    "research-7500": (1827, 500),  # 7,500 / 4 = 1,875 > 500: the same
}


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_apiserver_carries_the_large_cluster_flags(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], apiserver_units: dict[str, list[dict[str, str]]],
    stack: str,
) -> None:
    plan = plans[stack]
    units = apiserver_units[stack]
    assert len(units) == len(plan.control_plane.instances)
    [lb] = [r.plain() for r in graphs[stack].of_type("azure-native:network:LoadBalancer")
            if r.name.endswith("apiserver-lb")]
    [probe] = lb["probes"]
    for flags in units:
        assert flags["enable-priority-and-fairness"] == "true"
        assert (int(flags["max-requests-inflight"]), int(flags["max-mutating-requests-inflight"])) == \
            EXPECTED_INFLIGHT[stack]
        assert "disable-http2-serving" not in flags  # GOAWAY is HTTP/2's (config.go l.1069)
        assert "watch-cache-sizes" not in flags and "default-watch-cache-size" not in flags
        if len(units) == 1:
            # "Clusters with single apiservers ... should NOT enable this"
            assert "goaway-chance" not in flags and "shutdown-delay-duration" not in flags
            continue
        assert flags["goaway-chance"] == "0.001"
        assert 0 < float(flags["goaway-chance"]) <= 0.02  # server_run_options.go l.208
        # serving on until the load balancer's probe has taken the apiserver out
        delay = int(flags["shutdown-delay-duration"].removesuffix("s"))
        assert delay > probe["intervalInSeconds"] * probe["probeThreshold"]
        assert delay + 60 < 90  # + the 60 s request timeout's drain, within systemd's default stop timeout


# ---------------------------------------------------------------- explain

def test_describe_names_the_levels_their_members_and_the_seats(plans: dict[str, ClusterPlan]) -> None:
    lines = describe(plans["research-7500"])
    assert lines[0].endswith("2327 seats per apiserver (--max-requests-inflight=1827 + "
                             "--max-mutating-requests-inflight=500)")
    [agents] = [line for line in lines if line.startswith(NODE_AGENTS)]
    assert "164 seats" in agents and "kube-system/kube-proxy" in agents and "kube-system/cloud-node-manager" in agents
    [monitoring] = [line for line in lines if line.startswith(MONITORING)]
    assert "82 seats" in monitoring and f"{MONITORING_NAMESPACE}/*" in monitoring and MONITORING_GROUP in monitoring
    assert any("system-node-high" in line and "GPU health agent" in line for line in lines)
    assert not any("GPU" in line for line in describe(plans["local"]))  # no GPU pools there
    [bootstrap] = [line for line in lines if line.startswith(BOOTSTRAP)]
    assert "82 seats" in bootstrap and f"group {BOOTSTRAPPERS}" in bootstrap and "8 queues, hand 8, 128" in bootstrap


def test_without_the_bootstrap_level_joins_would_be_one_flow_in_global_default(graph: Graph) -> None:
    """The seeded break: drop kilonode's bootstrap schema, and a joining node's CSR lands beside
    every cluster admin; every node on the one token is the same user, so one ByUser flow."""
    without = [fs for fs in all_schemas(graph, 34) if fs["metadata"]["name"] != BOOTSTRAP]
    chosen = classify(CASES["a joining node creates its client CSR"][0], without, list(all_levels(graph)))
    assert chosen["metadata"]["name"] == "global-default"
    other_node = Request("system:bootstrap:abcdef", JOINING[1], "create", "certificatesigningrequests",
                         "certificates.k8s.io")
    assert other_node.user == CASES["a joining node creates its client CSR"][0].user  # the same flow
