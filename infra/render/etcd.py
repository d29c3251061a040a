"""etcd member artefacts (main and events clusters): the unit with its flags, cloud-init."""

from __future__ import annotations

from kilonode.plan import wellknown
from kilonode.plan.model import ClusterPlan, EtcdClusterPlan, EtcdMember
from kilonode.render.cloud_init import user_data
from kilonode.render.common import Flag, render_template, systemd_exec
from kilonode.render.files import USER_DATA, HostFiles, RenderedFile

# The pinned etcd release (node-image/binaries.toml, role etcd) that the etcd image carries.
ETCD_BINARY = "/usr/local/bin/etcd"
ETCD_UNIT = "etc/systemd/system/etcd.service"


def etcd_flags(cluster: EtcdClusterPlan, member: EtcdMember) -> list[Flag]:
    return [
        ("name", member.name),
        # 2,500-node post: data on the local SSD.
        ("data-dir", cluster.data_dir),
        ("listen-peer-urls", member.peer_url),
        ("listen-client-urls", f"{member.client_url},https://127.0.0.1:2379"),
        ("advertise-client-urls", member.client_url),
        ("initial-advertise-peer-urls", member.peer_url),
        ("initial-cluster", cluster.initial_cluster),
        # "new" at the first bootstrap; "existing" for a member that rejoins with an empty
        # data dir (stack: etcd.<cluster>.rejoining). Ignored once the data dir holds a member.
        ("initial-cluster-state", member.initial_cluster_state),
        ("initial-cluster-token", cluster.token),
        ("listen-metrics-urls", f"{member.metrics_url},http://127.0.0.1:2381"),
        # CIS 2.1-2.6: TLS for clients and peers with client-cert auth, never auto-TLS.
        ("cert-file", wellknown.ETCD_SERVER_CERT),
        ("key-file", wellknown.ETCD_SERVER_KEY),
        ("client-cert-auth", True),
        ("trusted-ca-file", wellknown.ETCD_CLIENT_CA),
        ("auto-tls", False),
        ("peer-cert-file", wellknown.ETCD_PEER_CERT),
        ("peer-key-file", wellknown.ETCD_PEER_KEY),
        ("peer-client-cert-auth", True),
        ("peer-trusted-ca-file", wellknown.ETCD_CA),
        ("peer-auto-tls", False),
        # 2,500-node post: the 2 GB default quota stopped all writes past 1,000 nodes.
        ("quota-backend-bytes", cluster.quota_backend_bytes),
        ("auto-compaction-mode", "periodic"),
        ("auto-compaction-retention", cluster.auto_compaction_retention),
        ("snapshot-count", cluster.snapshot_count),
    ]


def render_etcd_member(plan: ClusterPlan, cluster: EtcdClusterPlan, member: EtcdMember) -> HostFiles:
    files: HostFiles = {
        ETCD_UNIT: RenderedFile(render_template(
            ETCD_UNIT,
            member=member.name,
            role=cluster.role,
            cluster=plan.cluster,
            mount_point=cluster.local_disk.mount_point,
            data_dir=cluster.data_dir,
            binary=ETCD_BINARY,
            exec_start=systemd_exec(ETCD_BINARY, etcd_flags(cluster, member)),
        )),
    }
    files[USER_DATA] = RenderedFile(user_data(
        role=f"etcd member {member.name} of cluster {plan.cluster}",
        local_disk=cluster.local_disk,
        files=files,
        restart_units=[],
        # the etcd image has the binary and the etcd user: nothing is installed at boot
        start_units=["etcd.service"],
    ))
    return dict(sorted(files.items()))
