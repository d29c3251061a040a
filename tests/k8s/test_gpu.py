"""GPU pools in the cluster (kilonode.k8s.gpu): the NVIDIA device plugin, pinned by digest, on
the GPU pools only; the GPU health taint controller's RBAC, exactly the requests it makes;
the agent's requests, within what Kubernetes grants a node's own identity; the controller's
credentials and unit on the apiserver VMs only; what `kilonode plan` says about all of it."""

from __future__ import annotations

import base64
import dataclasses
import email
import re
import shutil
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kilonode.azure.custom_data import decode
from kilonode.azure.graph import Graph, Recorded, format_markdown, format_text
from kilonode.catalog.components import components
from kilonode.config import load_stack
from kilonode.k8s.gpu import describe
from kilonode.node.gpu import agent as gpu_agent
from kilonode.node.gpu import controller as gpu_controller
from kilonode.node.gpu import protocol
from kilonode.node.gpu.kubeapi import ApiError, Client, load_kubeconfig
from kilonode.plan import ClusterPlan, plan_stack, wellknown
from tests import shared
from tests.conftest import StackWriter, shipped_cluster_value
from tests.graphcache import recorded
from tests.render.consumers import systemd_verify

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

# NVIDIA's GPU Operator pins the device plugin by digest next to its version: at its tags
# v25.3.3 (1f1f9cda) and v25.3.4 (d73a0086), bundle/manifests/gpu-operator-certified.
# clusterserviceversion.yaml l.213 (relatedImages device-plugin-image) holds this digest and
# deployments/gpu-operator/values.yaml l.234 devicePlugin.version is v0.17.4. Copied here by
# hand from that source, so a change to the module's constant is a change this test sees.
RECORDED_DEVICE_PLUGIN = (
    "nvcr.io/nvidia/k8s-device-plugin:v0.17.4"
    "@sha256:3c54348fe5a57e5700e7d8068e7531d2ef2d5f3ccb70c8f6bac0953432527abd"
)
# NVIDIA/k8s-device-plugin v0.17.4 cmd/nvidia-device-plugin/main.go l.60-168: the environment
# variables its flags read, and the values the three we set accept (api/config/v1/consts.go
# l.39-42 for the list strategies; the flag's usage text for discovery; a bool for the last).
PLUGIN_ENV_VARS = {
    "MIG_STRATEGY", "FAIL_ON_INIT_ERROR", "NVIDIA_DRIVER_ROOT", "NVIDIA_DEV_ROOT", "PASS_DEVICE_SPECS",
    "DEVICE_LIST_STRATEGY", "DEVICE_ID_STRATEGY", "GDS_ENABLED", "MOFED_ENABLED", "KUBELET_SOCKET", "CONFIG_FILE",
    "CDI_ANNOTATION_PREFIX", "NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH", "DRIVER_ROOT_CTR_PATH",
    "CONTAINER_DRIVER_ROOT", "MPS_ROOT", "DEVICE_DISCOVERY_STRATEGY", "IMEX_CHANNEL_IDS", "IMEX_REQUIRED",
}
PLUGIN_ENV_VALUES = {
    "DEVICE_LIST_STRATEGY": {"envvar", "volume-mounts", "cdi-annotations", "cdi-cri"},
    "DEVICE_DISCOVERY_STRATEGY": {"auto", "nvml", "tegra"},
    "FAIL_ON_INIT_ERROR": {"true", "false"},
}
GPU_TAINTS = {"kilonode.io/gpu-health", "kilonode.io/gpu-unhealthy", "kilonode.io/gpu-check"}
CONTROLLER_USER = "kilonode:gpu-health-controller"


def k8s_objects(graph: Graph) -> list[Recorded]:
    return [r for r in graph.resources if r.type.startswith("kubernetes:") and r.custom]


def gpu_objects(graph: Graph) -> list[Recorded]:
    parents = {r.name for r in graph.resources
               if r.type in ("kilonode:k8s:DevicePlugin", "kilonode:k8s:GpuHealthAccess")}
    return [r for r in k8s_objects(graph) if r.parent in parents]


def daemonset(graph: Graph) -> dict[str, Any]:
    [record] = [r for r in k8s_objects(graph) if r.type == "kubernetes:apps/v1:DaemonSet"
                and r.plain()["metadata"]["name"] == "nvidia-device-plugin-daemonset"]
    return record.plain()


