"""One control-plane machine: a NIC with a static private IP and a VM (etcd, apiserver).

Shared by EtcdCluster and ControlPlane so both build machines the same way; each passes
its own names, addresses and sizes from the plan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from typing import Protocol

import pulumi
from pulumi_azure_native import compute, network

from kilonode.azure.common import ADMIN_USERNAME, gallery_image, linux_config, security_profile, tags
from kilonode.azure.tags import PUBLIC_IP_ACKNOWLEDGED_TAG

CUSTOM_DATA_PATH = "osProfile.customData"
IMAGE_PATH = "storageProfile.imageReference"


@dataclass(frozen=True)
class MachineSpec:
    """Everything one machine needs; every value comes from the plan or another component."""

    name: str  # Pulumi name; the NIC and public IP add suffixes
    vm_name: str  # Azure VM name, from the plan
    vm_size: str
    os_disk_gib: int  # the role's OS disk (DisksPlan): without it Azure makes it the image's 4 GiB
    zone: str
    ip: str  # static private IP, from the plan
    location: str
    resource_group_name: pulumi.Input[str]
    subnet_id: pulumi.Input[str]
    custom_data: pulumi.Output[str]
    ssh_public_keys: Sequence[pulumi.Input[str]]  # the role's (kilonode.azure.ssh)
    image_version_id: pulumi.Input[str]  # the role's image in the cluster's gallery
    tags: dict[str, str]
    encryption_at_host: bool  # ClusterPlan.encryption_at_host(vm_size)
    public_ip: bool
    backend_pool_ids: Sequence[pulumi.Input[str]] = ()
    # user-assigned managed identities (the etcd members': the snapshot upload, kilonode.azure.backup)
    identity_ids: Sequence[pulumi.Input[str]] = ()
    # tags on the VM alone (an etcd member's quota, for the policy pack), beside `tags`
    vm_tags: dict[str, str] = field(default_factory=dict)


class Host(Protocol):
    """A planned machine: an etcd member or an apiserver instance."""

    @property
    def name(self) -> str: ...  # the host directory and custom data key: etcd-main-0, apiserver-0
    @property
    def vm_name(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def ip(self) -> IPv4Address: ...
    @property
    def zone(self) -> str: ...


class RoleArgs(Protocol):
    """What a role's component (EtcdCluster, ControlPlane) holds for all its machines alike."""

    @property
    def cluster(self) -> str: ...
    @property
    def location(self) -> str: ...
    @property
    def resource_group_name(self) -> pulumi.Input[str]: ...
    @property
    def subnet_id(self) -> pulumi.Input[str]: ...
    @property
    def custom_data(self) -> Mapping[str, pulumi.Output[str]]: ...
    @property
    def ssh_public_keys(self) -> Sequence[pulumi.Input[str]]: ...
    @property
    def encryption_at_host(self) -> Callable[[str], bool]: ...  # by VM size: ClusterPlan.encryption_at_host
    @property
    def image_version_id(self) -> pulumi.Input[str]: ...
    @property
    def public_ips(self) -> bool: ...


def host_spec(
    component: str,
    host: Host,
    vm_size: str,
    os_disk_gib: int,
    args: RoleArgs,
    role: str,
    *,
    backend_pool_ids: Sequence[pulumi.Input[str]] = (),
    identity_ids: Sequence[pulumi.Input[str]] = (),
    vm_tags: Mapping[str, str] | None = None,
) -> MachineSpec:
    """The MachineSpec of `host`, the component's machine number `host.index`: the one way an
    etcd member and an apiserver are described (Pulumi name `<component>-<index>`, tagged
    with `role`)."""
    return MachineSpec(
        name=f"{component}-{host.index}",
        vm_name=host.vm_name,
        vm_size=vm_size,
        os_disk_gib=os_disk_gib,
        zone=host.zone,
        ip=str(host.ip),
        location=args.location,
        resource_group_name=args.resource_group_name,
        subnet_id=args.subnet_id,
        custom_data=args.custom_data[host.name],
        ssh_public_keys=args.ssh_public_keys,
        encryption_at_host=args.encryption_at_host(vm_size),
        image_version_id=args.image_version_id,
        tags=tags(args.cluster, role),
        public_ip=args.public_ips,
        backend_pool_ids=backend_pool_ids,
        identity_ids=identity_ids,
        vm_tags=dict(vm_tags or {}),
    )


def _public_ip(spec: MachineSpec, parent: pulumi.Resource) -> network.PublicIPAddressArgs | None:
    """The machine's public address, where the spec asks for one."""
    if not spec.public_ip:
        return None
    # Only when the stack sets network.publicIpsOnControlPlane; the NSG still admits
    # nothing but its allow rules.
    pip = network.PublicIPAddress(
        f"{spec.name}-pip",
        public_ip_address_name=f"{spec.vm_name}-pip",
        resource_group_name=spec.resource_group_name,
        sku=network.PublicIPAddressSkuArgs(name="Standard"),
        public_ip_allocation_method="Static",
        zones=[spec.zone],
        opts=pulumi.ResourceOptions(parent=parent),
        location=spec.location,
        tags={**spec.tags, PUBLIC_IP_ACKNOWLEDGED_TAG: "network.publicIpsOnControlPlane"},
    )
    return network.PublicIPAddressArgs(id=pip.id)


