"""The trust layout (kilonode.plan.pki): hand-written invariants of who signs what and who
receives which file, and one layout object read by both issuers (pulumi-tls in Azure,
`cryptography` locally)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kilonode.azure import custom_data
from kilonode.azure.mockplan import run_program
from kilonode.azure.tls import Tls, TlsArgs
from kilonode.local import pki as local_pki
from kilonode.plan import ClusterPlan, defaults, pki, wellknown


@pytest.fixture(scope="module")
def layout(plans: dict[str, ClusterPlan]) -> pki.PkiLayout:
    return pki.pki_layout(plans["local"])


def test_each_etcd_cluster_has_its_own_ca_which_signs_only_its_members(layout: pki.PkiLayout,
                                                                       plans: dict[str, ClusterPlan]) -> None:
    for cluster in plans["local"].etcd_clusters:
        for member in cluster.members:
            assert layout.leaf(f"{member.name}-server").ca == f"etcd-{cluster.role}-ca"
            assert layout.leaf(f"{member.name}-peer").ca == f"etcd-{cluster.role}-ca"
            files = {f.path: f for f in layout.hosts[member.name]}
            # a member trusts peers signed by its own cluster's CA only
            assert files[wellknown.ETCD_CA].content == pki.Cert(f"etcd-{cluster.role}-ca")


def test_each_apiserver_has_its_own_etcd_client_certificate_that_both_clusters_accept(
    layout: pki.PkiLayout,
) -> None:
    client = layout.leaf("apiserver-0-etcd-client")
    assert client.ca == "etcd-main-ca" and client.uses == ("digital_signature", "key_encipherment", "client_auth")
    client_ca = {name: {f.path: f.content for f in files}[wellknown.ETCD_CLIENT_CA]
                 for name, files in layout.hosts.items() if name.startswith("etcd-")}
    assert client_ca["etcd-main-0"] == pki.Bundle(("etcd-main-ca",))
    assert client_ca["etcd-events-0"] == pki.Bundle(("etcd-main-ca", "etcd-events-ca"))
    apiserver = {f.path: f.content for f in layout.hosts["apiserver-0"]}
    assert apiserver[wellknown.APISERVER_ETCD_CA_BUNDLE] == pki.Bundle(("etcd-main-ca", "etcd-events-ca"))
    assert apiserver[wellknown.APISERVER_ETCD_CLIENT_CERT] == pki.Cert("apiserver-0-etcd-client")


def test_every_leaf_a_host_holds_is_that_hosts_alone_so_one_generation_renews_one_host(
    plans: dict[str, ClusterPlan],
) -> None:
    # research-7500: 5 apiservers, GPU pools (the GPU health controller's identity too)
    layout = pki.pki_layout(plans["research-7500"])
    holders: dict[str, set[str]] = {}
    for host, files in layout.hosts.items():
        for f in files:
            names = {f.content.of} if isinstance(f.content, pki.Cert | pki.PrivateKey) else \
                {f.content.client} if isinstance(f.content, pki.Kubeconfig) and f.content.client else set()
            for name in names:
                holders.setdefault(name, set()).add(host)
    for leaf in layout.leaves:
        if leaf.host is None:
            # on no host: the administrators' credentials, in the Pulumi state alone
            assert leaf.name in ("admin", "super-admin") and leaf.name not in holders, leaf.name
        else:
            assert holders[leaf.name] == {leaf.host}, leaf.name
    apiserver_3 = {leaf.name for leaf in pki.host_leaves(layout, "apiserver-3")}
    assert apiserver_3 == {"apiserver-3-serving", "apiserver-3-etcd-client", "apiserver-3-kubelet-client",
                           "apiserver-3-kube-scheduler", "apiserver-3-kube-controller-manager",
                           "apiserver-3-kube-scheduler-serving", "apiserver-3-kube-controller-manager-serving",
                           "apiserver-3-gpu-health-controller", "apiserver-3-node-client-approver",
                           "apiserver-3-front-proxy-client"}
    # the CA keys stay shared: renewing a host never touches what signs it
    assert holders.get("kubernetes-ca", set()) == {f"apiserver-{i}" for i in range(5)}


def test_a_hosts_generation_reaches_its_leaves_and_no_others(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["research-7500"].model_copy(update={"certificate_generations": {"etcd-main-2": 3,
                                                                                  "apiserver-1": 1}})
    layout = pki.pki_layout(plan)
    renewed = {leaf.name: leaf.generation for leaf in layout.leaves if leaf.generation}
    assert renewed == {"etcd-main-2-server": 3, "etcd-main-2-peer": 3,
                       **{f"apiserver-1-{n}": 1 for n in ("serving", "etcd-client", "kubelet-client",
                                                          "kube-scheduler", "kube-controller-manager",
                                                          "kube-scheduler-serving", "kube-controller-manager-serving",
                                                          "gpu-health-controller", "node-client-approver",
                                                          "front-proxy-client")}}
    # pulumi-tls early renewal: off on every host's leaf, the last 10 days of the administrators' 30
    hours = {leaf.name: pki.early_renewal_hours(leaf) for leaf in layout.leaves}
    assert {h for n, h in hours.items() if n not in ("admin", "super-admin")} == {0}
    assert hours["admin"] == hours["super-admin"] == 10 * 24
    validity = {leaf.name: pki.validity_hours(leaf) for leaf in layout.leaves}
    assert validity.pop("admin") == validity.pop("super-admin") == 30 * 24
    assert set(validity.values()) == {365 * 24}


@pytest.mark.parametrize(("generation", "group"), [(0, "kilonode:cluster-admins"), (2, "kilonode:cluster-admins:g2")])
def test_the_admin_credential_is_in_its_generations_group_and_the_super_admin_in_system_masters(
    plans: dict[str, ClusterPlan], generation: int, group: str,
) -> None:
    layout = pki.pki_layout(plans["local"].model_copy(update={"admin_generation": generation}))
    admin, super_admin = layout.leaf("admin"), layout.leaf("super-admin")
    assert (admin.organization, admin.generation, admin.host) == (group, generation, None)
    assert (super_admin.organization, super_admin.generation) == ("system:masters", 0)


def test_member_certificates_name_the_member_its_vm_and_its_address(layout: pki.PkiLayout) -> None:
    server, peer = layout.leaf("etcd-main-0-server"), layout.leaf("etcd-main-0-peer")
    assert server.dns_names == ("etcd-main-0", "local-etcd-main-0", "localhost")
    assert server.ip_addresses == ("10.0.1.10", "127.0.0.1")  # etcdctl on the host reaches 127.0.0.1
    assert peer.ip_addresses == ("10.0.1.10",)  # peers only ever dial the member's own address
    assert set(server.uses) >= {"server_auth", "client_auth"}


def test_the_apiserver_serving_certificate_covers_every_name_clients_use(layout: pki.PkiLayout) -> None:
    serving = layout.leaf("apiserver-0-serving")
    assert serving.ca == "kubernetes-ca" and "client_auth" not in serving.uses
    assert {"kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"} <= set(serving.dns_names)
    # its own address, the load balancer, the `kubernetes` Service IP, localhost
    assert serving.ip_addresses == ("10.0.0.10", "10.0.0.4", "172.16.0.1", "127.0.0.1")


@pytest.mark.parametrize("component, cert, key", [
    ("kube-scheduler", wellknown.SCHEDULER_SERVING_CERT, wellknown.SCHEDULER_SERVING_KEY),
    ("kube-controller-manager", wellknown.CONTROLLER_MANAGER_SERVING_CERT, wellknown.CONTROLLER_MANAGER_SERVING_KEY),
])
def test_the_scheduler_and_controller_manager_serve_a_cluster_ca_certificate_for_their_hosts_address_alone(
    plans: dict[str, ClusterPlan], component: str, cert: str, key: str
) -> None:
    plan = plans["research-7500"]
    layout = pki.pki_layout(plan)
    for instance in plan.control_plane.instances:
        leaf = layout.leaf(f"{instance.name}-{component}-serving")
        # what Prometheus dials (the scrape job's target) is the only name: no DNS, no loopback
        assert (leaf.ca, leaf.ip_addresses, leaf.dns_names) == ("kubernetes-ca", (str(instance.ip),), ())
        assert leaf.uses == pki.SERVER_USES and leaf.common_name == component
        assert leaf.host == instance.name  # renewed by that host's generation, with its other leaves
        files = {f.path: f for f in layout.hosts[instance.name]}
        assert files[cert].content == pki.Cert(leaf.name) and files[cert].mode == 0o644
        assert files[key].content == pki.PrivateKey(leaf.name) and files[key].mode == 0o600


def test_the_aggregation_layer_has_its_own_ca_whose_only_leaves_are_the_apiservers_front_proxy_clients(
    plans: dict[str, ClusterPlan],
) -> None:
    """The front-proxy CA, kept apart from the Kubernetes CA as kubeadm does (kilonode.plan.pki
    FRONT_PROXY_CA): it signs each apiserver's own client certificate (CN front-proxy-client, the
    one name --requestheader-allowed-names admits, no group) and nothing else; its key is on no host."""
    plan = plans["research-7500"]
    layout = pki.pki_layout(plan)
    assert layout.authority(pki.FRONT_PROXY_CA).common_name == "research-7500 front-proxy CA"
    signed = [leaf for leaf in layout.leaves if leaf.ca == pki.FRONT_PROXY_CA]
    assert [leaf.name for leaf in signed] == [f"{i.name}-front-proxy-client" for i in plan.control_plane.instances]
    for instance, leaf in zip(plan.control_plane.instances, signed, strict=True):
        assert (leaf.common_name, leaf.organization, leaf.uses, leaf.host) == (
            defaults.FRONT_PROXY_CLIENT_USER, None, pki.CLIENT_USES, instance.name)
        files = {f.path: f for f in layout.hosts[instance.name]}
        assert files[wellknown.FRONT_PROXY_CA].content == pki.Cert(pki.FRONT_PROXY_CA)
        assert files[wellknown.FRONT_PROXY_CLIENT_CERT].content == pki.Cert(leaf.name)
        assert files[wellknown.FRONT_PROXY_CLIENT_KEY].content == pki.PrivateKey(leaf.name)
        assert files[wellknown.FRONT_PROXY_CLIENT_KEY].mode == 0o600
    everywhere = [f for files in layout.hosts.values() for f in files] + list(layout.node_files)
    assert not [f.path for f in everywhere if f.content == pki.PrivateKey(pki.FRONT_PROXY_CA)]
    # only the apiservers trust it: an etcd member or a node has no use for it
    assert {host for host, files in layout.hosts.items() if any(f.content == pki.Cert(pki.FRONT_PROXY_CA)
                                                                for f in files)} == {
        i.name for i in plan.control_plane.instances}


def test_keys_are_0600_and_etcd_keys_belong_to_etcd(layout: pki.PkiLayout) -> None:
    files = [f for host in layout.hosts.values() for f in host] + list(layout.node_files)
    for f in files:
        secret = isinstance(f.content, pki.PrivateKey | pki.Kubeconfig)
        assert f.mode == (0o600 if secret else 0o644), f.path
        assert f.owner == ("etcd:etcd" if secret and f.path.startswith("/etc/etcd/") else "root:root"), f.path
    # the modes Azure's custom data writes are the layout's
    assert (pki.KEY_MODE, pki.CERT_MODE, pki.ROOT) == (custom_data.KEY_MODE, custom_data.CERT_MODE, custom_data.ROOT)


def test_nodes_get_the_cluster_ca_and_a_bootstrap_token_kubeconfig_only(layout: pki.PkiLayout) -> None:
    assert [(f.path, f.content) for f in layout.node_files] == [
        (wellknown.K8S_CA, pki.Cert("kubernetes-ca")),
        (wellknown.KUBELET_BOOTSTRAP_KUBECONFIG,
         pki.Kubeconfig("https://10.0.0.4:6443", "kubelet-bootstrap", "kubernetes-ca", None)),
    ]


def test_only_gpu_stacks_get_the_gpu_health_controller_identity(plans: dict[str, ClusterPlan]) -> None:
    paths = {name: {f.path for f in pki.pki_layout(plan).hosts["apiserver-0"]} for name, plan in plans.items()}
    assert wellknown.GPU_HEALTH_CONTROLLER_KUBECONFIG not in paths["local"]
    assert wellknown.GPU_HEALTH_CONTROLLER_KUBECONFIG in paths["research-7500"]


def test_a_layout_that_names_something_twice_or_an_unknown_ca_is_refused(layout: pki.PkiLayout) -> None:
    with pytest.raises(ValueError, match="twice"):
        dataclasses.replace(layout, leaves=(*layout.leaves, layout.leaves[0]))
    stray = dataclasses.replace(layout.leaves[0], name="stray", ca="no-such-ca")
    with pytest.raises(KeyError, match="no-such-ca"):
        dataclasses.replace(layout, leaves=(*layout.leaves, stray))


def _marked(layout: pki.PkiLayout) -> pki.PkiLayout:
    """The layout with one extra leaf and one changed subject: what no second copy could know."""
    extra = pki.Leaf("marker", "etcd-events-ca", "marker-cn", "marker-org", ("marker.example",), ("10.0.1.20",),
                     pki.CLIENT_USES)
    leaves = tuple(dataclasses.replace(leaf, common_name="changed-cn") if leaf.name == "apiserver-0-etcd-client"
                   else leaf for leaf in layout.leaves)
    return dataclasses.replace(layout, leaves=(*leaves, extra))


def test_the_azure_component_and_the_local_issuer_read_the_same_layout_object(
    plans: dict[str, ClusterPlan], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    plan = plans["local"]
    calls: list[ClusterPlan] = []
    original = pki.pki_layout

    def marked_layout(p: ClusterPlan) -> pki.PkiLayout:
        calls.append(p)
        return _marked(original(p))

    monkeypatch.setattr(pki, "pki_layout", marked_layout)

    graph = run_program("local", {}, lambda: Tls("t", TlsArgs(plan=plan)))
    requests = {r.name: r.inputs for r in graph.of_type("tls:index/certRequest:CertRequest")}
    assert requests["t-marker-csr"]["subject"] == {"commonName": "marker-cn", "organization": "marker-org"}
    assert requests["t-apiserver-0-etcd-client-csr"]["subject"]["commonName"] == "changed-cn"
    signed = {r.name: r.inputs for r in graph.of_type("tls:index/locallySignedCert:LocallySignedCert")}
    assert signed["t-marker"]["caCertPem"] == "mock-certificate:t-etcd-events-ca"

    local_pki.issue_plan(plan, tmp_path)  # what `kilonode local up` calls
    where = local_pki.LocalPki(tmp_path)
    marker = local_pki.profile_of(local_pki._load_cert(where.cert("marker", "leaf")))
    assert (marker.common_name, marker.organization) == ("marker-cn", "marker-org")
    assert marker.ip_addresses == {"127.0.1.20"}  # the local issuer maps the address, nothing else
    client = local_pki.profile_of(local_pki._load_cert(where.cert("apiserver-0-etcd-client", "leaf")))
    assert client.common_name == "changed-cn"
    assert len(calls) == 2


def test_without_the_patch_neither_issuer_has_the_marker(plans: dict[str, ClusterPlan], tmp_path: Path) -> None:
    """The negative of the test above: the marker comes from the patched layout alone."""
    plan = plans["local"]
    graph = run_program("local", {}, lambda: Tls("t", TlsArgs(plan=plan)))
    assert "t-marker-csr" not in {r.name for r in graph.of_type("tls:index/certRequest:CertRequest")}
    local_pki.issue_plan(plan, tmp_path)
    assert not local_pki.LocalPki(tmp_path).cert("marker", "leaf").exists()
