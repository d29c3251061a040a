"""Alertmanager (kilonode.k8s.alertmanager) under Pulumi's mock engine, in each shipped stack's recorded graph
and in the local stack with receivers set: where it runs, how it is locked down, what it mounts, who may reach
it, where its secrets come from, and each object against the OpenAPI schema of the stack's Kubernetes version
(kubernetes-validate, strict)."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

from kilonode.azure.graph import Graph, Recorded
from kilonode.config import load_stack
from kilonode.k8s.alertmanager import checked_secret, needed_secrets, read_secrets
from kilonode.paths import EXAMPLE_STACKS_DIR
from kilonode.plan import ClusterPlan, defaults
from kilonode.plan.model import AlertingPlan
from kilonode.plan.resolve.components import boot_images, prometheus_pool
from kilonode.render.alertmanager import alertmanager_files
from tests import shared
from tests.graphcache import recorded_program

STACKS = list(shared.SHIPPED_STACKS)
PARENT = "-k8s-alertmanager"
RECEIVERS = {"pagerDuty": True, "webhookUrl": "https://alerts.example.com/hook", "webhookBearerToken": True}


def records(graph: Graph) -> list[Recorded]:
    return [r for r in graph.resources if r.custom and (r.parent or "").endswith(PARENT)]


def one(graph: Graph, kind: str) -> dict[str, Any]:
    [found] = [r.plain() for r in records(graph) if r.type.endswith(f":{kind}")]
    return found


def pod(graph: Graph) -> dict[str, Any]:
    spec: dict[str, Any] = one(graph, "StatefulSet")["spec"]["template"]["spec"]
    return spec


@pytest.fixture(scope="module")
def with_receivers() -> Graph:
    """The local stack with PagerDuty and a webhook with a bearer token (the secrets: the mock engine's stand-ins)."""
    raw = shared.cluster_value("local")
    raw["alerting"] = dict(RECEIVERS)
    return recorded_program("local", raw)


@pytest.mark.parametrize("stack", STACKS)
def test_every_alertmanager_object_is_valid_for_the_stacks_kubernetes(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str) -> None:
    found = records(graphs[stack])
    kinds = sorted(r.type.rpartition(":")[2] for r in found)
    # a Secret only where a receiver needs one: research-7500's PagerDuty routing key
    secret = ["Secret"] if plans[stack].alerting is not None and plans[stack].alerting.pager_duty else []
    assert kinds == sorted(["ConfigMap", "NetworkPolicy", "Service", "StatefulSet", *secret])
    for record in found:
        shared.validate_object(record.plain(), f"1.{plans[stack].components.kubernetes_minor}.0")


def test_with_receivers_the_secret_is_valid_and_masked_and_mounted_where_the_config_names_it(
        with_receivers: Graph, plans: dict[str, ClusterPlan]) -> None:
    kinds = sorted(r.type.rpartition(":")[2] for r in records(with_receivers))
    assert kinds == ["ConfigMap", "NetworkPolicy", "Secret", "Service", "StatefulSet"]
    [secret] = [r for r in records(with_receivers) if r.type.endswith(":Secret")]
    assert secret.masked()["stringData"] == "[secret]"  # the engine holds it as a secret
    plain = secret.plain()
    assert plain["metadata"]["name"] == "alertmanager-receivers"
    assert sorted(plain["stringData"]) == ["pagerduty-routing-key", "webhook-token"]
    shared.validate_object(plain, f"1.{plans['local'].components.kubernetes_minor}.0")
    spec = pod(with_receivers)
    [container] = spec["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["receivers"]["mountPath"] == defaults.ALERTMANAGER_SECRETS_DIR and mounts["receivers"]["readOnly"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["receivers"]["secret"] == {"secretName": "alertmanager-receivers", "defaultMode": 0o440}
    config = shared.load_yaml(one(with_receivers, "ConfigMap")["data"]["alertmanager.yml"])
    page = next(r for r in config["receivers"] if r["name"] == defaults.RECEIVER_PAGE)
    key_file = page["pagerduty_configs"][0]["routing_key_file"]
    assert key_file == f"{defaults.ALERTMANAGER_SECRETS_DIR}/pagerduty-routing-key"
    auth = page["webhook_configs"][0]["http_config"]["authorization"]
    assert auth["credentials_file"] == f"{defaults.ALERTMANAGER_SECRETS_DIR}/webhook-token"
    # no secret value in the ConfigMap (the stand-ins' text would show)
    assert "unset-" not in one(with_receivers, "ConfigMap")["data"]["alertmanager.yml"]


@pytest.mark.parametrize("stack", STACKS)
def test_it_runs_on_prometheus_pool_tolerating_exactly_its_taints_with_its_image_at_boot(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str) -> None:
    plan = plans[stack]
    assert plan.prometheus is not None
    statefulset = one(graphs[stack], "StatefulSet")
    assert statefulset["metadata"] == {**statefulset["metadata"], "namespace": "monitoring", "name": "alertmanager"}
    assert statefulset["spec"]["replicas"] == 1
    spec = pod(graphs[stack])
    assert spec["nodeSelector"] == {"kilonode.io/pool": plan.prometheus.pool}
    taints = {f"{t['key']}{'=' + t['value'] if 'value' in t else ''}:{t['effect']}"
              for t in spec.get("tolerations", [])}
    assert taints == set(plan.prometheus.pool_taints)
    [container] = spec["containers"]
    assert container["image"] == plan.components.alertmanager_image == "quay.io/prometheus/alertmanager:v0.34.0"
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    config = load_stack(EXAMPLE_STACKS_DIR / f"Pulumi.{stack}.yaml").config
    pool = prometheus_pool(config)
    assert pool is not None and pool.name == plan.prometheus.pool
    assert plan.components.alertmanager_image in boot_images(config, pool)
    assert not any(plan.components.alertmanager_image in boot_images(config, p)
                   for p in config.node_pools if p != pool)


def test_the_pod_is_hardened_as_prometheus_and_mounts_no_token(graphs: dict[str, Graph]) -> None:
    spec = pod(graphs["research-7500"])
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True,
                                       "runAsUser": 65534, "runAsGroup": 65534, "fsGroup": 65534}
    [container] = spec["containers"]
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]} and context["runAsNonRoot"] is True
    # the only writable path is the claim (silences, the notification log)
    writable = {m["name"]: m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"data": "/alertmanager"}
    assert "--storage.path=/alertmanager" in container["args"]
    assert "--cluster.listen-address=" in container["args"]  # one replica: no gossip port
    assert {p["containerPort"] for p in container["ports"]} == {9093}


