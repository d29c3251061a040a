"""Custom data: the rendered user-data unchanged, then the TLS files; keys 0600, secret, no PEM in plans."""

from __future__ import annotations

import email
from email.message import Message
from pathlib import Path

import pytest

from kilonode.azure import custom_data, custom_data_size
from kilonode.azure.graph import Graph
from kilonode.local import pki as local_pki
from kilonode.node import ship
from kilonode.plan import ClusterPlan, defaults
from kilonode.plan import wellknown as pki
from kilonode.plan.pki import pki_layout
from kilonode.render import USER_DATA
from tests import shared
from tests.azure.conftest import VM, VMSS

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


def parts(encoded: str) -> list[Message]:
    message = email.message_from_string(custom_data.decode(encoded))
    assert message.is_multipart()
    return [p for p in message.walk() if not p.is_multipart()]


def payload(part: Message) -> str:
    raw = part.get_payload(decode=True)
    assert isinstance(raw, bytes)
    return raw.decode()


def files_of(part: Message) -> dict[str, dict[str, object]]:
    document = shared.load_yaml(payload(part))
    assert document["merge_how"] == custom_data.MERGE_HOW
    return {f["path"]: f for f in document["write_files"]}


def test_custom_data_is_a_secret_input_of_every_vm_and_scale_set(graph_7500: Graph) -> None:
    for r in graph_7500.of_type(VM) + graph_7500.of_type(VMSS):
        profile = r.masked()["osProfile"] if r.type == VM else r.masked()["virtualMachineProfile"]["osProfile"]
        assert profile["customData"] == "[secret]"


@pytest.mark.parametrize("host", ["etcd-main-0", "etcd-events-2", "apiserver-4"])
def test_custom_data_keeps_the_rendered_user_data_unchanged_as_its_first_part(
    graph_7500: Graph, host: str
) -> None:
    rendered = shared.rendered("research-7500")[host][USER_DATA].content
    role, index = host.rsplit("-", 1)
    vm = graph_7500.named(f"research-7500-{role}-{index}").plain()
    first, second = parts(vm["osProfile"]["customData"])
    assert payload(first).rstrip("\n") == rendered.rstrip("\n")
    assert first.get_content_type() == second.get_content_type() == "text/cloud-config"


def test_etcd_members_get_their_own_clusters_pki_with_keys_0600_owned_by_etcd(graph_7500: Graph) -> None:
    for role, index in [("main", 0), ("events", 1)]:
        vm = graph_7500.named(f"research-7500-etcd-{role}-{index}").plain()
        files = files_of(parts(vm["osProfile"]["customData"])[1])
        # the TLS files, and where the snapshots go (kilonode.azure.backup)
        assert set(files) == {pki.ETCD_CA, pki.ETCD_CLIENT_CA, pki.ETCD_SERVER_CERT, pki.ETCD_SERVER_KEY,
                              pki.ETCD_PEER_CERT, pki.ETCD_PEER_KEY, defaults.ETCD_SNAPSHOT_AZURE_CONFIG}
        for key in (pki.ETCD_SERVER_KEY, pki.ETCD_PEER_KEY):
            assert files[key]["permissions"] == "0600" and files[key]["owner"] == "etcd:etcd"
            assert files[key]["defer"] is True  # the etcd user exists only after package install
            assert str(files[key]["content"]).startswith(f"mock-private-key:research-7500-tls-etcd-{role}-{index}")
        assert files[pki.ETCD_CA]["content"] == f"mock-certificate:research-7500-tls-etcd-{role}-ca"
        # Both clusters accept the apiserver's one client cert, signed by the main CA.
        assert str(files[pki.ETCD_CLIENT_CA]["content"]).startswith("mock-certificate:research-7500-tls-etcd-main-ca")


def test_apiservers_get_every_pki_path_the_renderer_references(graph_7500: Graph) -> None:
    vm = graph_7500.named("research-7500-apiserver-0").plain()
    files = files_of(parts(vm["osProfile"]["customData"])[1])
    wanted = {pki.K8S_CA, pki.K8S_CA_KEY, pki.APISERVER_CERT, pki.APISERVER_KEY, pki.APISERVER_ETCD_CA_BUNDLE,
              pki.APISERVER_ETCD_CLIENT_CERT, pki.APISERVER_ETCD_CLIENT_KEY, pki.APISERVER_KUBELET_CLIENT_CERT,
              pki.APISERVER_KUBELET_CLIENT_KEY, pki.SERVICE_ACCOUNT_KEY, pki.SERVICE_ACCOUNT_PUB,
              pki.FRONT_PROXY_CA, pki.FRONT_PROXY_CLIENT_CERT, pki.FRONT_PROXY_CLIENT_KEY}
    assert wanted <= set(files)
    for path, entry in files.items():
        secret = path.endswith(".key") or "kubeconfig" in path or path == pki.ENCRYPTION_CONFIG
        assert entry["permissions"] == ("0600" if secret else "0644")
    bundle = str(files[pki.APISERVER_ETCD_CA_BUNDLE]["content"]).splitlines()
    assert bundle == ["mock-certificate:research-7500-tls-etcd-main-ca",
                      "mock-certificate:research-7500-tls-etcd-events-ca"]


