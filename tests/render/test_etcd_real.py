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

from kilonode.plan import ClusterPlan, wellknown
from kilonode.render import render_cluster
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


@pytest.fixture
def main_cluster(plans: dict[str, ClusterPlan], tmp_path: Path):
    if not Path(ETCD).exists():
        pytest.fail("etcd missing: run `make setup` (installs Debian's etcd-server)")
    plan = plans["local"]
    cluster = plan.etcd_main
    hosts = render_cluster(plan)
    # a loopback /24 of this run's own, so parallel runs never meet on 2379/2380
    net = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}"
    addresses = {str(m.ip): f"{net}.{11 + m.index}" for m in cluster.members}
    ca = TestCA(tmp_path / "pki", "etcd-main-ca")
    client_cert, client_key = ca.issue("client", ["127.0.0.1"])
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for member in cluster.members:
            local_ip = addresses[str(member.ip)]
            cert, key = ca.issue(member.name, [local_ip, "127.0.0.1"])
            files = {
                cluster.data_dir: str(tmp_path / member.name / "data"),
                wellknown.ETCD_SERVER_CERT: str(cert), wellknown.ETCD_SERVER_KEY: str(key),
                wellknown.ETCD_PEER_CERT: str(cert), wellknown.ETCD_PEER_KEY: str(key),
                wellknown.ETCD_CLIENT_CA: str(ca.ca_file), wellknown.ETCD_CA: str(ca.ca_file),
            }
            unit = hosts[member.name]["etc/systemd/system/etcd.service"].content
            args = localise(rendered_flags(unit), addresses, files)
            log = (tmp_path / f"{member.name}.log").open("wb")
            processes.append(subprocess.Popen([ETCD, *args], stdout=log, stderr=subprocess.STDOUT))
        endpoints = [f"https://{addresses[str(m.ip)]}:2379" for m in cluster.members]
        yield cluster, addresses, endpoints, (ca.ca_file, client_cert, client_key)
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        shutil.rmtree(tmp_path / "pki", ignore_errors=True)


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
