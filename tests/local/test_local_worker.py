"""`kilonode local up` with its worker VM: the `local` stack's pool image, built because the
cache has none, booted under qemu with the pool's cloud-init, its live facts read against the
plan; a second `up` that changes nothing; `down` that leaves no qemu and no state.

One VM boot (TCG: 2-3 minutes) and one image build (the base root filesystem from the cache).
The image cache is the test's own (XDG_CACHE_HOME in a temporary directory, with the real
base root filesystems linked in), so the build path runs every time and the user's cache is
left alone. The stack is `local` with its control-plane subnets moved (10.0.4/10.0.5 ->
127.0.4.x/127.0.5.x): its etcd members do not collide with tests/local/test_local_etcd.py's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import paramiko
import pytest

from kilonode.config import load_stack
from kilonode.image import cache
from kilonode.local import etcd
from kilonode.plan import plan_stack
from tests.conftest import StackWriter, shipped_cluster_value

# a VM: with the image tests, one guest at a time on two cores (tests/conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("node-images")]

# build (~1-2 min) + first boot with cloud-init (~2-3 min) on a busy 2-core machine, with room
UP_TIMEOUT_S = 1500
GC_THRESH = {"net.ipv4.neigh.default.gc_thresh1": 80000, "net.ipv4.neigh.default.gc_thresh2": 90000,
             "net.ipv4.neigh.default.gc_thresh3": 100000}  # field notes, written by hand


def kilonode(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kilonode.cli", "local", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env=env)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """An empty image cache of the test's own; the base root filesystems are the real cache's."""
    root = tmp_path / "cache" / "kilonode"
    root.mkdir(parents=True)
    (root / "rootfs").symlink_to(cache.cache_root() / "rootfs", target_is_directory=True)
    return os.environ | {"COLUMNS": "200", "XDG_CACHE_HOME": str(tmp_path / "cache")}


@pytest.fixture
def stack(write_stack: StackWriter) -> Path:
    cluster = shipped_cluster_value("local")
    cluster["network"] = {"controlPlaneSubnet": "10.0.4.0/24", "etcdSubnet": "10.0.5.0/24"}
    return write_stack(cluster, name="local")




def status_json(env: dict[str, str], state: Path, expect_rc: int = 0) -> dict[str, Any]:
    result = kilonode(env, "status", "--state-dir", str(state), "--json", timeout=120)
    assert result.returncode == expect_rc, result.stdout + result.stderr
    return json.loads(result.stdout)


def listeners(port: int) -> list[str]:
    """The local addresses listening on TCP `port` (IPv4 and IPv6), from /proc."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, _, hex_port = fields[1].partition(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:
                found.append(socket.inet_ntoa(bytes.fromhex(address)[::-1]) if len(address) == 8 else address)
    return found


def ssh(worker: dict[str, Any], command: str) -> str:
    """Run `command` on the worker with exactly what status lists (port, user, key): not kilonode's code."""
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    ssh_info = worker["ssh"]
    client.connect(ssh_info["address"], port=ssh_info["port"], username=ssh_info["user"], key_filename=ssh_info["key"],
                   timeout=30, banner_timeout=30, auth_timeout=30, allow_agent=False, look_for_keys=False)
    with closing(client):
        _stdin, stdout, _stderr = client.exec_command(command, timeout=60)
        text = stdout.read().decode()
        assert stdout.channel.recv_exit_status() == 0, f"`{command}` failed on the worker"
        return text


