"""Images every node needs at boot (kube-proxy, CoreDNS and its autoscaler, metrics-server, the
serving-certificate approver, the cloud provider's node and controller managers, the gang
scheduler and its controller; on
GPU pools the NVIDIA device plugin):
baked like the pause image when the stack supplies their archives, else named as pulled at
first start, in the plan, the image manifest and `kilonode explain`."""

from __future__ import annotations

from pathlib import Path

from kilonode.catalog.components import components
from kilonode.plan import ClusterPlan
from kilonode.render import render_cluster
from tests.conftest import StackWriter, shipped_cluster_value
from tests.plan.test_resolve import plan_of

BOOT = (
    "registry.k8s.io/kube-proxy:v1.34.2",
    # by digest: the catalogue's, from registry.k8s.io's promotion manifest
    "registry.k8s.io/coredns/coredns:v1.12.1@sha256:e8c262566636e6bc340ece6473b0eed193cad045384401529721ddbe6463d31c",
    "registry.k8s.io/cpa/cluster-proportional-autoscaler:v1.10.1"
    "@sha256:56af5fdd4015a1ae26e2c33747ba173f9fa7955760bc25d3672b6cf6f498b887",
    # by digest, from the same promotion manifests (k8s-staging-metrics-server)
    "registry.k8s.io/metrics-server/metrics-server:v0.8.0"
    "@sha256:89258156d0e9af60403eafd44da9676fd66f600c7934d468ccc17e42b199aee2",
    # the exporters (kilonode.k8s.exporters; by tag: no digest read here)
    "quay.io/prometheus/node-exporter:v1.12.1",
    "registry.k8s.io/kube-state-metrics/kube-state-metrics:v2.18.0",
    "ghcr.io/postfinance/kubelet-csr-approver:v1.2.14",
    # the NetworkPolicy engine: Felix on every node, Typha on some (by tag: no digest read here)
    "quay.io/calico/node:v3.31.7",
    "quay.io/calico/typha:v3.31.7",
    "mcr.microsoft.com/oss/v2/kubernetes/azure-cloud-node-manager:v1.34.13",
    "mcr.microsoft.com/oss/v2/kubernetes/azure-cloud-controller-manager:v1.34.13",
    # Azure Disk CSI's controller, beside cloud-controller-manager (kilonode.k8s.storage; by tag)
    "mcr.microsoft.com/oss/v2/kubernetes-csi/csi-provisioner:v6.3.0",
    "mcr.microsoft.com/oss/v2/kubernetes-csi/csi-attacher:v4.12.0",
    "mcr.microsoft.com/oss/v2/kubernetes-csi/csi-resizer:v2.2.0",
    "registry.k8s.io/scheduler-plugins/kube-scheduler:v0.34.7",
    "registry.k8s.io/scheduler-plugins/controller:v0.34.7",
)


AUTOSCALER = "registry.k8s.io/autoscaling/cluster-autoscaler:v1.34.5"
DEVICE_PLUGIN = components().device_plugin.image("devicePlugin", str(components().device_plugin.version))
RDMA_PLUGIN = components().rdma_shared_device_plugin.image(
    "rdmaSharedDevicePlugin", str(components().rdma_shared_device_plugin.version))
PROMETHEUS = "quay.io/prometheus/prometheus:v3.5.5"  # on its pool only (kilonode.k8s.monitoring)
GRAFANA = "docker.io/grafana/grafana:13.0.3"  # beside it, on the same pool (kilonode.k8s.grafana)
ALERTMANAGER = "quay.io/prometheus/alertmanager:v0.34.0"  # likewise (kilonode.k8s.alertmanager)
DCGM_EXPORTER = "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless"  # GPU pools (kilonode.k8s.exporters)
# Azure Disk CSI's node plugin: pools without GPUs, monitoring and system pools (kilonode.k8s.storage)
DISK_PLUGIN = ("mcr.microsoft.com/oss/v2/kubernetes-csi/azuredisk-csi:v1.34.5",
               "mcr.microsoft.com/oss/v2/kubernetes-csi/csi-node-driver-registrar:v2.17.0",
               "mcr.microsoft.com/oss/v2/kubernetes-csi/livenessprobe:v2.19.0")