def pool_selector(graph: Graph) -> list[str]:
    affinity = daemonset(graph)["spec"]["template"]["spec"]["affinity"]
    [term] = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    [expression] = term["matchExpressions"]
    assert (expression["key"], expression["operator"]) == ("kilonode.io/pool", "In")
    return list(expression["values"])


@pytest.fixture(scope="module")
def mixed_graph(tmp_path_factory: pytest.TempPathFactory) -> Graph:
    """`local` plus one GPU pool: a CPU pool and a GPU pool side by side."""
    cluster = shipped_cluster_value("local")
    cluster["nodePools"].append({
        "name": "gpu", "nodes": 2, "subnet": "10.0.3.0/27", "runtime": "docker",
        "vmSize": "Standard_NC24ads_A100_v4", "podsPerNode": 8,
    })
    path = tmp_path_factory.mktemp("mixed") / "Pulumi.mixed.yaml"
    path.write_text(yaml.safe_dump({"config": {"kilonode:cluster": cluster}}, sort_keys=False))
    return recorded(load_stack(str(path)))


# --- the objects -----------------------------------------------------------------------------

@pytest.mark.parametrize("stack", ["research-2500", "research-7500"])
def test_the_gpu_objects_are_valid_against_the_openapi_schema_of_the_stacks_version(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    objects = gpu_objects(graphs[stack])
    # DaemonSet; ClusterRole + binding (nodes); Role + binding (events in "default")
    assert sorted(r.type.rsplit(":", 1)[1] for r in objects) == [
        "ClusterRole", "ClusterRoleBinding", "DaemonSet", "Role", "RoleBinding"]
    for record in objects:
        shared.validate_object(record.plain(), f"1.{plans[stack].kubernetes_minor}.0")


def test_the_device_plugin_is_pinned_by_the_digest_nvidia_pins(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan]
) -> None:
    [container] = daemonset(graphs["research-7500"])["spec"]["template"]["spec"]["containers"]
    image = container["image"]
    assert re.fullmatch(r"nvcr\.io/nvidia/k8s-device-plugin:v0\.17\.\d+@sha256:[0-9a-f]{64}", image), image
    plugin = components().device_plugin
    assert image == plans["research-7500"].components.device_plugin_image == RECORDED_DEVICE_PLUGIN
    assert image.endswith(str(plugin.digest)) and f":{plugin.version}@" in image


