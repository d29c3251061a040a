"""The rendered etcd flags, run by real etcd (Debian's etcd-server) on loopback.

Each member is started as systemd starts its rendered unit (tests/etcd/harness.py: etcd-join,
then ExecStart= with the unit's environment), its Azure address mapped to a loopback address of
its own, its data dir and TLS files to a temporary directory; every other flag is used as
rendered. The faults (a full events cluster, a lost minority, a blank disk, a restart of every
member) are in tests/etcd/test_faults.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kilonode.plan import ClusterPlan
from tests.etcd.harness import ETCD, ETCDCTL, LocalEtcd

pytestmark = pytest.mark.slow


@pytest.fixture
def local_etcd(plans: dict[str, ClusterPlan], tmp_path: Path) -> Iterator[LocalEtcd]:
    if not Path(ETCD).exists():
        pytest.fail("etcd missing: run `make setup` (installs Debian's etcd-server)")
    etcd = LocalEtcd(plans["local"], tmp_path)
    try:
        etcd.start_cluster("main")
        yield etcd
    finally:
        etcd.kill_all()


def test_rendered_etcd_flags_form_a_healthy_tls_cluster_with_the_raised_quota(local_etcd: LocalEtcd) -> None:
    etcd = local_etcd
    cluster = etcd.plan.etcd_main
    health = etcd.ctl("main", "endpoint", "health")
    assert health.returncode == 0, health.stdout + health.stderr
    members = json.loads(etcd.ctl("main", "member", "list", "-w", "json").stdout)["members"]
    assert sorted(m["name"] for m in members) == [m.name for m in cluster.members]
    assert etcd.ctl("main", "put", "/kilonode/probe", "ok").returncode == 0
    # without a client certificate the member refuses: client-cert auth is on
    insecure = subprocess.run(
        [ETCDCTL, f"--endpoints={etcd.endpoints('main')[0]}", "--insecure-skip-tls-verify",
         "--command-timeout=3s", "get", "/kilonode/probe"],
        capture_output=True, text=True, timeout=30, check=False, env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"},
    )
    assert insecure.returncode != 0
    metrics_url = f"http://{etcd.members[cluster.members[0].name].ip}:2381/metrics"
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        metrics = response.read().decode()
    quota = re.search(r"^etcd_server_quota_backend_bytes (\S+)$", metrics, re.M)
    assert quota and float(quota.group(1)) == cluster.quota_backend_bytes == 8 * 1024**3
