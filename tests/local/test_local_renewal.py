"""A certificate renewal rehearsed on real etcd, one member at a time, before expiry: the `local`
stack's clusters brought up by `kilonode local up` from their rendered units, a steady stream of
writes into the main cluster, and `kilonode local renew-certs` on etcd-main-0, -1 and -2 in turn
(new keys, the same CA, new serials, as a new certificate generation issues them in Azure; the
member restarted alone from its unit's command line). Quorum and every acknowledged write survive."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography import x509

from kilonode.local import etcd, rehearsal
from kilonode.local.pki import LocalPki
from tests.etcd.harness import Kv, Writer

# the same loopback addresses as tests/local/test_local_etcd.py: never two rehearsals at once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("local-rehearsal")]

MEMBERS = ("etcd-main-0", "etcd-main-1", "etcd-main-2")
WRITE_RATE = 20.0  # puts a second: a steady apiserver-like stream that two cores keep up with


def kilonode(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kilonode.cli", "local", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env=os.environ | {"COLUMNS": "200"})




def serial(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def test_renewing_the_main_cluster_one_member_at_a_time_keeps_quorum_and_every_write(state: Path) -> None:
    up = kilonode("up", "--no-worker", "--state-dir", str(state))
    assert up.returncode == 0, up.stdout + up.stderr
    record = rehearsal.Record.load(state)
    assert record is not None
    main = next(c for c in record.clusters if c.role == "main")
    where = LocalPki(state)
    ca = x509.load_pem_x509_certificate(where.cert("etcd-main-ca", "authority").read_bytes())
    pids_before = {m.name: etcd.probe(m).pid for m in record.members}
    files_before = {m: {kind: serial(where.cert(f"{m}-{kind}", "leaf")) for kind in ("server", "peer")}
                    for m in MEMBERS}
    events_0 = where.cert("etcd-events-0-server", "leaf").read_bytes()

    writer = Writer(main.endpoints, (main.tls.ca, main.tls.cert, main.tls.key), "/renewal/", rate=WRITE_RATE)
    writer.start()
    renewed: dict[str, dict[str, int]] = {}
    try:
        time.sleep(2)  # writes under way before the first member goes
        for name in MEMBERS:
            result = kilonode("renew-certs", name, "--state-dir", str(state))
            assert result.returncode == 0, result.stdout + result.stderr
            # the member now serves, on both ports, the certificate the renewal wrote: new serial, same CA
            served = {listener: int(line.split("-> ")[1], 16) for line in result.stdout.splitlines()
                      for listener in ("client", "peer") if line.startswith(f"{name} {listener} certificate")}
            assert served == {"client": serial(where.cert(f"{name}-server", "leaf")),
                              "peer": serial(where.cert(f"{name}-peer", "leaf"))}
            assert served["client"] != files_before[name]["server"] and served["peer"] != files_before[name]["peer"]
            for kind in ("server", "peer"):
                cert = x509.load_pem_x509_certificate(where.cert(f"{name}-{kind}", "leaf").read_bytes())
                cert.verify_directly_issued_by(ca)
            renewed[name] = served
            # only that member restarted; the other members (and the events cluster) kept their PIDs
            pids = {m.name: etcd.probe(m).pid for m in record.members}
            changed = {m for m in pids if pids[m] != pids_before[m]}
            assert changed == set(MEMBERS[: MEMBERS.index(name) + 1]), changed
            # the others still trust it: every member answers a client, and each serves (its peer
            # port) to a peer of the cluster; the events cluster is untouched
            health = etcd.etcdctl(main.endpoints, main.tls, "endpoint", "health")
            assert health.returncode == 0, health.stderr
            time.sleep(1)  # writes flow between renewals, as between two `pulumi up`
    finally:
        log = writer.stop()

    assert set(renewed) == set(MEMBERS)
    assert where.cert("etcd-events-0-server", "leaf").read_bytes() == events_0
    # quorum held throughout: writes kept being acknowledged, never a gap as long as a lost quorum
    start, end = log.ack_times[0], log.ack_times[-1]
    assert len(log.acknowledged) >= WRITE_RATE * (end - start) * 0.5, (len(log.acknowledged), end - start)
    assert log.longest_gap_s(start, end) < 5.0, log.longest_gap_s(start, end)
    # every acknowledged write is there, read back from every member (each restarted on new certificates)
    for endpoint in main.endpoints:
        reader = Kv(endpoint, (main.tls.ca, main.tls.cert, main.tls.key))
        try:
            stored = reader.range_prefix("/renewal/")
        finally:
            reader.close()
        missing = [k for k, v in log.acknowledged.items() if stored.get(k) != v]
        assert not missing, (endpoint, len(missing), missing[:3])


def test_renewal_is_refused_for_a_host_the_stack_does_not_have_and_when_the_cluster_is_unhealthy(
    state: Path,
) -> None:
    up = kilonode("up", "--no-worker", "--state-dir", str(state))
    assert up.returncode == 0, up.stdout + up.stderr
    unknown = kilonode("renew-certs", "etcd-main-7", "--state-dir", str(state))
    assert unknown.returncode == 2 and "etcd-main-7 is no control-plane host" in " ".join(unknown.stdout.split() +
                                                                                        unknown.stderr.split())
    record = rehearsal.Record.load(state)
    assert record is not None
    # one member down: renewing another would take a second of three down at once
    down = next(m for m in record.members if m.name == "etcd-main-1")
    etcd.stop([[down]])
    before = serial(LocalPki(state).cert("etcd-main-0-server", "leaf"))
    refused = kilonode("renew-certs", "etcd-main-0", "--state-dir", str(state))
    message = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode == 2 and "the main cluster is not healthy" in message, message
    assert serial(LocalPki(state).cert("etcd-main-0-server", "leaf")) == before  # nothing was issued
