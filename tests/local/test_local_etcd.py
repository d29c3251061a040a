"""`kilonode local up|status|down` on the `local` stack, with real etcd (Debian's etcd-server)
on loopback addresses: what a user relies on, through the command line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kilonode.local import etcd
from kilonode.local.addresses import address_map
from kilonode.local.check import check_apiserver_etcd
from kilonode.local.etcd import ClientTls
from kilonode.local.pki import LocalPki
from kilonode.plan import ClusterPlan, pki
from kilonode.render import render_cluster
from tests.conftest import StackWriter, shipped_cluster_value

# one worker, in file order, under `make test`'s xdist: both tests use the `local` stack's
# loopback addresses (127.0.1.10-22), which two rehearsals cannot share. `up --no-worker`: these
# tests are about etcd; tests/local/test_local_worker.py boots the worker VM.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("local-rehearsal")]

APISERVER_UNIT = "etc/systemd/system/kube-apiserver.service"


def kilonode(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kilonode.cli", "local", *args], capture_output=True, text=True,
                          timeout=180, check=False, env=os.environ | {"COLUMNS": "200"})




def status_json(directory: Path) -> dict[str, Any]:
    result = kilonode("status", "--state-dir", str(directory), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def pids(document: dict[str, Any]) -> dict[str, int]:
    return {m["name"]: m["pid"] for c in document["clusters"].values() for m in c["members"]}


def ctl(cluster: dict[str, Any], *args: str, ca: str | None = None) -> subprocess.CompletedProcess[str]:
    tls = ClientTls(Path(ca or cluster["ca"]), Path(cluster["cert"]), Path(cluster["key"]))
    return etcd.etcdctl(cluster["endpoints"], tls, *args)


def test_up_refuses_a_taken_port_before_starting_anything(state: Path) -> None:
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.1.22", 2379))  # etcd-events-2's client address in the `local` stack
        held.listen()
        result = kilonode("up", "--no-worker", "--state-dir", str(state))
    assert result.returncode == 2
    message = " ".join((result.stdout + result.stderr).split())
    assert "127.0.1.22:2379" in message and f"taken by PID {os.getpid()}" in message
    assert not list(state.glob("etcd/*/etcd.pid"))  # nothing was started


def test_local_up_status_and_down_on_the_local_stack(state: Path, plans: dict[str, ClusterPlan]) -> None:
    first = kilonode("up", "--no-worker", "--state-dir", str(state))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "ok apiserver-0 kube-apiserver etcd flags" in first.stdout
    assert "Not started here, and why" in first.stdout and "kube-apiserver" in first.stdout
    # the worker VM is left out here (tests/local/test_local_worker.py boots it), and says so
    assert "worker VM" in first.stdout and "--no-worker" in first.stdout

    document = status_json(state)
    clusters = document["clusters"]
    assert set(clusters) == {"main", "events"} and document["healthy"]
    assert clusters["main"]["cluster_id"] != clusters["events"]["cluster_id"]
    assert clusters["main"]["endpoints"] == ["https://127.0.1.10:2379", "https://127.0.1.11:2379",
                                             "https://127.0.1.12:2379"]
    for cluster in clusters.values():
        assert cluster["quota_bytes"] == 8 * 1024**3 and cluster["alarms"] == []
        for endpoint in cluster["endpoints"]:
            # exactly the listed certificates, one endpoint at a time
            health = ctl(cluster | {"endpoints": [endpoint]}, "endpoint", "health")
            assert health.returncode == 0 and "is healthy" in health.stdout + health.stderr, health.stderr
    # negative: the other cluster's CA does not verify these servers
    wrong_ca = ctl(clusters["main"], "endpoint", "health", ca=clusters["events"]["ca"])
    assert wrong_ca.returncode != 0

    # the apiserver flag check passes, and the same function catches an events endpoint in --etcd-servers
    plan = plans["local"]
    unit = render_cluster(plan)["apiserver-0"][APISERVER_UNIT].content
    where = LocalPki(state)
    layout = pki.pki_layout(plan)
    ids = {role: int(c["cluster_id"], 16) for role, c in clusters.items()}
    urls = {role: c["endpoints"] for role, c in clusters.items()}
    def check(text: str):
        return check_apiserver_etcd(text, "apiserver-0", address_map(plan), where.host_files("apiserver-0", layout),
                                    ids, urls)

    assert check(unit).ok, check(unit).problems
    wrong = unit.replace("--etcd-servers=https://10.0.1.10:2379,", "--etcd-servers=https://10.0.1.20:2379,")
    assert wrong != unit
    problems = check(wrong).problems
    assert any("https://10.0.1.20:2379" in p and "the events cluster" in p and "not of the main" in p
               for p in problems), problems
    assert any("leaves out main member(s) https://127.0.1.10:2379" in p for p in problems), problems

    # a second up changes nothing
    before = pids(document)
    second = kilonode("up", "--no-worker", "--state-dir", str(state))
    assert second.returncode == 0 and "Nothing changed" in second.stdout, second.stdout + second.stderr
    assert pids(status_json(state)) == before

    # a member that died is started again; the others are left alone
    os.kill(before["etcd-main-1"], signal.SIGKILL)
    third = kilonode("up", "--no-worker", "--state-dir", str(state))
    assert third.returncode == 0 and "started etcd-main-1" in third.stdout, third.stdout + third.stderr
    after = pids(status_json(state))
    assert after["etcd-main-1"] != before["etcd-main-1"]
    assert {k: v for k, v in after.items() if k != "etcd-main-1"} == \
        {k: v for k, v in before.items() if k != "etcd-main-1"}

    # data survives down --keep and up
    assert ctl(clusters["main"], "put", "/kilonode/rehearsal", "kept").returncode == 0
    kept = kilonode("down", "--state-dir", str(state), "--keep")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert not any(etcd.alive(pid) for pid in after.values()) and state.is_dir()
    # a PID file that now names another process (ours) is named, and that process left alone
    pid_file = state / "etcd" / "etcd-main-0" / "etcd.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    stale = kilonode("status", "--state-dir", str(state))
    assert stale.returncode == 1 and f"PID {os.getpid()}" in stale.stdout and "not this member" in stale.stdout
    again = kilonode("up", "--no-worker", "--state-dir", str(state))
    assert again.returncode == 0, again.stdout + again.stderr
    got = ctl(clusters["main"], "get", "/kilonode/rehearsal", "--print-value-only")
    assert got.stdout.strip() == "kept"

    last = pids(status_json(state))
    gone = kilonode("down", "--state-dir", str(state))
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert not any(etcd.alive(pid) for pid in last.values())
    assert not state.exists()


def test_changed_flags_are_refused_while_the_old_ones_run_and_taken_after_down_keep(
    state: Path, write_stack: StackWriter
) -> None:
    """A stack edited while its rehearsal runs: `up` never restarts a healthy member behind the
    user's back; after `down --keep` it starts the members with the new flags, on their data."""
    cluster = shipped_cluster_value("local")
    path = write_stack(cluster, name="local")
    first = kilonode("up", "--no-worker", str(path), "--state-dir", str(state))
    assert first.returncode == 0, first.stdout + first.stderr
    cluster["etcd"]["events"]["quotaBackendBytes"] = 4 * 1024**3
    write_stack(cluster, name="local")
    refused = kilonode("up", "--no-worker", str(path), "--state-dir", str(state))
    message = " ".join(refused.stderr.split())
    assert refused.returncode == 2 and "other flags for etcd-events-0, etcd-events-1, etcd-events-2" in message
    assert "--keep" in message
    assert kilonode("down", str(path), "--state-dir", str(state), "--keep").returncode == 0
    again = kilonode("up", "--no-worker", str(path), "--state-dir", str(state))
    assert again.returncode == 0, again.stdout + again.stderr
    clusters = status_json(state)["clusters"]
    assert (clusters["main"]["quota_bytes"], clusters["events"]["quota_bytes"]) == (8 * 1024**3, 4 * 1024**3)


