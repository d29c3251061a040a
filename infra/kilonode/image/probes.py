"""Helpers the verification suite's checks share (the suite ships as data: see kilonode.paths)."""

from __future__ import annotations

import json

import testinfra

from kilonode.plan.model import LocalStoragePlan


def same_disk(host: testinfra.host.Host, source: str, device: str) -> bool:
    """Is mount source `source` the plan's `device`, or a partition of it?

    The plan may name a stable symlink (Azure: /dev/disk/cloud/azure_resource) while the
    kernel reports /dev/sdb1: compare resolved paths.
    """
    resolved = run_ok(host, f"readlink -f {source} {device}").split()
    if len(resolved) != 2:
        return False
    real_source, real_device = resolved
    return real_source == real_device or (
        real_source.startswith(real_device) and real_source[len(real_device):].lstrip("p").isdigit()
    )


def run_ok(host: testinfra.host.Host, command: str) -> str:
    """Run on the node; fail the check with the command's output if it fails."""
    result = host.run(command)
    assert result.rc == 0, f"`{command}` exited {result.rc}: {result.stderr.strip() or result.stdout.strip()}"
    return str(result.stdout)


def is_local_disk(host: testinfra.host.Host, storage: LocalStoragePlan, source: str) -> bool:
    """Is mount source `source` the local disk the plan chose: its device, or (NVMe) the RAID 0
    array over exactly the disks of the plan's models, or the one such disk?"""
    if storage.kind == "device":
        return same_disk(host, source, str(storage.device))
    found = json.loads(run_ok(host, "lsblk --json --nodeps -o PATH,TYPE,MODEL"))["blockdevices"]
    disks = {d["path"] for d in found if d["type"] == "disk" and (d.get("model") or "").strip() in storage.nvme_models}
    if len(disks) != storage.nvme_count:
        return False
    real = run_ok(host, f"readlink -f {source}").strip()
    if storage.kind == "nvme":
        return {real} == disks
    detail = host.run(f"mdadm --detail --export {real}")
    values = dict(line.split("=", 1) for line in detail.stdout.splitlines() if "=" in line)
    members = {v for k, v in values.items() if k.startswith("MD_DEVICE_") and k.endswith("_DEV")}
    return (detail.rc == 0 and values.get("MD_LEVEL") == "raid0" and values.get("MD_DEVICES") == str(len(disks))
            and members == disks)
