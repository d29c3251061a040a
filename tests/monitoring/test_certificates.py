"""Certificate expiry, from the host to the alert: the program each control-plane host runs per
scrape (kilonode/node/cert_expiry.py) read against `cryptography` on the PKI the local issuer
makes, behind a real socket (systemd-socket-activate, as the rendered socket unit's Accept=yes
starts it); its units checked by systemd-analyze; its scrape job and NSG path; and the alerts
evaluated by promtool on synthetic series (tests/monitoring/alert_cases.py: each fires when it
should, and only then)."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from kilonode.azure.graph import Graph
from kilonode.local import pki as local_pki
from kilonode.node import cert_expiry
from kilonode.node.ship import CERT_EXPIRY, programs_for
from kilonode.plan import ClusterPlan, pki, wellknown
from kilonode.render import cert_metrics, monitoring, render_cluster
from tests.azure.conftest import covers_port, nsg_rules_for, sources
from tests.render.consumers import systemd_verify, verify_rendered_units

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


def metric_lines(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


@pytest.fixture
def issued(plans: dict[str, ClusterPlan], tmp_path: Path) -> tuple[ClusterPlan, Path, Path]:
    """The `local` PKI issued here, and etcd-main-0's certificate config pointing at its files."""
    plan = plans["local"]
    layout, _ = local_pki.issue_plan(plan, tmp_path / "state")
    where = local_pki.LocalPki(tmp_path / "state")
    rendered = json.loads(render_cluster(plan)["etcd-main-0"][cert_metrics.CONFIG_PATH].content)
    local = {"host": rendered["host"], "files": [str(where.host_file("etcd-main-0", p)) for p in rendered["files"]]}
    config = tmp_path / "certificates.json"
    config.write_text(json.dumps(local))
    assert layout.hosts["etcd-main-0"]
    return plan, config, tmp_path / "state"


