"""GpuNodePool: one scale set per shard of the plan, all with the same VM model.

- InfiniBand pools keep a single placement group, so a shard holds at most 100 VMs (VMSS
  placement-groups doc); the plan has already cut the pool into such shards.
- Native pod networking (field notes: flannel capped pods at ~2 Gbit/s): each NIC has a
  primary IP configuration plus `podsPerNode` secondary ones from the pool subnet; the
  plan's `ip_configs_per_nic` is that count.
- Waves (kilonode.plan.resolve.joins): the cluster creates the scale sets in the plan's order,
  each wave's dependsOn its timer (kilonode.azure.join_waves), so nodes join no faster than
  the apiservers are sized to take.
- Manual upgrade policy: a new image or custom data reaches a node only when an operator
  upgrades it (pods are semi-stateful; field notes). No overprovisioning: extra VMs would
  join the cluster and churn MPI jobs, and eat subnet IPs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import compute

from kilonode.azure.common import ADMIN_USERNAME, gallery_image, linux_config, security_profile, tags
from kilonode.azure.custom_data import DeliveredFile, custom_data
from kilonode.plan.model import NodePoolPlan, ScaleSetShard
from kilonode.plan.node_templates import node_template_tags


@dataclass(frozen=True)
class GpuNodePoolArgs:
    pool: NodePoolPlan
    cluster: str
    location: str
    resource_group_name: pulumi.Input[str]
    subnet_id: pulumi.Input[str]
    image_version_id: pulumi.Input[str]
    # the rendered user-data of each registration group: None for the shared scale sets, a
    # team's name for its own (NodePoolPlan.role)
    user_data: Mapping[str | None, str]
    files: Mapping[str | None, Sequence[DeliveredFile]]  # per registration group: its join token's
    ssh_public_keys: Sequence[pulumi.Input[str]]  # the pool's role's (kilonode.azure.ssh)
    encryption_at_host: bool  # ClusterPlan.encryption_at_host(pool.vm_size)
    # user-assigned identities: the controllers' on the pools they run on (the plan's
    # controller_pools), where they read their tokens from the instance metadata service;
    # none on any other pool (kilonode.azure.identity)
    identity_ids: Sequence[pulumi.Input[str]]
    # the NSG every NIC of the pool's scale sets carries (kilonode.azure.network NIC_NSG: a `peered`
    # deployer's outbound deny where no cluster identity writes); None: the subnet's alone
    nic_nsg_id: pulumi.Input[str] | None = None
    # scale set -> its size in Azure as this run read it (kilonode.azure.live); None where the
    # program is recorded, not deployed (under the mock engine: no live size to read)
    live_capacities: Mapping[str, int] | None = None


def ip_configurations(
    count: int, subnet_id: pulumi.Input[str]
) -> list[compute.VirtualMachineScaleSetIPConfigurationArgs]:
    """`count` IP configurations (the plan's ip_configs_per_nic): the first is primary."""
    subnet = compute.ApiEntityReferenceArgs(id=subnet_id)
    return [
        compute.VirtualMachineScaleSetIPConfigurationArgs(
            name="primary" if i == 0 else f"pod-{i}",
            primary=i == 0,
            private_ip_address_version="IPv4",
            subnet=subnet,
        )
        for i in range(count)
    ]


class GpuNodePool(pulumi.ComponentResource):
    """The pool's component; its scale sets are added one by one (`scale_set`) in the order of
    the plan's waves (kilonode.azure.cluster), then `done` registers the outputs."""

    scale_set_ids: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, args: GpuNodePoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:azure:GpuNodePool", name, None, opts)
        self._name, self._args = name, args
        pool = args.pool
        # One custom data per registration group: the pool's shared shards share one, each
        # team's shards another (their kubelet registers the team's label and taint).
        self._data = {
            team: custom_data(text, args.files[team], pool.role(team)) for team, text in args.user_data.items()
        }
        self._storage = compute.VirtualMachineScaleSetStorageProfileArgs(
            image_reference=gallery_image(args.image_version_id),
            # Sized by the plan per pool kind (kilonode.plan.defaults.disks): the kubelet root,
            # pod logs and the journal stay here; without diskSizeGB it is the image's 4 GiB (P1).
            os_disk=compute.VirtualMachineScaleSetOSDiskArgs(
                create_option="FromImage",
                disk_size_gb=pool.disks.os_disk_gib,
                caching=compute.CachingTypes.READ_WRITE,
                managed_disk=compute.VirtualMachineScaleSetManagedDiskParametersArgs(
                    storage_account_type="Premium_LRS"
                ),
            ),
        )
        self._network = compute.VirtualMachineScaleSetNetworkProfileArgs(
            network_interface_configurations=[
                compute.VirtualMachineScaleSetNetworkConfigurationArgs(
                    name="primary",
                    primary=True,
                    enable_accelerated_networking=True,
                    ip_configurations=ip_configurations(pool.ip_configs_per_nic, args.subnet_id),
                    network_security_group=(compute.SubResourceArgs(id=args.nic_nsg_id)
                                            if args.nic_nsg_id is not None else None),
                )
            ]
        )
        self._scaled = {group.shard for group in pool.autoscaling.node_groups} if pool.autoscaling else set()
        self.scale_set_ids = {}

    def scale_set(self, shard: ScaleSetShard, after: Sequence[pulumi.Resource] = ()) -> compute.VirtualMachineScaleSet:
        """The shard's scale set, created once everything in `after` is (its wave's timer and
        an earlier wave, kilonode.azure.join_waves): Azure boots its VMs only then."""
        args, pool = self._args, self._args.pool
        profile = compute.VirtualMachineScaleSetVMProfileArgs(
            os_profile=compute.VirtualMachineScaleSetOSProfileArgs(
                # Instance hostnames are the prefix plus a per-scale-set instance number,
                # so the prefix must be the shard's unique name: with the pool's name,
                # every shard's first VM would be the same Kubernetes node name. Linux
                # takes prefixes up to 58 characters (64-character hostnames).
                computer_name_prefix=shard.name,
                admin_username=ADMIN_USERNAME,
                custom_data=self._data[shard.team],
                linux_configuration=linux_config(args.ssh_public_keys),
            ),
            security_profile=security_profile(args.encryption_at_host),
            storage_profile=self._storage,
            network_profile=self._network,
        )
        vmss = compute.VirtualMachineScaleSet(
            f"{self._name}-{shard.index:03d}",
            vm_scale_set_name=shard.name,
            resource_group_name=args.resource_group_name,
            location=args.location,
            # the autoscaler's template of a node of this scale set, read while it holds none
            tags={**tags(args.cluster, pool.role(shard.team)), **node_template_tags(pool, shard)},
            zones=[shard.zone],
            sku=compute.SkuArgs(name=pool.vm_size, tier="Standard", capacity=self._capacity(shard)),
            orchestration_mode="Uniform",
            single_placement_group=shard.single_placement_group,
            overprovision=False,
            upgrade_policy=compute.UpgradePolicyArgs(mode=compute.UpgradeMode.MANUAL),
            identity=compute.VirtualMachineScaleSetIdentityArgs(
                type=compute.ResourceIdentityType.USER_ASSIGNED,
                user_assigned_identities=list(args.identity_ids),
            ) if args.identity_ids else None,
            virtual_machine_profile=profile,
            # The autoscaler owns an autoscaled shard's capacity (kilonode.plan.capacity), and an
            # update of the scale set must not undo it (_capacity). Recorded offline, its size is the
            # autoscaler's, unknown: ignoreChanges says so to the review and preflight. Deployed,
            # the live size is the input (no ignoreChanges: with it the engine would put the size
            # recorded at creation back in the update, pulumi-azure-native#2032).
            # dependsOn orders creation and updates, and is no input: adding it to a scale set
            # that exists changes nothing in Azure.
            opts=pulumi.ResourceOptions(
                parent=self,
                ignore_changes=(["sku.capacity"] if shard.name in self._scaled and args.live_capacities is None
                                else None),
                depends_on=list(after) or None,
            ),
        )
        self.scale_set_ids[shard.name] = vmss.id
        return vmss

    def _capacity(self, shard: ScaleSetShard) -> int:
        """The size the scale set is given. A fixed shard's is the plan's. An autoscaled shard's is
        the plan's when it is created, and after that its size in Azure as this run read it: pulumi-
        azure-native updates a scale set with a PUT of its whole model (sku included), and a PUT's
        sku.capacity is the scale set's new size (Azure/vm-scale-sets#70; Azure/aks-engine#2183:
        an update that re-sent the created size removed the instances the cluster had grown by,
        with no drain). ignoreChanges cannot keep it: the engine then sends the input recorded at
        creation (pulumi/pulumi pkg/resource/deploy step_generator.go processIgnoreChanges), and a
        refresh does not bring an ignored input up to date (pulumi/pulumi#16146); a scale set the
        autoscaler had grown from 0 (kilonode.plan.capacity: beyond the pool's nodes) would go back
        to 0 at its next model change, an image rollout's."""
        live = self._args.live_capacities
        if shard.name in self._scaled and live is not None and shard.name in live:
            return live[shard.name]
        return shard.capacity

    def done(self) -> None:
        self.register_outputs({"scaleSetIds": self.scale_set_ids})