def processes_naming(path: Path) -> list[int]:
    """PIDs (not zombies) whose command line names `path`: qemu's names its overlay there."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if str(path) in (proc / "cmdline").read_bytes().decode(errors="replace") and etcd.alive(int(proc.name)):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def test_local_up_boots_the_worker_vm_checks_it_against_the_plan_and_down_leaves_nothing(
    env: dict[str, str], stack: Path, state: Path
) -> None:
    plan = plan_stack(load_stack(stack))
    pool = plan.node_pools[0]
    started = time.monotonic()
    first = kilonode(env, "up", str(stack), "--state-dir", str(state), timeout=UP_TIMEOUT_S)
    up_s = time.monotonic() - started
    output = first.stdout + first.stderr
    assert first.returncode == 0, output[-8000:]
    # the cache had no image: it was built, with progress lines, then booted
    assert "pool image local-cpu: not in the cache" in output and "pool image local-cpu: built in" in output
    assert "  image: GPT disk: done in" in output
    assert "worker VM: booted from a fresh overlay (pool image built)" in output
    assert "worker VM, pool cpu: image local-cpu" in output
    assert "kubelet.service, cri-docker.service" in output and "the node cannot join" in output
    print(f"\nlocal up with the worker (image built, first boot): {up_s:.0f} s")

    document = status_json(env, state)
    worker = document["worker"]
    assert document["healthy"] and worker["ok"], worker["problems"]
    assert worker["state"] == "running" and worker["pool"] == "cpu"
    assert worker["ssh"]["user"] == "debian" and Path(worker["ssh"]["key"]).is_file()
    port = worker["ssh"]["port"]
    assert listeners(port) == ["127.0.0.1"], f"the SSH forward listens on {listeners(port)}, not loopback only"
    pid = worker["pid"]
    assert "qemu-system-x86_64" in Path(f"/proc/{pid}/cmdline").read_text()

    # the plan's sysctls, live on the node: as status reads them, and as the node says over plain SSH
    sysctls = {s["name"]: s for s in worker["sysctls"]}
    assert set(sysctls) == {s.name for s in pool.sysctls}
    for name, value in GC_THRESH.items():
        assert sysctls[name]["live"] == sysctls[name]["plan"] == str(value), sysctls[name]
        assert ssh(worker, f"cat /proc/sys/{name.replace('.', '/')}").strip() == str(value)
    # the runtime's root is the plan's, on the local SSD (the second disk, /dev/vdb), not the OS disk
    runtime = worker["runtime"]
    assert runtime["name"] == "docker" and runtime["root"] == pool.runtime_root == "/mnt/local-ssd/docker"
    assert runtime["on_local_ssd"] and runtime["mount"] == "/mnt/local-ssd"
    assert runtime["source"] in ("/dev/vdb", "/dev/vdb1"), runtime
    assert ssh(worker, "findmnt -n -o SOURCE /").strip().startswith("/dev/vda")
    # the pause image in docker's store, with the ID the build baked
    pause = next(i for i in worker["images"]["preloaded"] if i["pause"])
    assert pause["image"] == pool.pause_image == "registry.k8s.io/pause:3.10"
    assert pause["in_store"] and pause["id_matches"] is True and pause["store_id"].startswith("sha256:")
    assert pool.pause_image in worker["images"]["store"]
    assert worker["release_units"]["kubelet.service"].startswith("inactive (condition failed")

    # negative: a sysctl changed on the node is reported against the plan (status reads it live)
    ssh(worker, "sudo sysctl -q -w net.ipv4.neigh.default.gc_thresh1=128")
    changed = status_json(env, state, expect_rc=1)["worker"]
    assert not changed["ok"]
    assert "net.ipv4.neigh.default.gc_thresh1 is 128, the plan says 80000" in changed["problems"]
    ssh(worker, "sudo sysctl -q -w net.ipv4.neigh.default.gc_thresh1=80000")

    # a second up changes nothing: the same qemu and members, nothing built or booted
    members = {m["name"]: m["pid"] for c in document["clusters"].values() for m in c["members"]}
    started = time.monotonic()
    second = kilonode(env, "up", str(stack), "--state-dir", str(state), timeout=600)
    second_s = time.monotonic() - started
    assert second.returncode == 0 and "Nothing changed" in second.stdout, second.stdout + second.stderr
    assert "worker VM already running" in second.stdout and "building" not in second.stdout
    again = status_json(env, state)
    assert again["worker"]["pid"] == pid and again["worker"]["ssh"]["port"] == port
    assert {m["name"]: m["pid"] for c in again["clusters"].values() for m in c["members"]} == members
    print(f"second local up (nothing to do): {second_s:.0f} s")

    # down: the guest powers off, no qemu (and no member) is left, nor any state
    started = time.monotonic()
    gone = kilonode(env, "down", "--state-dir", str(state), timeout=300)
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert "worker VM: powered off" in gone.stdout, gone.stdout
    print(f"local down: {time.monotonic() - started:.0f} s")
    assert not etcd.alive(pid)
    assert not any(etcd.alive(p) for p in members.values())
    assert processes_naming(state) == []
    assert not state.exists()