def test_its_data_is_a_small_retained_claim_and_a_config_change_rolls_the_pod(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan]) -> None:
    statefulset = one(graphs["research-7500"], "StatefulSet")
    [claim] = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"] == {"storage": "4Gi"}
    assert claim["spec"]["storageClassName"] == "kilonode-premium-ssd-retain"
    assert statefulset["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain",
                                                                          "whenScaled": "Retain"}
    # it reads its configuration at start: the template carries the ConfigMap's digest
    annotations = statefulset["spec"]["template"]["metadata"]["annotations"]
    from kilonode.k8s.pods import CONFIG_DIGEST_ANNOTATION, config_digest

    assert annotations[CONFIG_DIGEST_ANNOTATION] == config_digest(alertmanager_files(plans["research-7500"]))


@pytest.mark.parametrize("stack", STACKS)
def test_the_configmap_is_the_rendered_file_and_the_container_loads_it(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str) -> None:
    config_map = one(graphs[stack], "ConfigMap")
    assert config_map["data"] == alertmanager_files(plans[stack])
    [container] = pod(graphs[stack])["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert f"--config.file={mounts['config']}/alertmanager.yml" in container["args"]


def test_port_9093_admits_prometheus_and_grafana_alone(graphs: dict[str, Graph]) -> None:
    graph = graphs["research-7500"]
    service = one(graph, "Service")
    assert service["metadata"]["name"] == "alertmanager"
    assert service["spec"]["ports"] == [{"name": "web", "port": 9093, "targetPort": "web"}]
    assert "type" not in service["spec"]  # ClusterIP
    policy = one(graph, "NetworkPolicy")
    assert policy["spec"]["podSelector"] == {"matchLabels": service["spec"]["selector"]}
    [rule] = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9093}]
    peers = [p["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for p in rule["from"]]
    assert peers == ["prometheus", "grafana"]
    # those labels select the real pods
    labels = {r.inputs["metadata"]["name"]: r.plain()["spec"]["template"]["metadata"]["labels"]
              for r in graph.resources if r.type in ("kubernetes:apps/v1:StatefulSet", "kubernetes:apps/v1:Deployment")
              and r.inputs["metadata"].get("namespace") == "monitoring"}
    for peer in rule["from"]:
        name = peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
        assert peer["podSelector"]["matchLabels"].items() <= labels[name].items()


@pytest.mark.parametrize(("alerting", "files"), [
    (None, []),
    (AlertingPlan(webhook_url="https://x.example"), []),
    (AlertingPlan(pager_duty=True), ["pagerduty-routing-key"]),
    (AlertingPlan(pager_duty=True, webhook_url="https://x.example", webhook_bearer_token=True),
     ["pagerduty-routing-key", "webhook-token"]),
])
def test_the_secrets_needed_follow_the_receivers(alerting: AlertingPlan | None, files: list[str]) -> None:
    assert needed_secrets(alerting) == files


@pytest.mark.parametrize("value", ["", "key with space", "key\n", "k" * (defaults.ALERTING_SECRET_MAX + 1)])
def test_a_malformed_secret_is_refused_without_showing_it(value: str) -> None:
    with pytest.raises(ValueError, match="kilonode:alertingPagerDutyRoutingKey") as error:
        checked_secret("alertingPagerDutyRoutingKey", value)
    assert value.strip() == "" or value.strip() not in str(error.value)


def test_a_routing_key_passes_as_it_is() -> None:
    assert checked_secret("alertingPagerDutyRoutingKey", "0123456789abcdef0123456789abcdef") == \
        "0123456789abcdef0123456789abcdef"


class _NoSecrets:
    def get_secret(self, key: str) -> pulumi.Output[str] | None:
        return None


def test_pulumi_up_refuses_receivers_whose_secret_is_not_set() -> None:
    with pytest.raises(pulumi.RunError, match="pulumi config set --secret kilonode:alertingPagerDutyRoutingKey"):
        read_secrets(AlertingPlan(pager_duty=True), _NoSecrets())  # type: ignore[arg-type]
    assert read_secrets(None, _NoSecrets()) == {}  # type: ignore[arg-type]