def test_the_device_plugin_is_upstreams_static_deployment_with_settings_its_flags_read(
    graphs: dict[str, Graph],
) -> None:
    value = daemonset(graphs["research-7500"])
    pod = value["spec"]["template"]["spec"]
    [container] = pod["containers"]
    # deployments/static/nvidia-device-plugin.yml at v0.17.4
    assert value["metadata"]["namespace"] == "kube-system"
    assert value["spec"]["selector"]["matchLabels"] == {"name": "nvidia-device-plugin-ds"}
    assert pod["priorityClassName"] == "system-node-critical"
    assert container["name"] == "nvidia-device-plugin-ctr"
    # upstream's Helm chart's for a volume-mounts device list (SYS_ADMIN, the rest dropped: the toolkit
    # hands NVML to its image's NVIDIA_VISIBLE_DEVICES only with CAP_SYS_ADMIN), and a read-only root
    # filesystem (it writes only its socket, in the hostPath)
    assert container["securityContext"] == {"allowPrivilegeEscalation": False,
                                             "capabilities": {"add": ["SYS_ADMIN"], "drop": ["ALL"]},
                                             "readOnlyRootFilesystem": True}
    # on the host network (no pod IP), behind an init container waiting for the node's devices
    assert pod["hostNetwork"] is True
    [wait] = pod["initContainers"]
    assert "/run/kilonode/nvidia/ready" in " ".join(wait["command"]) and wait["image"] == container["image"]
    assert wait["volumeMounts"] == [{"name": "nvidia-ready", "mountPath": "/run/kilonode/nvidia", "readOnly": True}]
    # it builds no Kubernetes client (kilonode.k8s.gpu): no ServiceAccount token in the pod
    assert pod["automountServiceAccountToken"] is False
    assert container["volumeMounts"] == [{"name": "kubelet-device-plugins-dir",
                                          "mountPath": "/var/lib/kubelet/device-plugins"}]
    assert pod["volumes"] == [{"name": "kubelet-device-plugins-dir",
                               "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}},
                              {"name": "nvidia-ready",
                               "hostPath": {"path": "/run/kilonode/nvidia", "type": "DirectoryOrCreate"}}]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert set(env) <= PLUGIN_ENV_VARS, set(env) - PLUGIN_ENV_VARS
    for name, allowed in PLUGIN_ENV_VALUES.items():
        assert env[name] in allowed, (name, env[name])
    # only GPU nodes run it: a plugin that cannot reach NVML there is a fault to show
    assert env["FAIL_ON_INIT_ERROR"] == "true" and env["DEVICE_DISCOVERY_STRATEGY"] == "nvml"
    assert value["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}}


def test_the_device_plugin_tolerates_the_gpu_taints_and_every_taint_gpu_pools_register(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan]
) -> None:
    tolerations = daemonset(graphs["research-7500"])["spec"]["template"]["spec"]["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    # and the cloud provider's uninitialized taint: it needs nothing the cloud provider gives
    assert {t["key"] for t in tolerations} == GPU_TAINTS | {"nvidia.com/gpu", wellknown.TEAM_LABEL,
                                                            "node.cloudprovider.kubernetes.io/uninitialized"}
    assert {protocol.STARTUP_TAINT, protocol.FAULT_TAINT, protocol.CHECK_TAINT} == GPU_TAINTS
    for toleration in tolerations:  # any value: the fault taint's value is the failed check
        assert toleration["operator"] == "Exists" and toleration["effect"] == "NoSchedule"

    def tolerated(taint: str) -> bool:
        key, _, effect = taint.partition(":")
        key = key.split("=", 1)[0]
        return any(t["key"] == key and t["effect"] == effect for t in tolerations)

    for pool in plans["research-7500"].gpu_pools:
        assert all(tolerated(taint) for taint in pool.taints), pool.taints
    # a team's reserved nodes register its taint too: a DaemonSet pod needs it tolerated
    teams = plans["research-7500"].teams
    assert teams and all(tolerated(wellknown.team_taint(team.name)) for team in teams)
    assert tolerated(f"{protocol.STARTUP_TAINT}={protocol.STARTUP_VALUE}:{protocol.EFFECT}")
    assert not tolerated("node.kubernetes.io/unschedulable:NoSchedule")  # not a blanket toleration


def test_the_device_plugin_runs_on_exactly_the_gpu_pools(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], mixed_graph: Graph
) -> None:
    assert pool_selector(graphs["research-7500"]) == ["a100-ib", "h100-ib"]
    assert pool_selector(graphs["research-2500"]) == [p.name for p in plans["research-2500"].gpu_pools]
    assert pool_selector(mixed_graph) == ["gpu"]  # not "cpu"
    # the label is the one each pool's kubelet registers
    rendered = shared.rendered("research-7500")
    for pool in ("a100-ib", "h100-ib"):
        unit = rendered[f"pool-{pool}"]["etc/systemd/system/kubelet.service"].content
        assert f"kilonode.io/pool={pool}" in unit
    # no GPU pool: no device plugin, no GPU RBAC, no component
    local = graphs["local"]
    assert gpu_objects(local) == []
    assert not [r for r in local.resources if r.type in ("kilonode:k8s:DevicePlugin", "kilonode:k8s:GpuHealthAccess")]
    assert all(r.plain().get("metadata", {}).get("name") != CONTROLLER_USER for r in k8s_objects(local))


def test_gpu_pools_boot_the_device_plugin_image_and_preload_it_when_an_archive_is_given(
    write_stack: StackWriter, tmp_path: Path
) -> None:
    cluster = shipped_cluster_value("local")
    cluster["nodePools"].append({"name": "gpu", "nodes": 2, "subnet": "10.0.3.0/27", "runtime": "docker",
                                 "vmSize": "Standard_NC24ads_A100_v4", "podsPerNode": 8})
    plan = plan_stack(load_stack(str(write_stack(cluster))))
    pools = {p.name: p for p in plan.node_pools}
    plugin = plan.components.device_plugin_image
    assert plugin in pools["gpu"].boot_images_not_preloaded
    assert plugin not in pools["cpu"].boot_images_not_preloaded
    cluster["bootImageArchives"] = [{"image": plugin, "archive": "device-plugin.tar", "imageId": "sha256:" + "e" * 64}]
    (tmp_path / "device-plugin.tar").write_bytes(b"")  # validate wants it there; the image build reads it
    plan = plan_stack(load_stack(str(write_stack(cluster))))
    pools = {p.name: p for p in plan.node_pools}
    [preloaded] = [p for p in pools["gpu"].preload_images if p.image == plugin]
    assert (preloaded.source, preloaded.archive) == ("archive", "device-plugin.tar")
    assert "@" not in preloaded.baked_path and ":" not in preloaded.baked_path.rsplit("/", 1)[1]
    assert plugin not in pools["gpu"].boot_images_not_preloaded
    assert all(p.image != plugin for p in pools["cpu"].preload_images)


# --- the controller's RBAC: exactly what it asks for ----------------------------------------

def of_kind(graph: Graph, kind: str) -> dict[str, Any]:
    [record] = [r for r in gpu_objects(graph) if r.type.endswith(f":{kind}")]
    return record.plain()


def test_the_controllers_rbac_is_exactly_the_listed_rules_bound_to_its_user(graphs: dict[str, Graph]) -> None:
    graph = graphs["research-7500"]
    role, binding = of_kind(graph, "ClusterRole"), of_kind(graph, "ClusterRoleBinding")
    events, events_binding = of_kind(graph, "Role"), of_kind(graph, "RoleBinding")
    assert role["metadata"]["name"] == CONTROLLER_USER
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "update"]}]
    assert events["metadata"]["namespace"] == protocol.EVENT_NAMESPACE == "default"
    assert events["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    user = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": CONTROLLER_USER}]
    assert binding["subjects"] == events_binding["subjects"] == user
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": CONTROLLER_USER}
    assert events_binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                         "name": CONTROLLER_USER}
    assert events_binding["metadata"]["namespace"] == "default"


