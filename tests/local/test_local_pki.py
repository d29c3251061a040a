"""The local issuer (kilonode.local.pki): the layout's certificates, checked by Debian's
openssl, at loopback addresses; idempotent; reissues what is no longer right."""

from __future__ import annotations

import datetime
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography import x509

from kilonode.local import pki as local_pki
from kilonode.local.addresses import address_map
from kilonode.plan import ClusterPlan, pki

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"
PURPOSE = {"server_auth": "sslserver", "client_auth": "sslclient"}


@pytest.fixture(scope="module")
def issued(plans: dict[str, ClusterPlan], tmp_path_factory: pytest.TempPathFactory) -> tuple[pki.PkiLayout, Path]:
    root = tmp_path_factory.mktemp("state")
    layout, report = local_pki.issue_plan(plans["local"], root)
    assert len(report.created) == len(layout.authorities) + len(layout.leaves) + len(layout.keys)
    return layout, root


def openssl_verify(ca: Path, cert: Path, purpose: str | None = None) -> subprocess.CompletedProcess[str]:
    args = [OPENSSL, "verify", "-CAfile", str(ca), *(["-purpose", purpose] if purpose else []), str(cert)]
    return subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)


def test_every_leaf_verifies_against_its_ca_with_openssl_for_each_of_its_uses(
    issued: tuple[pki.PkiLayout, Path]
) -> None:
    layout, root = issued
    where = local_pki.LocalPki(root)
    for leaf in layout.leaves:
        ca, cert = where.cert(leaf.ca, "authority"), where.cert(leaf.name, "leaf")
        result = openssl_verify(ca, cert)
        assert result.returncode == 0 and result.stdout.strip().endswith(": OK"), (leaf.name, result.stderr)
        for use in set(leaf.uses) & set(PURPOSE):
            assert openssl_verify(ca, cert, PURPOSE[use]).returncode == 0, (leaf.name, use)
        for use in set(PURPOSE) - set(leaf.uses):
            # a client certificate is refused as a server one, and the other way round
            assert openssl_verify(ca, cert, PURPOSE[use]).returncode != 0, (leaf.name, use)


def test_a_leaf_does_not_verify_against_another_clusters_ca(issued: tuple[pki.PkiLayout, Path]) -> None:
    _, root = issued
    where = local_pki.LocalPki(root)
    result = openssl_verify(where.cert("etcd-events-ca", "authority"), where.cert("etcd-main-0-peer", "leaf"))
    assert result.returncode != 0 and "unable to get local issuer certificate" in result.stdout + result.stderr


def test_sans_and_extended_uses_are_the_layouts_with_loopback_addresses(
    issued: tuple[pki.PkiLayout, Path]
) -> None:
    layout, root = issued
    where = local_pki.LocalPki(root)
    for leaf in layout.leaves:
        found = local_pki.profile_of(x509.load_pem_x509_certificate(where.cert(leaf.name, "leaf").read_bytes()))
        assert found.dns_names == set(leaf.dns_names)
        assert found.extended == {u for u in leaf.uses if u in PURPOSE}
        assert not found.is_ca
        assert all(ip.startswith("127.") or ip == "172.16.0.1" for ip in found.ip_addresses), leaf.name
    # written out by hand, not derived: 10.0.1.10 -> 127.0.1.10, the LB 10.0.0.4 -> 127.0.0.4
    server = local_pki.profile_of(_cert(where.cert("etcd-main-0-server", "leaf")))
    assert server.ip_addresses == {"127.0.1.10", "127.0.0.1"}
    serving = local_pki.profile_of(_cert(where.cert("apiserver-0-serving", "leaf")))
    assert serving.ip_addresses == {"127.0.0.10", "127.0.0.4", "172.16.0.1", "127.0.0.1"}
    for authority in layout.authorities:
        ca = local_pki.profile_of(_cert(where.cert(authority.name, "authority")))
        assert ca.is_ca and ca.key_usage == {"cert_signing", "crl_signing", "digital_signature"}


