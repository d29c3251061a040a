"""resolve(config) -> ClusterPlan: pure and deterministic, no I/O, no Pulumi. One module per
concern (network, budgets, etcd, control plane, pools, components); this one composes them.

Its cost grows with pools and scale-set shards, never with the node count: nothing here
enumerates nodes.
"""

from __future__ import annotations

from typing import Any

from kilonode.config.model import CONTROL_PLANE_IMAGE, ETCD_IMAGE, ClusterConfig
from kilonode.config.sysctl_profile import SysctlProfile
from kilonode.plan import defaults
from kilonode.plan.model import ClusterPlan, DeployerPlan, NetworkPlan
from kilonode.plan.resolve.alertmanager import alerting_plan, egress_alerts
from kilonode.plan.resolve.budgets import (
    acknowledged_warnings,
    budget_problems,
    budget_warnings,
    budgets_of,
    gallery_replicas,
    growth,
    location_warnings,
    unrecorded_warnings,
)
from kilonode.plan.resolve.clients import clients_plan
from kilonode.plan.resolve.components import components_plan, unused_archive_problems
from kilonode.plan.resolve.control_plane import control_plane_plan
from kilonode.plan.resolve.disks import disk_tiers
from kilonode.plan.resolve.etcd import etcd_cluster
from kilonode.plan.resolve.join_tokens import join_tokens
from kilonode.plan.resolve.monitoring import NO_POOL_WARNING, prometheus_plan
from kilonode.plan.resolve.network import allocate_subnets, nat_gateways, pool_capacity
from kilonode.plan.resolve.pools import node_pool_plan, place_capacity, sysctls_of
from kilonode.plan.resolve.quota import vcpu_quota, vm_size_facts
from kilonode.problems import PlanError, Problem

__all__ = ["gallery_replicas", "pool_capacity", "resolve"]


def resolve(config: ClusterConfig, sysctl_profile: SysctlProfile) -> ClusterPlan:
    problems: list[Problem] = []
    budgets = budgets_of(config)
    problems += budget_problems(config, budgets)
    gateways, nat_problems = nat_gateways(config)
    problems += nat_problems
    problems += unused_archive_problems(config)
    if problems:
        raise PlanError(problems)

    subnets = allocate_subnets(config)  # raises PlanError when the VNet cannot hold them
    etcd_main = etcd_cluster(config, "main", config.etcd.main, subnets.etcd, defaults.ETCD_MAIN_FIRST_OFFSET)
    etcd_events = etcd_cluster(
        config, "events", config.etcd.events, subnets.etcd, defaults.ETCD_EVENTS_FIRST_OFFSET
    )
    etcd_leases = None if config.etcd.leases is None else etcd_cluster(
        config, "leases", config.etcd.leases, subnets.etcd, defaults.ETCD_LEASES_FIRST_OFFSET
    )
    etcd = (etcd_main, etcd_events, *((etcd_leases,) if etcd_leases else ()))
    control_plane = control_plane_plan(config, subnets.control_plane, etcd_main, etcd[1:])
    sysctls = sysctls_of(config, sysctl_profile)
    pools = tuple(
        node_pool_plan(config, pool, subnets.pools[pool.name], sysctls) for pool in config.node_pools
    )
    pools, teams = place_capacity(config, pools)
    prometheus = prometheus_plan(config, pools, etcd, control_plane)
    sizes = vm_size_facts(etcd, control_plane, pools)
    components = components_plan(config, pools)
    return ClusterPlan(
        cluster=config.name,
        location=config.location,
        zones=config.zones,
        kubernetes_version=config.kubernetes_version,
        control_plane_emulated_version=config.control_plane_emulated_version,
        network=network_plan(config, subnets, gateways),
        etcd_main=etcd_main,
        etcd_events=etcd_events,
        etcd_leases=etcd_leases,
        control_plane=control_plane,
        node_pools=pools,
        gallery_replicas=gallery_replicas(config),
        node_image_version=config.node_image.version,
        pool_image_versions={name: image.version for name, image in sorted(config.node_image.pools.items())},
        image_previous=image_previous(config),
        teardown=config.teardown,
        etcd_image_version=config.etcd_image.version,
        control_plane_image_version=config.control_plane_image.version,
        # A handful of VMs, created one group at a time: the production floor is enough.
        role_image_replicas=config.node_image.min_replicas,
        acknowledge_restart=config.acknowledge_restart,
        certificate_generations=dict(sorted(config.certificate_generations.items())),
        admin_generation=config.admin_generation,
        join_tokens=join_tokens(config, pools),
        teams=teams.teams,
        budgets=tuple(budgets),
        disk_tiers=disk_tiers(),
        warnings=tuple(
            location_warnings(config) + budget_warnings(budgets) + unrecorded_warnings(subnets.unrecorded)
            + acknowledged_warnings(config) + node_image_warnings(config)
            + list(teams.warnings) + ([] if prometheus else [NO_POOL_WARNING])
        ),
        components=components,
        controller_clients=clients_plan(config, pools, components.joins),
        prometheus=prometheus,
        alerting=alerting_plan(config),
        egress_alerts=egress_alerts(),
        vm_sizes=sizes,
        vcpu_quota=vcpu_quota(etcd, control_plane, [(p.vm_size, growth(p)) for p in config.node_pools], sizes),
        ssh_keys=dict(config.ssh_keys),
    )


