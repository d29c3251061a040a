"""The schedulers and controller managers, scraped: each one's flags (its VM's address, its secure
port, the serving pair the PKI layout delivers to that host), the scrape job that dials exactly
there with the cluster CA, the certificate a real TLS client accepts at that address and nowhere
else, and what the Azure program issues and writes into the VM's custom data. The security group
that lets the Prometheus pool in and no other pool (tests/azure/test_network.py; the path traced by
preflight: tests/preflight/test_scrape_path.py). The alerts' promtool cases are in
tests/monitoring/alert_cases.py (the leases); the flags' existence at the pinned Kubernetes in
tests/render/test_upstream_flags.py."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from kilonode.azure.graph import Graph
from kilonode.local import pki as local_pki
from kilonode.local.addresses import address_map
from kilonode.plan import ClusterPlan, pki, wellknown
from kilonode.render import monitoring
from tests import shared
from tests.k8s.test_gpu import written_files
from tests.render.test_upstream_flags import exec_start

STACKS = ["local", "research-2500", "research-7500"]
# (job, unit, port, serving certificate, its key)
COMPONENTS = [
    (monitoring.JOB_SCHEDULER, "kube-scheduler", wellknown.SCHEDULER_PORT, wellknown.SCHEDULER_SERVING_CERT,
     wellknown.SCHEDULER_SERVING_KEY),
    (monitoring.JOB_CONTROLLER_MANAGER, "kube-controller-manager", wellknown.CONTROLLER_MANAGER_PORT,
     wellknown.CONTROLLER_MANAGER_SERVING_CERT, wellknown.CONTROLLER_MANAGER_SERVING_KEY),
]


def jobs(plan: ClusterPlan) -> dict[str, dict[str, Any]]:
    return {j["job_name"]: j for j in yaml.safe_load(monitoring.prometheus_config(plan) or "")["scrape_configs"]}


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("job_name, unit, port, cert, key", COMPONENTS)
def test_each_one_listens_on_its_vms_address_with_the_pair_delivered_there_where_its_job_dials(
    plans: dict[str, ClusterPlan], stack: str, job_name: str, unit: str, port: int, cert: str, key: str
) -> None:
    plan = plans[stack]
    layout = pki.pki_layout(plan)
    rendered = shared.rendered(stack)
    dialled = []
    for instance in plan.control_plane.instances:
        program, flags = exec_start(rendered[instance.name][f"etc/systemd/system/{unit}.service"].content)
        assert program == unit
        # its VM's address, not 0.0.0.0 and not loopback; the port the NSG and the job name
        assert flags["bind-address"] == str(instance.ip) and flags["secure-port"] == str(port)
        assert (flags["tls-cert-file"], flags["tls-private-key-file"]) == (cert, key)
        delivered = {f.path: f.content for f in layout.hosts[instance.name]}
        served = delivered[cert]
        assert isinstance(served, pki.Cert)
        leaf = layout.leaf(served.of)
        assert delivered[key] == pki.PrivateKey(leaf.name)
        assert leaf.ip_addresses == (flags["bind-address"],) and leaf.ca == pki.KUBERNETES_CA
        dialled.append(f"{flags['bind-address']}:{flags['secure-port']}")
    job = jobs(plan)[job_name]
    assert job["static_configs"] == [{"targets": dialled}]
    # https verified with the cluster CA (what the ServiceAccount mounts), the ServiceAccount's token;
    # never insecure_skip_verify
    assert job["scheme"] == "https" and job["tls_config"] == {"ca_file": monitoring.SA_CA}
    assert job["authorization"] == {"type": "Bearer", "credentials_file": monitoring.SA_TOKEN}
    assert plan.prometheus is not None
    assert job["scrape_interval"] == f"{plan.prometheus.control_plane_interval_s}s"


def serve_once(address: str, cert: Path, key: Path) -> tuple[int, threading.Thread]:
    """A TLS server on `address` with the certificate and key, answering one handshake."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server((address, 0))
    port = int(listener.getsockname()[1])

    def accept() -> None:
        with listener:
            listener.settimeout(10)
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                return
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError):
                pass  # the client refused the certificate

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    return port, thread


def handshake(address: str, port: int, ca: Path, name: str) -> bytes:
    """Connect to address:port as Prometheus does: the CA alone trusted, the target's address the
    name the certificate must carry (an IP SAN)."""
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection((address, port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=name) as tls:
        return tls.recv(2)


@pytest.mark.parametrize("job_name, unit, port, cert, key", COMPONENTS)
def test_a_tls_client_trusting_the_cluster_ca_accepts_the_certificate_at_its_hosts_address_only(
    plans: dict[str, ClusterPlan], tmp_path: Path, job_name: str, unit: str, port: int, cert: str, key: str
) -> None:
    """The local issuer (what `kilonode local up` runs, the same layout as Azure's) gives each host's
    address its loopback twin: the certificate names that address alone, the Kubernetes CA signed it,
    it serves and does not sign or authenticate clients; a client verifying as Prometheus does
    completes the handshake at that address and refuses it at another apiserver's."""
    plan = plans["research-7500"]
    local_pki.issue_plan(plan, tmp_path)
    where = local_pki.LocalPki(tmp_path)
    addresses = address_map(plan)
    first, second = plan.control_plane.instances[:2]
    here = addresses[str(first.ip)]
    ca_file = where.host_file(first.name, wellknown.K8S_CA)
    ca = x509.load_pem_x509_certificate(ca_file.read_bytes())
    served = x509.load_pem_x509_certificate(where.host_file(first.name, cert).read_bytes())
    san = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == [here]
    assert san.get_values_for_type(x509.DNSName) == []
    public = ca.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    public.verify(served.signature, served.tbs_certificate_bytes, ec.ECDSA(served.signature_hash_algorithm))
    assert served.issuer == ca.subject
    assert list(served.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == \
        [ExtendedKeyUsageOID.SERVER_AUTH]
    assert served.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False

    key_file = where.host_file(first.name, key)
    listening, thread = serve_once(here, where.host_file(first.name, cert), key_file)
    assert handshake(here, listening, ca_file, here) == b"ok"
    thread.join(10)
    # the same certificate where the job dials another apiserver's scheduler: refused
    elsewhere = addresses[str(second.ip)]
    listening, thread = serve_once(elsewhere, where.host_file(first.name, cert), key_file)
    with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):
        handshake(elsewhere, listening, ca_file, elsewhere)
    thread.join(10)


@pytest.mark.parametrize("job_name, unit, port, cert, key", COMPONENTS)
def test_the_azure_program_issues_the_pair_for_the_vms_address_and_writes_it_into_its_custom_data(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], job_name: str, unit: str, port: int, cert: str,
    key: str
) -> None:
    graph, plan = graphs["research-7500"], plans["research-7500"]
    for instance in plan.control_plane.instances:
        name = f"research-7500-tls-{instance.name}-{unit}-serving"
        request = graph.named(f"{name}-csr").plain()
        assert request["ipAddresses"] == [str(instance.ip)] and "dnsNames" not in request
        assert request["subject"] == {"commonName": unit}
        signed = graph.named(name).plain()
        assert signed["caCertPem"] == "mock-certificate:research-7500-tls-kubernetes-ca"
        assert signed["allowedUses"] == list(pki.SERVER_USES)
        vm = graph.named(f"research-7500-{instance.name}").plain()
        written = written_files(vm["osProfile"]["customData"])
        assert written[cert]["content"] == f"mock-certificate:{name}" and written[cert]["permissions"] == "0644"
        assert written[key]["permissions"] == "0600" and written[key]["owner"] == "root:root"