def test_a_stack_with_a_leases_cluster_runs_three_clusters_and_the_apiserver_reaches_each(
    state: Path, tmp_path: Path
) -> None:
    from kilonode.config import load_stack
    from kilonode.plan import plan_stack
    from tests.golden.update import variant_stack

    stack = variant_stack("local-leases", tmp_path)
    up = kilonode("up", str(stack.file), "--no-worker", "--state-dir", str(state))
    assert up.returncode == 0, up.stdout + up.stderr
    said = " ".join(up.stdout.split())
    assert "all 9 endpoints answer" in said and "the coordination.k8s.io/leases override the leases cluster" in said
    document = status_json_of(stack.file, state)
    clusters = document["clusters"]
    assert list(clusters) == ["main", "events", "leases"] and document["healthy"]
    assert len({c["cluster_id"] for c in clusters.values()}) == 3
    assert clusters["leases"]["endpoints"] == ["https://127.0.1.30:2379", "https://127.0.1.31:2379",
                                               "https://127.0.1.32:2379"]
    # a Lease written where the apiserver would write it, read back from the leases cluster alone
    key = "/registry/leases/kube-node-lease/node-0"
    assert ctl(clusters["leases"], "put", key, "renewed").returncode == 0
    assert ctl(clusters["leases"], "get", key, "--print-value-only").stdout.strip() == "renewed"
    assert ctl(clusters["main"], "get", key, "--print-value-only").stdout.strip() == ""
    assert ctl(clusters["leases"], "endpoint", "health", ca=clusters["main"]["ca"]).returncode != 0

    # the apiserver check names a missing leases override, and one whose cluster does not run
    plan = plan_stack(load_stack(str(stack.file)))
    unit = render_cluster(plan)["apiserver-0"][APISERVER_UNIT].content
    layout = pki.pki_layout(plan)
    files = LocalPki(state).host_files("apiserver-0", layout)
    ids = {role: int(c["cluster_id"], 16) for role, c in clusters.items()}
    urls = {role: c["endpoints"] for role, c in clusters.items()}
    assert check_apiserver_etcd(unit, "apiserver-0", address_map(plan), files, ids, urls).ok
    entry = "," + plan.control_plane.etcd_servers_overrides.split(",")[1]
    assert entry.startswith(",coordination.k8s.io/leases#https://10.0.1.30:2379")
    without = check_apiserver_etcd(unit.replace(entry, ""), "apiserver-0", address_map(plan), files, ids, urls)
    assert without.problems == ("--etcd-servers-overrides has no coordination.k8s.io/leases entry: every Lease "
                                "would share the main cluster",)
    no_cluster = check_apiserver_etcd(unit, "apiserver-0", address_map(plan), files,
                                      {r: i for r, i in ids.items() if r != "leases"},
                                      {r: u for r, u in urls.items() if r != "leases"})
    assert "--etcd-servers-overrides names coordination.k8s.io/leases, but no cluster for it runs here" in \
        no_cluster.problems

    last = pids(document)
    gone = kilonode("down", str(stack.file), "--state-dir", str(state))
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert len(last) == 9 and not any(etcd.alive(pid) for pid in last.values())
    assert not state.exists()


def status_json_of(stack_file: Path, directory: Path) -> dict[str, Any]:
    result = kilonode("status", str(stack_file), "--state-dir", str(directory), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)