def test_the_program_reports_each_certificates_not_after_as_cryptography_reads_it(
    issued: tuple[ClusterPlan, Path, Path],
) -> None:
    _plan, config, _state = issued
    out = subprocess.run([sys.executable, str(CERT_EXPIRY.path), "--print", "--config", str(config)],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    found = metric_lines(out)
    files = json.loads(config.read_text())["files"]
    wanted = {}
    for path in files:
        certs = x509.load_pem_x509_certificates(Path(path).read_bytes())
        for i, cert in enumerate(certs):
            key = f'kilonode_certificate_not_after_seconds{{host="etcd-main-0",path="{path}",index="{i}"}}'
            wanted[key] = cert.not_valid_after_utc.timestamp()
    assert found == wanted
    # the member's CA, its client CA bundle, its server and peer certificates: four files, four certificates
    assert len(files) == 4 and len(found) == 4


def test_a_kubeconfigs_client_certificate_is_copied_out_and_reported_as_cryptography_reads_it(
    plans: dict[str, ClusterPlan], tmp_path: Path,
) -> None:
    """apiserver-0's component kubeconfigs (scheduler, controller manager, node client approver, GPU
    health controller) carry client certificates that expire like any other, and their keys: the
    answer runs as a dynamic user that reads no key (0600, root's), so the unit's privileged
    ExecStartPre copies each client certificate, and nothing else, to a 0644 file the answer reads
    (the independent trace of issue 37, round 4: the kubeconfigs themselves were listed, and read
    as unreadable on every apiserver)."""
    plan = plans["local"]
    local_pki.issue_plan(plan, tmp_path / "state")
    where = local_pki.LocalPki(tmp_path / "state")
    rendered = json.loads(render_cluster(plan)["apiserver-0"][cert_metrics.CONFIG_PATH].content)
    assert rendered["copies"] == cert_metrics.CLIENT_CERT_DIR
    kubeconfigs = [p for p in rendered["files"] if p.endswith(".kubeconfig")]
    assert wellknown.SCHEDULER_KUBECONFIG in kubeconfigs and wellknown.NODE_CLIENT_APPROVER_KUBECONFIG in kubeconfigs
    copies = tmp_path / "run"
    config = {"host": "apiserver-0", "copies": str(copies),
              "files": [str(where.host_file("apiserver-0", k)) for k in kubeconfigs]}
    path = tmp_path / "certificates.json"
    path.write_text(json.dumps(config))
    subprocess.run([sys.executable, str(CERT_EXPIRY.path), "--extract-client-certs", "--config", str(path)],
                   check=True, timeout=30)
    wanted = {}
    for kubeconfig in config["files"]:
        copy = copies / (Path(kubeconfig).name.removesuffix(".kubeconfig") + ".crt")
        assert copy.stat().st_mode & 0o777 == 0o644 and b"PRIVATE KEY" not in copy.read_bytes()
        user = yaml.safe_load(Path(kubeconfig).read_text())["users"][0]["user"]
        cert = x509.load_pem_x509_certificate(base64.b64decode(user["client-certificate-data"]))
        assert x509.load_pem_x509_certificates(copy.read_bytes()) == [cert]
        # the series keeps the kubeconfig's path: what the operator renews
        key = f'kilonode_certificate_not_after_seconds{{host="apiserver-0",path="{kubeconfig}",index="0"}}'
        wanted[key] = cert.not_valid_after_utc.timestamp()
    found = metric_lines(cert_expiry.metrics(config))
    assert found == wanted and len(found) == len(kubeconfigs)
    # a kubeconfig gone leaves no stale copy behind: the answer says unreadable
    Path(config["files"][0]).unlink()
    cert_expiry.extract_client_certs(config)
    assert not (copies / (Path(config["files"][0]).name.removesuffix(".kubeconfig") + ".crt")).exists()
    assert "kilonode_certificate_unreadable" in cert_expiry.metrics(config)


def test_a_missing_or_broken_file_is_reported_never_silent(issued: tuple[ClusterPlan, Path, Path],
                                                           tmp_path: Path) -> None:
    _plan, config, _state = issued
    broken = tmp_path / "broken.crt"
    broken.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    document = json.loads(config.read_text())
    document["files"] += [str(tmp_path / "absent.crt"), str(broken)]
    found = metric_lines(cert_expiry.metrics(document))
    assert found[f'kilonode_certificate_unreadable{{host="etcd-main-0",path="{tmp_path / "absent.crt"}",'
                 'error="FileNotFoundError"}'] == 1
    assert any(k.startswith("kilonode_certificate_unreadable") and str(broken) in k for k in found)
    assert sum(k.startswith("kilonode_certificate_not_after_seconds") for k in found) == 4


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_behind_a_real_accepting_socket_each_connection_gets_one_answer(issued: tuple[ClusterPlan, Path, Path]) -> None:
    if not shutil.which("systemd-socket-activate"):
        pytest.fail("systemd-socket-activate missing (Debian's systemd package)")
    _plan, config, _state = issued
    port = free_port()
    # --inetd: the connection on stdin and stdout, as the rendered service's StandardInput=socket
    server = subprocess.Popen(["systemd-socket-activate", "--accept", "--inetd", "-l", f"127.0.0.1:{port}",
                               sys.executable, str(CERT_EXPIRY.path), "--config", str(config)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        answers = []
        while len(answers) < 2 and time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                    conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n\r\n")
                    data = b""
                    while chunk := conn.recv(65536):
                        data += chunk
                answers.append(data.decode())
            except ConnectionRefusedError:
                time.sleep(0.1)
        assert len(answers) == 2
        for answer in answers:
            head, _, body = answer.partition("\r\n\r\n")
            assert head.startswith("HTTP/1.0 200 OK") and "text/plain; version=0.0.4" in head
            assert len(metric_lines(body)) == 4
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_the_units_pass_systemd_analyze_verify_and_listen_where_prometheus_scrapes(
    plans: dict[str, ClusterPlan], tmp_path: Path
) -> None:
    plan = plans["research-7500"]
    hosts = render_cluster(plan)
    files = hosts["apiserver-3"]
    assert verify_rendered_units(tmp_path, files, (cert_metrics.SOCKET_PATH, cert_metrics.SERVICE_PATH)) == []
    # a misspelt key is caught by the same check (the check can fail)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / cert_metrics.SOCKET).write_text(files[cert_metrics.SOCKET_PATH].content.replace("Accept=", "Acept="))
    (broken / cert_metrics.SERVICE).write_text(files[cert_metrics.SERVICE_PATH].content)
    assert any("Acept" in line for line in systemd_verify(broken, [broken / cert_metrics.SOCKET]))

    [job] = [j for j in yaml.safe_load(monitoring.scrape_config(plan))["scrape_configs"]
             if j["job_name"] == monitoring.JOB_CERTIFICATES]
    targets = {group["labels"]["member"]: group["targets"] for group in job["static_configs"]}
    for name, host_files in hosts.items():
        if cert_metrics.SOCKET_PATH not in host_files:
            continue
        listen = next(line.split("=", 1)[1] for line in host_files[cert_metrics.SOCKET_PATH].content.splitlines()
                      if line.startswith("ListenStream="))
        assert targets.pop(name) == [listen], name
        # started at boot with the host's other units
        assert cert_metrics.SOCKET in host_files["user-data"].content
    assert targets == {}  # every target is a host that listens
    control_plane = {m.name for c in plan.etcd_clusters for m in c.members} | \
        {i.name for i in plan.control_plane.instances}
    assert {n for n, f in hosts.items() if cert_metrics.SOCKET_PATH in f} == control_plane
    # the program they run is their images' (kilonode.node.ship), in no host's custom data
    assert not [n for n, f in hosts.items() if cert_metrics.SCRIPT_PATH in f]
    assert CERT_EXPIRY.machine_path == f"/{cert_metrics.SCRIPT_PATH}" and CERT_EXPIRY.mode & 0o111
    assert CERT_EXPIRY in programs_for("etcd") and CERT_EXPIRY in programs_for("control-plane")
    assert CERT_EXPIRY not in programs_for(None, ("gpu", "infiniband"))


def test_each_host_lists_every_certificate_file_it_holds(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["research-7500"]
    layout = pki.pki_layout(plan)
    rendered = render_cluster(plan)
    for host in layout.hosts:
        config = json.loads(rendered[host][cert_metrics.CONFIG_PATH].content)
        assert config["host"] == host
        held = {f.path for f in layout.hosts[host] if f.path.endswith(".crt")}
        # and the co-located components' kubeconfigs, which embed their client certificates (read
        # from copies: the answer may not read their keys)
        kubeconfigs = {f.path for f in layout.hosts[host] if isinstance(f.content, pki.Kubeconfig) and f.content.client}
        assert ("copies" in config) == bool(kubeconfigs), host
        assert set(config["files"]) == held | kubeconfigs, host
    assert wellknown.APISERVER_ETCD_CA_BUNDLE in json.loads(rendered["apiserver-0"][cert_metrics.CONFIG_PATH]
                                                            .content)["files"]


@pytest.mark.parametrize("stack", ["local", "research-7500"])
def test_prometheus_and_no_other_pool_reaches_every_hosts_certificate_metrics(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    plan = plans[stack]
    assert plan.prometheus is not None
    [monitoring] = [str(p.subnet) for p in plan.node_pools if p.name == plan.prometheus.pool]
    for nsg in ("etcd", "control-plane"):
        rules = [r for r in nsg_rules_for(graphs[stack], nsg)
                 if r["access"] == "Allow" and covers_port(r, wellknown.CERT_METRICS_PORT)]
        # plain HTTP: the scraper's subnet alone (kilonode.azure.network)
        assert {s for r in rules for s in sources(r)} == {monitoring}, nsg


# The expiry and unreadable alerts' promtool cases are in tests/monitoring/alert_cases.py (certificate_*).
