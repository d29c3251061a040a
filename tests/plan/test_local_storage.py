"""A pool's local disk is decided by the plan from its VM size: the NVMe disks (RAID 0 when
several) where the size has them, else the temp disk; rendered so that the node's unit, not
cloud-init, makes the NVMe array, and cloud-init keeps the temp-disk case."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kilonode.catalog.vm import AZURE_NVME_LOCAL_MODELS, AZURE_TEMP_DISK
from kilonode.cli import app
from kilonode.config import load_stack
from kilonode.node.ship import LOCAL_DISK_SETUP
from kilonode.paths import REPO_ROOT
from kilonode.plan import plan_stack
from kilonode.render import USER_DATA, render_cluster
from kilonode.render.pool import LOCAL_DISK_CONFIG, LOCAL_DISK_UNIT
from tests.conftest import StackWriter, shipped_cluster_value
from tests.render.consumers import cloud_init_validator, systemd_verify

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

OVERLAY = REPO_ROOT / "node-image" / "rootfs"
SCRIPT = LOCAL_DISK_SETUP.machine_path


def pool_plan(write_stack: StackWriter, vm_size: str, **local_disk: str):  # type: ignore[no-untyped-def]
    cluster = shipped_cluster_value("local")
    pool = cluster["nodePools"][0]
    pool["vmSize"] = vm_size
    pool.pop("gpusPerNode", None)
    pool["localDisk"] = local_disk
    plan = plan_stack(load_stack(str(write_stack(cluster))))
    return plan, plan.node_pools[0]


def test_h100_pool_gets_its_eight_nvme_disks_as_raid0(write_stack: StackWriter) -> None:
    _plan, pool = pool_plan(write_stack, "Standard_ND96isr_H100_v5")
    storage = pool.local_storage
    assert (storage.kind, storage.nvme_count, storage.device) == ("nvme-raid0", 8, None)
    # Azure's local NVMe model strings (azure-vm-utils doc/disk-identification.md), not its
    # remote-disk controller
    assert "Microsoft NVMe Direct Disk" in storage.nvme_models
    assert not any("Accelerator" in m for m in storage.nvme_models)
    assert pool.runtime_root == f"{storage.mount_point}/docker"
    assert "1024 GiB temp disk is left alone" in storage.reason


def test_one_nvme_disk_is_used_without_an_array(write_stack: StackWriter) -> None:
    _plan, pool = pool_plan(write_stack, "Standard_NC24ads_A100_v4")
    assert (pool.local_storage.kind, pool.local_storage.nvme_count) == ("nvme", 1)


def test_sizes_without_nvme_keep_the_temp_disk(write_stack: StackWriter) -> None:
    _plan, pool = pool_plan(write_stack, "Standard_D4ds_v5")
    assert (pool.local_storage.kind, pool.local_storage.device) == ("device", AZURE_TEMP_DISK)
    assert "no local NVMe disks: its temp disk (150 GiB)" in pool.local_storage.reason


def test_a_device_the_stack_names_is_kept_on_an_nvme_size(write_stack: StackWriter) -> None:
    device = "/dev/disk/by-id/wwn-0x60022480e7a5b1c3d1f5a0d6e4e8f2a1"
    _plan, pool = pool_plan(write_stack, "Standard_ND96isr_H100_v5", device=device)
    assert (pool.local_storage.kind, pool.local_storage.device) == ("device", device)
    assert "8 NVMe disk(s) stay unused" in pool.local_storage.reason


def test_nvme_only_size_is_accepted_for_a_pool_but_not_for_etcd(write_stack: StackWriter) -> None:
    """GB200 v6: no temp disk, 4 NVMe disks. A pool uses them; etcd (temp disk) is still refused."""
    _plan, pool = pool_plan(write_stack, "Standard_ND128isr_NDR_GB200_v6")
    assert (pool.local_storage.kind, pool.local_storage.nvme_count) == ("nvme-raid0", 4)
    cluster = shipped_cluster_value("local")
    cluster["etcd"]["main"]["vmSize"] = "Standard_ND128isr_NDR_GB200_v6"
    cluster["etcd"]["main"]["localDisk"] = {}
    result = CliRunner().invoke(app, ["validate", str(write_stack(cluster))])
    assert result.exit_code == 2 and "etcd.main.vmSize: Standard_ND128isr_NDR_GB200_v6 has no local temp disk" in (
        result.stderr), result.output


def test_nvme_pool_renders_the_unit_config_and_leaves_cloud_init_off_the_disks(write_stack: StackWriter) -> None:
    plan, pool = pool_plan(write_stack, "Standard_ND96isr_H100_v5")
    files = render_cluster(plan)[f"pool-{pool.name}"]
    config = json.loads(files[LOCAL_DISK_CONFIG].content)
    assert config == {
        "models": list(AZURE_NVME_LOCAL_MODELS), "count": 8, "array": "kilonode-local", "filesystem": "ext4",
        "label": "kn-local-ssd", "mountPoint": "/mnt/local-ssd", "diskWaitSeconds": 120,
    }
    user_data = yaml.safe_load(files[USER_DATA].content)
    # the size's temp disk: cloud-init's default /mnt mount of ephemeral0 dropped (it would
    # hide /mnt/local-ssd), nothing of ours formatted
    assert "fs_setup" not in user_data and "disk_setup" not in user_data and user_data["mounts"] == [["ephemeral0"]]
    assert f"/{LOCAL_DISK_CONFIG}" in {f["path"] for f in user_data["write_files"]}
    runcmd = user_data["runcmd"]
    enable = runcmd.index(["systemctl", "enable", "--now", LOCAL_DISK_UNIT])
    assert enable < runcmd.index(["systemctl", "restart", "docker.service"])
    dropin = files["etc/systemd/system/docker.service.d/10-kilonode-local-ssd.conf"].content
    assert f"After={LOCAL_DISK_UNIT}" in dropin and "AssertPathIsMountPoint=/mnt/local-ssd" in dropin
    assert cloud_init_validator()(user_data) == []


def test_temp_disk_pool_overrides_azures_built_in_temp_disk_config(write_stack: StackWriter) -> None:
    plan, pool = pool_plan(write_stack, "Standard_D4ds_v5")
    files = render_cluster(plan)[f"pool-{pool.name}"]
    assert LOCAL_DISK_CONFIG not in files
    user_data = yaml.safe_load(files[USER_DATA].content)
    assert pool.local_disk.device == AZURE_TEMP_DISK
    # by cloud-init's own key for the temp disk (DataSourceAzure disk_aliases), so that the
    # datasource's built-in disk_setup.ephemeral0 and default ephemeral0 -> /mnt are replaced
    assert user_data["disk_setup"] == {"ephemeral0": {"table_type": "gpt", "layout": [100], "overwrite": True}}
    assert user_data["fs_setup"][0]["device"] == "ephemeral0.1"
    assert user_data["mounts"] == [["ephemeral0.1", "/mnt/local-ssd", "ext4", "defaults,nofail", "0", "2"]]
    assert cloud_init_validator()(user_data) == []
    assert not any(LOCAL_DISK_UNIT in cmd for cmd in user_data["runcmd"])
    assert LOCAL_DISK_UNIT not in files["etc/systemd/system/docker.service.d/10-kilonode-local-ssd.conf"].content


def test_explain_shows_each_pools_local_disk() -> None:
    result = CliRunner().invoke(app, ["explain", "research-7500"])
    assert result.exit_code == 0, result.output
    assert "RAID 0 of 8 NVMe" in result.stdout  # the table's column (rich may wrap the rest)
    assert "pool h100-ib local disk: Standard_ND96isr_H100_v5 has 8 local NVMe disk(s)" in result.stdout
    assert "pool a100-ib local disk: Standard_ND96asr_v4 has no local NVMe disks: its temp disk" in result.stdout


def test_the_image_unit_passes_systemd_analyze(tmp_path: Path) -> None:
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze missing: run `make setup` (installs .ci/debian-packages.txt)")
    unit = tmp_path / LOCAL_DISK_UNIT
    unit.write_text((OVERLAY / "etc/systemd/system" / LOCAL_DISK_UNIT).read_text())
    # the script is in the image, not on this machine: the only complaint allowed (ExecStart, ExecStop)
    assert systemd_verify(tmp_path, [unit]) == 2 * [
        f"{unit.name}: Command {SCRIPT} is not executable: No such file or directory"
    ]
    assert LOCAL_DISK_SETUP.mode & 0o111 and LOCAL_DISK_SETUP.delivery == "image"  # shipped executable