def test_the_apiservers_front_proxy_client_cert_is_signed_by_the_front_proxy_ca_not_the_cluster_ca(
        graph_7500: Graph) -> None:
    cert = graph_7500.named("research-7500-tls-apiserver-4-front-proxy-client").plain()
    assert cert["caCertPem"] == "mock-certificate:research-7500-tls-front-proxy-ca"
    assert cert["allowedUses"] == ["digital_signature", "key_encipherment", "client_auth"]
    csr = graph_7500.named("research-7500-tls-apiserver-4-front-proxy-client-csr").plain()
    assert csr["subject"] == {"commonName": "front-proxy-client"}
    vm = graph_7500.named("research-7500-apiserver-4").plain()
    files = files_of(parts(vm["osProfile"]["customData"])[1])
    assert files[pki.FRONT_PROXY_CA]["content"] == "mock-certificate:research-7500-tls-front-proxy-ca"
    assert files[pki.FRONT_PROXY_CLIENT_CERT]["content"] == \
        "mock-certificate:research-7500-tls-apiserver-4-front-proxy-client"
    assert files[pki.FRONT_PROXY_CLIENT_KEY]["permissions"] == "0600"


def test_apiserver_etcd_client_cert_is_signed_by_the_main_etcd_ca(graph_7500: Graph) -> None:
    cert = graph_7500.named("research-7500-tls-apiserver-4-etcd-client").plain()
    assert cert["caCertPem"] == "mock-certificate:research-7500-tls-etcd-main-ca"
    assert cert["allowedUses"] == ["digital_signature", "key_encipherment", "client_auth"]


def test_member_certificates_name_the_members_static_ip(graph_7500: Graph, plans: dict[str, ClusterPlan]) -> None:
    for member in plans["research-7500"].etcd_events.members:
        csr = graph_7500.named(f"research-7500-tls-{member.name}-server-csr").plain()
        assert str(member.ip) in csr["ipAddresses"]
        signed = graph_7500.named(f"research-7500-tls-{member.name}-server").plain()
        assert signed["caCertPem"] == "mock-certificate:research-7500-tls-etcd-events-ca"


def test_private_keys_are_secret_inputs_wherever_they_flow(graph_7500: Graph) -> None:
    carriers = set()
    for r in graph_7500.resources:
        masked = r.masked()
        for key in ("privateKeyPem", "caPrivateKeyPem"):
            if key in masked:
                assert masked[key] == "[secret]", r.name
                carriers.add(r.type.rsplit(":", 1)[1])
    # the check saw every kind of resource a key flows into (certificate requests, the CAs'
    # self-signed certificates, the certificates each CA signs)
    assert carriers == {"CertRequest", "SelfSignedCert", "LocallySignedCert"}


def test_composed_custom_data_is_deterministic_and_refuses_the_boundary() -> None:
    files = [("/etc/b.key", "k", 0o600, "root:root"), ("/etc/a.crt", "c", 0o644, "root:root")]
    one = custom_data.compose_mime("#cloud-config\nruncmd: []\n", files)
    assert one == custom_data.compose_mime("#cloud-config\nruncmd: []\n", list(reversed(files)))
    assert one.index("/etc/a.crt") < one.index("/etc/b.key")
    with pytest.raises(ValueError, match="boundary"):
        custom_data.compose_mime(f"#cloud-config\n# {custom_data.BOUNDARY}\n", files)
    with pytest.raises(ValueError, match="must start with"):
        custom_data.compose_mime("runcmd: []\n", files)


def test_custom_data_above_azures_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="above Azure's 65535"):
        custom_data.encode("#cloud-config\n" + "x" * 60000, "etcd-main-0")


def _machines(graph: Graph) -> list[str]:
    """Every distinct custom data of the graph's VMs and scale sets (a pool's shards share theirs)."""
    found = [r.plain()["osProfile"]["customData"] if r.type == VM
             else r.plain()["virtualMachineProfile"]["osProfile"]["customData"]
             for r in graph.of_type(VM) + graph.of_type(VMSS)]
    return list(dict.fromkeys(found))


def _host_of(stack: str, user_data: str) -> str:
    """The render role whose user-data is `user_data` (each member's and apiserver's is its own)."""
    [host] = [h for h, files in shared.rendered(stack).items()
              if USER_DATA in files and files[USER_DATA].content.rstrip("\n") == user_data.rstrip("\n")]
    return host