def test_host_files_are_the_layouts_with_keys_0600(issued: tuple[pki.PkiLayout, Path]) -> None:
    layout, root = issued
    where = local_pki.LocalPki(root)
    for host, files in (*layout.hosts.items(), ("node", layout.node_files)):
        for f in files:
            path = where.host_file(host, f.path)
            assert path.stat().st_mode & 0o777 == f.mode, path
    for key in (root / "pki").rglob("*.key"):
        assert key.stat().st_mode & 0o777 == 0o600, key
    main = where.host_file("etcd-events-1", "/etc/etcd/pki/client-ca.crt").read_text()
    assert main.count("BEGIN CERTIFICATE") == 2  # main CA (the apiserver's client) + events CA
    assert where.host_file("etcd-main-0", "/etc/etcd/pki/server.key").read_bytes() == \
        where.key("etcd-main-0-server", "leaf").read_bytes()
    bootstrap = where.host_file("node", "/etc/kubernetes/bootstrap-kubelet.kubeconfig").read_text()
    assert "server: https://127.0.0.4:6443" in bootstrap and where.token_file.read_text() in bootstrap


def test_a_second_run_reuses_everything_and_writes_nothing(plans: dict[str, ClusterPlan], tmp_path: Path) -> None:
    _, first = local_pki.issue_plan(plans["local"], tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    _, second = local_pki.issue_plan(plans["local"], tmp_path)
    assert second.created == [] and second.reissued == [] and second.files_written == 0
    assert len(second.reused) == len(first.created)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_what_is_no_longer_right_is_reissued_and_named(plans: dict[str, ClusterPlan], tmp_path: Path) -> None:
    plan = plans["local"]
    local_pki.issue_plan(plan, tmp_path)
    where = local_pki.LocalPki(tmp_path)
    # a leaf signed by another CA, a leaf whose key is gone, a CA replaced (everything it signed follows)
    shutil.copy(where.cert("etcd-events-0-peer", "leaf"), where.cert("etcd-main-0-peer", "leaf"))
    where.key("etcd-main-1-peer", "leaf").unlink()
    where.key("kubernetes-ca", "authority").unlink()
    layout, report = local_pki.issue_plan(plan, tmp_path)
    reasons = dict(report.reissued)
    assert "etcd-main-0-peer" in reasons and "etcd-main-1-peer" in report.created
    assert "kubernetes-ca" in report.created
    assert all("CA did not sign it" in reasons[leaf.name] for leaf in layout.leaves if leaf.ca == "kubernetes-ca")
    main_ca, peer = where.cert("etcd-main-ca", "authority"), where.cert("etcd-main-0-peer", "leaf")
    assert openssl_verify(main_ca, peer).returncode == 0


def test_only_the_administrators_leaves_renew_early_and_a_hosts_leaf_only_once_expired(
    plans: dict[str, ClusterPlan], tmp_path: Path
) -> None:
    # As pulumi-tls does with the layout's early_renewal_hours: a host's leaves are renewed by
    # its generation (or `kilonode local renew-certs`), never all at once by the calendar.
    plan = plans["local"]
    layout, _ = local_pki.issue_plan(plan, tmp_path)
    now = datetime.datetime.now(datetime.UTC)
    in_window = now + datetime.timedelta(hours=pki.LEAF_HOURS - pki.RENEW_HOURS + 1)
    reasons = dict(local_pki.issue(layout, tmp_path, address_map(plan), now=in_window).reissued)
    assert set(reasons) == {"admin", "super-admin"}
    assert "inside its renewal window" in reasons["admin"]
    expired = now + datetime.timedelta(hours=pki.LEAF_HOURS + 1)
    reasons = dict(local_pki.issue(layout, tmp_path, address_map(plan), now=expired).reissued)
    # every host leaf once expired (the admins' were just reissued); CAs live ten years
    assert set(reasons) == {leaf.name for leaf in layout.leaves if leaf.host is not None}


def test_a_changed_address_map_reissues_the_certificates_that_name_the_address(
    plans: dict[str, ClusterPlan], tmp_path: Path
) -> None:
    plan = plans["local"]
    layout, _ = local_pki.issue_plan(plan, tmp_path)
    moved = address_map(plan) | {"10.0.1.10": "127.9.9.9"}
    reasons = dict(local_pki.issue(layout, tmp_path, moved).reissued)
    assert set(reasons) == {"etcd-main-0-server", "etcd-main-0-peer"}
    assert "ip_addresses" in reasons["etcd-main-0-server"]


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())
