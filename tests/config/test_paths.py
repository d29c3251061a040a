"""Local disks, mount points and the audit log stay off the OS disk, kernel devices, and every
folder the node's programs keep files in. The protected folders are checked against what kilonode
itself puts on a node (every rendered file, every folder its files name, every pinned binary), so
a new program's folder cannot be forgotten; the refusals are hostile files (sem-path-*)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kilonode.catalog import binaries
from kilonode.config import load_stack
from kilonode.config.values import _device, _hidden, _mount_point
from kilonode.plan import plan_stack
from kilonode.render import render_tree
from tests.conftest import StackWriter, shipped_cluster_value

# an absolute path inside a rendered file's text
HOST_PATH = re.compile(r"(?<![\w.:/-])/(?:var|opt|srv|home|root|tmp|mnt|data|etc|usr|run|lib)(?:/[A-Za-z0-9._@-]+)+")


def _node_paths(stack: str) -> set[str]:
    """Every path on a node that kilonode's render writes or names, outside the stack's local disks."""
    loaded = load_stack(stack)
    plan = plan_stack(loaded)
    disks = (loaded.config.apiserver.local_disk, *(c.local_disk for _, c in loaded.config.etcd.clusters()))
    mounts = {pool.local_storage.mount_point for pool in plan.node_pools} | {d.mount_point for d in disks}
    found = set()
    for name, rendered in render_tree(loaded.config, plan).items():
        if name.count("/") >= 1 and not name.endswith("/user-data"):
            found.add("/" + name.split("/", 1)[1])
        content = getattr(rendered, "content", rendered)
        text = content.decode("utf-8", "replace") if isinstance(content, bytes) else str(content)
        found |= set(HOST_PATH.findall(text))
    return {p for p in found if not any(p == m or p.startswith(m + "/") for m in mounts)}


@pytest.mark.parametrize("stack", ["local", "research-2500"])
def test_every_folder_kilonode_puts_files_in_is_refused_as_a_mount_point(stack: str) -> None:
    paths = _node_paths(stack)
    for component in binaries.load().components.values():
        paths |= {f.path if hasattr(f, "path") else str(f) for f in component.expanded_files("1.34.2")}
    open_ = sorted(p for p in paths if _hidden(p.rsplit("/", 1)[0] or "/") is None and _hidden(p) is None)
    assert len(paths) > 50
    assert not open_, f"add these folders to kilonode.config.values.STATE_DIRS: {open_}"


@pytest.mark.parametrize("mount", ["/mnt/local-ssd", "/mnt", "/srv/ssd", "/data", "/opt/scratch", "/var/lib/scratch",
                                   "/local"])
def test_a_folder_of_its_own_is_a_mount_point(mount: str) -> None:
    assert _mount_point(mount) == mount


@pytest.mark.parametrize("device", ["/dev/disk/cloud/azure_resource", "/dev/disk/cloud/azure_resource-part1",
                                    "/dev/disk/by-id/nvme-Microsoft_NVMe_Direct_Disk_0123456789",
                                    "/dev/disk/by-id/wwn-0x60022480e7a5b1c3", "/dev/vdb", "/dev/vdc1", "/dev/vdaa"])
def test_a_disk_by_a_stable_name_is_a_local_disk(device: str) -> None:
    assert _device(device) == device


@pytest.mark.parametrize("device", ["/dev/sda", "/dev/sda1", "/dev/sdb", "/dev/sdc", "/dev/nvme0n1", "/dev/nvme1n1p1",
                                    "/dev/vda", "/dev/vda1", "/dev/root", "/dev/mem", "/dev/kmem", "/dev/port",
                                    "/dev/null", "/dev/zero", "/dev/shm", "/dev/disk/cloud/azure_root",
                                    "/dev/disk/azure/os", "/dev/disk/by-label/cloudimg-rootfs", "/dev/mapper/control",
                                    "/dev/xvda", "/dev/md0", "/dev/loop0", "/dev/tty0", "/dev/kmsg"])
def test_any_other_device_is_refused(device: str) -> None:
    with pytest.raises(ValueError, match="formatted at first boot"):
        _device(device)


def _with_audit_log(write_stack: StackWriter, path: str, mount: str | None = None) -> Any:
    cluster = shipped_cluster_value("local")
    cluster["apiserver"]["auditLog"] = {"path": path}
    if mount:
        cluster["apiserver"]["localDisk"]["mountPoint"] = mount
    return load_stack(str(write_stack(cluster))).config


@pytest.mark.parametrize(("path", "mount"), [
    ("/mnt/local-ssd/audit.log", None), ("/mnt/local-ssd/kubernetes/audit/audit.log", None),
    ("/var/log/kubernetes/audit.log", None), ("/var/log/kube-apiserver/audit/audit.log", None),
    ("/srv/ssd/audit/audit.log", "/srv/ssd"),
])
def test_an_audit_log_on_the_local_disk_or_in_a_folder_of_its_own_under_var_log_passes(
        write_stack: StackWriter, path: str, mount: str | None) -> None:
    assert _with_audit_log(write_stack, path, mount).apiserver.audit_log.path == path