class Recorder(Client):
    """kilonode.gpu.kubeapi's client with the network cut out: every request it would send is
    recorded as (method, path, query) and answered from `answers`."""

    def __init__(self, answers: dict[tuple[str, str], Any] | None = None) -> None:
        self.prefix = ""
        self.timeout = 1.0
        self.sent: list[tuple[str, str, dict[str, str]]] = []
        self.answers = answers or {}

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                query: dict[str, str] | None = None) -> Any:
        self.sent.append((method, path, dict(query or {})))
        answer = self.answers.get((method, path))
        if isinstance(answer, list) and answer:
            answer = answer.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer if answer is not None else {"metadata": {"resourceVersion": "1"}, "items": []}

    def _connection(self, timeout: float) -> Any:  # the watch's own connection
        recorder = self

        class Connection:
            def request(self, method: str, target: str, headers: dict[str, str]) -> None:
                path, _, query = target.partition("?")
                recorder.sent.append((method, path, dict(urllib.parse.parse_qsl(query))))

            def getresponse(self) -> Any:
                class Response:
                    status = 200

                    def __iter__(self) -> Iterator[bytes]:
                        return iter([b'{"type": "ADDED", "object": {"metadata": {"name": "n"}}}\n'])

                return Response()

            def close(self) -> None:
                pass

        return Connection()


def attributes(method: str, path: str, query: dict[str, str]) -> dict[str, str]:
    """An API request as the authorizer sees it (k8s.io/apiserver request info): verb, group,
    namespace, resource, subresource, name, and the field selector of a list or watch."""
    parts = path.strip("/").split("/")
    assert parts[:2] == ["api", "v1"], path  # the core group: all either program uses
    rest = parts[2:]
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource, name, subresource = rest[0], (rest[1] if len(rest) > 1 else ""), (rest[2] if len(rest) > 2 else "")
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, "")
    if method == "GET":
        verb = "watch" if query.get("watch") in ("1", "true") else ("get" if name else "list")
    return {"verb": verb, "group": "", "namespace": namespace, "resource": resource, "subresource": subresource,
            "name": name, "fieldSelector": query.get("fieldSelector", "")}


def rbac_allows(rules: list[dict[str, Any]], namespace: str | None, request: dict[str, str]) -> bool:
    """RBAC's rule match (plugin/pkg/auth/authorizer/rbac/rbac.go RuleAllows) for resource
    requests; `namespace` None for a ClusterRole's binding, else the Role's namespace."""
    if namespace is not None and request["namespace"] != namespace:
        return False
    resource = request["resource"] + (f"/{request['subresource']}" if request["subresource"] else "")
    return any(request["group"] in rule["apiGroups"] and resource in rule["resources"]
               and request["verb"] in rule["verbs"] for rule in rules)


