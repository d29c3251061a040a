"""The apiservers and their load balancer."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

from kilonode.config.checks import CLUSTER_DNS_OFFSET, KUBERNETES_SERVICE_OFFSET
from kilonode.config.model import ClusterConfig
from kilonode.plan import defaults
from kilonode.plan.model import (
    ApiserverInstance,
    ControlPlanePlan,
    EtcdClusterPlan,
)
from kilonode.plan.resolve.disks import apiserver_disks, audit_log_plan
from kilonode.plan.wellknown import (
    APISERVER_PORT,
    ETCD_OVERRIDE_RESOURCES,
)


def etcd_servers_overrides(others: tuple[EtcdClusterPlan, ...]) -> str:
    """--etcd-servers-overrides: each cluster but main with the resource it holds, in the plan's
    order (events, then leases): `group/resource#server;server`, comma separated
    (kilonode.plan.wellknown.ETCD_OVERRIDE_RESOURCES says where the syntax is read)."""
    return ",".join(f"{ETCD_OVERRIDE_RESOURCES[c.role]}#" + ";".join(c.client_endpoints) for c in others)


def control_plane_plan(
    config: ClusterConfig, subnet: IPv4Network, main: EtcdClusterPlan, others: tuple[EtcdClusterPlan, ...]
) -> ControlPlanePlan:
    """`others`: the etcd clusters besides main (events, and leases where the stack has it)."""
    api = config.apiserver
    instances = tuple(
        ApiserverInstance(
            name=f"apiserver-{i}",
            vm_name=f"{config.name}-apiserver-{i}",
            index=i,
            ip=subnet.network_address + defaults.APISERVER_FIRST_OFFSET + i,
            zone=config.zones[i % len(config.zones)],
        )
        for i in range(api.replicas)
    )
    lb_ip = subnet.network_address + defaults.LB_FRONTEND_OFFSET
    service_cidr = config.network.service_cidr
    disks = apiserver_disks(api)
    return ControlPlanePlan(
        instances=instances,
        load_balancer_ip=lb_ip,
        endpoint=f"https://{lb_ip}:{APISERVER_PORT}",
        etcd_servers=",".join(main.client_endpoints),
        # 7,500-node post: Events in their own etcd; with etcd.leases every Lease in its own too
        # (as kops shards coordination.k8s.io/leases).
        etcd_servers_overrides=etcd_servers_overrides(others),
        service_cidr=service_cidr,
        kubernetes_service_ip=IPv4Address(int(service_cidr.network_address) + KUBERNETES_SERVICE_OFFSET),
        cluster_dns_ip=IPv4Address(int(service_cidr.network_address) + CLUSTER_DNS_OFFSET),
        audit_log=audit_log_plan(api, disks),
        vm_size=api.vm_size,
        local_disk=api.local_disk,
        disks=disks,
    )
