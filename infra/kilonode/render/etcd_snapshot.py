"""Scheduled etcd snapshots on every member of every etcd cluster: a timer, the oneshot unit
it starts and the config of the script that unit runs.

The timer fires on every member at the same wall-clock minutes; the script asks the local
member whether it leads the cluster and only the leader takes the snapshot (one per cluster
per interval). It saves it atomically to a directory on the local SSD, keeps the newest
defaults.ETCD_SNAPSHOT_KEEP_LOCAL there, and in Azure uploads it, encrypted and with a signed
manifest, to its etcd cluster's own container in the cluster's backup storage account
(kilonode.azure.backup) with that etcd cluster's user-assigned identity. The Azure half of its
config (blob endpoint, container, the identity's client ID) exists only once Azure created
them: the Pulumi program delivers it as defaults.ETCD_SNAPSHOT_AZURE_CONFIG, and without that
file (a local rehearsal) the script keeps local snapshots only. Rendering stays pure.

The script is a node program (kilonode/node/etcd_snapshot.py, linted with the package) that the
etcd image carries (kilonode.node.ship ETCD_SNAPSHOT): values live in the config, not in the
code, and the member's custom data holds only the units and the config. The restore is
docs/runbooks/etcd-restore-from-snapshot.md.
"""

from __future__ import annotations

from typing import Any

from kilonode.node.ship import ETCD_SNAPSHOT, PYTHON
from kilonode.plan import defaults, wellknown
from kilonode.plan.model import ClusterPlan, EtcdClusterPlan, EtcdMember
from kilonode.render.common import render_template, systemd_exec, to_json
from kilonode.render.files import HostFiles, RenderedFile

SERVICE = "kilonode-etcd-snapshot.service"
TIMER = "kilonode-etcd-snapshot.timer"
SERVICE_PATH = f"etc/systemd/system/{SERVICE}"
TIMER_PATH = f"etc/systemd/system/{TIMER}"
SCRIPT_PATH = ETCD_SNAPSHOT.machine_path.lstrip("/")  # in the etcd image, not rendered
CONFIG_PATH = "etc/kilonode/etcd-snapshot.json"
# What the member's cloud-init enables and starts (the lead adds it to render_etcd_member's
# start_units): the timer; the service only ever runs from it (or by hand).
UNITS_TO_ENABLE = (TIMER,)

# The etcd image carries etcd, etcdctl and etcdutl of the pinned release here
# (node-image/binaries.toml, component etcd); kilonode.render.etcd names the same directory.
BIN = "/usr/local/bin"
ETCDCTL = f"{BIN}/etcdctl"
ETCDUTL = f"{BIN}/etcdutl"
# Debian's age (node-image/packages/control.txt): encrypts each snapshot before it is uploaded.
AGE = "/usr/bin/age"
# Every member also listens for clients on 127.0.0.1 (kilonode.render.etcd listen-client-urls),
# and its server certificate names 127.0.0.1 (kilonode.azure.tls).
LOCAL_ENDPOINT = f"https://127.0.0.1:{wellknown.ETCD_CLIENT_PORT}"
# etcdctl snapshot save streams the whole DB: up to the 8 GiB quota at some hundred MB/s; the
# unit's own timeout (defaults.ETCD_SNAPSHOT_TIMEOUT_S) bounds the run as a whole.
SAVE_TIMEOUT_S = 300
# One blob request (a block of defaults.ETCD_SNAPSHOT_BLOCK_BYTES) may take this long.
REQUEST_TIMEOUT_S = 120


def snapshot_directory(cluster: EtcdClusterPlan) -> str:
    """On the local SSD beside the data dir: the OS disk is the image's few GiB."""
    return f"{cluster.local_disk.mount_point}/etcd-snapshots"


def on_calendar(interval_min: int) -> str:
    """systemd OnCalendar for every `interval_min` minutes from the full hour, the same
    wall-clock minutes on every member (so the interval must divide the hour)."""
    if not 0 < interval_min <= 60 or 60 % interval_min:
        raise ValueError(f"a snapshot interval of {interval_min} min does not divide the hour")
    return "hourly" if interval_min == 60 else f"*:0/{interval_min}"


def snapshot_config(plan: ClusterPlan, cluster: EtcdClusterPlan, member: EtcdMember) -> dict[str, Any]:
    return {
        "cluster": plan.cluster,
        "role": cluster.role,
        "member": member.name,
        "endpoint": LOCAL_ENDPOINT,
        # The member's own server certificate as the client (it carries clientAuth); the
        # cluster's CA signed it and is in the member's --trusted-ca-file. Its key also signs each
        # uploaded snapshot's manifest, which the restore checks against that CA.
        "caFile": wellknown.ETCD_CA,
        "certFile": wellknown.ETCD_SERVER_CERT,
        "keyFile": wellknown.ETCD_SERVER_KEY,
        "etcdctl": ETCDCTL,
        "etcdutl": ETCDUTL,
        "age": AGE,
        "directory": snapshot_directory(cluster),
        "keep": defaults.ETCD_SNAPSHOT_KEEP_LOCAL,
        "saveTimeoutSeconds": SAVE_TIMEOUT_S,
        # In Azure: the file naming this cluster's own container and identity (kilonode.azure.backup).
        "azureConfig": defaults.ETCD_SNAPSHOT_AZURE_CONFIG,
        "blockBytes": defaults.ETCD_SNAPSHOT_BLOCK_BYTES,
        "requestTimeoutSeconds": REQUEST_TIMEOUT_S,
    }


def snapshot_files(plan: ClusterPlan, cluster: EtcdClusterPlan, member: EtcdMember) -> HostFiles:
    """The member's snapshot job: timer, service and config, keyed by host path (the script is
    the etcd image's)."""
    directory = snapshot_directory(cluster)
    values = {"member": member.name, "role": cluster.role, "cluster": plan.cluster}
    return {
        TIMER_PATH: RenderedFile(render_template(
            TIMER_PATH, interval_min=defaults.ETCD_SNAPSHOT_INTERVAL_MIN,
            on_calendar=on_calendar(defaults.ETCD_SNAPSHOT_INTERVAL_MIN), **values,
        )),
        SERVICE_PATH: RenderedFile(render_template(
            SERVICE_PATH,
            mount_point=cluster.local_disk.mount_point,
            directory=directory,
            etcdctl=ETCDCTL,
            timeout_s=defaults.ETCD_SNAPSHOT_TIMEOUT_S,
            exec_start=systemd_exec(f"{PYTHON} /{SCRIPT_PATH}", [("config", f"/{CONFIG_PATH}")]),
            **values,
        )),
        CONFIG_PATH: RenderedFile(to_json(snapshot_config(plan, cluster, member))),
    }
