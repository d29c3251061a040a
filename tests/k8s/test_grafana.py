"""Grafana (kilonode.k8s.grafana) under Pulumi's mock engine, in each shipped stack's recorded graph:
where it runs, how it is locked down, how it is provisioned (Grafana's documentation at v13.0,
"Provision Grafana"), where its admin password comes from, and each object against the OpenAPI
schema of the stack's Kubernetes version (kubernetes-validate, strict)."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.azure.graph import Graph, Recorded
from kilonode.config import load_stack
from kilonode.paths import EXAMPLE_STACKS_DIR
from kilonode.plan import ClusterPlan
from kilonode.plan.resolve.components import boot_images, prometheus_pool
from kilonode.render.dashboards import dashboard_files
from tests import shared

STACKS = list(shared.SHIPPED_STACKS)
PARENT = "-k8s-grafana"


def records(graph: Graph) -> list[Recorded]:
    return [r for r in graph.resources if r.custom and (r.parent or "").endswith(PARENT)]


def one(graph: Graph, kind: str) -> dict[str, Any]:
    [found] = [r.plain() for r in records(graph) if r.type.endswith(f":{kind}")]
    return found


def pod(graph: Graph) -> dict[str, Any]:
    spec: dict[str, Any] = one(graph, "Deployment")["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("stack", STACKS)
def test_every_grafana_object_is_valid_for_the_stacks_kubernetes(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str) -> None:
    found = records(graphs[stack])
    kinds = sorted(r.type.rpartition(":")[2] for r in found)
    assert kinds == ["ConfigMap", "ConfigMap", "Deployment", "NetworkPolicy", "RandomPassword", "Secret", "Service"]
    for record in found:
        if record.type.startswith("kubernetes:"):
            shared.validate_object(record.plain(), f"1.{plans[stack].components.kubernetes_minor}.0")


@pytest.mark.parametrize("stack", STACKS)
def test_it_runs_on_prometheus_pool_tolerating_exactly_its_taints_in_monitoring(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str) -> None:
    plan = plans[stack]
    assert plan.prometheus is not None
    deployment = one(graphs[stack], "Deployment")
    assert deployment["metadata"]["namespace"] == "monitoring"
    spec = pod(graphs[stack])
    assert spec["nodeSelector"] == {"kilonode.io/pool": plan.prometheus.pool}
    taints = {f"{t['key']}{'=' + t['value'] if 'value' in t else ''}:{t['effect']}"
              for t in spec.get("tolerations", [])}
    assert taints == set(plan.prometheus.pool_taints)
    [container] = spec["containers"]
    assert container["image"] == plan.components.grafana_image
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    # its image is among what that pool's nodes start at boot
    config = load_stack(EXAMPLE_STACKS_DIR / f"Pulumi.{stack}.yaml").config
    pool = prometheus_pool(config)
    assert pool is not None and pool.name == plan.prometheus.pool
    assert plan.components.grafana_image in boot_images(config, pool)
    assert not any(plan.components.grafana_image in boot_images(config, p) for p in config.node_pools if p != pool)


def test_the_pod_passes_restricted_with_a_read_only_root_and_no_token(graphs: dict[str, Graph]) -> None:
    spec = pod(graphs["research-7500"])
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True,
                                       "runAsUser": 472, "runAsGroup": 472, "fsGroup": 472}
    [container] = spec["containers"]
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/var/lib/grafana", "/tmp"}
    assert all("emptyDir" in volumes[m["name"]] for m in container["volumeMounts"] if not m.get("readOnly"))


def test_no_anonymous_access_and_the_admin_password_is_a_generated_secret_read_from_a_file(
        graphs: dict[str, Graph]) -> None:
    graph = graphs["research-7500"]
    [container] = pod(graph)["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false" and env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env  # never in the environment
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert env["GF_SECURITY_ADMIN_PASSWORD__FILE"] == f"{mounts['admin']}/admin-password"
    volumes = {v["name"]: v for v in pod(graph)["volumes"]}
    secret = one(graph, "Secret")
    assert volumes["admin"]["secret"]["secretName"] == secret["metadata"]["name"] == "grafana-admin"
    # the RandomPassword's result, which the engine holds as a secret (the graph's inputs wrap it)
    [record] = [r for r in records(graph) if r.type.endswith(":Secret")]
    assert record.masked()["stringData"] == "[secret]"
    [password] = [r for r in records(graph) if r.type.endswith(":RandomPassword")]
    assert password.inputs["length"] >= 32 and password.inputs["special"] is False


@pytest.mark.parametrize("stack", STACKS)
def test_it_is_provisioned_with_the_clusters_prometheus_and_the_plans_dashboards(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str) -> None:
    graph = graphs[stack]
    maps = {m["metadata"]["name"]: m["data"] for m in (r.plain() for r in records(graph)
                                                       if r.type.endswith(":ConfigMap"))}
    assert maps["grafana-dashboards"] == dashboard_files(plans[stack])
    [source] = shared.load_yaml(maps["grafana-provisioning"]["datasources.yaml"])["datasources"]
    prometheus = [r.plain() for r in graph.resources if r.type == "kubernetes:core/v1:Service"
                  and r.inputs["metadata"]["name"] == "prometheus"]
    [service] = prometheus
    port = service["spec"]["ports"][0]["port"]
    assert source["url"] == f"http://prometheus.{service['metadata']['namespace']}.svc:{port}"
    assert source["type"] == "prometheus" and source["isDefault"] is True and source["editable"] is False
    [provider] = shared.load_yaml(maps["grafana-provisioning"]["dashboards.yaml"])["providers"]
    [container] = pod(graph)["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert provider["type"] == "file" and provider["options"]["path"] == mounts["dashboards"]
    assert provider["allowUiUpdates"] is False
    assert mounts["datasources"] == "/etc/grafana/provisioning/datasources"
    assert mounts["providers"] == "/etc/grafana/provisioning/dashboards"


def test_its_port_is_served_to_its_own_namespace_alone(graphs: dict[str, Graph]) -> None:
    graph = graphs["research-7500"]
    service = one(graph, "Service")
    assert service["metadata"]["name"] == "grafana"  # kubectl -n monitoring port-forward svc/grafana 3000
    assert service["spec"]["ports"] == [{"name": "http", "port": 3000, "targetPort": "http"}]
    assert "type" not in service["spec"]  # ClusterIP: nothing outside the cluster reaches it
    policy = one(graph, "NetworkPolicy")
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": 3000}]}]
