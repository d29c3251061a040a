"""RdmaDevicePlugin: InfiniBand devices into pods, as a schedulable resource.

Mellanox's k8s-rdma-shared-dev-plugin (pinned by digest in the catalogue) on every node of the
InfiniBand pools registers `rdma/ib` (kilonode.plan.wellknown.RDMA_RESOURCE) with the kubelet;
a pod that asks for `rdma/ib: 1` gets the node's RDMA devices (/dev/infiniband/uverbs*, rdma_cm)
in its container, without privilege or hostPath. "Shared": every such pod on the node gets all
of the node's HCAs (an 8-GPU pod uses all eight NICs, as NCCL wants); `rdmaHcaMax` bounds how
many pods may share them. Which devices: the InfiniBand links only (`linkTypes: infiniband`,
the netlink encapsulation of an IPoIB interface, pkg/resources/pci_net_device.go), so the
front-end NIC's accelerated-networking VF, also a Mellanox device (vendor 15b3), is not handed
out. The config format is the plugin's at v1.5.3 (pkg/types/types.go UserConfigList), the
DaemonSet upstream's (deployment/k8s/base/daemonset.yaml): privileged, host network, /dev and
the kubelet's device-plugin and plugin-registry directories.

The rest of the RDMA path lives elsewhere: memlock unlimited for containers on InfiniBand pools
(kilonode.render.pool: Docker's default-ulimits, the runtime unit's LimitMEMLOCK), each node's
fabric label (kilonode.render.pool fabric-label) and the gang policy (kilonode.k8s.scheduling).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_kubernetes import apps, core, meta

from kilonode.k8s.bootstrap import KUBE_SYSTEM
from kilonode.k8s.gpu import device_plugin_affinity, device_plugin_tolerations
from kilonode.k8s.pods import SKIP_AWAIT, config_digest_annotation, system_pod_spec
from kilonode.plan import wellknown

NAME = "rdma-shared-dp-ds"  # upstream's DaemonSet name
CONFIG_MAP = "rdma-devices"  # upstream's ConfigMap name
CONFIG_DIR = "/k8s-rdma-shared-dev-plugin"  # resources_manager.go DefaultConfigFilePath's directory
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
PLUGINS_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
# How many pods of one node may hold the shared HCAs at once: wellknown.RDMA_HCA_MAX (the
# autoscaler's node template of an empty scale set names it too).
RDMA_HCA_MAX = wellknown.RDMA_HCA_MAX
# How often the plugin looks for devices again (seconds): kilonode.plan.wellknown.RDMA_PLUGIN_RESCAN_S
# says why 30, not upstream's example 300 (a pod then got the HCAs of a scan up to 5 minutes old: some
# of the eight, where the virtual functions arrived after the plugin's start); the GPU health agent
# holds a booting node that long after its ports are up (the same constant).
PERIODIC_UPDATE_INTERVAL_S = wellknown.RDMA_PLUGIN_RESCAN_S
SELECTOR = {"name": NAME}
REQUESTS = {"cpu": "10m", "memory": "32Mi"}


def plugin_config() -> dict[str, object]:
    """The plugin's config.json: one resource, the node's InfiniBand HCAs."""
    return {
        "periodicUpdateInterval": PERIODIC_UPDATE_INTERVAL_S,
        "configList": [{
            "resourceName": wellknown.RDMA_RESOURCE_NAME,
            "rdmaHcaMax": RDMA_HCA_MAX,
            "selectors": {"vendors": ["15b3"], "linkTypes": ["infiniband"]},
        }],
    }


@dataclass(frozen=True)
class RdmaDevicePluginArgs:
    pools: Sequence[str]  # the InfiniBand pools' names
    image: str  # the plan's (components)


class RdmaDevicePlugin(pulumi.ComponentResource):
    def __init__(self, name: str, args: RdmaDevicePluginArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:RdmaDevicePlugin", name, None, opts)
        if not args.pools:
            raise ValueError("RdmaDevicePlugin needs at least one InfiniBand pool")
        child = pulumi.ResourceOptions(parent=self)
        labels = {**SELECTOR, "app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": "kilonode"}
        data = {"config.json": json.dumps(plugin_config(), indent=2) + "\n"}
        config = core.v1.ConfigMap(
            f"{name}-config",
            metadata=meta.v1.ObjectMetaArgs(name=CONFIG_MAP, namespace=KUBE_SYSTEM, labels=labels),
            data=data,
            opts=child,
        )
        mounts = {"device-plugin": DEVICE_PLUGIN_DIR, "plugins-registry": PLUGINS_REGISTRY_DIR, "devs": "/dev/"}
        apps.v1.DaemonSet(
            f"{name}-daemonset",
            # on every InfiniBand node: not waited for (kilonode.k8s.pods.SKIP_AWAIT says why)
            metadata=meta.v1.ObjectMetaArgs(name=NAME, namespace=KUBE_SYSTEM, labels=labels, annotations=SKIP_AWAIT),
            spec=apps.v1.DaemonSetSpecArgs(
                selector=meta.v1.LabelSelectorArgs(match_labels=SELECTOR),
                template=core.v1.PodTemplateSpecArgs(
                    # Rolls on a config change (kilonode.k8s.pods.CONFIG_DIGEST_ANNOTATION): the plugin
                    # reads config.json once, before it starts its servers (cmd/k8s-rdma-shared-dp/main.go:
                    # rm.ReadConfig, pkg/resources/resources_manager.go), and even its SIGHUP restart
                    # (RestartAllServers) does not read it again. Under the DaemonSet's default
                    # RollingUpdate (maxUnavailable 1); the kubelet keeps running pods' devices.
                    metadata=meta.v1.ObjectMetaArgs(labels=labels, annotations=config_digest_annotation(data)),
                    spec=system_pod_spec(
                        "node",
                        host_network=True,
                        # it talks to the kubelet's device-plugin socket only, never to the apiserver
                        automount_service_account_token=False,
                        # the GPU DaemonSets' placement: the pools' nodes, every GPU and team taint
                        affinity=device_plugin_affinity(args.pools),
                        tolerations=device_plugin_tolerations(),
                        containers=[core.v1.ContainerArgs(
                            name="k8s-rdma-shared-dp-ds",
                            image=args.image,
                            # upstream's: it opens the devices to enumerate and hand them out
                            security_context=core.v1.SecurityContextArgs(privileged=True),
                            resources=core.v1.ResourceRequirementsArgs(requests=REQUESTS),
                            volume_mounts=[
                                *(core.v1.VolumeMountArgs(name=n, mount_path=p) for n, p in mounts.items()),
                                core.v1.VolumeMountArgs(name="config", mount_path=CONFIG_DIR, read_only=True),
                            ],
                        )],
                        volumes=[
                            *(core.v1.VolumeArgs(name=n, host_path=core.v1.HostPathVolumeSourceArgs(path=p))
                              for n, p in mounts.items()),
                            core.v1.VolumeArgs(name="config", config_map=core.v1.ConfigMapVolumeSourceArgs(
                                name=config.metadata.name,
                                items=[core.v1.KeyToPathArgs(key="config.json", path="config.json")])),
                        ],
                    ),
                ),
            ),
            opts=child,
        )
        self.register_outputs({})