def test_without_archives_the_boot_images_are_named_as_pulled_at_first_start(plans: dict[str, ClusterPlan]) -> None:
    for pool in plans["research-7500"].node_pools:
        # the GPU pools: the device plugin too (not the system pool), the InfiniBand pools the RDMA
        # device plugin; a pool autoscales: the autoscaler; the monitoring pool: Prometheus
        plugin = (DEVICE_PLUGIN, DCGM_EXPORTER) if pool.gpus_per_node else ()
        rdma = (RDMA_PLUGIN,) if pool.infiniband else ()
        prometheus = (PROMETHEUS, GRAFANA, ALERTMANAGER) if pool.name == "monitoring" else ()
        disks = DISK_PLUGIN if not pool.gpus_per_node else ()
        assert pool.boot_images_not_preloaded == (*BOOT, AUTOSCALER, *plugin, *rdma, *disks, *prometheus)
        assert [i.image for i in pool.preload_images] == ["registry.k8s.io/pause:3.10"]
    assert AUTOSCALER not in plans["research-2500"].node_pools[0].boot_images_not_preloaded
    # where no pool is marked, Prometheus is the first system or untainted pool's: local's cpu pool
    [cpu] = plans["local"].node_pools
    assert plans["local"].prometheus is not None and plans["local"].prometheus.pool == cpu.name
    assert cpu.boot_images_not_preloaded[-3:] == (PROMETHEUS, GRAFANA, ALERTMANAGER)


def test_a_supplied_archive_is_preloaded_on_every_pool_and_rendered_into_the_loader_list(
    write_stack: StackWriter, tmp_path: Path,
) -> None:
    cluster = shipped_cluster_value("local")
    cluster["bootImageArchives"] = [{"image": BOOT[0], "archive": "archives/kube-proxy.tar",
                                     "imageId": "sha256:" + "e" * 64}]
    (tmp_path / "archives").mkdir()
    (tmp_path / "archives" / "kube-proxy.tar").write_bytes(b"")  # validate wants it there; the image build reads it
    plan = plan_of(cluster, write_stack)
    (pool,) = plan.node_pools
    proxy = pool.preload_images[1]
    assert (proxy.image, proxy.source, proxy.archive) == (BOOT[0], "archive", "archives/kube-proxy.tar")
    # local's one pool also runs the cluster's Prometheus, pulled at first start like the rest
    assert pool.boot_images_not_preloaded == (*BOOT[1:], *DISK_PLUGIN, PROMETHEUS, GRAFANA, ALERTMANAGER)
    loader_list = render_cluster(plan)[f"pool-{pool.name}"]["etc/kilonode/preload-images.json"].content
    assert BOOT[0] in loader_list and BOOT[1] not in loader_list


def test_the_in_cluster_program_runs_the_images_the_plan_preloads(graphs: dict, plans: dict[str, ClusterPlan]) -> None:
    from kilonode.azure.graph import _unwrap

    images = {
        container["image"]
        for r in graphs["research-7500"].resources if r.type.startswith("kubernetes:apps/v1:")
        for container in _unwrap(r.inputs)["spec"]["template"]["spec"]["containers"]
    }
    # ... and the pause image, which every node has from the image build (balloon pods run it)
    assert images == {*BOOT, AUTOSCALER, DEVICE_PLUGIN, DCGM_EXPORTER, RDMA_PLUGIN, PROMETHEUS, GRAFANA, ALERTMANAGER,
                      *DISK_PLUGIN,
                      plans["research-7500"].node_pools[0].pause_image}
    # each image the program runs is one some pool's nodes preload or name as pulled at first start
    named = {i for pool in plans["research-7500"].node_pools
             for i in (*pool.boot_images_not_preloaded, *(p.image for p in pool.preload_images))}
    assert images <= named