def _nic(spec: MachineSpec, parent: pulumi.Resource, nic_depends_on: Sequence[pulumi.Resource]
         ) -> network.NetworkInterface:
    """The machine's NIC: its static address, its public IP where asked, and its place in the load
    balancers' backend pools. The VM depends on it, not the other way round, so it outlives a
    delete-before-replace of its VM."""
    location, resource_tags = spec.location, spec.tags
    public = _public_ip(spec, parent)
    return network.NetworkInterface(
        f"{spec.name}-nic",
        network_interface_name=f"{spec.vm_name}-nic",
        resource_group_name=spec.resource_group_name,
        enable_accelerated_networking=True,
        ip_configurations=[
            network.NetworkInterfaceIPConfigurationArgs(
                name="primary",
                primary=True,
                private_ip_allocation_method="Static",
                private_ip_address=spec.ip,
                subnet=network.SubnetArgs(id=spec.subnet_id),
                public_ip_address=public,
                load_balancer_backend_address_pools=[
                    network.BackendAddressPoolArgs(id=pool) for pool in spec.backend_pool_ids
                ] or None,
            )
        ],
        opts=pulumi.ResourceOptions(parent=parent, depends_on=list(nic_depends_on) or None),
        location=location,
        tags=resource_tags,
    )


def machine(
    spec: MachineSpec,
    parent: pulumi.Resource,
    protect: bool = False,
    nic_depends_on: Sequence[pulumi.Resource] = (),
    delete_before_replace: bool = False,
) -> compute.VirtualMachine:
    """The machine's NIC (and public IP where asked) and its VM. `delete_before_replace`: the VM's
    Azure name is fixed (the plan's), so its replacement can only be created once the old VM is
    gone; pulumi-azure-native refuses to create over a VM still there, which is what Pulumi's
    default create-before-delete would ask of it."""
    location, resource_tags = spec.location, spec.tags
    nic = _nic(spec, parent, nic_depends_on)
    return compute.VirtualMachine(
        spec.name,
        vm_name=spec.vm_name,
        resource_group_name=spec.resource_group_name,
        zones=[spec.zone],
        hardware_profile=compute.HardwareProfileArgs(vm_size=spec.vm_size),
        network_profile=compute.NetworkProfileArgs(
            network_interfaces=[compute.NetworkInterfaceReferenceArgs(id=nic.id, primary=True)]
        ),
        os_profile=compute.OSProfileArgs(
            computer_name=spec.vm_name,
            admin_username=ADMIN_USERNAME,
            custom_data=spec.custom_data,
            linux_configuration=linux_config(spec.ssh_public_keys),
        ),
        security_profile=security_profile(spec.encryption_at_host),
        identity=compute.VirtualMachineIdentityArgs(
            type=compute.ResourceIdentityType.USER_ASSIGNED, user_assigned_identities=list(spec.identity_ids),
        ) if spec.identity_ids else None,
        storage_profile=compute.StorageProfileArgs(
            image_reference=gallery_image(spec.image_version_id),
            # The OS disk holds the OS and the journal; etcd data and the apiserver's audit log
            # go to the local SSD that cloud-init mounts (field notes: ~200 us vs ~2 ms fsync).
            # Sized by the plan (kilonode.plan.defaults.disks): without diskSizeGB it is the
            # image's 4 GiB, a P1 disk of 120 IOPS; cloud-init's growpart grows the root to it.
            os_disk=compute.OSDiskArgs(
                create_option="FromImage",
                disk_size_gb=spec.os_disk_gib,
                caching=compute.CachingTypes.READ_WRITE,
                delete_option="Delete",
                managed_disk=compute.ManagedDiskParametersArgs(storage_account_type="Premium_LRS"),
            ),
        ),
        # Azure refuses to change osProfile.customData, or the image, of an existing VM, and the
        # provider would preview it as a plain update that then fails: a new custom data or a
        # new image version is a new VM, shown as a replacement in preview and stopped by
        # `protect` on etcd members. Delete-before-replace deletes the VM alone: its NIC (the
        # static IP, the load balancer's backend pool) is what the VM depends on, not a dependent,
        # so it stays and the new VM takes it (Azure detaches a NIC from a deleted VM: no
        # deleteOption on it); the OS disk goes with the VM (deleteOption Delete) and the new one
        # gets a name of Azure's.
        opts=pulumi.ResourceOptions(
            parent=parent, protect=protect, replace_on_changes=[CUSTOM_DATA_PATH, IMAGE_PATH],
            delete_before_replace=delete_before_replace or None,
        ),
        location=location,
        tags={**resource_tags, **spec.vm_tags},
    )