def controller_requests() -> list[dict[str, str]]:
    """Every request the controller's code sends, driven through its own functions."""
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n", "uid": "u", "resourceVersion": "7"},
            "spec": {"taints": [protocol.taint(protocol.STARTUP_TAINT, protocol.STARTUP_VALUE)]},
            "status": {"nodeInfo": {"bootID": "b"},
                       "conditions": [{"type": protocol.CONDITION, "status": "True",
                                       "reason": protocol.REASON_PASSED, "lastTransitionTime": "t"}]}}
    conflict = ApiError(409, "Conflict", "stale")
    client = Recorder({("PUT", "/api/v1/nodes/n"): [conflict, node], ("GET", "/api/v1/nodes/n"): node})
    client.list_nodes()
    list(client.watch("/api/v1/nodes", "1", 5))
    gpu_controller.reconcile(client, node, "apiserver-0", log=lambda *_: None)  # PUT, 409, GET, PUT, Event
    return [attributes(*sent) for sent in client.sent]


def test_the_controllers_requests_are_exactly_what_its_rbac_grants(graphs: dict[str, Graph]) -> None:
    graph = graphs["research-7500"]
    cluster_rules, role_rules = of_kind(graph, "ClusterRole")["rules"], of_kind(graph, "Role")["rules"]
    requests = controller_requests()
    for request in requests:
        assert rbac_allows(cluster_rules, None, request) or rbac_allows(role_rules, "default", request), request
    # every verb granted is one the controller uses (nothing more)
    used = {(r["resource"], r["verb"]) for r in requests}
    granted = {(resource, verb) for rule in cluster_rules + role_rules
               for resource in rule["resources"] for verb in rule["verbs"]}
    assert used == granted
    # the controller's code calls nothing on its client beyond what was driven above
    calls = set(re.findall(r"\bclient\.(\w+)\(", Path(gpu_controller.__file__).read_text()))
    assert calls <= {"list_nodes", "watch", "replace_node", "get_node", "create_event"}, calls
    # and the check can fail: an Event elsewhere, a patch, a delete are refused
    assert not rbac_allows(role_rules, "default", {**requests[-1], "namespace": "kube-system"})
    assert not rbac_allows(cluster_rules, None, {**requests[0], "verb": "patch"})
    assert not rbac_allows(cluster_rules, None, {**requests[0], "verb": "delete"})


# --- the agent: the node's own identity, no RBAC of its own ---------------------------------

def node_authorizer_allows(node: str, request: dict[str, str]) -> bool:
    """The Node authorizer of Kubernetes 1.34 for the resources the agent touches (kubernetes/
    kubernetes plugin/pkg/auth/authorizer/node/node_authorizer.go: Authorize, authorizeNode,
    authorizePod; AuthorizeNodeWithSelectors is GA and locked on from 1.34, beta and on by
    default from 1.32, pkg/features/kube_features.go), and for the rest the static NodeRules()
    of plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go as far as they concern it."""
    verb, resource, sub, name = request["verb"], request["resource"], request["subresource"], request["name"]
    if resource == "nodes":  # authorizeNode
        if sub == "":
            if verb in ("create", "update", "patch"):
                return True  # NodeRestriction (admission) limits it to its own Node
            if verb in ("get", "list", "watch"):
                return name == node  # "can only read its own Node object"
            return False
        return sub == "status" and verb in ("update", "patch")  # NodeRestriction: its own only
    if resource == "pods":  # authorizePod
        if sub == "" and verb in ("list", "watch"):
            return request["fieldSelector"] == f"spec.nodeName={node}"
        if sub == "" and verb in ("create", "delete"):
            return True  # mirror pods
        if sub == "" and verb == "get":
            raise AssertionError("get of a pod is decided by the authorizer's graph: not modelled here")
        return (sub == "status" and verb in ("update", "patch")) or (sub == "eviction" and verb == "create")
    # NodeRules(): core events create, update, patch (any namespace); other rules not used here
    return resource == "events" and sub == "" and verb in ("create", "update", "patch")


def agent_requests(node: str) -> list[dict[str, str]]:
    client = Recorder()
    client.get_node(node)
    client.patch_node_status(node, {"status": {"conditions": []}})
    client.create_event(protocol.node_event({"metadata": {"name": node}}, kind="Normal", reason="Passed",
                                            message="ok", action="Check", controller="c", instance=node))
    client.list_pods_on(node)
    return [attributes(*sent) for sent in client.sent]


