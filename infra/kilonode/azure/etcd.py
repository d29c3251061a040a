"""EtcdCluster: one VM per member of one etcd cluster (instantiated for main, events and leases).

Members sit on `d`/NVMe sizes whose local SSD holds the data dir (field notes: ~200 us
fsync on local SSD vs ~2 ms on premium SSD), at the static IPs and zones the plan gives.
The VMs are protected: replacing a member is a remove-then-add procedure, never a
`pulumi up` side effect; a change that would replace one stops at the protect flag. Once
unprotected (docs/runbooks/etcd-member-lost-its-disk.md), `pulumi up --target` the member's VM
replaces it delete-before-replace: its name is fixed, so the old VM must go first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pulumi

from kilonode.azure.tags import quota_tags
from kilonode.azure.vm import host_spec, machine
from kilonode.plan.model import EtcdClusterPlan


@dataclass(frozen=True)
class EtcdClusterArgs:
    etcd: EtcdClusterPlan
    cluster: str
    location: str
    resource_group_name: pulumi.Input[str]
    subnet_id: pulumi.Input[str]
    # member name (etcd-main-0) -> its custom data (rendered user-data + TLS files), secret,
    # released only once the restart guard (kilonode.azure.rollout) let the update through
    custom_data: Mapping[str, pulumi.Output[str]]
    ssh_public_keys: Sequence[pulumi.Input[str]]  # this etcd cluster's role's (kilonode.azure.ssh)
    encryption_at_host: Callable[[str], bool]  # by VM size: ClusterPlan.encryption_at_host
    image_version_id: pulumi.Input[str]  # the role's image in the cluster's gallery
    public_ips: bool
    teardown: bool = False  # ClusterPlan.teardown: the members unprotected for `pulumi destroy`
    # this cluster's snapshot uploader's identity (kilonode.azure.backup): blobs/write on this
    # cluster's snapshot container only, carried by no other cluster's VMs
    identity_id: pulumi.Input[str] | None = None


class EtcdCluster(pulumi.ComponentResource):
    vm_ids: list[pulumi.Output[str]]
    client_endpoints: list[str]

    def __init__(self, name: str, args: EtcdClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:azure:EtcdCluster", name, None, opts)
        etcd = args.etcd
        self.vm_ids = []
        for member in etcd.members:
            vm = machine(
                host_spec(
                    name, member, member.vm_size, etcd.disks.os_disk_gib, args, f"etcd-{etcd.role}",
                    identity_ids=[args.identity_id] if args.identity_id is not None else [],
                    vm_tags=quota_tags(etcd.quota_backend_bytes),
                ),
                parent=self,
                # a member's data goes with its VM: only a stack armed for teardown lets it go
                protect=not args.teardown,
                # Its Azure name is fixed, so a replacement (the member runbook, once it is
                # removed from etcd and unprotected) can only delete first; its data is on the
                # local SSD, lost by a replacement either way.
                delete_before_replace=True,
            )
            self.vm_ids.append(vm.id)
        self.client_endpoints = list(etcd.client_endpoints)
        self.register_outputs({"vmIds": self.vm_ids, "clientEndpoints": self.client_endpoints})
