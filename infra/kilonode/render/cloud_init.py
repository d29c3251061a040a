"""cloud-init user-data tying a role together: mount the local SSD, write files, start units.

Azure passes it as custom data; locally a NoCloud seed carries the same text.
"""

from __future__ import annotations

from typing import Any

from kilonode.config.model import LocalDiskConfig
from kilonode.render.common import GENERATED
from kilonode.render.files import USER_DATA, HostFiles
from kilonode.yamlio import block_yaml

LOCAL_SSD_LABEL = "kn-local-ssd"


def _local_disk(disk: LocalDiskConfig, alias: str | None) -> dict[str, Any]:
    """disk_setup/fs_setup/mounts for the local (temp) SSD, formatted once per instance and
    mounted with nofail so a missing disk leaves the node up for diagnosis rather than stuck in
    emergency mode; the units that need it fail (AssertPathIsMountPoint) without the mount.

    On Azure, cloud-init's datasource adds its own temp-disk config whenever the disk exists
    (cloud-init 22.4.2, DataSourceAzure.py BUILTIN_CLOUD_EPHEMERAL_DISK_CONFIG:
    disk_setup.ephemeral0 {gpt, layout [100], overwrite}, fs_setup ext4 on ephemeral0.1), and
    cc_mounts adds ephemeral0 -> /mnt unless a mounts entry names the same device (cc_mounts.py
    handle(), "add them only if no other entry has the same device name"). User-data wins key
    by key (helpers.py ConfigMerger: user-data before datasource config; dicts merge, lists are
    kept whole): so the temp disk is named by the same key, ephemeral0, and its partition
    ephemeral0.1 -- our disk_setup replaces the built-in's, our fs_setup list replaces its list,
    and our mounts entry for ephemeral0.1 is the same device as the default's, which is then not
    added. One gpt partition, as the built-in would make, formatted and mounted once.
    A device the stack names itself (the local verify VM's /dev/vdb under NoCloud, which has
    no such built-in) is formatted whole, as named."""
    if alias:
        partition = f"{alias}.1"
        return {
            "disk_setup": {alias: {"table_type": "gpt", "layout": [100], "overwrite": True}},
            "fs_setup": [{"label": LOCAL_SSD_LABEL, "filesystem": disk.filesystem,
                          "device": partition, "overwrite": True}],
            "mounts": [[partition, disk.mount_point, disk.filesystem, "defaults,nofail", "0", "2"]],
        }
    return {
        "fs_setup": [{
            "label": LOCAL_SSD_LABEL,
            "filesystem": disk.filesystem,
            "device": disk.device,
            "partition": "none",
            "overwrite": True,
        }],
        "mounts": [[disk.device, disk.mount_point, disk.filesystem, "defaults,nofail", "0", "2"]],
    }


def user_data(
    *,
    role: str,
    local_disk: LocalDiskConfig,
    local_disk_alias: str | None,
    files: HostFiles,
    restart_units: list[str],
    start_units: list[str],
    apply_sysctls: bool = False,
    local_disk_unit: str | None = None,
) -> str:
    """`local_disk_alias`: cloud-init's name for the local disk when it is Azure's temp disk
    (the plan's DisksPlan.local_disk_alias). `local_disk_unit`: the unit that makes and mounts
    the local disk itself (a pool's NVMe disks, kilonode-local-disk.service); cloud-init then
    leaves the disks alone and enables that unit (every later boot runs it) before it restarts
    the runtime."""
    runcmd: list[list[str]] = []
    if apply_sysctls:
        # A sysctl.d file written now is not live yet: systemd-sysctl ran earlier in boot.
        runcmd.append(["sysctl", "--system"])
    runcmd.append(["systemctl", "daemon-reload"])
    if local_disk_unit:
        runcmd.append(["systemctl", "enable", "--now", local_disk_unit])
    runcmd += [["systemctl", "restart", unit] for unit in restart_units]
    if start_units:
        runcmd.append(["systemctl", "enable", "--now", *start_units])
    document: dict[str, Any] = {}
    if local_disk_unit is None:
        document |= _local_disk(local_disk, local_disk_alias)
    elif local_disk_alias:
        # The pool's NVMe disks are mounted at the local-disk mount point (below /mnt) by that
        # unit; Azure's built-in config would mount the size's temp disk over /mnt, hiding it
        # whenever it mounts later. An entry naming ephemeral0 alone drops that default
        # (cc_mounts.py at 22.4.2: "an entry ... containing fs_spec ... but no mountpoint (i.e.
        # [ swap ] ...)"; the default is skipped as "already previously included"). The
        # built-in still formats the temp disk, which stays unused. Under NoCloud ephemeral0
        # names no device and the entry is ignored.
        document["mounts"] = [[local_disk_alias]]
    document |= {
        # cc_locale fails on minimal images without `locales`; C.UTF-8 is always there.
        "locale": "C.UTF-8",
        # RSA host keys are the slowest first-boot step and add nothing over ed25519.
        "ssh_genkeytypes": ["ed25519", "ecdsa"],
        "ssh_pwauth": False,
        "write_files": [
            {
                "path": f"/{path}",
                "owner": "root:root",
                "permissions": f"0{file.mode:o}",
                "content": file.content,
            }
            for path, file in sorted(files.items())
            if path != USER_DATA
        ],
        "runcmd": runcmd,
    }
    header = f"#cloud-config\n# {GENERATED}\n# Role: {role}\n"
    return header + block_yaml(document)