def test_the_agents_requests_are_within_what_a_node_may_do_with_its_own_identity() -> None:
    node = "research-7500-h100-ib-000000001"
    requests = agent_requests(node)
    assert [(r["verb"], r["resource"], r["subresource"]) for r in requests] == [
        ("get", "nodes", ""), ("patch", "nodes", "status"), ("create", "events", ""), ("list", "pods", "")]
    for request in requests:
        assert node_authorizer_allows(node, request), request
    # the agent's code calls nothing on its client beyond what was checked above
    calls = set(re.findall(r"\bapi(?:\(\))?\.(\w+)\(", Path(gpu_agent.__file__).read_text()))
    assert calls <= {"get_node", "patch_node_status", "create_event", "list_pods_on"}, calls
    # what it could not do: read another Node, list every pod, list pods of another node
    other = "research-7500-h100-ib-000000002"
    assert not node_authorizer_allows(node, agent_requests(other)[0])
    assert not node_authorizer_allows(node, {**requests[3], "fieldSelector": ""})
    assert not node_authorizer_allows(node, {**requests[3], "fieldSelector": f"spec.nodeName={other}"})
    assert not node_authorizer_allows(node, {**requests[2], "verb": "delete"})


# --- the controller on the apiserver VMs ------------------------------------------------------

def written_files(custom_data: str) -> dict[str, dict[str, Any]]:
    """Every #cloud-config part's write_files, by path."""
    files: dict[str, dict[str, Any]] = {}
    for part in email.message_from_string(decode(custom_data)).walk():
        payload = part.get_payload(decode=True)
        if payload and payload.startswith(b"#cloud-config"):
            files.update({f["path"]: f for f in (shared.load_yaml(payload) or {}).get("write_files", [])})
    return files


def test_the_controllers_kubeconfig_goes_to_the_apiservers_only(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], tmp_path: Path
) -> None:
    graph = graphs["research-7500"]
    path = wellknown.GPU_HEALTH_CONTROLLER_KUBECONFIG
    assert path == "/etc/kubernetes/gpu-health-controller.kubeconfig"
    for vm in graph.of_type("azure-native:compute:VirtualMachine"):
        files = written_files(vm.plain()["osProfile"]["customData"])
        on_apiserver = vm.parent == "research-7500-apiserver"
        assert (path in files) == on_apiserver, vm.name
        if on_apiserver:
            assert len(base64.b64decode(vm.plain()["osProfile"]["customData"])) < 64 * 1024
    for vmss in graph.of_type("azure-native:compute:VirtualMachineScaleSet"):
        assert path not in written_files(vmss.plain()["virtualMachineProfile"]["osProfile"]["customData"])
    apiserver = graph.named("research-7500-apiserver-0").plain()
    entry = written_files(apiserver["osProfile"]["customData"])[path]
    assert entry["permissions"] == "0600"
    config = yaml.safe_load(entry["content"])
    [user] = config["users"]
    assert base64.b64decode(user["user"]["client-certificate-data"]).decode() == \
        "mock-certificate:research-7500-tls-apiserver-0-gpu-health-controller"
    assert config["clusters"][0]["cluster"]["server"] == f"https://127.0.0.1:{wellknown.APISERVER_PORT}"
    csr = graph.named("research-7500-tls-apiserver-0-gpu-health-controller-csr").plain()
    assert csr["subject"] == {"commonName": CONTROLLER_USER}  # the user the RBAC binds; no group
    signed = graph.named("research-7500-tls-apiserver-0-gpu-health-controller").plain()
    assert signed["caCertPem"] == "mock-certificate:research-7500-tls-kubernetes-ca"
    assert signed["allowedUses"] == ["digital_signature", "key_encipherment", "client_auth"]
    # the controller's own kubeconfig reader takes it
    (tmp_path / "kubeconfig").write_text(entry["content"])
    loaded = load_kubeconfig(tmp_path / "kubeconfig")
    assert loaded.server == f"https://127.0.0.1:{wellknown.APISERVER_PORT}"
    assert loaded.cert_pem == b"mock-certificate:research-7500-tls-apiserver-0-gpu-health-controller"
    # no GPU pool: no certificate, no kubeconfig
    local = graphs["local"]
    assert not [r for r in local.resources if "gpu-health-controller" in r.name]
    for vm in local.of_type("azure-native:compute:VirtualMachine"):
        assert path not in written_files(vm.plain()["osProfile"]["customData"])


