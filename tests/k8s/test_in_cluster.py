"""The in-cluster half of the program, recorded under the mock engine: every object checked
against the Kubernetes OpenAPI schema of the stack's version (kubernetes-validate), the TLS
bootstrap objects against what kubeadm creates, the kubeconfigs read by kubectl, and the
readiness gate run for real against an address where no apiserver answers."""

from __future__ import annotations

import base64
import functools
import json
import math
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kilonode.azure.custom_data import decode
from kilonode.azure.graph import Graph, Recorded, _unwrap
from kilonode.k8s.approver import host_name_regex
from kilonode.k8s.readiness import SCRIPT
from kilonode.plan import ClusterPlan, defaults, wellknown
from tests import shared

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACKS = ["local", "research-2500", "research-7500"]
# kilonode.k8s.autoscaler: what it creates where pools autoscale
AUTOSCALER_OBJECTS = 7
KUBECTL = shutil.which("kubectl")


def needs_kubectl(test: Any) -> Any:
    """`make setup` installs kubectl (scripts/install-host-packages, Debian's kubernetes-client):
    a test that needs it fails, saying so, where it is missing, never skips."""
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> Any:
        if KUBECTL is None:
            pytest.fail("kubectl not on PATH: run `make setup` (scripts/install-host-packages installs Debian's "
                        "kubernetes-client)")
        return test(*args, **kwargs)
    return run


def k8s_objects(graph: Graph) -> list[Recorded]:
    return [r for r in graph.resources if r.type.startswith("kubernetes:") and r.custom]


def manifest(record: Recorded) -> dict[str, Any]:
    return record.plain()