def network_plan(config: ClusterConfig, subnets: Any, gateways: Any) -> NetworkPlan:
    """The VNet, its control-plane and etcd subnets, who may reach the apiservers, and the NAT gateways."""
    net = config.network
    return NetworkPlan(
        vnet_cidr=net.vnet_cidr,
        control_plane_subnet=subnets.control_plane,
        etcd_subnet=subnets.etcd,
        apiserver_allowed_cidrs=net.apiserver_allowed_cidrs,
        admin_cidr=net.admin_cidr,
        public_ips_on_control_plane=net.public_ips_on_control_plane,
        deployer=None if config.deployer is None else DeployerPlan(
            network=config.deployer.network, cidrs=config.deployer.cidrs, vnet_id=config.deployer.vnet_id,
        ),
        unrecorded=subnets.unrecorded,
        nat_gateways=gateways,
    )


def node_image_warnings(config: ClusterConfig) -> list[str]:
    """nodeImage.version that no pool boots: every pool has its own nodeImage.pools entry (of_pool
    prefers it), and the stack-wide version is none of theirs, current or previous. Raising it (the
    documented way to roll a new image to every pool) then changes nothing, and `kilonode diff`
    finds no risk in it. A minor upgrade's pool steps leave such entries until its cleanup."""
    images = config.node_image
    pools = [pool.name for pool in config.node_pools]
    if not pools or any(name not in images.pools for name in pools):
        return []
    own = {images.pools[name].version for name in pools} | {images.pools[name].previous for name in pools}
    if images.version in own:
        return []
    listed = ", ".join(f"{name}: {images.pools[name].version}" for name in pools)
    return [f"nodeImage.version {images.version} reaches no pool: every pool has its own nodeImage.pools entry "
            f"({listed}), which wins, so raising nodeImage.version rolls nothing. Raise each pool's entry, or, "
            "with every pool at one version, set nodeImage.version to it and remove nodeImage.pools"]


def image_previous(config: ClusterConfig) -> dict[str, str]:
    """Image name (a pool's, a role's) -> the version before its current one, kept published."""
    found = {pool.name: previous for pool in config.node_pools
             if (previous := config.node_image.of_pool(pool.name).previous) is not None}
    for role, image in ((ETCD_IMAGE, config.etcd_image), (CONTROL_PLANE_IMAGE, config.control_plane_image)):
        if image.previous is not None:
            found[role] = image.previous
    return found
