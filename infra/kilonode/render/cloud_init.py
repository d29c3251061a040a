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


def user_data(
    *,
    role: str,
    local_disk: LocalDiskConfig,
    files: HostFiles,
    restart_units: list[str],
    start_units: list[str],
    apply_sysctls: bool = False,
    local_disk_unit: str | None = None,
) -> str:
    """`local_disk_unit`: the unit that makes and mounts the local disk itself (a pool's
    NVMe disks, kilonode-local-disk.service); cloud-init then leaves the disks alone and
    enables that unit (every later boot runs it) before it restarts the runtime."""
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
        disk = local_disk.device
        # The local (temp) SSD, formatted once per instance and mounted with nofail so a
        # missing disk leaves the node up for diagnosis rather than stuck in emergency
        # mode; the units that need it refuse to start without the mount.
        document["fs_setup"] = [{
            "label": LOCAL_SSD_LABEL,
            "filesystem": local_disk.filesystem,
            "device": disk,
            "partition": "none",
            "overwrite": True,
        }]
        document["mounts"] = [[disk, local_disk.mount_point, local_disk.filesystem, "defaults,nofail", "0", "2"]]
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