def real_custom_data(stack: str, plan: ClusterPlan, encoded: str, state: Path) -> tuple[str, str]:
    """(host, custom data) of one VM's or scale set's recorded custom data as Azure receives it: the
    same rendered user-data and files, with the local issuer's real certificates, keys and kubeconfigs
    (built as pulumi-tls builds them: the same algorithms, extensions and so about the same PEM
    sizes) where the mock engine has placeholders, and its other files (the snapshot upload's
    config, the EncryptionConfiguration) as the mock engine wrote them, at their real lengths.
    A pool's files are what every node of it gets (the cluster CA and the bootstrap kubeconfig)."""
    first, second = parts(encoded)
    user_data, written = payload(first), files_of(second)
    host = _host_of(stack, user_data)
    layout = pki_layout(plan)
    where = local_pki.LocalPki(state)
    issued = "node" if host not in layout.hosts else host
    real = {f.path: where.host_file(issued, f.path).read_text() for f in layout.hosts.get(host, layout.node_files)}
    assert set(real) <= set(written), host
    entries = [(path, str(entry["content"]), int(str(entry["permissions"]), 8), str(entry["owner"]))
               for path, entry in written.items()]
    # composed again from its parts, unchanged, it is the recorded custom data itself
    assert custom_data.encode(custom_data.compose_mime(user_data, entries), host) == encoded, host
    entries = [(path, real.get(path, content), mode, owner) for path, content, mode, owner in entries]
    return host, custom_data.encode(custom_data.compose_mime(user_data, entries), host)  # refuses above the limit


def every_hosts_real_custom_data(stack: str, graph: Graph, plan: ClusterPlan, state: Path) -> dict[str, str]:
    local_pki.issue_plan(plan, state)
    return dict(real_custom_data(stack, plan, encoded, state) for encoded in _machines(graph))


@pytest.mark.parametrize("stack", shared.SHIPPED_STACKS)
def test_every_hosts_custom_data_with_real_certificates_stays_within_azures_limit(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str, tmp_path: Path
) -> None:
    """The mock engine's placeholders are a few bytes; real PEMs are not. Every etcd member, every
    apiserver and every pool's scale sets (one custom data per registration group), each with the
    local issuer's certificates, keys and kubeconfigs. Measured, base64 bytes of 65,535, the largest
    of each kind (a few bytes vary between runs: serials and signatures):

    | stack | etcd-main | etcd-events | apiserver | pool |
    | --- | --- | --- | --- | --- |
    | local | 30,872 | 31,868 | 42,292 | 25,768 (cpu) |
    | research-2500 | 31,336 | 32,216 | 51,880 | 30,152 (nc-a100) |
    | research-7500 | 31,336 | 32,212 | 51,868 | 35,120 (h100-ib) |

    Before the node programs moved into the images (kilonode.node.ship), with the snapshot job and
    the certificate expiry program inline, the etcd members were over the limit: etcd-main 66,084
    (local) and 66,548 (research-*), etcd-events 67,076 and 67,424; the apiservers, with the
    certificate expiry program, 51,344 and 60,936; the pools, with the pod traffic program, up to
    59,324 (research-7500 h100-ib). A pool's fabric-label script named each of its scale sets until
    it named runs of them (kilonode.render.pool.index_patterns): h100-ib's 25 took 36,140, and each
    scale set more ~48 bytes; the script no longer grows with the pool."""
    plan = plans[stack]
    measured = every_hosts_real_custom_data(stack, graphs[stack], plan, tmp_path)
    machines = {*(m.name for c in plan.etcd_clusters for m in c.members),
                *(i.name for i in plan.control_plane.instances),
                *(p.role(t) for p in plan.node_pools for t in (None, *p.teams))}
    assert set(measured) == machines
    for host, encoded in measured.items():
        assert len(encoded) <= custom_data.AZURE_CUSTOM_DATA_MAX_BYTES, host
        # real PEMs went in, and no node program did
        written = files_of(parts(encoded)[1])
        assert any("BEGIN CERTIFICATE" in str(f["content"]) for f in written.values()), host
        rendered = shared.load_yaml(payload(parts(encoded)[0]))
        assert not {f["path"] for f in rendered["write_files"]} & {p.machine_path for p in ship.PROGRAMS
                                                                   if p.delivery == "image"}, host
    apiserver = files_of(parts(measured[plan.control_plane.instances[0].name])[1])
    assert {pki.SCHEDULER_SERVING_CERT, pki.CONTROLLER_MANAGER_SERVING_KEY, pki.ENCRYPTION_CONFIG} <= set(apiserver)


@pytest.mark.parametrize("stack", shared.SHIPPED_STACKS)
def test_preflights_estimate_of_each_hosts_custom_data_bounds_the_real_one_closely(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str, tmp_path: Path
) -> None:
    """custom-data-size composes each host's custom data with PEMs of a modelled size and the Azure
    values at their real lengths: the same files as the program delivers, never smaller than with
    real certificates, and at most 2 % larger."""
    plan = plans[stack]
    layout = pki_layout(plan)
    for host, encoded in every_hosts_real_custom_data(stack, graphs[stack], plan, tmp_path).items():
        first, second = parts(encoded)
        estimate = custom_data_size.delivered(plan, layout, host)
        assert {path for path, *_ in estimate} == set(files_of(second)), host
        size = custom_data_size.encoded_size(payload(first), estimate)
        assert len(encoded) <= size <= len(encoded) * 1.02, (host, len(encoded), size)
