"""The etcd clusters (main, events, and leases if set): members at fixed offsets in the etcd subnet."""

from __future__ import annotations

from ipaddress import IPv4Network

from kilonode.catalog.limits import limits
from kilonode.config.model import ClusterConfig, EtcdClusterConfig
from kilonode.plan.model import (
    EtcdClusterPlan,
    EtcdMember,
)
from kilonode.plan.resolve.disks import etcd_disks
from kilonode.plan.wellknown import (
    ETCD_CLIENT_PORT,
    ETCD_METRICS_PORT,
    ETCD_PEER_PORT,
)


def etcd_cluster(
    config: ClusterConfig, role: str, spec: EtcdClusterConfig, subnet: IPv4Network, first_offset: int
) -> EtcdClusterPlan:
    members = []
    for i in range(spec.members):
        ip = subnet.network_address + first_offset + i
        members.append(EtcdMember(
            name=f"etcd-{role}-{i}",
            vm_name=f"{config.name}-etcd-{role}-{i}",
            index=i,
            ip=ip,
            zone=config.zones[i % len(config.zones)],
            vm_size=spec.vm_size_overrides.get(i, spec.vm_size),
            client_url=f"https://{ip}:{ETCD_CLIENT_PORT}",
            peer_url=f"https://{ip}:{ETCD_PEER_PORT}",
            metrics_url=f"http://{ip}:{ETCD_METRICS_PORT}",
        ))
    return EtcdClusterPlan(
        role=role,  # type: ignore[arg-type]
        token=f"{config.name}-etcd-{role}",
        members=tuple(members),
        initial_cluster=",".join(f"{m.name}={m.peer_url}" for m in members),
        client_endpoints=tuple(m.client_url for m in members),
        quota_backend_bytes=spec.quota_backend_bytes,
        largest_write_bytes=limits().etcd.max_request_bytes.value + limits().etcd.kv_overhead_bytes.value,
        auto_compaction_retention=spec.auto_compaction_retention,
        snapshot_count=spec.snapshot_count,
        vm_size=spec.vm_size,
        local_disk=spec.local_disk,
        disks=etcd_disks([spec.vm_size, *spec.vm_size_overrides.values()], spec.local_disk),
        # 2,500-node post: etcd's data dir on the local SSD (~200 us fsync vs ~2 ms).
        data_dir=f"{spec.local_disk.mount_point}/etcd",
    )
