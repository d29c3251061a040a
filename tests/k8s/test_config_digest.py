"""A ConfigMap change rolls each workload that reads its mounted config only at start
(kilonode.k8s.pods.CONFIG_DIGEST_ANNOTATION): the digest of what the pod mounts is in its pod
template, so new data is a new template. And it does not roll the ones that reload on their own
(CoreDNS's `reload`, Prometheus's auto-reload): their templates stay as they were.

Each component is built twice under Pulumi's mock engine, with the config changed and nothing
else; the shipped stacks' recorded graphs show every annotation is the digest of the data its
pod mounts, and which workloads carry one."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import pulumi
import pytest

from kilonode.azure.graph import Graph
from kilonode.azure.mockplan import run_program
from kilonode.k8s import rdma
from kilonode.k8s.autoscaler import ClusterAutoscaler, ClusterAutoscalerArgs
from kilonode.k8s.cloud_provider import AzureTarget, CloudProvider, CloudProviderArgs
from kilonode.k8s.dns import ClusterDns, ClusterDnsArgs
from kilonode.k8s.monitoring import PROMETHEUS_FILE, Monitoring, MonitoringArgs
from kilonode.k8s.pods import CONFIG_DIGEST_ANNOTATION, config_digest
from kilonode.k8s.proxy import KubeProxy, KubeProxyArgs
from kilonode.k8s.rdma import RdmaDevicePlugin, RdmaDevicePluginArgs
from kilonode.k8s.scheduling import SCHEDULER, GangScheduler, GangSchedulerArgs
from kilonode.plan.model import ClusterPlan
from kilonode.review.compare import compare_stack
from kilonode.review.risks import assess
from tests import shared
from tests.review.snapshots import snapshot, workload

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

WORKLOADS = ("DaemonSet", "Deployment", "StatefulSet")
# (kind, name) of every workload that carries the digest, in the shipped stacks
ANNOTATED = {
    ("DaemonSet", "kube-proxy"), ("Deployment", "cloud-controller-manager"), ("Deployment", "cluster-autoscaler"),
    ("DaemonSet", "rdma-shared-dp-ds"), ("Deployment", SCHEDULER),
    # its counters CSV, read at start (kilonode.k8s.exporters)
    ("DaemonSet", "dcgm-exporter"),
    # its own azure.json, read at start (kilonode.k8s.storage)
    ("Deployment", "csi-azuredisk-controller"),
    # its data source file, read at start, and the dashboards (kilonode.k8s.grafana)
    ("Deployment", "grafana"),
    # alertmanager.yml, read at start (kilonode.k8s.alertmanager)
    ("StatefulSet", "alertmanager"),
}


def _workloads(graph: Graph) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, metadata.name) -> the object, for every DaemonSet, Deployment and StatefulSet."""
    found = {}
    for resource in graph.resources:
        kind = resource.type.rsplit(":", 1)[-1]
        if resource.type.startswith("kubernetes:") and kind in WORKLOADS:
            obj = resource.plain()
            found[(kind, obj["metadata"]["name"])] = obj
    return found


def _config_maps(graph: Graph) -> dict[tuple[str, str], dict[str, Any]]:
    """(namespace, name) -> ConfigMap."""
    return {(obj["metadata"].get("namespace", ""), obj["metadata"]["name"]): obj
            for obj in (r.plain() for r in graph.resources if r.type == "kubernetes:core/v1:ConfigMap")}


def _template(graph: Graph, kind: str, name: str) -> dict[str, Any]:
    template: dict[str, Any] = _workloads(graph)[(kind, name)]["spec"]["template"]
    return template


def _digest(graph: Graph, kind: str, name: str) -> str:
    digest: str = _template(graph, kind, name)["metadata"]["annotations"][CONFIG_DIGEST_ANNOTATION]
    assert len(digest) == 64 and int(digest, 16) >= 0
    return digest


def _build(program: Callable[[], object]) -> Graph:
    return run_program("local", {}, program)


def _target(**changed: str) -> AzureTarget:
    return dataclasses.replace(AzureTarget(
        tenant_id="00000000-0000-0000-0000-000000000001", subscription_id="00000000-0000-0000-0000-000000000002",
        resource_group="rg-nodes", network_resource_group="rg-net", vnet_name="vnet", subnet_name="nodes",
        security_group_name="nsg", identity_client_id="00000000-0000-0000-0000-00000000000a",
        autoscaler_identity_client_id="00000000-0000-0000-0000-00000000000b"), **changed)


@pytest.fixture(scope="module")
def plan_7500() -> ClusterPlan:
    return shared.plan("research-7500")


