"""disks: each writer's disk, sized from the render and the graph; seeded breaks."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from kilonode.preflight import breaks, run
from kilonode.preflight.checks.disks import image_gib, size_bytes
from tests.preflight.conftest import artefacts, inputs_of

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


def disk_findings(stack: str, **planted: object) -> list[tuple[str, str, str]]:
    return [(f.level, f.where, f.what) for f in run(inputs_of(stack, **planted), ["disks"])]  # type: ignore[arg-type]


def breaks_at(stack: str, host: str, **planted: object) -> list[str]:
    return [what for level, where, what in disk_findings(stack, **planted) if level == "break" and where == host]


def _scale_sets(graph: dict[str, Any], role: str) -> list[dict[str, Any]]:
    return [r for r in graph["resources"] if r["type"] == "azure-native:compute:VirtualMachineScaleSet"
            and r["inputs"]["tags"]["kilonode-role"] == role]


def test_sizes_read_as_kubernetes_and_docker_write_them() -> None:
    assert size_bytes("100Mi") == 100 * 1024**2
    assert size_bytes("100m") == 100 * 1024**2  # Docker's units are binary
    assert size_bytes("2Gi") == 2 * 1024**3


def test_the_shipped_stacks_give_every_writer_a_disk() -> None:
    for stack in ("local", "research-2500", "research-7500"):
        assert [f for f in disk_findings(stack) if f[0] == "break"] == [], stack


def test_an_os_disk_without_disk_size_on_a_gpu_pool_is_the_images_size() -> None:
    files, graph = artefacts("research-7500")
    for vmss in _scale_sets(graph, "pool-h100-ib"):
        del vmss["inputs"]["virtualMachineProfile"]["storageProfile"]["osDisk"]["diskSizeGB"]
    found = breaks_at("research-7500", "pool-h100-ib", files=files, graph=graph)
    assert any("no diskSizeGB" in what and f"{image_gib():g} GiB" in what and "P1 (120 IOPS)" in what
               for what in found), found
    # a Docker pool: its container logs are in the runtime root on the local NVMe disks
    assert len(found) == 1, found
    assert breaks_at("research-7500", "pool-a100-ib", files=files, graph=graph) == []


@pytest.mark.parametrize(("size", "said"), [
    (3, "smaller than the 4 GiB image: Azure refuses to create the machines"),
    (5, "leaves no room once the image and the journal are on it: 5 x 90% (the kubelet evicts below 10% free) - "
        "4 image - 0.5 journal = 0.0 GiB"),
])
def test_an_explicit_os_disk_too_small_for_the_image_and_the_journal_is_a_break(size: int, said: str) -> None:
    files, graph = artefacts("research-7500")
    for vmss in _scale_sets(graph, "pool-h100-ib"):
        vmss["inputs"]["virtualMachineProfile"]["storageProfile"]["osDisk"]["diskSizeGB"] = size
    found = breaks_at("research-7500", "pool-h100-ib", files=files, graph=graph)
    assert any(said in what for what in found), found
    assert breaks_at("research-7500", "pool-a100-ib", files=files, graph=graph) == []


def test_an_etcd_members_os_disk_without_room_is_a_break() -> None:
    files, graph = artefacts("research-7500")
    vm = next(r for r in graph["resources"] if r["type"] == "azure-native:compute:VirtualMachine"
              and "etcd" in r["inputs"]["vmName"])
    vm["inputs"]["storageProfile"]["osDisk"]["diskSizeGB"] = 4
    found = [what for level, _, what in disk_findings("research-7500", files=files, graph=graph) if level == "break"]
    assert any("leaves no room once the image and the journal are on it: 4 - 4 image - 0.4 journal = -0.4 GiB; "
               "the first writes after boot fail (ENOSPC)" in what for what in found), found


def test_the_audit_log_on_the_os_disk_is_a_break_with_its_rate() -> None:
    files, graph = artefacts("research-7500")
    unit = "apiserver-2/etc/systemd/system/kube-apiserver.service"
    files[unit] = re.sub(r"--audit-log-path=\S+", "--audit-log-path=/var/log/kubernetes/audit/audit.log", files[unit])
    files[unit] = re.sub(r"--audit-log-maxbackup=\d+", "--audit-log-maxbackup=10", files[unit])
    found = breaks_at("research-7500", "apiserver-2", files=files, graph=graph)
    assert len(found) == 1 and "/var/log/kubernetes/audit/audit.log is on the 128 GiB OS disk" in found[0]
    # 7,500 nodes x 0.3/s x 1 KiB over 5 apiservers: a 100 MB file in minutes
    assert "450 KiB/s per apiserver: one 100 MB file lasts 3.8 min, 11 files" in found[0]
    assert breaks_at("research-7500", "apiserver-1", files=files, graph=graph) == []


def test_audit_files_larger_than_the_local_disk_are_a_break() -> None:
    files, graph = artefacts("research-7500")
    unit = "apiserver-0/etc/systemd/system/kube-apiserver.service"
    files[unit] = re.sub(r"--audit-log-maxbackup=\d+", "--audit-log-maxbackup=20000", files[unit])
    found = breaks_at("research-7500", "apiserver-0", files=files, graph=graph)
    assert len(found) == 1 and "exceed the 1,200 GiB local SSD" in found[0]


def test_etcd_data_off_the_local_ssd_is_a_break() -> None:
    files, graph = artefacts("research-2500")
    unit = "etcd-main-1/etc/systemd/system/etcd.service"
    files[unit] = re.sub(r"--data-dir=\S+", "--data-dir=/var/lib/etcd", files[unit])
    found = breaks_at("research-2500", "etcd-main-1", files=files, graph=graph)
    assert len(found) == 1 and "/var/lib/etcd is on the 128 GiB OS disk" in found[0]
    assert "500 IOPS vs the 500 sequential IOPS" in found[0]


def test_a_container_log_budget_larger_than_the_kubelet_roots_disk_is_a_break() -> None:
    files, graph = artefacts("research-2500")  # a containerd pool: pod logs in /var/log/pods
    config = "pool-nc-a100/etc/kubernetes/kubelet-config.yaml"
    assert "containerd" in json.dumps(list(files))
    files[config] = files[config].replace("containerLogMaxSize: 100Mi", "containerLogMaxSize: 20Gi")
    found = breaks_at("research-2500", "pool-nc-a100", files=files, graph=graph)
    assert len(found) == 1 and "container log budget does not fit the kubelet root's disk" in found[0]
    assert "20480 MiB x 3 x 14 pods" in found[0] and "512 x 90%" in found[0]


@pytest.mark.parametrize(("host", "unit", "path"), [
    ("etcd-main-0", "etcd.service", "etc/systemd/system/etcd.service"),
    ("pool-system", "docker.service", "etc/systemd/system/docker.service.d/10-kilonode-local-ssd.conf"),
    ("apiserver-0", "kube-apiserver.service", "etc/systemd/system/kube-apiserver.service"),
])
def test_a_unit_that_skips_instead_of_failing_without_its_mount_is_a_break(host: str, unit: str, path: str) -> None:
    files, graph = artefacts("research-7500")
    key = f"{host}/{path}"
    assert "AssertPathIsMountPoint=/mnt/local-ssd" in files[key]
    files[key] = files[key].replace("AssertPathIsMountPoint=", "ConditionPathIsMountPoint=")
    found = breaks(run(inputs_of("research-7500", files=files, graph=graph), ["disks"]))
    assert [f.where for f in found] == [f"{host}: {unit}"]
    assert "silently does not run" in found[0].what
    files[key] = "\n".join(line for line in files[key].splitlines() if "MountPoint=" not in line)
    [finding] = breaks(run(inputs_of("research-7500", files=files, graph=graph), ["disks"]))
    assert "fills the OS disk" in finding.what