@pytest.mark.parametrize("stack", STACKS)
def test_every_object_is_valid_against_the_openapi_schema_of_the_stacks_version(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    minor = plans[stack].kubernetes_minor
    objects = k8s_objects(graphs[stack])
    plan = plans[stack]
    per_component = Counter(r.parent.removeprefix(f"{stack}-k8s-") for r in objects if r.parent)
    expected = {
        # a token Secret per pool and generation, 4 bindings, the node client approver's ClusterRole,
        # binding, pool-table ConfigMap, Role and RoleBinding
        "node-bootstrap": len(plan.join_tokens) + 9,
        "serving-cert-approver": 4,  # SA, role, binding, Deployment
        # SA, role, binding, ConfigMap, Deployment, PDB, Service; the autoscaler's SA, ClusterRole
        # and binding, Role and binding, ConfigMap, Deployment
        "dns": 14,
        "kube-proxy": 4,  # SA, binding, ConfigMap, DaemonSet
        # kilonode.k8s.calico: 24 CRDs; calico-node and Typha: SA, ClusterRole, binding, TLS Secret each;
        # Typha's Service, Deployment, PDB; calico-node's DaemonSet, its writes' admission policy and binding
        "calico": 38,
        "kube-system-policies": 6,  # one NetworkPolicy per kube-system pod-network workload
        # SA; the metrics readers' aggregated ClusterRole; the auth-reader RoleBinding and the
        # auth-delegator binding; its ClusterRole and binding; Deployment, PDB, Service, APIService
        "metrics-server": 10,
        # kilonode.k8s.exporters: node-exporter's DaemonSet; kube-state-metrics's SA, ClusterRole, binding,
        # kube-system Role and RoleBinding, Deployment, Service, NetworkPolicy; on GPU stacks dcgm-exporter's
        # counters ConfigMap and DaemonSet
        "exporters": 9 + (2 if plan.gpu_pools else 0),
        # 2 x (SA, role, binding), RoleBinding, ConfigMap, Deployment, PDB, DaemonSet; with autoscaled
        # pools the autoscaler's azure.json (its own identity)
        "cloud-provider": 11 + (1 if plan.autoscaled_pools else 0),
        # kilonode.k8s.scheduling: 2 CRDs; scheduler and controller: SA, role, binding, Deployment,
        # PDB each; 2 system bindings, 1 RoleBinding, the config ConfigMap
        # and, when every GPU pool is InfiniBand, the fabric and gang-size policies and bindings
        "gang": 16 + (4 if plan.gpu_pools and all(p.infiniband for p in plan.gpu_pools) else 0),
        "api-protection": 6,  # 3 PriorityLevelConfigurations, 3 FlowSchemas
        # kilonode.k8s.storage: the CSIDriver, the StorageClass; the controller's SA, 3 roles and
        # bindings, Deployment, its azure.json ConfigMap; the node plugin's SA, role, binding, DaemonSet
        "storage": 15,
        # Namespace, ConfigMap, 2 NetworkPolicies; Prometheus: SA, ClusterRole, binding, 2 Roles, 2 RoleBindings,
        # Service, StatefulSet
        "monitoring": 4 + (9 if plan.prometheus else 0),
        "kube-system-pod-security": 1,  # kube-system's PodSecurity labels (a NamespacePatch)
        # the default ServiceAccount's automount off (a ServiceAccountPatch each): the 4 built-in
        # namespaces, monitoring and, with balloons, kilonode-capacity
        "default-service-accounts": 5 + (1 if any(p.autoscaling and p.autoscaling.warm_nodes
                                                  for p in plan.autoscaled_pools) else 0),
        # 4 PriorityClasses; with teams the borrowing policy (pods) and its binding; on every
        # stack the node-identity policy and its binding (a node's pool and system labels); with
        # balloons their Namespace, its NetworkPolicy and a Deployment per pool
        "capacity": 4 + (2 if plan.teams else 0) + 2
        + (2 + sum(1 for p in plan.autoscaled_pools if p.autoscaling and p.autoscaling.warm_nodes)
           if any(p.autoscaling and p.autoscaling.warm_nodes for p in plan.autoscaled_pools) else 0),
    }
    # kilonode.k8s.reserved_pools: the policy and its binding, where a system pool or a tainted
    # Prometheus pool is to be kept to the system namespaces (none on `local`)
    if plan.system_pools or (plan.prometheus and plan.prometheus.pool_taints):
        expected["reserved-pools"] = 2
    if plan.prometheus:  # kilonode.k8s.grafana: NetworkPolicy, Secret, 2 ConfigMaps, Service, Deployment
        expected["grafana"] = 6
        # kilonode.k8s.alertmanager: NetworkPolicy, ConfigMap, Service, StatefulSet (a Secret with receivers)
        expected["alertmanager"] = 5 if plan.alerting is not None and plan.alerting.pager_duty else 4
    if plan.gpu_pools:  # kilonode.k8s.gpu: the device plugin's DaemonSet; the controller's roles and bindings
        expected |= {"device-plugin": 1, "gpu-health": 4}
    if any(p.infiniband for p in plan.node_pools):  # kilonode.k8s.rdma: its ConfigMap and DaemonSet
        expected["rdma"] = 2
    if plan.autoscaled_pools:  # kilonode.k8s.autoscaler
        expected["autoscaler"] = AUTOSCALER_OBJECTS
    assert dict(per_component) == expected
    for record in objects:
        shared.validate_object(manifest(record), f"1.{minor}.0")


def test_the_schema_check_catches_a_misspelt_field(graphs: dict[str, Graph]) -> None:
    deployment = next(r for r in k8s_objects(graphs["local"]) if r.name.endswith("approver-deployment"))
    broken = manifest(deployment)
    broken["spec"]["template"]["spec"]["serviceAccount_name"] = broken["spec"]["template"]["spec"].pop(
        "serviceAccountName")
    with pytest.raises(kubernetes_validate.ValidationError, match="serviceAccount_name"):
        kubernetes_validate.validate(broken, "1.34.0", strict=True)


def test_every_object_goes_through_the_programs_own_provider_which_waits_for_readyz(
    graphs: dict[str, Graph],
) -> None:
    graph = graphs["research-7500"]
    assert {r.provider for r in k8s_objects(graph)} == {"research-7500-k8s-provider"}
    provider = graph.named("research-7500-k8s-provider")
    assert "research-7500-k8s-apiserver-ready-readyz" in provider.depends_on
    ready = graph.named("research-7500-k8s-apiserver-ready-readyz")
    # ... which runs after the apiservers' load balancer and image exist, and depends on no apiserver VM:
    # one is replaced at a time under it (tests/azure/test_rolling_control_plane.py)
    assert "research-7500-apiserver-lb" in ready.depends_on and "research-7500-apiserver-0" not in ready.depends_on


def test_each_pools_join_token_secret_is_what_the_apiservers_authenticator_reads(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan]
) -> None:
    plan = plans["research-7500"]
    secrets = [manifest(r) for r in k8s_objects(graphs["research-7500"]) if r.type == "kubernetes:core/v1:Secret"
               and manifest(r)["metadata"]["name"].startswith("bootstrap-token-")]
    assert len(secrets) == len(plan.join_tokens)
    by_pool = {}
    for value in secrets:
        data = value["stringData"]
        assert value["type"] == "bootstrap.kubernetes.io/token"
        assert value["metadata"]["name"] == f"bootstrap-token-{data['token-id']}"
        assert value["metadata"]["namespace"] == "kube-system"
        # k8s.io/cluster-bootstrap/token/api: [a-z0-9]{6} and [a-z0-9]{16}
        assert re.fullmatch(r"[a-z0-9]{6}", data["token-id"]) and re.fullmatch(r"[a-z0-9]{16}", data["token-secret"])
        assert data["usage-bootstrap-authentication"] == "true" and data["usage-bootstrap-signing"] == "true"
        # cluster-bootstrap token/api/types.go BootstrapGroupPattern, for every extra group
        groups = data["auth-extra-groups"].split(",")
        assert all(re.fullmatch(r"system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]", g) for g in groups), groups
        pool = value["metadata"]["labels"]["kilonode.io/pool"]
        team = value["metadata"]["labels"].get("kilonode.io/team")
        group = pool if team is None else f"{pool}:team:{team}"  # a token per registration group
        assert groups == ["system:bootstrappers:kilonode:nodes", f"system:bootstrappers:kilonode:pool:{group}"]
        # time.Parse(time.RFC3339, ...) in cluster-bootstrap util/secrets GetExpiration: whole seconds, Z
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", data["expiration"]), data["expiration"]
        by_pool.setdefault(group, []).append(data["expiration"])
    # the stack's current and previous generation: two live tokens per registration group, each its own expiry
    assert {group: sorted(e) for group, e in by_pool.items()} == {
        t.registration: sorted(u.expires for u in plan.join_tokens if u.registration == t.registration)
        for t in plan.join_tokens}
    assert all(len(set(e)) == 2 for e in by_pool.values())


