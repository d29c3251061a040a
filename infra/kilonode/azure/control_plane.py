"""ControlPlane: apiserver VMs at static IPs behind an internal Standard load balancer.

kube-scheduler and kube-controller-manager run on the same VMs; their units and configs
come in the rendered apiserver user-data, so nothing here knows about them. The load
balancer's frontend IP, and every VM's IP, come from the plan; the health probe asks
`/readyz` over HTTPS on 6443, so a starting or draining apiserver gets no traffic.

For a deployer on the internet (the stack's `deployer.network: internet`) a second, public
load balancer fronts the same VMs, admitted only from the deployer's addresses: the machine
running `pulumi up` must reach the apiserver to create the objects without which no node joins
(docs/azure.md, "How `pulumi up` reaches the apiserver").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_random as random
from pulumi_azure_native import network

from kilonode.azure.common import tags
from kilonode.azure.custom_data import KEY_MODE, DeliveredFile
from kilonode.azure.vm import host_spec, machine
from kilonode.plan import defaults
from kilonode.plan.encryption import KEY_BYTES, encryption_configuration
from kilonode.plan.model import ControlPlanePlan, DeployerPlan
from kilonode.plan.wellknown import APISERVER_PORT, ENCRYPTION_CONFIG

FRONTEND = "apiserver"
PUBLIC_FRONTEND = "apiserver-public"
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
    ssh_public_keys: Sequence[pulumi.Input[str]]  # the apiservers' role's (kilonode.azure.ssh)
    encryption_at_host: Callable[[str], bool]  # by VM size: ClusterPlan.encryption_at_host
    image_version_id: pulumi.Input[str]  # the role's image in the cluster's gallery
    public_ips: bool
    # where `pulumi up` runs: an internet deployer gets the public frontend
    deployer: DeployerPlan | None = None


class ControlPlane(pulumi.ComponentResource):
    load_balancer_ip: pulumi.Output[str | None]
    endpoint: str  # the internal load balancer: what nodes and components use
    # what the machine running `pulumi up` uses: the public frontend for an internet deployer,
    # else the internal one (reached over the deployer's peering)
    deployer_endpoint: pulumi.Output[str]
    # What the apiservers' readiness check waits for (kilonode.k8s.readiness), as outputs, so a
    # dependency on them is on those resources alone: the load balancers' IDs, and the image the
    # apiservers boot (on a first run its upload and gallery copy take far longer than the check's
    # deadline, and every apiserver VM waits for it: the check must not start before). Never this
    # component as a whole: Pulumi's Python SDK expands a dependency on a component to every child
    # (pulumi/pulumi#7732), every apiserver VM and NIC included, and everything in the cluster hangs
    # off that check.
    ready_after: list[pulumi.Output[str]]
    vm_ids: list[pulumi.Output[str]]

    def __init__(self, name: str, args: ControlPlaneArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:azure:ControlPlane", name, None, opts)
        cp = args.control_plane
        internal = _load_balancer(
            f"{name}-lb", args,
            network.FrontendIPConfigurationArgs(
                name=FRONTEND,
                private_ip_allocation_method="Static",
                private_ip_address=str(cp.load_balancer_ip),
                subnet=network.SubnetArgs(id=args.subnet_id),
                zones=list(args.zones),  # zone-redundant frontend
            ),
            "apiserver-lb", self,
        )
        balancers = [internal]
        self.deployer_endpoint = pulumi.Output.from_input(cp.endpoint)
        if args.deployer is not None and args.deployer.public_frontend:
            public = self._public_frontend(name, args)
            balancers.append(public)
        backend_ids = [lb.backend_id for lb in balancers]
        self.ready_after = [*(lb.resource.id for lb in balancers), pulumi.Output.from_input(args.image_version_id)]

        self.vm_ids = []
        for instance in cp.instances:
            vm = machine(
                host_spec(name, instance, cp.vm_size, cp.disks.os_disk_gib, args, "apiserver",
                          backend_pool_ids=backend_ids),
                parent=self,
                nic_depends_on=[lb.resource for lb in balancers],
                # Rolled one at a time (docs/azure.md, "Rolling the control plane"): `pulumi up
                # --target` one VM deletes it and creates it anew under its fixed name, at its
                # NIC, while the others serve behind the load balancer.
                delete_before_replace=True,
            )
            self.vm_ids.append(vm.id)
        self.load_balancer_ip = internal.resource.frontend_ip_configurations.apply(
            lambda fronts: fronts[0].private_ip_address if fronts else None
        )
        self.endpoint = cp.endpoint
        self.register_outputs({"loadBalancerIp": self.load_balancer_ip, "vmIds": self.vm_ids})

    def _public_frontend(self, name: str, args: ControlPlaneArgs) -> _Balancer:
        """A second, public Standard load balancer in front of the same apiservers, for a deployer
        on the internet (the stack's `deployer.network: internet`): the internal one stays what
        nodes and components use. "A virtual machine can reference backend address pools of one
        public and one internal load balancer" (Azure's REST spec, the IP configuration's
        loadBalancerBackendAddressPools). Only `deployer.cidrs` get through: the
        control-plane NSG admits them on 6443 and nothing else from the internet
        (kilonode.azure.network), and every request still needs a client certificate."""
        ip = network.PublicIPAddress(
            f"{name}-public-ip",
            public_ip_address_name=f"{args.cluster}-apiserver-public-ip",
            resource_group_name=args.resource_group_name,
            location=args.location,
            tags=tags(args.cluster, "apiserver-public-ip"),
            # Standard: zone-redundant and closed until an NSG opens it; Static: the address the
            # program's kubeconfig names never moves under the deployment.
            sku=network.PublicIPAddressSkuArgs(name="Standard", tier="Regional"),
            public_ip_allocation_method="Static",
            zones=list(args.zones),
            opts=pulumi.ResourceOptions(parent=self),
        )
        balancer = _load_balancer(
            f"{name}-public-lb", args,
            network.FrontendIPConfigurationArgs(
                name=PUBLIC_FRONTEND, public_ip_address=network.PublicIPAddressArgs(id=ip.id),
            ),
            "apiserver-public-lb", self,
            # Outbound leaves through the subnet's NAT gateway (kilonode.azure.network), never
            # through this frontend.
            disable_outbound_snat=True,
        )
        # The address is Azure's to choose; the apiserver's certificate cannot name it, so the
        # kubeconfig asks for a name it does carry (kilonode.azure.tls, DEPLOYER_TLS_SERVER_NAME).
        self.deployer_endpoint = ip.ip_address.apply(lambda address: f"https://{address}:{APISERVER_PORT}")
        return balancer


def secrets_encryption_file(name: str, parent: pulumi.Resource) -> DeliveredFile:
    """kube-apiserver's EncryptionConfiguration (kilonode.plan.encryption), for every
    apiserver's custom data and nothing else: its key is random bytes Pulumi keeps as a secret
    (RandomBytes marks `base64` secret), and the file is 0600 root. Every apiserver must hold
    the same key (each reads what the others wrote), so there is one for the cluster.

    Replacing this resource changes the key: Secrets written under the old one stop reading.
    A rotation adds a second key first (docs/azure.md, "Secrets at rest")."""
    key = random.RandomBytes(name, length=KEY_BYTES, opts=pulumi.ResourceOptions(parent=parent))
    content = pulumi.Output.secret(key.base64.apply(encryption_configuration))
    return DeliveredFile(ENCRYPTION_CONFIG, content, KEY_MODE)


@dataclass(frozen=True)
class _Balancer:
    resource: network.LoadBalancer
    backend_id: pulumi.Output[str]


def _load_balancer(lb_name: str, args: ControlPlaneArgs, frontend: network.FrontendIPConfigurationArgs,
                   component: str, parent: pulumi.Resource, *, disable_outbound_snat: bool = False) -> _Balancer:
    """A Standard load balancer with one frontend, the apiservers' backend pool, the /readyz
    probe and one rule for 6443."""
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
        tags=tags(args.cluster, component),
        sku=network.LoadBalancerSkuArgs(name="Standard", tier="Regional"),
        frontend_ip_configurations=[frontend],
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
                frontend_ip_configuration=sub("frontendIPConfigurations", str(frontend.name)),
                backend_address_pool=sub("backendAddressPools", BACKEND),
                probe=sub("probes", PROBE),
                idle_timeout_in_minutes=defaults.LB_IDLE_TIMEOUT_MIN,
                enable_tcp_reset=True,
                disable_outbound_snat=disable_outbound_snat or None,
            )
        ],
        opts=pulumi.ResourceOptions(parent=parent),
    )
    return _Balancer(lb, pulumi.Output.concat(lb_id, f"/backendAddressPools/{BACKEND}"))