def test_the_digest_is_of_the_data_not_of_its_order() -> None:
    assert config_digest({"a": "1", "b": "2"}) == config_digest({"b": "2", "a": "1"})
    assert config_digest({"a": "1"}) != config_digest({"a": "2"}) != config_digest({"b": "2"})
    # a key's text cannot pass for another key's: the canonical form keeps the boundaries
    assert config_digest({"a": "1b"}) != config_digest({"a": "1", "b": ""})


def test_a_kube_proxy_config_change_rolls_its_daemonset() -> None:
    before, after = (_build(lambda endpoint=endpoint: KubeProxy("p", KubeProxyArgs(endpoint=endpoint, image="kp")))
                     for endpoint in ("https://lb-a:6443", "https://lb-b:6443"))
    assert _config_maps(before) != _config_maps(after)
    assert _digest(before, "DaemonSet", "kube-proxy") != _digest(after, "DaemonSet", "kube-proxy")
    # the same config, the same template: nothing rolls without a change
    again = _build(lambda: KubeProxy("p", KubeProxyArgs(endpoint="https://lb-a:6443", image="kp")))
    assert _template(again, "DaemonSet", "kube-proxy") == _template(before, "DaemonSet", "kube-proxy")


def test_an_azure_json_change_rolls_cloud_controller_manager_not_cloud_node_manager(plan_7500: ClusterPlan) -> None:
    def build(target: AzureTarget) -> Graph:
        return _build(lambda: CloudProvider("c", CloudProviderArgs(plan=plan_7500,
                                                                   target=pulumi.Output.from_input(target))))
    before, after = build(_target()), build(_target(security_group_name="nsg-2"))
    assert _digest(before, "Deployment", "cloud-controller-manager") != _digest(
        after, "Deployment", "cloud-controller-manager")
    # cloud-node-manager mounts no ConfigMap (--use-instance-metadata): its template does not move
    assert _template(before, "DaemonSet", "cloud-node-manager") == _template(after, "DaemonSet", "cloud-node-manager")
    assert CONFIG_DIGEST_ANNOTATION not in _template(before, "DaemonSet", "cloud-node-manager")["metadata"][
        "annotations"]


def test_an_azure_json_change_rolls_the_cluster_autoscaler(plan_7500: ClusterPlan) -> None:
    assert plan_7500.autoscaled_pools

    def build(target: AzureTarget) -> Graph:
        return _build(lambda: ClusterAutoscaler("a", ClusterAutoscalerArgs(plan=plan_7500,
                                                                           target=pulumi.Output.from_input(target))))
    before = build(_target())
    after = build(_target(autoscaler_identity_client_id="00000000-0000-0000-0000-00000000000c"))
    assert _digest(before, "Deployment", "cluster-autoscaler") != _digest(after, "Deployment", "cluster-autoscaler")
    # a change to cloud-controller-manager's identity alone is not in the autoscaler's azure.json
    other = build(_target(identity_client_id="00000000-0000-0000-0000-00000000000d"))
    assert _digest(other, "Deployment", "cluster-autoscaler") == _digest(before, "Deployment", "cluster-autoscaler")


def test_an_rdma_plugin_config_change_rolls_its_daemonset(monkeypatch: pytest.MonkeyPatch) -> None:
    def build() -> Graph:
        return _build(lambda: RdmaDevicePlugin("r", RdmaDevicePluginArgs(pools=["ib"], image="rdma")))
    before = build()
    monkeypatch.setattr(rdma, "RDMA_HCA_MAX", rdma.RDMA_HCA_MAX + 1)
    after = build()
    assert _config_maps(before) != _config_maps(after)
    assert _digest(before, "DaemonSet", rdma.NAME) != _digest(after, "DaemonSet", rdma.NAME)


def test_a_gang_scheduler_config_change_rolls_the_scheduler_not_the_controller(plan_7500: ClusterPlan) -> None:
    args = GangSchedulerArgs.of(plan_7500)
    assert args.gpu
    before = _build(lambda: GangScheduler("g", args))
    after = _build(lambda: GangScheduler("g", dataclasses.replace(args, gpu=False)))  # another packing score
    assert _digest(before, "Deployment", SCHEDULER) != _digest(after, "Deployment", SCHEDULER)
    controller = [name for kind, name in _workloads(before) if kind == "Deployment" and name != SCHEDULER]
    assert controller
    for name in controller:
        assert _template(before, "Deployment", name) == _template(after, "Deployment", name)
        assert CONFIG_DIGEST_ANNOTATION not in (_template(before, "Deployment", name)["metadata"].get("annotations")
                                                or {})