def test_rbac_grants_what_kubeadm_grants_and_no_more(graphs: dict[str, Graph]) -> None:
    """The bootstrap and core components' bindings (the gang scheduler's and the autoscaler's
    are checked against their upstream manifests in their own tests)."""
    # the Prometheus ClusterRole's rules: tests/monitoring/test_prometheus.py
    own_tests = ("research-7500-k8s-gang", "research-7500-k8s-autoscaler", "research-7500-k8s-monitoring",
                 "research-7500-k8s-storage")  # tests/k8s/test_storage.py
    bindings = {
        manifest(r)["metadata"]["name"]: (manifest(r)["roleRef"]["name"],
                                          [(s["kind"], s["name"]) for s in manifest(r)["subjects"]])
        for r in k8s_objects(graphs["research-7500"])
        if r.type.endswith(":ClusterRoleBinding") and r.parent not in own_tests
    }
    assert bindings == {
        "kilonode:kubelet-bootstrap": ("system:node-bootstrapper", [("Group", defaults.BOOTSTRAP_GROUP)]),
        "kilonode:node-autoapprove-certificate-rotation": (
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", [("Group", "system:nodes")]),
        "kilonode:cluster-admins": ("cluster-admin", [("Group", "kilonode:cluster-admins")]),
        # the apiservers' kubelet client certificate's user (no group): the kubelet API and nothing more
        "kilonode:apiserver-kubelet-client": ("system:kubelet-api-admin", [("User", "kube-apiserver-kubelet-client")]),
        "kilonode:kubelet-csr-approver": ("kilonode:kubelet-csr-approver",
                                          [("ServiceAccount", "kubelet-csr-approver")]),
        "system:coredns": ("system:coredns", [("ServiceAccount", "coredns")]),
        # nodes list/watch only (cluster-proportional-autoscaler examples/RBAC/RBAC-configs.yaml; its
        # scale and ConfigMap rights in a Role on the one Deployment and ConfigMap)
        "kilonode:coredns-autoscaler": ("kilonode:coredns-autoscaler", [("ServiceAccount", "coredns-autoscaler")]),
        "kilonode:node-proxier": ("system:node-proxier", [("ServiceAccount", "kube-proxy")]),
        # Calico's (kilonode.k8s.calico): upstream's calico-node role, less two rules; Typha's read-only one
        "calico-node": ("calico-node", [("ServiceAccount", "calico-node")]),
        "calico-typha": ("calico-typha", [("ServiceAccount", "calico-typha")]),
        # metrics-server's, as its manifests/base/rbac.yaml: its own reads, and the built-in role that
        # lets an aggregated API server delegate authentication and authorisation to the apiserver
        "system:metrics-server": ("system:metrics-server", [("ServiceAccount", "metrics-server")]),
        "metrics-server:system:auth-delegator": ("system:auth-delegator", [("ServiceAccount", "metrics-server")]),
        # kube-state-metrics's (kilonode.k8s.exporters): examples/standard/cluster-role.yaml cut to list/watch nodes
        "kube-state-metrics": ("kube-state-metrics", [("ServiceAccount", "kube-state-metrics")]),
        "kilonode:cloud-controller-manager": ("kilonode:cloud-controller-manager",
                                              [("ServiceAccount", "cloud-controller-manager")]),
        "kilonode:cloud-node-manager": ("kilonode:cloud-node-manager", [("ServiceAccount", "cloud-node-manager")]),
        "kilonode:gpu-health-controller": ("kilonode:gpu-health-controller",
                                           [("User", "kilonode:gpu-health-controller")]),
        "kilonode:node-client-approver": ("kilonode:node-client-approver",
                                          [("User", "kilonode:node-client-approver")]),
    }
    role = next(manifest(r) for r in k8s_objects(graphs["research-7500"])
                if r.type.endswith(":ClusterRole") and r.name.endswith("serving-cert-approver-role"))
    approve = [rule for rule in role["rules"] if "approve" in rule["verbs"]]
    assert approve == [{"apiGroups": ["certificates.k8s.io"], "resources": ["signers"],
                        "resourceNames": ["kubernetes.io/kubelet-serving"], "verbs": ["approve"]}]


@pytest.mark.parametrize("stack", STACKS)
def test_the_apiservers_reach_kubelets_as_a_user_bound_before_any_node_can_join(
    graphs: dict[str, Graph], stack: str,
) -> None:
    """Written from the kubelet's side: it authorises the apiserver by SubjectAccessReview (RBAC),
    so the user in the apiserver's --kubelet-client-certificate must be bound to
    system:kubelet-api-admin, and a node that authenticates (with its join token Secret) before
    that binding exists would refuse logs and exec from every apiserver."""
    graph = graphs[stack]
    # every apiserver's certificate: that user, in no group (system:masters would bypass RBAC)
    requests = [r for r in graph.of_type("tls:index/certRequest:CertRequest") if r.name.endswith("-kubelet-client-csr")]
    assert len(requests) == len(graph_apiservers(graph)) > 0
    assert all(r.plain()["subject"] == {"commonName": "kube-apiserver-kubelet-client"} for r in requests)
    objects = k8s_objects(graph)
    binding = next(r for r in objects if r.type.endswith(":ClusterRoleBinding")
                   and manifest(r)["metadata"]["name"] == "kilonode:apiserver-kubelet-client")
    assert manifest(binding)["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                              "name": "kube-apiserver-kubelet-client"}]
    tokens = [r for r in objects if r.type == "kubernetes:core/v1:Secret"
              and manifest(r)["metadata"]["name"].startswith("bootstrap-token-")]
    assert tokens
    for token in tokens:
        assert binding.name in token.depends_on, token.name


def graph_apiservers(graph: Graph) -> list[Recorded]:
    return [r for r in graph.resources if r.type == "azure-native:compute:VirtualMachine" and "-apiserver-" in r.name]


def test_the_serving_cert_approver_is_scoped_to_the_pools_host_names_and_subnets(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan]
) -> None:
    plan = plans["research-7500"]
    deployment = next(manifest(r) for r in k8s_objects(graphs["research-7500"])
                      if r.type.endswith("Deployment") and r.name.endswith("approver-deployment"))
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert container["image"] == plan.components.serving_cert_approver_image
    assert env["PROVIDER_IP_PREFIXES"].split(",") == [str(p.subnet) for p in plan.node_pools]
    assert env["MAX_EXPIRATION_SEC"] == str(365 * 24 * 3600)
    regex = re.compile(env["PROVIDER_REGEX"])
    assert env["PROVIDER_REGEX"] == host_name_regex(plan.cluster, [p.name for p in plan.node_pools])
    # A scale set's instances are named <computerNamePrefix><6 base-36 characters>.
    for pool in plan.node_pools:
        for shard in pool.shards:
            assert regex.match(shard.name + "00001a"), shard.name
    for other in ["research-7500-etcd-main-0", "research-2500-a100-ib-00000001a", "research-7500-a100-ib-00000001",
                  "evil.research-7500-a100-ib-00000001a"]:
        assert not regex.match(other), other


@pytest.mark.parametrize("stack", STACKS)
def test_the_serving_cert_approver_runs_on_the_controllers_pools_alone(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    """Its token approves any kubelet's serving certificate: no replica on a GPU or team node.
    Required, not preferred, node affinity, and no toleration but the system pool's taint (an
    empty-key Exists would admit it to every tainted node)."""
    plan = plans[stack]
    spec = next(manifest(r) for r in k8s_objects(graphs[stack])
                if r.type.endswith("Deployment") and r.name.endswith("approver-deployment"))["spec"]["template"]["spec"]
    assert spec["tolerations"] == [{"key": "CriticalAddonsOnly", "operator": "Exists"}]
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    [expression] = term["matchExpressions"]
    assert expression["operator"] == "In"

    def labels(pool: Any) -> dict[str, str]:  # what each pool's kubelets register with
        return {"kilonode.io/pool": pool.name, **({"kilonode.io/system": "true"} if pool.system else {})}

    admitted = {p.name for p in plan.node_pools if labels(p).get(expression["key"]) in expression["values"]}
    assert admitted == {p.name for p in plan.controller_pools} != set()
    assert not admitted & {p.name for p in plan.gpu_pools} or not plan.system_pools


@pytest.mark.parametrize("stack", STACKS)
def test_the_metrics_api_reaches_metrics_server_which_verifies_the_kubelets_with_the_cluster_ca(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    """Upstream's objects (kubernetes-sigs/metrics-server manifests/base and the high-availability
    component at v0.8.0), with the kubelets reached at their InternalIP and verified by the CA the
    pod's ServiceAccount mounts, never --kubelet-insecure-tls; the APIService registered only
    after the Deployment and the Service it routes to."""
    plan = plans[stack]
    objects = {r.name: r for r in k8s_objects(graphs[stack]) if r.parent == f"{stack}-k8s-metrics-server"}
    api = objects[f"{stack}-k8s-metrics-server-apiservice"]
    spec = manifest(api)["spec"]
    assert manifest(api)["metadata"]["name"] == "v1beta1.metrics.k8s.io"
    assert (spec["group"], spec["version"], spec["service"]) == (
        "metrics.k8s.io", "v1beta1", {"name": "metrics-server", "namespace": "kube-system"})
    assert {f"{stack}-k8s-metrics-server-deployment", f"{stack}-k8s-metrics-server-service"} <= set(api.depends_on)
    service = manifest(objects[f"{stack}-k8s-metrics-server-service"])
    deployment = manifest(objects[f"{stack}-k8s-metrics-server-deployment"])
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"] == {"k8s-app": "metrics-server"}
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "https" and container["ports"] == [
        {"name": "https", "containerPort": 10250, "protocol": "TCP"}]
    args = dict(a.removeprefix("--").partition("=")[::2] for a in container["args"])
    assert args["kubelet-certificate-authority"] == "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    assert args["kubelet-preferred-address-types"] == "InternalIP"
    assert "kubelet-insecure-tls" not in args and pod.get("automountServiceAccountToken") is not False
    assert args["cert-dir"] == "/tmp" and container["volumeMounts"] == [{"name": "tmp-dir", "mountPath": "/tmp"}]
    ms = plan.components.metrics_server
    assert container["image"] == plan.components.metrics_server_image and "@sha256:" in container["image"]
    assert container["resources"] == {"requests": {"cpu": f"{ms.cpu_millis}m", "memory": f"{ms.memory_mib}Mi"}}
    # two replicas, never on one node (upstream's high-availability manifest), a PDB keeping one
    assert deployment["spec"]["replicas"] == 2
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert manifest(objects[f"{stack}-k8s-metrics-server-pdb"])["spec"]["minAvailable"] == 1
    reader = manifest(objects[f"{stack}-k8s-metrics-server-aggregated-reader"])
    assert {k for k, v in reader["metadata"]["labels"].items() if v == "true"} == {
        f"rbac.authorization.k8s.io/aggregate-to-{role}" for role in ("view", "edit", "admin")}
    auth_reader = manifest(objects[f"{stack}-k8s-metrics-server-auth-reader"])
    assert (auth_reader["metadata"]["namespace"], auth_reader["roleRef"]) == (
        "kube-system", {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": "extension-apiserver-authentication-reader"})


def test_metrics_server_is_sized_by_upstreams_per_node_figures_for_the_nodes_it_scrapes(
        plans: dict[str, ClusterPlan]) -> None:
    """README "Scaling" at v0.8.0: 100m and 200 MiB up to 100 nodes, then 1m and 2 MiB per node;
    past the 5,000 nodes upstream supports, the plan says so."""
    sized = {stack: plans[stack].components.metrics_server for stack in STACKS}
    assert {stack: (ms.nodes, ms.cpu_millis, ms.memory_mib) for stack, ms in sized.items()} == {
        "local": (2, 100, 200), "research-2500": (2504, 2504, 5008), "research-7500": (7504, 7504, 15008)}
    assert sized["research-2500"].past_supported is None
    assert "past the 5,000 metrics-server supports" in str(sized["research-7500"].past_supported)


def test_no_token_or_key_material_reaches_the_plan_output(graphs: dict[str, Graph]) -> None:
    from kilonode.azure.graph import format_json, format_text

    graph = graphs["research-7500"]
    secret = next(r for r in k8s_objects(graph) if r.type == "kubernetes:core/v1:Secret"
                  and manifest(r)["metadata"]["name"].startswith("bootstrap-token-"))
    token_secret = manifest(secret)["stringData"]["token-secret"]
    for text in (format_text(graph), format_json(graph)):
        assert token_secret not in text
        assert "mock-private-key" not in text
        assert "client-key-data" not in text


# --- kubeconfigs, read by kubectl -----------------------------------------------------------

def kubectl_view(tmp_path: Path, text: str) -> dict[str, Any]:
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    result = subprocess.run([KUBECTL, "config", "view", "--raw", "-o", "json", "--kubeconfig", str(path)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@needs_kubectl
def test_the_admin_kubeconfig_output_is_a_secret_kubectl_reads(graphs: dict[str, Graph],
                                                                plans: dict[str, ClusterPlan],
                                                                tmp_path: Path) -> None:
    from kilonode.azure.graph import format_json

    graph = graphs["research-7500"]
    assert json.loads(format_json(graph))["outputs"]["adminKubeconfig"] == "[secret]"
    config = kubectl_view(tmp_path, _unwrap(graph.outputs)["adminKubeconfig"])
    (cluster,) = config["clusters"]
    # research-7500's deployer is on the internet: the kubeconfig names the public frontend,
    # whose address no apiserver certificate carries, and asks for a name every one does
    public = _unwrap(graph.outputs)["deployerEndpoint"]
    assert public != plans["research-7500"].control_plane.endpoint
    assert cluster["cluster"]["server"] == public
    assert cluster["cluster"]["tls-server-name"] == "kubernetes"
    (user,) = config["users"]
    assert base64.b64decode(user["user"]["client-certificate-data"]).decode() == \
        "mock-certificate:research-7500-tls-admin"
    assert config["current-context"] == "kilonode"


@needs_kubectl
def test_every_pool_node_gets_a_bootstrap_kubeconfig_kubectl_reads(graphs: dict[str, Graph],
                                                                    plans: dict[str, ClusterPlan],
                                                                    tmp_path: Path) -> None:
    graph = graphs["research-7500"]
    vmss = next(r for r in graph.resources if r.type == "azure-native:compute:VirtualMachineScaleSet")
    # its pool's current join token (the scale set's name is its shard's: <cluster>-<pool>-<index>)
    plan = plans["research-7500"]
    [token] = [t for t in plan.join_tokens if t.current and vmss.plain()["vmScaleSetName"] in t.prefixes]
    [data] = [manifest(r)["stringData"] for r in k8s_objects(graph) if r.type == "kubernetes:core/v1:Secret"
              and manifest(r)["metadata"]["labels"].get("kilonode.io/pool") == token.pool
              and manifest(r)["metadata"]["labels"].get("kilonode.io/team") == token.team
              and manifest(r)["stringData"].get("expiration") == token.expires]
    mime = decode(vmss.plain()["virtualMachineProfile"]["osProfile"]["customData"])
    written = _write_files(mime)
    assert written[wellknown.KUBELET_BOOTSTRAP_KUBECONFIG]["permissions"] == "0600"
    config = kubectl_view(tmp_path, written[wellknown.KUBELET_BOOTSTRAP_KUBECONFIG]["content"])
    assert config["clusters"][0]["cluster"]["server"] == plans["research-7500"].control_plane.endpoint
    assert config["users"][0]["user"]["token"] == f"{data['token-id']}.{data['token-secret']}"


def _write_files(mime: str) -> dict[str, dict[str, Any]]:
    """The #cloud-config part's write_files, by path."""
    import email

    message = email.message_from_string(mime)
    for part in message.walk():
        payload = part.get_payload(decode=True)
        if payload and payload.startswith(b"#cloud-config") and b"write_files" in payload:
            files = shared.load_yaml(payload)["write_files"]
            if any(f["path"] == wellknown.KUBELET_BOOTSTRAP_KUBECONFIG for f in files):
                return {f["path"]: f for f in files}
    raise AssertionError("no #cloud-config part with the bootstrap kubeconfig")


# --- the readiness gate, run for real -------------------------------------------------------

def test_the_readiness_script_is_valid_posix_sh() -> None:
    result = subprocess.run(["sh", "-n", "-c", SCRIPT], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@needs_kubectl
def test_the_readiness_gate_fails_naming_the_endpoint_when_no_apiserver_answers(tmp_path: Path) -> None:
    # 127.0.0.1:9 (discard) refuses connections: no apiserver there.
    endpoint = "https://127.0.0.1:9"
    kubeconfig = yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": endpoint, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "abcdef.0123456789abcdef"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}], "current-context": "c",
    })
    # The clock is a fake one second further at each read and the pause is written down, not
    # waited for: the script's own arithmetic still decides when the deadline has passed.
    shims, home = tmp_path / "bin", tmp_path / "home"
    shims.mkdir()
    home.mkdir()
    (shims / "date").write_text(FAKE_DATE)
    (shims / "sleep").write_text(FAKE_SLEEP)
    for shim in shims.iterdir():
        shim.chmod(0o755)
    env = {"PATH": f"{shims}:{Path(KUBECTL).parent}:/usr/bin:/bin", "HOME": str(home),
           "KILONODE_KUBECONFIG": kubeconfig, "KILONODE_ENDPOINT": endpoint, "KILONODE_TIMEOUT_S": "2",
           "KILONODE_INTERVAL_S": "1"}
    result = subprocess.run(["/bin/sh", "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 1
    assert result.stderr.strip() == f"kube-apiserver at {endpoint} did not answer /readyz within 2 s"
    # deadline 1000 + 2; after the first ask the clock reads 1001: a pause; after the second 1002: the end
    assert (shims / "sleep.log").read_text().split() == ["1"]
    assert list(home.iterdir()) == []  # nothing left behind (the kubeconfig was a temp file elsewhere)


# `date +%s` from 1000 on, one second later at each call; `sleep` that logs its argument
FAKE_DATE = """#!/bin/sh
now=$(cat "$0.now" 2>/dev/null || echo 1000)
echo $((now + 1)) > "$0.now"
echo "$now"
"""
FAKE_SLEEP = """#!/bin/sh
echo "$1" >> "$0.log"
"""


@pytest.mark.parametrize(("stack", "replicas"), [("local", 2), ("research-2500", 11), ("research-7500", 31)])
def test_cluster_dns_answers_at_the_kubelets_cluster_dns_one_replica_per_vm(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str, replicas: int
) -> None:
    objects = {r.name: manifest(r) for r in k8s_objects(graphs[stack])}
    service = objects[f"{stack}-k8s-dns-service"]
    kubelet = yaml.safe_load(shared.rendered(stack)[f"pool-{plans[stack].node_pools[0].name}"]
                             ["etc/kubernetes/kubelet-config.yaml"].content)
    assert service["spec"]["clusterIP"] == kubelet["clusterDNS"][0] == str(plans[stack].control_plane.cluster_dns_ip)
    assert service["metadata"]["name"] == "kube-dns"
    deployment = objects[f"{stack}-k8s-dns-deployment"]
    # the replicas are the autoscaler's: max(2, ceil(nodes / 250)) at the pools' ceiling
    assert "replicas" not in deployment["spec"]
    linear = json.loads(objects[f"{stack}-k8s-dns-autoscaler-params"]["data"]["linear"])
    assert linear["max"] == replicas and linear["preventSinglePointFailure"] is True
    assert math.ceil(plans[stack].components.dns_autoscale.eligible_nodes / linear["nodesPerReplica"]) >= replicas
    # Field notes: required (not preferred) anti-affinity on the host name.
    (term,) = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {"labelSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                    "topologyKey": "kubernetes.io/hostname"}
    assert "kubernetes cluster.local in-addr.arpa ip6.arpa" in objects[f"{stack}-k8s-dns-corefile"]["data"]["Corefile"]


# KubeProxyConfiguration's JSON fields at 1.34 (staging/src/k8s.io/kube-proxy/config/v1alpha1/
# types.go, read with the search tools): what the rendered config may name.
KUBE_PROXY_FIELDS = {
    "apiVersion", "kind", "featureGates", "clientConnection", "logging", "hostnameOverride", "bindAddress",
    "healthzBindAddress", "metricsBindAddress", "bindAddressHardFail", "enableProfiling",
    "showHiddenMetricsForVersion", "serviceProxyName", "mode", "iptables", "ipvs", "nftables", "winkernel",
    "detectLocalMode", "detectLocal", "clusterCIDR", "nodePortAddresses", "oomScoreAdj", "conntrack",
    "configSyncPeriod", "portRange",
}


@needs_kubectl
def test_kube_proxy_runs_nftables_on_every_node_with_upstream_field_names(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], tmp_path: Path
) -> None:
    plan = plans["research-7500"]
    objects = {r.name: manifest(r) for r in k8s_objects(graphs["research-7500"])}
    data = objects["research-7500-k8s-kube-proxy-config"]["data"]
    config = yaml.safe_load(data["config.conf"])
    assert set(config) <= KUBE_PROXY_FIELDS
    assert config["mode"] == "nftables"
    assert (config["detectLocalMode"], config["detectLocal"]) == ("InterfaceNamePrefix",
                                                                   {"interfaceNamePrefix": "azv"})
    kubeconfig = kubectl_view(tmp_path, data["kubeconfig.conf"])
    # the load balancer: the kubernetes Service IP works only once kube-proxy runs
    assert kubeconfig["clusters"][0]["cluster"]["server"] == plan.control_plane.endpoint
    assert kubeconfig["users"][0]["user"]["tokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    daemonset = objects["research-7500-k8s-kube-proxy-daemonset"]
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["containers"][0]["image"] == f"registry.k8s.io/kube-proxy:v{plan.kubernetes_version}"
    assert daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == "10%"
