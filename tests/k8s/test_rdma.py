"""RDMA into pods (kilonode.k8s.rdma, kilonode.render.pool): the shared device plugin on every
InfiniBand node, registering rdma/ib for the InfiniBand links only, its config in the plugin's
own format at the pinned tag; memlock unlimited for containers on InfiniBand pools only."""

from __future__ import annotations

import json
from typing import Any

from kilonode.azure.graph import Graph
from kilonode.k8s.gpu import device_plugin_tolerations
from kilonode.k8s.rdma import CONFIG_DIR, plugin_config
from kilonode.plan import wellknown
from kilonode.plan.model import ClusterPlan
from tests import shared

# The plugin's config fields at v1.5.3 (pkg/types/types.go: UserConfigList, UserConfig, Selectors)
CONFIG_LIST_FIELDS = {"periodicUpdateInterval", "configList"}
CONFIG_FIELDS = {"resourceName", "resourcePrefix", "rdmaHcaMax", "devices", "selectors"}
SELECTOR_FIELDS = {"vendors", "deviceIDs", "drivers", "ifNames", "linkTypes"}


def rdma_objects(graph: Graph) -> dict[str, dict[str, Any]]:
    return {r.type.rsplit(":", 1)[1]: r.plain() for r in graph.resources
            if r.type.startswith("kubernetes:") and r.parent is not None and r.parent.endswith("-k8s-rdma")}


def test_the_plugin_runs_on_every_infiniband_node_and_nowhere_else(graphs: dict[str, Graph],
                                                                   plans: dict[str, ClusterPlan]) -> None:
    objects = rdma_objects(graphs["research-7500"])
    assert set(objects) == {"ConfigMap", "DaemonSet"}
    assert rdma_objects(graphs["local"]) == {} and rdma_objects(graphs["research-2500"]) == {}
    for obj in objects.values():
        shared.validate_object(obj, f"1.{plans['research-7500'].kubernetes_minor}.0")
    ds = objects["DaemonSet"]
    assert ds["metadata"]["annotations"] == {"pulumi.com/skipAwait": "true"}
    pod = ds["spec"]["template"]["spec"]
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    infiniband = sorted(p.name for p in plans["research-7500"].node_pools if p.infiniband)
    assert term["matchExpressions"] == [{"key": "kilonode.io/pool", "operator": "In", "values": infiniband}]
    # the GPU DaemonSets' tolerations: every GPU taint and every team's
    assert pod["tolerations"] == device_plugin_tolerations()
    assert pod["hostNetwork"] is True and pod["automountServiceAccountToken"] is False
    [container] = pod["containers"]
    assert container["image"] == plans["research-7500"].components.rdma_device_plugin_image
    assert "@sha256:" in container["image"]
    assert container["securityContext"] == {"privileged": True}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/plugins_registry", "/dev/", CONFIG_DIR}


def test_the_config_names_rdma_ib_for_infiniband_links_in_the_plugins_format(graphs: dict[str, Graph]) -> None:
    config = json.loads(rdma_objects(graphs["research-7500"])["ConfigMap"]["data"]["config.json"])
    assert config == plugin_config()
    assert set(config) <= CONFIG_LIST_FIELDS
    [resource] = config["configList"]
    assert set(resource) <= CONFIG_FIELDS and set(resource["selectors"]) <= SELECTOR_FIELDS
    # resourcePrefix unset: the plugin's "rdma" (resources_manager.go rdmaHcaResourcePrefix)
    assert f"rdma/{resource['resourceName']}" == wellknown.RDMA_RESOURCE
    # Mellanox HCAs on InfiniBand links only: the front-end NIC's VF is a Mellanox Ethernet device
    assert resource["selectors"] == {"vendors": ["15b3"], "linkTypes": ["infiniband"]}


def test_the_plugin_rescans_often_and_each_infiniband_gpu_node_is_held_one_rescan(graphs: dict[str, Graph],
                                                                                 plans: dict[str, ClusterPlan]) -> None:
    config = json.loads(rdma_objects(graphs["research-7500"])["ConfigMap"]["data"]["config.json"])
    # v1.5.3 lists an HCA only at a scan after its devices exist and hands out the last scan
    # (pkg/resources/server.go:369-391): a rescan every 10-30 s, not upstream's example 300
    assert 10 <= config["periodicUpdateInterval"] <= 30
    # ... and the GPU health agent holds each InfiniBand GPU node that long after its ports are up
    held = {}
    files = shared.rendered("research-7500")
    for pool in (p for p in plans["research-7500"].node_pools if p.infiniband and p.gpus_per_node):
        agent = json.loads(files[pool.role()]["etc/kilonode/gpu-health.json"].content)
        held[pool.name] = agent.get("rdmaDevicePluginRescanSeconds")
    assert held and set(held.values()) == {config["periodicUpdateInterval"]}


def test_memlock_is_unlimited_for_containers_on_infiniband_pools_only() -> None:
    rendered = shared.rendered("research-7500")
    for role in ("pool-h100-ib", "pool-a100-ib", "pool-a100-ib.team-language"):
        files = rendered[role]
        for name in ("etc/docker/daemon.json", "etc/docker/daemon-nvidia.json"):
            assert json.loads(files[name].content)["default-ulimits"] == {
                "memlock": {"Name": "memlock", "Hard": -1, "Soft": -1}}
        assert "LimitMEMLOCK=infinity" in files["etc/systemd/system/docker.service.d/20-kilonode-memlock.conf"].content
    system = rendered["pool-system"]
    assert "default-ulimits" not in json.loads(system["etc/docker/daemon.json"].content)
    assert not [p for p in system if "memlock" in p]