def test_the_controller_unit_runs_on_gpu_clusters_apiservers_after_the_apiserver(
    tmp_path: Path
) -> None:
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze missing: run `make setup` (installs .ci/debian-packages.txt)")
    unit_path = "etc/systemd/system/kilonode-gpu-health-controller.service"
    files = shared.rendered("research-7500")["apiserver-0"]
    text = files[unit_path].content
    unit = tmp_path / "kilonode-gpu-health-controller.service"
    unit.write_text(text)
    assert systemd_verify(tmp_path, [unit]) == []
    # its kubeconfig as the credential systemd hands its dynamic user (tests/render/test_apiserver_agents.py)
    assert "ExecStart=/usr/bin/python3 -m kilonode.gpu.controller \\\n" \
           "    --kubeconfig=%d/kubeconfig \\\n" \
           "    --metrics-file=/run/kilonode/gpu-health-controller/metrics.json\n" in text
    # its record for Prometheus in its runtime directory, the one place its sandbox lets it write
    assert "RuntimeDirectory=kilonode/gpu-health-controller\n" in text and "ProtectSystem=strict\n" in text
    assert "Environment=PYTHONPATH=/usr/local/lib/kilonode/python\n" in text
    assert "Restart=on-failure\n" in text
    after = next(line for line in text.splitlines() if line.startswith("After="))
    assert "kube-apiserver.service" in after.split("=", 1)[1].split()
    # the apiserver's cloud-init starts it with the control plane
    user_data = yaml.safe_load(files["user-data"].content)
    [start] = [cmd for cmd in user_data["runcmd"] if cmd[:3] == ["systemctl", "enable", "--now"]
               and "kube-apiserver.service" in cmd]
    assert "kilonode-gpu-health-controller.service" in start
    # only where there are GPU pools, only on apiservers
    rendered_local = shared.rendered("local")
    assert all(unit_path not in host for host in rendered_local.values())
    assert all(unit_path not in host for name, host in shared.rendered("research-7500").items()
               if not name.startswith("apiserver-"))


# --- what `kilonode plan` says ------------------------------------------------------------------

def test_the_plan_output_shows_the_agents_identity_the_controllers_role_and_the_device_plugin(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan]
) -> None:
    graph = dataclasses.replace(graphs["research-7500"], notes={"GPU access": describe(plans["research-7500"])})
    text = format_text(graph)
    section = text.split("\nGPU access:\n", 1)[1].split("\n\n", 1)[0]
    assert (f"    device plugin: DaemonSet kube-system/nvidia-device-plugin-daemonset, image {RECORDED_DEVICE_PLUGIN}, "
            "on pools a100-ib, h100-ib") in section
    assert "GPU health agent: the node's own identity (the kubelet's client certificate, system:node:<node>" in section
    assert "patch its own Node's status (condition GPUHealthy), create Events, list pods with spec.nodeName=<node>" \
        in section
    assert ("GPU health controller: user kilonode:gpu-health-controller" in section
            and "ClusterRole kilonode:gpu-health-controller: nodes get,list,watch,update; "
                "Role default/kilonode:gpu-health-controller: events create" in section)
    assert "## GPU access" in format_markdown(graph)
    assert describe(plans["local"]) == ["no GPU pools: no device plugin, no GPU health agent or controller"]


def test_gpus_reach_a_container_only_as_the_device_plugins_volume_mounts(graphs: dict[str, Graph]) -> None:
    """The device plugin hands out GPUs as volume mounts, and the image's toolkit takes them
    that way and ignores NVIDIA_VISIBLE_DEVICES from unprivileged containers: both halves agree."""
    import tomllib

    from kilonode.image.gpu import TOOLKIT_CONFIG_TEXT

    env = {e["name"]: e["value"]
           for e in daemonset(graphs["research-7500"])["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["DEVICE_LIST_STRATEGY"] == "volume-mounts"
    toolkit = tomllib.loads(TOOLKIT_CONFIG_TEXT)
    assert toolkit == {"accept-nvidia-visible-devices-envvar-when-unprivileged": False,
                       "accept-nvidia-visible-devices-as-volume-mounts": True}
