"""ControlPlane: apiserver VMs at static IPs behind an internal Standard load balancer.

kube-scheduler and kube-controller-manager run on the same VMs; their units and configs
come in the rendered apiserver user-data, so nothing here knows about them. The load
balancer's frontend IP, and every VM's IP, come from the plan; the health probe asks
`/readyz` over HTTPS on 6443, so a starting or draining apiserver gets no traffic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import network

from kilonode.azure.common import tags
from kilonode.azure.vm import host_spec, machine
from kilonode.plan import defaults
from kilonode.plan.model import ControlPlanePlan
from kilonode.plan.wellknown import APISERVER_PORT

FRONTEND = "apiserver"
BACKEND = "apiservers"
PROBE = "readyz"


@dataclass(frozen=True)
class ControlPlaneArgs:
    control_plane: ControlPlanePlan
    cluster: str
    location: str
    zones: Sequence[str]
    resource_group_name: pulumi.Input[str]
    resource_group_id: pulumi.Input[str]
    subnet_id: pulumi.Input[str]
    # apiserver-0 -> its custom data (rendered user-data + TLS files), secret, released only
    # once the restart guard (kilonode.azure.rollout) let the update through
    custom_data: Mapping[str, pulumi.Output[str]]
    ssh_public_key: pulumi.Input[str]
    image_version_id: pulumi.Input[str]  # the role's image in the cluster's gallery
    public_ips: bool


class ControlPlane(pulumi.ComponentResource):
    load_balancer_ip: pulumi.Output[str | None]
    endpoint: str
    vm_ids: list[pulumi.Output[str]]

    def __init__(self, name: str, args: ControlPlaneArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:azure:ControlPlane", name, None, opts)
        cp = args.control_plane
        lb_name = f"{name}-lb"
        # Sub-resources of a load balancer refer to each other by ID before it exists;
        # the ID is the group's ID plus fixed names (string formatting only).
        lb_id = pulumi.Output.concat(args.resource_group_id, "/providers/Microsoft.Network/loadBalancers/", lb_name)

        def sub(kind: str, sub_name: str) -> network.SubResourceArgs:
            return network.SubResourceArgs(id=pulumi.Output.concat(lb_id, f"/{kind}/{sub_name}"))

        lb = network.LoadBalancer(
            lb_name,
            load_balancer_name=lb_name,
            resource_group_name=args.resource_group_name,
            location=args.location,
            tags=tags(args.cluster, "apiserver-lb"),
            sku=network.LoadBalancerSkuArgs(name="Standard", tier="Regional"),
            frontend_ip_configurations=[
                network.FrontendIPConfigurationArgs(
                    name=FRONTEND,
                    private_ip_allocation_method="Static",
                    private_ip_address=str(cp.load_balancer_ip),
                    subnet=network.SubnetArgs(id=args.subnet_id),
                    zones=list(args.zones),  # zone-redundant frontend
                )
            ],
            backend_address_pools=[network.BackendAddressPoolArgs(name=BACKEND)],
            probes=[
                network.ProbeArgs(
                    name=PROBE,
                    protocol="Https",
                    port=APISERVER_PORT,
                    request_path=defaults.LB_PROBE_PATH,
                    interval_in_seconds=defaults.LB_PROBE_INTERVAL_S,
                    probe_threshold=defaults.LB_PROBE_THRESHOLD,
                )
            ],
            load_balancing_rules=[
                network.LoadBalancingRuleArgs(
                    name=f"apiserver-{APISERVER_PORT}",
                    protocol="Tcp",
                    frontend_port=APISERVER_PORT,
                    backend_port=APISERVER_PORT,
                    frontend_ip_configuration=sub("frontendIPConfigurations", FRONTEND),
                    backend_address_pool=sub("backendAddressPools", BACKEND),
                    probe=sub("probes", PROBE),
                    idle_timeout_in_minutes=defaults.LB_IDLE_TIMEOUT_MIN,
                    enable_tcp_reset=True,
                )
            ],
            opts=pulumi.ResourceOptions(parent=self),
        )
        backend_id = pulumi.Output.concat(lb_id, f"/backendAddressPools/{BACKEND}")

        self.vm_ids = []
        for instance in cp.instances:
            vm = machine(
                host_spec(name, instance, cp.vm_size, cp.disks.os_disk_gib, args, "apiserver",
                          backend_pool_ids=[backend_id]),
                parent=self,
                nic_depends_on=[lb],
            )
            self.vm_ids.append(vm.id)
        self.load_balancer_ip = lb.frontend_ip_configurations.apply(
            lambda fronts: fronts[0].private_ip_address if fronts else None
        )
        self.endpoint = cp.endpoint
        self.register_outputs({"loadBalancerIp": self.load_balancer_ip, "vmIds": self.vm_ids})
