"""etcd member artefacts (of every cluster: main, events, leases): the unit with its flags, the boot path
that lets a member with a blank data dir rejoin by itself (etcd-join), cloud-init."""

from __future__ import annotations

from kilonode.plan import defaults, wellknown
from kilonode.plan.model import ClusterPlan, EtcdClusterPlan, EtcdMember
from kilonode.render.cert_metrics import UNITS_TO_ENABLE as CERT_METRICS_UNITS
from kilonode.render.cert_metrics import cert_metrics_files
from kilonode.render.cloud_init import user_data
from kilonode.render.common import Flag, render_template, systemd_exec
from kilonode.render.etcd_snapshot import UNITS_TO_ENABLE as SNAPSHOT_UNITS
from kilonode.render.etcd_snapshot import snapshot_files
from kilonode.render.files import USER_DATA, HostFiles, RenderedFile

# The pinned etcd release (node-image/binaries.toml, role etcd) that the etcd image carries;
# etcdctl comes from the same release tarball, into the same directory.
ETCD_BINARY = "/usr/local/bin/etcd"
ETCDCTL_BINARY = "/usr/local/bin/etcdctl"
ETCD_UNIT = "etc/systemd/system/etcd.service"
# Run by the unit before etcd (ExecStartPre=): decides how a member with a blank data dir
# starts (templates/usr/local/lib/kilonode/etcd-join.j2 says how).
ETCD_JOIN = "usr/local/lib/kilonode/etcd-join"
# etcd.service's RuntimeDirectory= (/run/etcd: made for each start, removed at each stop):
# where etcd-join leaves its verdict for this start only.
RUNTIME_DIRECTORY = "etcd"
JOIN_ENV_FILE = f"/run/{RUNTIME_DIRECTORY}/join.env"
# etcd.service's StateDirectory= (/var/lib/kilonode-etcd, on the OS disk, which a
# deallocation keeps): the marker the unit writes once etcd is ready (ExecStartPost=).
STATE_DIRECTORY = "kilonode-etcd"
READY_MARKER = f"/var/lib/{STATE_DIRECTORY}/ready"
# The flag etcd-join decides. etcd reads any flag missing from its command line from
# ETCD_<FLAG> (server/etcdmain/config.go configFromCmdLine -> pkg/flags SetFlagsFromEnv),
# and a setting given both ways is fatal ("conflicting environment variable ... is shadowed
# by corresponding command-line flag", pkg/flags verifyEnv, 3.4.23 and 3.5.33): so it is
# never a flag here, only the unit's Environment= default and etcd-join's file.
INITIAL_CLUSTER_STATE_ENV = "ETCD_INITIAL_CLUSTER_STATE"


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
        # No --initial-cluster-state: ETCD_INITIAL_CLUSTER_STATE, from the unit and etcd-join.
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
        # AEAD suites only, for clients and peers (kilonode.plan.defaults.TLS_CIPHER_SUITES)
        ("cipher-suites", ",".join(defaults.TLS_CIPHER_SUITES)),
        # 2,500-node post: the 2 GB default quota stopped all writes past 1,000 nodes.
        ("quota-backend-bytes", cluster.quota_backend_bytes),
        ("auto-compaction-mode", "periodic"),
        ("auto-compaction-retention", cluster.auto_compaction_retention),
        ("snapshot-count", cluster.snapshot_count),
    ]


def render_etcd_join(cluster: EtcdClusterPlan, member: EtcdMember) -> str:
    return render_template(
        ETCD_JOIN,
        name=member.name,
        role=cluster.role,
        peer_url=member.peer_url,
        # the other members' client URLs: where it asks whether the cluster holds quorum
        others=" ".join(m.client_url for m in cluster.members if m.name != member.name),
        data_dir=cluster.data_dir,
        env_file=JOIN_ENV_FILE,
        ready_marker=READY_MARKER,
        etcdctl=ETCDCTL_BINARY,
        # its own server certificate (clientAuth too, kilonode.azure.tls) and its cluster's CA
        cacert=wellknown.ETCD_CA,
        cert=wellknown.ETCD_SERVER_CERT,
        key=wellknown.ETCD_SERVER_KEY,
    )


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
            join_script=f"/{ETCD_JOIN}",
            state_env=INITIAL_CLUSTER_STATE_ENV,
            join_env=JOIN_ENV_FILE,
            runtime_directory=RUNTIME_DIRECTORY,
            state_directory=STATE_DIRECTORY,
            ready_marker=READY_MARKER,
            exec_start=systemd_exec(ETCD_BINARY, etcd_flags(cluster, member)),
        ), mode=0o600),  # CIS 1.1.7: the unit with etcd's command line, root's alone
        ETCD_JOIN: RenderedFile(render_etcd_join(cluster, member), mode=0o755),
        # scheduled snapshots, taken by the cluster's leader (kilonode.render.etcd_snapshot)
        **snapshot_files(plan, cluster, member),
        # its certificates' expiry, for the alert (kilonode.render.cert_metrics)
        **cert_metrics_files(plan, member.name, str(member.ip)),
    }
    files[USER_DATA] = RenderedFile(user_data(
        role=f"etcd member {member.name} of cluster {plan.cluster}",
        local_disk=cluster.local_disk,
        local_disk_alias=cluster.disks.local_disk_alias,
        files=files,
        restart_units=[],
        # the etcd image has the binary and the etcd user: nothing is installed at boot
        start_units=["etcd.service", *SNAPSHOT_UNITS, *CERT_METRICS_UNITS],
    ))
    return dict(sorted(files.items()))
