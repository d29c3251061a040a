"""The rendered etcd flags, run by real etcd (Debian's etcd-server) on loopback.

Each member's Azure address is mapped to its own loopback address (127.X.Y.11, ...), its
data dir and TLS files to a temporary directory; every other flag is used as rendered.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from kilonode.config import load_stack
from kilonode.plan import ClusterPlan, plan_stack, wellknown
from kilonode.render import render_cluster
from tests.conftest import StackWriter, shipped_cluster_value
from tests.render.local_pki import TestCA

pytestmark = pytest.mark.slow

ETCD = "/usr/bin/etcd"
START_TIMEOUT_S = 30


def rendered_flags(unit: str) -> list[tuple[str, str]]:
    exec_start = unit.split("ExecStart=", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"--([a-z0-9-]+)=(\S+)", exec_start)


def localise(flags: list[tuple[str, str]], addresses: dict[str, str], files: dict[str, str]) -> list[str]:
    args = []
    for name, value in flags:
        for azure, loopback in addresses.items():
            value = value.replace(f"{azure}:", f"{loopback}:")
        for rendered_path, local_path in files.items():
            value = value.replace(rendered_path, local_path)
        if name in {"listen-client-urls", "listen-metrics-urls"}:
            # every member also listens on 127.0.0.1 on a real host; here they share one
            # loopback, so each keeps its own address only
            value = ",".join(dict.fromkeys(u for u in value.split(",") if "127.0.0.1:" not in u))
        args.append(f"--{name}={value}")
    return args


class LocalEtcd:
    """The main cluster of a plan, each member a real etcd on its own loopback address, with
    the rendered flags and certificates from a test CA; stops what it started, by process."""

    def __init__(self, plan: ClusterPlan, tmp_path: Path) -> None:
        self.cluster = plan.etcd_main
        self.tmp_path = tmp_path
        # a loopback /24 of this run's own, so parallel runs never meet on 2379/2380
        net = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}"
        self.addresses = {str(m.ip): f"{net}.{11 + m.index}" for m in self.cluster.members}
        self.ca = TestCA(tmp_path / "pki", "etcd-main-ca")
        client_cert, client_key = self.ca.issue("client", ["127.0.0.1"])
        self.tls = (self.ca.ca_file, client_cert, client_key)
        self.endpoints = [f"https://{self.addresses[str(m.ip)]}:2379" for m in self.cluster.members]
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, plan: ClusterPlan, name: str) -> None:
        """Start member `name` with the flags `plan` renders for it."""
        member = next(m for m in plan.etcd_main.members if m.name == name)
        local_ip = self.addresses[str(member.ip)]
        cert, key = self.ca.issue(member.name, [local_ip, "127.0.0.1"])
        files = {
            plan.etcd_main.data_dir: str(self.data_dir(name)),
            wellknown.ETCD_SERVER_CERT: str(cert), wellknown.ETCD_SERVER_KEY: str(key),
            wellknown.ETCD_PEER_CERT: str(cert), wellknown.ETCD_PEER_KEY: str(key),
            wellknown.ETCD_CLIENT_CA: str(self.ca.ca_file), wellknown.ETCD_CA: str(self.ca.ca_file),
        }
        unit = render_cluster(plan)[member.name]["etc/systemd/system/etcd.service"].content
        args = localise(rendered_flags(unit), self.addresses, files)
        log = (self.tmp_path / f"{member.name}.log").open("ab")
        self.processes[name] = subprocess.Popen([ETCD, *args], stdout=log, stderr=subprocess.STDOUT)

    def data_dir(self, name: str) -> Path:
        return self.tmp_path / name / "data"

    def stop(self, name: str) -> None:
        process = self.processes.pop(name)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def stop_all(self) -> None:
        for name in list(self.processes):
            self.stop(name)
        shutil.rmtree(self.tmp_path / "pki", ignore_errors=True)


@pytest.fixture
def local_etcd(plans: dict[str, ClusterPlan], tmp_path: Path):
    if not Path(ETCD).exists():
        pytest.fail("etcd missing: run `make setup` (installs Debian's etcd-server)")
    etcd = LocalEtcd(plans["local"], tmp_path)
    try:
        for member in etcd.cluster.members:
            etcd.start(plans["local"], member.name)
        yield etcd
    finally:
        etcd.stop_all()


@pytest.fixture
def main_cluster(local_etcd: LocalEtcd):
    yield local_etcd.cluster, local_etcd.addresses, local_etcd.endpoints, local_etcd.tls


def etcdctl(tls: tuple[Path, Path, Path], endpoints: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    ca, cert, key = tls
    return subprocess.run(
        ["etcdctl", f"--endpoints={','.join(endpoints)}", f"--cacert={ca}", f"--cert={cert}", f"--key={key}",
         "--command-timeout=5s", *args],
        capture_output=True, text=True, timeout=30, check=False, env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"},
    )


def test_rendered_etcd_flags_form_a_healthy_tls_cluster_with_the_raised_quota(main_cluster) -> None:
    cluster, addresses, endpoints, tls = main_cluster
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        health = etcdctl(tls, endpoints, "endpoint", "health")
        if health.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert health.returncode == 0, health.stdout + health.stderr
    members = json.loads(etcdctl(tls, endpoints[:1], "member", "list", "-w", "json").stdout)["members"]
    assert sorted(m["name"] for m in members) == [m.name for m in cluster.members]
    assert etcdctl(tls, endpoints, "put", "/kilonode/probe", "ok").returncode == 0
    # plain HTTP without a client certificate is refused: client-cert auth is on
    insecure = subprocess.run(
        ["etcdctl", f"--endpoints={endpoints[0]}", "--insecure-transport=false", "--insecure-skip-tls-verify",
         "--command-timeout=3s", "get", "/kilonode/probe"],
        capture_output=True, text=True, timeout=30, check=False, env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"},
    )
    assert insecure.returncode != 0
    metrics_url = f"http://{addresses[str(cluster.members[0].ip)]}:2381/metrics"
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        metrics = response.read().decode()
    quota = re.search(r"^etcd_server_quota_backend_bytes (\S+)$", metrics, re.M)
    assert quota and float(quota.group(1)) == cluster.quota_backend_bytes == 8 * 1024**3


def wait_healthy(tls: tuple[Path, Path, Path], endpoints: list[str]) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        health = etcdctl(tls, endpoints, "endpoint", "health")
        if health.returncode == 0 or time.monotonic() > deadline:
            return health
        time.sleep(0.5)


def test_a_member_with_an_empty_data_dir_rejoins_with_the_rendered_rejoining_flags(
    local_etcd: LocalEtcd, write_stack: StackWriter
) -> None:
    """What replacing (or resizing) one member does in Azure, and the stack's `rejoining`:
    the member comes back with an empty data dir; removed and re-added with etcdctl, it joins
    the running cluster with the flags rendered for it, and holds the cluster's data."""
    etcd, tls = local_etcd, local_etcd.tls
    assert wait_healthy(tls, etcd.endpoints).returncode == 0
    assert etcdctl(tls, etcd.endpoints, "put", "/kilonode/before", "kept").returncode == 0
    leaving = etcd.cluster.members[-1]
    members = json.loads(etcdctl(tls, etcd.endpoints[:1], "member", "list", "-w", "json").stdout)["members"]
    member_id = next(m["ID"] for m in members if m["name"] == leaving.name)
    # the VM is replaced: its process and its local SSD are gone
    etcd.stop(leaving.name)
    shutil.rmtree(etcd.data_dir(leaving.name))
    others = etcd.endpoints[:-1]
    assert etcdctl(tls, others, "member", "remove", f"{member_id:x}").returncode == 0
    peer = f"https://{etcd.addresses[str(leaving.ip)]}:2380"
    # etcd's strict reconfiguration check refuses an add until the remaining members have
    # been connected for a while (etcdserver: unhealthy cluster): retry, bounded
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        added = etcdctl(tls, others, "member", "add", leaving.name, f"--peer-urls={peer}")
        if added.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert added.returncode == 0, added.stdout + added.stderr
    # the stack says so; the member's new custom data carries --initial-cluster-state=existing
    cluster = shipped_cluster_value("local")
    cluster["etcd"]["main"]["rejoining"] = [leaving.index]
    rejoin_plan = plan_stack(load_stack(str(write_stack(cluster))))
    unit = render_cluster(rejoin_plan)[leaving.name]["etc/systemd/system/etcd.service"].content
    assert ("initial-cluster-state", "existing") in rendered_flags(unit)
    etcd.start(rejoin_plan, leaving.name)
    health = wait_healthy(tls, etcd.endpoints[-1:])
    assert health.returncode == 0, health.stdout + health.stderr + (etcd.tmp_path / f"{leaving.name}.log").read_text()
    # it serves the cluster's data from its own copy (a serializable read answers locally)
    got = etcdctl(tls, etcd.endpoints[-1:], "get", "/kilonode/before", "--consistency=s", "--print-value-only")
    assert got.stdout.strip() == "kept"
    members = json.loads(etcdctl(tls, etcd.endpoints[:1], "member", "list", "-w", "json").stdout)["members"]
    assert sorted(m["name"] for m in members) == [m.name for m in etcd.cluster.members]
