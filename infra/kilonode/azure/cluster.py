"""Cluster: the one top-level component; wires the subsystems together from the plan.

The component tree is fixed here and named from the cluster: re-parenting a resource
changes its URN and would replace it (an etcd VM!) unless aliases are given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi

from kilonode.azure import join_waves, rollout, ssh
from kilonode.azure.backup import EtcdBackup, EtcdBackupArgs
from kilonode.azure.common import storage_ip_rules
from kilonode.azure.control_plane import ControlPlane, ControlPlaneArgs, secrets_encryption_file
from kilonode.azure.custom_data import custom_data
from kilonode.azure.egress_alerts import EgressAlerts, EgressAlertsArgs
from kilonode.azure.etcd import EtcdCluster, EtcdClusterArgs
from kilonode.azure.identity import ControllerIdentities, ControllerIdentitiesArgs
from kilonode.azure.network import Network, NetworkArgs
from kilonode.azure.node_image import NodeImage, NodeImageArgs, gallery_images
from kilonode.azure.node_pool import GpuNodePool, GpuNodePoolArgs
from kilonode.azure.tls import Tls, TlsArgs
from kilonode.config.model import CONTROL_PLANE_IMAGE, ETCD_IMAGE
from kilonode.plan.model import ClusterPlan
from kilonode.render.files import USER_DATA, HostFiles


@dataclass(frozen=True)
class ClusterArgs:
    plan: ClusterPlan
    rendered: Mapping[str, HostFiles]  # render_cluster(plan)
    # image name (each pool's, "etcd", "control-plane") -> VHD from the node-image build
    # (node_image.default_vhd for the usual place)
    node_image_vhds: Mapping[str, str]
    # image name -> node_image.vhd_digest of its VHD: what its upload is keyed by
    node_image_digests: Mapping[str, str]
    # this stack's fully qualified name (org/project/stack): its last deployed outputs are
    # read back for the restart guard; None skips the guard (nothing deployed to compare)
    own_stack: str | None = None
    # scale set -> its size in Azure at this run's start (kilonode.azure.live); None when recorded
    # under the mock engine
    live_capacities: Mapping[str, int] | None = None


def _user_data(args: ClusterArgs, host: str) -> str:
    return args.rendered[host][USER_DATA].content


# (host, VM name, zone, VM size, image@version) of one control-plane machine: what its
# restart key names besides its custom data
_Machine = tuple[str, str, str, str, str]


def _control_plane_machines(plan: ClusterPlan) -> dict[str, list[_Machine]]:
    """Each restart-guarded group (kilonode.azure.rollout) -> its machines."""
    # the image each machine boots, as the restart key names it: its gallery image@version
    etcd_image = f"{ETCD_IMAGE}@{plan.etcd_image_version}"
    apiserver_image = f"{CONTROL_PLANE_IMAGE}@{plan.control_plane_image_version}"
    # one group per etcd cluster (etcd-main, etcd-events, etcd-leases where the stack has it)
    machines: dict[str, list[_Machine]] = {
        rollout.etcd_group(e.role): [(m.name, m.vm_name, m.zone, m.vm_size, etcd_image) for m in e.members]
        for e in plan.etcd_clusters
    }
    machines[rollout.APISERVERS] = [
        (i.name, i.vm_name, i.zone, plan.control_plane.vm_size, apiserver_image) for i in plan.control_plane.instances
    ]
    return machines


def etcd_endpoints_output(role: str) -> str:
    """The stack output of one etcd cluster's client URLs: etcdMainEndpoints, etcdEventsEndpoints,
    etcdLeasesEndpoints."""
    return f"etcd{role.capitalize()}Endpoints"


class Cluster(pulumi.ComponentResource):
    apiserver_address: pulumi.Output[str | None]
    # role (main, events, leases where the stack has it) -> its members' client URLs
    etcd_endpoints: dict[str, list[str]]
    image_version_ids: dict[str, pulumi.Output[str]]
    node_image: NodeImage  # the node images: the first join timer waits for them
    scale_set_ids: dict[str, pulumi.Output[str]]
    tls: Tls  # credentials: kubeconfigs, the pools' join tokens
    ssh_keys: dict[str, list[pulumi.Input[str]]]  # role -> its authorized keys (kilonode.azure.ssh)
    control_plane: ControlPlane  # the apiservers and their load balancer
    restart_keys: pulumi.Output[dict[str, dict[str, dict[str, str]]]]
    # the pools' resource group, and what cloud-controller-manager and the autoscaler act as
    identities: ControllerIdentities
    network: Network
    egress_alerts: EgressAlerts  # Azure Monitor's alerts on the NAT gateways

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:azure:Cluster", name, None, opts)
        plan = args.plan
        child = pulumi.ResourceOptions(parent=self)

        # What every machine group reads (network, credentials, images) is set on self first:
        # the methods below take it from there. The network also gives the names and IDs the
        # cloud provider's config needs.
        self.network = Network(f"{name}-network", NetworkArgs(plan=plan), child)
        net = self.network
        # Azure Monitor's alerts on the NAT gateways, which no Prometheus target sees (egress_alerts)
        self.egress_alerts = EgressAlerts(f"{name}-egress-alerts", EgressAlertsArgs(
            plan=plan, resource_group_name=net.resource_group_name, nat_gateway_ids=net.nat_gateway_ids), child)
        self.identities = ControllerIdentities(
            f"{name}-controllers",
            ControllerIdentitiesArgs(
                cluster=plan.cluster, location=plan.location, resource_group_name=net.resource_group_name,
                resource_group_id=net.resource_group_id, node_resource_group=plan.node_resource_group,
                pools_nsg_id=net.pools_nsg_id, vnet_id=net.vnet_id, pool_subnet_ids=net.pool_subnet_ids,
                autoscaler=bool(plan.autoscaled_pools),
            ),
            child,
        )
        self.tls = Tls(f"{name}-tls", TlsArgs(plan=plan), child)
        # each role's SSH keys, none shared, no private half exported (kilonode.azure.ssh)
        self._ssh = ssh.SshKeys(f"{name}-ssh-key", plan, child)
        self.ssh_keys = self._ssh.keys
        # the storage accounts admit the machine running `pulumi up` by its public addresses
        deployer_ip_rules = storage_ip_rules(plan.network.deployer.cidrs) if plan.network.deployer else []
        # where every etcd member's scheduled snapshots go (kilonode.render.etcd_snapshot)
        backup = EtcdBackup(
            f"{name}-etcd-backup",
            EtcdBackupArgs(cluster=plan.cluster, location=plan.location, zones=plan.zones,
                           resource_group_name=net.resource_group_name, resource_group_id=net.resource_group_id,
                           etcd_subnet_id=net.etcd_subnet_id, deployer_ip_rules=deployer_ip_rules,
                           roles=tuple(e.role for e in plan.etcd_clusters)),
            child,
        )
        image = NodeImage(
            f"{name}-image",
            NodeImageArgs(
                cluster=plan.cluster,
                location=plan.location,
                resource_group_name=net.resource_group_name,
                resource_group_id=net.resource_group_id,
                images=gallery_images(plan),
                vhds=args.node_image_vhds,
                vhd_digests=args.node_image_digests,
                deployer_ip_rules=deployer_ip_rules,
            ),
            child,
        )
        self.image_version_ids = image.image_version_ids
        self.node_image = image

        gated = self._guarded_custom_data(name, args, backup)
        etcd = self._etcd_clusters(name, plan, gated, backup.identity_ids)
        self.control_plane = self._apiservers(name, plan, gated)
        # The kubeconfigs of whoever runs `pulumi up` name the endpoint it can reach.
        self.tls.through(self.control_plane.deployer_endpoint,
                         public=plan.network.deployer is not None and plan.network.deployer.public_frontend)
        self.scale_set_ids = self._node_pools(name, args)
        self._grant_scale_sets(plan)

        self.apiserver_address = self.control_plane.load_balancer_ip
        self.etcd_backup_account = backup.account_name
        self.etcd_backup_containers = backup.container_names
        self.etcd_snapshot_identity = backup.snapshot_identity
        self.etcd_endpoints = {role: cluster.client_endpoints for role, cluster in etcd.items()}
        self.register_outputs({
            "restartKeys": self.restart_keys,
            "apiserverAddress": self.apiserver_address,
            **{etcd_endpoints_output(role): endpoints for role, endpoints in self.etcd_endpoints.items()},
            "imageVersionIds": self.image_version_ids,
            "scaleSetIds": self.scale_set_ids,
        })

    def _grant_scale_sets(self, plan: ClusterPlan) -> None:
        """The controllers' rights scoped to scale sets, once they exist: the autoscaler on its node
        groups' only, Azure Disk CSI's controller's attach on its node plugin's pools' only."""
        self.identities.grant_node_groups({
            group.shard: self.scale_set_ids[group.shard]
            for pool in plan.autoscaled_pools for group in (pool.autoscaling.node_groups if pool.autoscaling else ())
        })
        self.identities.grant_disk_pools({
            shard.name: self.scale_set_ids[shard.name]
            for pool in plan.node_pools if pool.name in plan.disk_plugin_pools for shard in pool.shards
        })

    def _guarded_custom_data(self, name: str, args: ClusterArgs, backup: EtcdBackup) -> dict[str, pulumi.Output[str]]:
        """Control-plane custom data (host -> value), and the restart guard that holds it back:
        no etcd member or apiserver VM is created or changed until the update is known not to
        restart a majority of an etcd cluster, or every apiserver, at once
        (kilonode.azure.rollout). Sets self.restart_keys."""
        plan = args.plan
        machines = _control_plane_machines(plan)
        # beside the TLS files: the etcd members get the snapshot upload's account, their own
        # cluster's container and identity, the apiservers the key that encrypts Secrets in etcd
        extra = {m.name: backup.host_file(e.role) for e in plan.etcd_clusters for m in e.members}
        extra |= dict.fromkeys((i.name for i in plan.control_plane.instances),
                               secrets_encryption_file(f"{name}-tls-secrets-encryption-key", self.tls))
        data = {
            host: custom_data(_user_data(args, host), [*self.tls.host_files[host], extra[host]], host)
            for group in machines.values() for host, *_ in group
        }
        self.restart_keys = pulumi.Output.from_input({
            group: {
                vm_name: pulumi.Output.unsecret(data[host].apply(rollout.digest)).apply(
                    lambda d, size=size, zone=zone, os_image=os_image: rollout.restart_key(size, zone, os_image, d)
                )
                for host, vm_name, zone, size, os_image in members
            }
            for group, members in machines.items()
        })
        verdict = self._restart_verdict(f"{name}-last-deployment", args.own_stack, plan.acknowledge_restart)
        return {host: pulumi.Output.all(verdict, value).apply(lambda v: v[1]) for host, value in data.items()}

    def _etcd_clusters(self, name: str, plan: ClusterPlan, gated: Mapping[str, pulumi.Output[str]],
                       backup_identity_ids: Mapping[str, pulumi.Output[str]]) -> dict[str, EtcdCluster]:
        """role ("main", "events", "leases" where the stack has it) -> its etcd cluster, whose VMs
        carry that cluster's snapshot identity and no other (kilonode.azure.backup)."""
        return {
            e.role: EtcdCluster(
                f"{name}-etcd-{e.role}",
                EtcdClusterArgs(
                    etcd=e,
                    cluster=plan.cluster,
                    location=plan.location,
                    resource_group_name=self.network.resource_group_name,
                    subnet_id=self.network.etcd_subnet_id,
                    custom_data={m.name: gated[m.name] for m in e.members},
                    ssh_public_keys=self.ssh_keys[ssh.etcd_role(e.role)],
                    encryption_at_host=plan.encryption_at_host,
                    image_version_id=self.image_version_ids[ETCD_IMAGE],
                    public_ips=plan.network.public_ips_on_control_plane,
                    teardown=plan.teardown,
                    identity_id=backup_identity_ids[e.role],
                ),
                pulumi.ResourceOptions(parent=self),
            )
            for e in plan.etcd_clusters
        }

    def _apiservers(self, name: str, plan: ClusterPlan,
                    gated: Mapping[str, pulumi.Output[str]]) -> ControlPlane:
        return ControlPlane(
            f"{name}-apiserver",
            ControlPlaneArgs(
                control_plane=plan.control_plane,
                cluster=plan.cluster,
                location=plan.location,
                zones=plan.zones,
                resource_group_name=self.network.resource_group_name,
                resource_group_id=self.network.resource_group_id,
                subnet_id=self.network.control_plane_subnet_id,
                custom_data={i.name: gated[i.name] for i in plan.control_plane.instances},
                ssh_public_keys=self.ssh_keys[ssh.APISERVERS],
                encryption_at_host=plan.encryption_at_host,
                image_version_id=self.image_version_ids[CONTROL_PLANE_IMAGE],
                public_ips=plan.network.public_ips_on_control_plane,
                deployer=plan.network.deployer,
            ),
            pulumi.ResourceOptions(parent=self),
        )

    def _node_pools(self, name: str, args: ClusterArgs) -> dict[str, pulumi.Output[str]]:
        """The pools' scale sets, in the pools' own resource group: scale set name -> ID, over
        every pool. Only the controller pools' carry identities (the controllers run there);
        every other pool's nodes carry none (kilonode.azure.identity). Started wave by wave (the
        plan's components.joins, kilonode.azure.join_waves): each wave's scale sets wait for
        their timer, a chain that starts the waves the plan's gaps apart, and for the scale sets
        of the wave in_flight_waves before."""
        plan = args.plan
        controllers = {pool.name for pool in plan.controller_pools}
        identities = [self.identities.cloud_provider.id, self.identities.disk_csi.id]
        if self.identities.autoscaler is not None:
            identities.append(self.identities.autoscaler.id)
        pools = {
            pool.name: GpuNodePool(
                f"{name}-{pool.name}",
                GpuNodePoolArgs(
                    pool=pool,
                    cluster=plan.cluster,
                    location=plan.location,
                    resource_group_name=self.identities.node_resource_group_name,
                    subnet_id=self.network.pool_subnet_ids[pool.name],
                    image_version_id=self.image_version_ids[pool.name],
                    user_data={team: _user_data(args, pool.role(team)) for team in (None, *pool.teams)
                               if (pool.name, team) in self.tls.pool_node_files},
                    files={team: self.tls.pool_node_files[(pool.name, team)] for team in (None, *pool.teams)
                           if (pool.name, team) in self.tls.pool_node_files},
                    ssh_public_keys=self.ssh_keys[pool.name],
                    encryption_at_host=plan.encryption_at_host(pool.vm_size),
                    identity_ids=identities if pool.name in controllers else [],
                    nic_nsg_id=self.network.pool_nic_nsg_id,
                    live_capacities=args.live_capacities,
                ),
                pulumi.ResourceOptions(parent=self),
            )
            for pool in plan.node_pools
        }
        shards = {s.name: (pool.name, s) for pool in plan.node_pools for s in pool.shards}
        joins = plan.components.joins
        # the first timer starts when the first wave can: once what the scale sets read exists
        # (the pools' group and the identities, not the ControllerIdentities component: its
        # autoscaler role assignments are scoped to these scale sets and wait for them)
        gate = [self.network, *self.identities.ready, self.tls, self._ssh, self.node_image]
        timers = join_waves.JoinWaves(name, joins, gate, pulumi.ResourceOptions(parent=self))
        created: list[list[pulumi.Resource]] = []
        for k, wave in enumerate(joins.waves):
            waits = timers.after(k, created)
            created.append([pools[shards[n][0]].scale_set(shards[n][1], after=waits) for n in wave])
        for component in pools.values():
            component.done()
        # in the plan's pool and shard order, whatever the waves' order
        return {s.name: pools[pool.name].scale_set_ids[s.name] for pool in plan.node_pools for s in pool.shards}

    def _restart_verdict(self, name: str, own_stack: str | None, acknowledged: tuple[str, ...]) -> pulumi.Output[bool]:
        """True once the last deployment's restart keys (read through a StackReference to this
        very stack) and this run's allow the update; fails the run, naming machines, if not."""
        if own_stack is None:
            return pulumi.Output.from_input(True)
        last = pulumi.StackReference(name, stack_name=own_stack, opts=pulumi.ResourceOptions(parent=self))
        previous = last.get_output(rollout.RESTART_KEYS_OUTPUT)

        def check(values: list[Any]) -> bool:
            found = rollout.disruptions(values[0], values[1], frozenset(acknowledged))
            if found:
                raise pulumi.RunError("; ".join(d.message() for d in found))
            # An acknowledged group passes: the roll is to go one targeted run per machine, which
            # the program cannot check (it never sees the targets), so it says so, in preview too.
            for passed in rollout.acknowledged(values[0], values[1], frozenset(acknowledged)):
                pulumi.log.warn(passed.message(), resource=self)
            return True

        return pulumi.Output.all(previous, self.restart_keys).apply(check)
