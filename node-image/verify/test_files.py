"""Files: every baked/rendered artefact on the node as built; kubelet config vs the plan."""

from __future__ import annotations

import json
from typing import Any

import pytest
import testinfra
import yaml

from kilonode.image.probes import is_local_disk, run_ok
from kilonode.plan.model import NodePoolPlan


def test_artefact_on_node_matches_build(host: testinfra.host.Host, artefact: dict[str, Any]) -> None:
    path = artefact["path"]
    # one command per file: each round trip costs about half a second under TCG
    result = host.run(f"stat -c %a {path} && sha256sum {path}")
    assert result.rc == 0, f"{path} missing"
    mode, digest = result.stdout.split()[:2]
    assert digest == artefact["sha256"], f"{path} differs from the {artefact['source']} output"
    assert f"{int(mode, 8):04o}" == artefact["mode"], f"{path} mode {mode}, built {artefact['mode']}"


def test_kubelet_config_matches_plan(host: testinfra.host.Host, pool: NodePoolPlan) -> None:
    config = yaml.safe_load(run_ok(host, "cat /etc/kubernetes/kubelet-config.yaml"))
    assert config["kind"] == "KubeletConfiguration"
    assert config["maxPods"] == pool.max_pods
    assert config["maxParallelImagePulls"] == pool.max_parallel_image_pulls
    # hand-written (field notes): one big pull must not block the others
    assert config["serializeImagePulls"] is False


@pytest.mark.persistent
def test_the_resolv_conf_pods_get_exists_and_names_no_loopback(host: testinfra.host.Host, pool: NodePoolPlan) -> None:
    """The file the kubelet gives dnsPolicy Default and hostNetwork pods (resolvConf, the
    plan's choice): present once the node is up, and no 127.x/::1 nameserver in it, which
    inside a pod is the pod itself (CoreDNS's `loop` plugin halts it; kilonode.plan.defaults.node)."""
    config = yaml.safe_load(run_ok(host, "cat /etc/kubernetes/kubelet-config.yaml"))
    path = config.get("resolvConf", "/etc/resolv.conf")  # the kubelet's default when unset
    assert path == pool.resolv_conf
    servers = [line.split()[1] for line in run_ok(host, f"cat {path}").splitlines()
               if line.startswith("nameserver") and len(line.split()) > 1]
    assert servers, f"{path} names no nameserver"
    loopback = [s for s in servers if s.startswith("127.") or s == "::1"]
    assert not loopback, f"{path} names loopback nameserver(s) {loopback}: a pod would query itself"


def test_kubelet_and_runtime_agree_on_cgroup_driver(host: testinfra.host.Host, pool: NodePoolPlan) -> None:
    """Hand-written: the kubelet's cgroupDriver matches the runtime's. On containerd 1.7 (no RuntimeConfig CRI
    call, so the kubelet keeps its own field) a mismatch fails every pod sandbox; on Docker pools cri-dockerd
    reports Docker's driver and the kubelet (KubeletCgroupDriverFromCRI, GA in 1.34) takes it, so the field is
    inert there, but a matching file is what the image ships (catalog/contracts.yaml kubelet-cgroup-driver)."""
    config = yaml.safe_load(run_ok(host, "cat /etc/kubernetes/kubelet-config.yaml"))
    if pool.runtime == "docker":
        runtime = json.loads(run_ok(host, "docker info --format '{{json .CgroupDriver}}'"))
    else:
        dump = run_ok(host, "containerd config dump")
        runtime = "systemd" if "SystemdCgroup = true" in dump else "cgroupfs"
    assert config["cgroupDriver"] == runtime


def test_image_pull_progress_deadline_flag(host: testinfra.host.Host, pool: NodePoolPlan) -> None:
    """Field notes: big pulls were cancelled for 'lack of progress' (docker runtime: cri-dockerd flag)."""
    if pool.runtime != "docker":
        pytest.skip("containerd has no pull progress deadline flag")
    exec_start = run_ok(host, "systemctl show cri-docker.service -p ExecStart --value")
    assert f"--image-pull-progress-deadline={pool.image_pull_progress_deadline}" in exec_start


@pytest.mark.persistent
def test_local_ssd_mounted(host: testinfra.host.Host, pool: NodePoolPlan) -> None:
    disk = pool.local_storage
    mount = host.mount_point(disk.mount_point)
    assert mount.exists, f"{disk.mount_point} is not mounted"
    assert is_local_disk(host, disk, mount.device) and mount.filesystem == disk.filesystem, (
        f"{disk.mount_point}: {mount.device} ({mount.filesystem}), plan {disk.kind} {disk.device or ''} "
        f"{disk.nvme_count or ''} ({disk.filesystem})"
    )
    if disk.kind != "device":
        # the node makes the NVMe array itself, at every boot; no fstab entry (nofail by design)
        assert host.service("kilonode-local-disk.service").is_enabled
        return
    fstab = [line.split() for line in run_ok(host, "cat /etc/fstab").splitlines() if disk.mount_point in line]
    # a missing local disk must not hang the boot
    assert fstab and "nofail" in fstab[0][3], "the local SSD's fstab entry is not nofail"