def test_a_corefile_change_does_not_roll_coredns(plan_7500: ClusterPlan) -> None:
    components = plan_7500.components

    def build(domain: str) -> Graph:
        return _build(lambda: ClusterDns("d", ClusterDnsArgs(
            dns_ip="10.0.0.10", autoscale=components.dns_autoscale, image=components.coredns_image,
            autoscaler_image=components.dns_autoscaler_image, awaits=components.awaits, cluster_domain=domain)))
    before, after = build("cluster.local"), build("example.internal")
    assert _config_maps(before)[("kube-system", "coredns")] != _config_maps(after)[("kube-system", "coredns")]
    # CoreDNS's `reload` plugin applies it in place (kilonode.k8s.dns): no roll
    for key in _workloads(before):
        assert _template(before, *key) == _template(after, *key)
        assert CONFIG_DIGEST_ANNOTATION not in (_template(before, *key)["metadata"].get("annotations") or {})


def test_a_prometheus_config_change_does_not_roll_prometheus(plan_7500: ClusterPlan) -> None:
    assert plan_7500.prometheus is not None

    def build(files: Mapping[str, str]) -> Graph:
        return _build(lambda: Monitoring("m", MonitoringArgs(
            files=files, kubernetes_minor=plan_7500.kubernetes_minor, prometheus=plan_7500.prometheus,
            image=plan_7500.components.prometheus_image, awaits=plan_7500.components.awaits)))
    before = build({PROMETHEUS_FILE: "global: {}\n", "rules.yml": "groups: []\n"})
    after = build({PROMETHEUS_FILE: "global: {scrape_interval: 15s}\n", "rules.yml": "groups: []\n"})
    assert _config_maps(before) != _config_maps(after)
    # --enable-feature=auto-reload-config reloads it in place; a roll would lose the emptyDir TSDB
    assert _template(before, "StatefulSet", "prometheus") == _template(after, "StatefulSet", "prometheus")
    assert CONFIG_DIGEST_ANNOTATION not in (_template(before, "StatefulSet", "prometheus")["metadata"].get(
        "annotations") or {})


def _mounted(template: Mapping[str, Any], config_maps: Mapping[tuple[str, str], Mapping[str, Any]],
             namespace: str) -> dict[str, str]:
    """The data of the ConfigMap(s) the pod template mounts, limited to the keys it projects."""
    data: dict[str, str] = {}
    for volume in template["spec"].get("volumes") or []:
        source = volume.get("configMap")
        if source is None:
            continue
        cm = config_maps[(namespace, source["name"])]["data"]
        keys = [item["key"] for item in source.get("items") or []] or list(cm)
        data.update({key: cm[key] for key in keys})
    return data


@pytest.mark.parametrize("stack", ["local", "research-2500", "research-7500"])
def test_each_digest_is_of_the_data_its_pod_mounts(graphs: dict[str, Graph], stack: str) -> None:
    graph = graphs[stack]
    config_maps = _config_maps(graph)
    carrying = set()
    for (kind, name), obj in _workloads(graph).items():
        template = obj["spec"]["template"]
        digest = (template["metadata"].get("annotations") or {}).get(CONFIG_DIGEST_ANNOTATION)
        if digest is None:
            continue
        carrying.add((kind, name))
        namespace = obj["metadata"].get("namespace", "")
        mounted = _mounted(template, config_maps, namespace)
        assert mounted, f"{kind} {name}: a config digest but no ConfigMap mounted"
        assert digest == config_digest(mounted), f"{kind} {name}: the digest is not of what its pod mounts"
    # every annotated consumer the stack has, and no other workload
    assert carrying <= ANNOTATED
    assert ("DaemonSet", "kube-proxy") in carrying and ("Deployment", "cloud-controller-manager") in carrying
    assert ("Deployment", SCHEDULER) in carrying
    if stack == "research-7500":
        assert carrying == ANNOTATED


def test_kilonode_diff_shows_a_kube_proxy_config_change_as_the_rollout_it_now_is() -> None:
    """The digest moves with the config (above), and `kilonode diff`'s daemonset-rollout rule sees the
    pod template change it makes: the rollout over every node, maxUnavailable at a time."""
    stack = "research-7500"
    head = snapshot(stack)
    template = workload(head, "DaemonSet", "kube-proxy")["spec"]["template"]
    assert CONFIG_DIGEST_ANNOTATION in template["metadata"]["annotations"]
    template["metadata"]["annotations"][CONFIG_DIGEST_ANNOTATION] = config_digest({"config.conf": "changed"})
    found = [r for r in assess(compare_stack(stack, snapshot(stack), head), {}) if r.rule == "daemonset-rollout"]
    [rollout] = found
    assert "DaemonSet kube-proxy: its pod template changes" in rollout.summary
    assert "7,504 nodes" in rollout.summary
