"""The cluster's trust layout as data: which CAs exist, every certificate they sign (subject,
SANs, uses), and which file each host receives (path, content, mode, owner).

Two issuers materialise this one layout, so the trust rules live nowhere else:

- `kilonode.azure.tls` creates it with pulumi-tls (resource names derive from the names
  here: renaming a CA or a leaf replaces it in Azure, and every VM that carries it);
- `kilonode.local.pki` creates it with `cryptography` into the local rehearsal's state
  directory, with each host's Azure address mapped to its loopback address.

    >>> layout = pki_layout(plan_stack(load_stack("local")))
    >>> layout.leaf("etcd-main-0-server").ip_addresses
    ('10.0.1.10', '127.0.0.1')
    >>> [f.path for f in layout.hosts["etcd-main-0"]][:2]
    ['/etc/etcd/pki/ca.crt', '/etc/etcd/pki/client-ca.crt']

The trust rules (kilonode.plan.wellknown explains the paths):

- each etcd cluster (main, events, and leases where the stack has it) has its own CA, which
  signs its members' server and peer certificates; a member's `--peer-trusted-ca-file` is its
  own cluster's CA alone, so a member of one cluster can never join another;
- each kube-apiserver has its own etcd client certificate, signed by the main etcd CA; each
  cluster's client CA file therefore holds the main CA (the others also their own CA, for
  etcdctl with a member's certificate); the apiserver's etcd CA bundle holds every etcd CA;
- a Kubernetes CA signs each apiserver's serving certificate, its kubelet client certificate,
  its co-located components' client certificates, the serving certificates of its scheduler and
  controller manager (for the host's address alone), and the administrators';
- a front-proxy CA of its own signs only each apiserver's front-proxy client certificate, which
  the apiserver presents to aggregated API servers (metrics-server) with the requesting user in
  headers; apiservers and aggregated servers trust it for that alone (--requestheader-client-ca-file).

Renewal is per host, never all at once: every leaf a control-plane host holds is that host's
alone (`Leaf.host`), so the host's generation (the stack's certificateGenerations) renews
its files and no other host's. The CAs are not renewed by any generation (ten years; the
runbook, docs/runbooks/certificate-renewal.md, says what that means).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from kilonode.plan import defaults, wellknown
from kilonode.plan.model import ClusterPlan, EtcdClusterPlan
from kilonode.yamlio import plain_yaml

# ECDSA P-256: etcd and Kubernetes accept it, and PEMs a tenth the size of RSA-4096 keep
# an apiserver's custom data (its PEM files and kubeconfigs) below Azure's 64 KiB limit
# (tests/azure/test_tls_and_custom_data.py measures it with real certificates).
KEY_ALGORITHM = "ECDSA"
KEY_CURVE = "P256"

# Lifetimes: kilonode.plan.defaults (CAs ten years; a host's leaves one year, renewed by its
# generation only; the administrators' (on no host) 30 days, renewed in their last 10).
CA_HOURS = defaults.CA_VALIDITY_HOURS
LEAF_HOURS = defaults.LEAF_VALIDITY_HOURS
ADMIN_HOURS = defaults.ADMIN_CLIENT_VALIDITY_HOURS
RENEW_HOURS = defaults.LEAF_RENEW_BEFORE_HOURS
HOST_RENEW_HOURS = defaults.HOST_LEAF_EARLY_RENEWAL_HOURS
# The exported admin credential's leaf: its key is replaced when the stack's adminGeneration moves.
ADMIN = "admin"


def validity_hours(leaf: Leaf) -> int:
    """pulumi-tls `validity_period_hours` for `leaf` (kilonode.plan.defaults says why)."""
    return LEAF_HOURS if leaf.host is not None else ADMIN_HOURS


def early_renewal_hours(leaf: Leaf) -> int:
    """pulumi-tls `early_renewal_hours` for `leaf` (kilonode.plan.defaults says why)."""
    return HOST_RENEW_HOURS if leaf.host is not None else RENEW_HOURS


def cluster_admins_group(generation: int) -> str:
    """The group of admin generation `generation` (defaults.CLUSTER_ADMINS_GROUP says why one each);
    generation 0 keeps the plain name, as stacks deployed before generations have it."""
    return defaults.CLUSTER_ADMINS_GROUP if generation == 0 else f"{defaults.CLUSTER_ADMINS_GROUP}:g{generation}"

# pulumi-tls `allowed_uses` names (terraform-provider-tls internal/provider/common_cert.go:
# keyUsages and extendedKeyUsages); kilonode.local.pki maps them to X.509 the same way.
Use = Literal["digital_signature", "key_encipherment", "server_auth", "client_auth", "cert_signing", "crl_signing"]
SERVER_USES: tuple[Use, ...] = ("digital_signature", "key_encipherment", "server_auth")
CLIENT_USES: tuple[Use, ...] = ("digital_signature", "key_encipherment", "client_auth")
PEER_USES: tuple[Use, ...] = ("digital_signature", "key_encipherment", "server_auth", "client_auth")
CA_USES: tuple[Use, ...] = ("cert_signing", "crl_signing", "digital_signature")

# Modes and owners of delivered files (cloud-init write_files). etcd.service runs as
# User=etcd (templates/etc/systemd/system/etcd.service.j2), so its keys must be readable by
# etcd alone.
KEY_MODE = 0o600
CERT_MODE = 0o644
ROOT = "root:root"
ETCD_OWNER = "etcd:etcd"

# The names every client uses for the in-cluster apiserver Service.
KUBERNETES_SERVICE_NAMES = (
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)

# kube-scheduler and kube-controller-manager run beside each apiserver and reach it on
# 127.0.0.1: an Azure internal load balancer does not route a backend's own traffic back to
# itself (no hairpin), and localhost needs no LB at all.
LOCAL_APISERVER = "https://127.0.0.1:6443"
COMPONENT_USER = "component"  # the kubeconfig's user entry name for a co-located component


@dataclass(frozen=True)
class Authority:
    """A self-signed CA. `name` names its key and certificate (`<component>-<name>-key`)."""

    name: str
    common_name: str
    organization: str = "kilonode"
    uses: tuple[Use, ...] = CA_USES


@dataclass(frozen=True)
class Leaf:
    """A certificate signed by `ca`, for its own key. `name` names key, CSR and certificate.

    `host` is the one control-plane host that carries it (None: it is on no host, only in the
    Pulumi state: the admin and super-admin credentials), and `generation` that host's renewal
    generation (the stack's certificateGenerations; for the admin leaf, the stack's
    adminGeneration): a new generation issues the key and the certificate again, and so changes
    that host's files alone."""

    name: str
    ca: str
    common_name: str
    organization: str | None
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]  # as the plan has them (Azure addresses)
    uses: tuple[Use, ...]
    host: str | None = None
    generation: int = 0


@dataclass(frozen=True)
class BareKey:
    """A key pair with no certificate (the service-account signing key)."""

    name: str


# What a delivered file holds. `of` names an Authority, a Leaf or a BareKey of the layout.
@dataclass(frozen=True)
class Cert:
    of: str


@dataclass(frozen=True)
class PrivateKey:
    of: str


@dataclass(frozen=True)
class PublicKey:
    of: str


@dataclass(frozen=True)
class Bundle:
    """Concatenated CA certificates, in this order."""

    cas: tuple[str, ...]


@dataclass(frozen=True)
class Kubeconfig:
    """A kubeconfig trusting `ca`, for `server`, as `user`: with the client certificate and
    key of leaf `client`, or (client None) with the cluster's bootstrap token."""

    server: str
    user: str
    ca: str
    client: str | None = None
    # Where the host holds `ca`'s certificate, for a kubeconfig that names it instead of embedding
    # it (certificate-authority rather than certificate-authority-data): the components that run as
    # root beside the file; not the sandboxed ones, which see no /etc/kubernetes/pki.
    ca_file: str | None = None


Content = Cert | PrivateKey | PublicKey | Bundle | Kubeconfig


@dataclass(frozen=True)
class HostFile:
    path: str  # absolute host path, from kilonode.plan.wellknown
    content: Content
    mode: int = CERT_MODE
    owner: str = ROOT


@dataclass(frozen=True)
class PkiLayout:
    authorities: tuple[Authority, ...]
    leaves: tuple[Leaf, ...]
    keys: tuple[BareKey, ...]
    # keyed like render_cluster's output (`etcd-main-0`, `apiserver-0`), in delivery order
    hosts: Mapping[str, tuple[HostFile, ...]]
    # what every pool node receives (its kubelet certificates come from TLS bootstrapping)
    node_files: tuple[HostFile, ...]
    # credentials handed to operators and the program's own provider, not to any host
    admin_kubeconfig: Kubeconfig
    super_admin_kubeconfig: Kubeconfig
    _index: dict[str, Authority | Leaf | BareKey] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index: dict[str, Authority | Leaf | BareKey] = {}
        for item in (*self.authorities, *self.leaves, *self.keys):
            if item.name in index:
                raise ValueError(f"PKI layout names {item.name!r} twice")
            index[item.name] = item
        object.__setattr__(self, "_index", index)
        for leaf in self.leaves:
            self.authority(leaf.ca)

    def authority(self, name: str) -> Authority:
        item = self._index.get(name)
        if not isinstance(item, Authority):
            raise KeyError(f"no CA {name!r} in the PKI layout")
        return item

    def leaf(self, name: str) -> Leaf:
        item = self._index.get(name)
        if not isinstance(item, Leaf):
            raise KeyError(f"no certificate {name!r} in the PKI layout")
        return item

    def kind(self, name: str) -> Literal["authority", "leaf", "key"]:
        item = self._index[name]
        return "authority" if isinstance(item, Authority) else "leaf" if isinstance(item, Leaf) else "key"


def etcd_ca_name(role: str) -> str:
    return f"etcd-{role}-ca"


KUBERNETES_CA = "kubernetes-ca"
# Why the aggregation layer's CA is not the Kubernetes CA, as kubeadm keeps them apart: whoever
# presents a certificate of --requestheader-client-ca-file's CA with an allowed CN is trusted to
# name any user in X-Remote-User/X-Remote-Group, by the apiservers and by every aggregated server
# (they read this CA from kube-system/extension-apiserver-authentication). With the Kubernetes CA
# there, every client certificate it signs (kubelets' by the thousand, the controllers', the
# administrators') would be checked as a front proxy first, and a certificate that CA signs with
# CN front-proxy-client (a CSR kube-controller-manager's signer might approve) could impersonate
# anyone. The Kubernetes documentation: "use different CA certs for the --client-ca-file option
# ... and the --requestheader-client-ca-file option" (kubernetes/website content/en/docs/tasks/
# extend-kubernetes/configure-aggregation-layer.md, "CA Reusage and Conflicts"). Its key is on no
# host: nothing there signs with it (the Pulumi state alone holds it).
FRONT_PROXY_CA = "front-proxy-ca"
SERVICE_ACCOUNT = "service-account"


def apiserver_etcd_client(instance: str) -> str:
    """The etcd client certificate of apiserver `instance` (apiserver-0): each apiserver holds its
    own, so renewing one apiserver's certificates changes no other apiserver's files."""
    return f"{instance}-etcd-client"


def host_leaves(layout: PkiLayout, host: str) -> tuple[Leaf, ...]:
    """The leaves `host`'s generation renews: every certificate that host holds alone."""
    return tuple(leaf for leaf in layout.leaves if leaf.host == host)


def pki_layout(plan: ClusterPlan) -> PkiLayout:
    """The trust layout of `plan`'s cluster: the one source both issuers read."""
    main_ca = etcd_ca_name("main")
    etcd_cas = tuple(etcd_ca_name(etcd.role) for etcd in plan.etcd_clusters)  # main first
    authorities = (
        *(Authority(etcd_ca_name(etcd.role), f"{plan.cluster} etcd {etcd.role} CA") for etcd in plan.etcd_clusters),
        Authority(KUBERNETES_CA, f"{plan.cluster} Kubernetes CA"),
        Authority(FRONT_PROXY_CA, f"{plan.cluster} front-proxy CA"),
    )
    leaves: list[Leaf] = []
    hosts: dict[str, tuple[HostFile, ...]] = {}
    for etcd in plan.etcd_clusters:
        # Each cluster accepts clients signed by the main CA (each apiserver's etcd client
        # certificate); the others also trust their own CA for etcdctl with a member's certificate.
        client_cas = (main_ca,) if etcd.role == "main" else (main_ca, etcd_ca_name(etcd.role))
        for name, files in _etcd_members(etcd, client_cas, leaves, plan.certificate_generations):
            hosts[name] = files

    def client(name: str, ca: str, common_name: str, organization: str | None = None,
               host: str | None = None) -> str:
        if host:
            generation = plan.certificate_generations.get(host, 0)
        else:  # the admin's key is its stack generation's; the super-admin's is never replaced by one
            generation = plan.admin_generation if name == ADMIN else 0
        leaves.append(Leaf(name, ca, common_name, organization, (), (), CLIENT_USES, host, generation))
        return name

    cp = plan.control_plane
    for instance in cp.instances:
        host = instance.name
        serving = f"{host}-serving"
        leaves.append(Leaf(
            serving, KUBERNETES_CA, "kube-apiserver", None,
            (*KUBERNETES_SERVICE_NAMES, instance.name, instance.vm_name, "localhost"),
            (str(instance.ip), str(cp.load_balancer_ip), str(cp.kubernetes_service_ip), "127.0.0.1"),
            SERVER_USES, host, plan.certificate_generations.get(host, 0),
        ))
        # kube-scheduler's and kube-controller-manager's serving certificates: each listens on its
        # secure port at the host's own address only (kilonode.render.control_plane), where the
        # cluster's Prometheus verifies it with the cluster CA; so the address is its only name.
        # One leaf each, not one shared: either process may be restarted or given another
        # certificate without touching the other's, and the expiry metrics name each file.
        serving_for: dict[str, str] = {}
        for component in ("kube-scheduler", "kube-controller-manager"):
            serving_for[component] = f"{host}-{component}-serving"
            leaves.append(Leaf(
                serving_for[component], KUBERNETES_CA, component, None, (), (str(instance.ip),),
                SERVER_USES, host, plan.certificate_generations.get(host, 0),
            ))
        # Every client certificate an apiserver host holds is its own, not shared with the
        # other apiservers: one shared certificate sits in every apiserver's custom data, so
        # renewing it would replace every apiserver at once (the restart guard refuses that).
        # Same subjects as kubeadm's; etcd and the kubelets authorise by CA and subject, not
        # by which certificate.
        etcd_client = client(apiserver_etcd_client(host), main_ca, "kube-apiserver-etcd-client", host=host)
        # The apiserver acts on kubelets (logs, exec, port-forward) as a user in no group, bound
        # to system:kubelet-api-admin (defaults.APISERVER_KUBELET_CLIENT_USER says why not
        # system:masters; the binding: kilonode.k8s.bootstrap).
        kubelet_client = client(f"{host}-kubelet-client", KUBERNETES_CA, defaults.APISERVER_KUBELET_CLIENT_USER,
                                host=host)
        # What the apiserver presents to aggregated API servers (--proxy-client-cert-file): the
        # front-proxy CA's, with kubeadm's CN and no group (the user travels in headers).
        front_proxy_client = client(f"{host}-front-proxy-client", FRONT_PROXY_CA, defaults.FRONT_PROXY_CLIENT_USER,
                                    host=host)
        component_kubeconfigs = {
            wellknown.SCHEDULER_KUBECONFIG: client(f"{host}-kube-scheduler", KUBERNETES_CA, "system:kube-scheduler",
                                                   host=host),
            wellknown.CONTROLLER_MANAGER_KUBECONFIG: client(
                f"{host}-kube-controller-manager", KUBERNETES_CA, "system:kube-controller-manager", host=host
            ),
        }
        root_components = set(component_kubeconfigs)
        # The node client approver runs beside each apiserver: its own identity, bound to its own
        # ClusterRole (kilonode.k8s.bootstrap).
        component_kubeconfigs[wellknown.NODE_CLIENT_APPROVER_KUBECONFIG] = client(
            f"{host}-node-client-approver", KUBERNETES_CA, defaults.NODE_CLIENT_APPROVER_USER, host=host
        )
        # The GPU health taint controller runs beside each apiserver too, only where there are
        # GPU pools: its own identity, bound to its own ClusterRole (kilonode.k8s.gpu).
        if plan.gpu_pools:
            component_kubeconfigs[wellknown.GPU_HEALTH_CONTROLLER_KUBECONFIG] = client(
                f"{host}-gpu-health-controller", KUBERNETES_CA, defaults.GPU_HEALTH_CONTROLLER_USER, host=host
            )
        hosts[host] = (
            HostFile(wellknown.K8S_CA, Cert(KUBERNETES_CA)),
            HostFile(wellknown.K8S_CA_KEY, PrivateKey(KUBERNETES_CA), KEY_MODE),
            HostFile(wellknown.APISERVER_CERT, Cert(serving)),
            HostFile(wellknown.APISERVER_KEY, PrivateKey(serving), KEY_MODE),
            HostFile(wellknown.APISERVER_ETCD_CA_BUNDLE, Bundle(etcd_cas)),
            HostFile(wellknown.APISERVER_ETCD_CLIENT_CERT, Cert(etcd_client)),
            HostFile(wellknown.APISERVER_ETCD_CLIENT_KEY, PrivateKey(etcd_client), KEY_MODE),
            HostFile(wellknown.APISERVER_KUBELET_CLIENT_CERT, Cert(kubelet_client)),
            HostFile(wellknown.APISERVER_KUBELET_CLIENT_KEY, PrivateKey(kubelet_client), KEY_MODE),
            HostFile(wellknown.FRONT_PROXY_CA, Cert(FRONT_PROXY_CA)),
            HostFile(wellknown.FRONT_PROXY_CLIENT_CERT, Cert(front_proxy_client)),
            HostFile(wellknown.FRONT_PROXY_CLIENT_KEY, PrivateKey(front_proxy_client), KEY_MODE),
            HostFile(wellknown.SERVICE_ACCOUNT_KEY, PrivateKey(SERVICE_ACCOUNT), KEY_MODE),
            HostFile(wellknown.SERVICE_ACCOUNT_PUB, PublicKey(SERVICE_ACCOUNT)),
            HostFile(wellknown.SCHEDULER_SERVING_CERT, Cert(serving_for["kube-scheduler"])),
            HostFile(wellknown.SCHEDULER_SERVING_KEY, PrivateKey(serving_for["kube-scheduler"]), KEY_MODE),
            HostFile(wellknown.CONTROLLER_MANAGER_SERVING_CERT, Cert(serving_for["kube-controller-manager"])),
            HostFile(wellknown.CONTROLLER_MANAGER_SERVING_KEY, PrivateKey(serving_for["kube-controller-manager"]),
                     KEY_MODE),
            *[
                # the scheduler's and controller manager's name the CA file the host holds (both run
                # as root, unsandboxed): each embedded copy cost ~1.2 KB of the apiserver's custom data
                HostFile(path, Kubeconfig(LOCAL_APISERVER, COMPONENT_USER, KUBERNETES_CA, user,
                                          ca_file=wellknown.K8S_CA if path in root_components else None), KEY_MODE)
                for path, user in component_kubeconfigs.items()
            ],
        )
    # The administrators' credentials are on no host: nothing but the Pulumi state holds them. The
    # exported one's group (and so its rights) is its generation's; the super-admin's is break-glass.
    admin = client(ADMIN, KUBERNETES_CA, "kilonode-admin", cluster_admins_group(plan.admin_generation))
    super_admin = client("super-admin", KUBERNETES_CA, "kilonode-super-admin", defaults.SUPER_ADMIN_GROUP)
    endpoint = cp.endpoint  # the load balancer: what kubelets and operators use
    return PkiLayout(
        authorities=authorities,
        leaves=tuple(leaves),
        keys=(BareKey(SERVICE_ACCOUNT),),
        hosts=hosts,
        # Nodes get the cluster CA and the bootstrap kubeconfig; their kubelet client and
        # serving certificates come from TLS bootstrapping (CSRs), not from here.
        node_files=(
            HostFile(wellknown.K8S_CA, Cert(KUBERNETES_CA)),
            HostFile(wellknown.KUBELET_BOOTSTRAP_KUBECONFIG, Kubeconfig(endpoint, "kubelet-bootstrap", KUBERNETES_CA),
                     KEY_MODE),
        ),
        admin_kubeconfig=Kubeconfig(endpoint, "kilonode-admin", KUBERNETES_CA, admin),
        super_admin_kubeconfig=Kubeconfig(endpoint, "kilonode-super-admin", KUBERNETES_CA, super_admin),
    )


def _etcd_members(
    etcd: EtcdClusterPlan, client_cas: tuple[str, ...], leaves: list[Leaf], generations: Mapping[str, int]
) -> list[tuple[str, tuple[HostFile, ...]]]:
    ca = etcd_ca_name(etcd.role)
    hosts = []
    for m in etcd.members:
        names = (m.name, m.vm_name, "localhost")
        generation = generations.get(m.name, 0)
        # The server cert also authenticates local etcdctl health checks as a client.
        server = Leaf(f"{m.name}-server", ca, m.name, None, names, (str(m.ip), "127.0.0.1"), PEER_USES,
                      m.name, generation)
        peer = Leaf(f"{m.name}-peer", ca, m.name, None, names, (str(m.ip),), PEER_USES, m.name, generation)
        leaves += [server, peer]
        hosts.append((m.name, (
            HostFile(wellknown.ETCD_CA, Cert(ca)),
            HostFile(wellknown.ETCD_CLIENT_CA, Bundle(client_cas)),
            HostFile(wellknown.ETCD_SERVER_CERT, Cert(server.name)),
            HostFile(wellknown.ETCD_SERVER_KEY, PrivateKey(server.name), KEY_MODE, ETCD_OWNER),
            HostFile(wellknown.ETCD_PEER_CERT, Cert(peer.name)),
            HostFile(wellknown.ETCD_PEER_KEY, PrivateKey(peer.name), KEY_MODE, ETCD_OWNER),
        )))
    return hosts


def bundle_text(pems: list[str]) -> str:
    """Concatenated PEM certificates, one after another, each ending in a newline."""
    return "".join(t if t.endswith("\n") else t + "\n" for t in pems)


# The name a kubeconfig asks the apiserver's certificate for when its server is an address the
# certificate cannot carry (the public frontend's, which Azure chooses): a SAN every apiserver
# serving certificate has (KUBERNETES_SERVICE_NAMES). client-go's kubeconfig field
# `tls-server-name` (k8s.io/client-go tools/clientcmd/api/v1 types.go, Cluster.TLSServerName)
# sets the SNI and the name verified, for kubectl and pulumi-kubernetes alike.
DEPLOYER_TLS_SERVER_NAME = "kubernetes"


def kubeconfig_text(server: str, ca_pem: str, user: str, *, cert_pem: str | None = None,
                    key_pem: str | None = None, token: str | None = None,
                    tls_server_name: str | None = None, ca_file: str | None = None) -> str:
    """A kubeconfig document: the cluster CA (embedded, or the path `ca_file` where the host holds
    it), and a client certificate and key or a token; `tls_server_name` when the server's address
    is not among the certificate's names."""
    if cert_pem is not None and key_pem is not None:
        credentials = {"client-certificate-data": base64.b64encode(cert_pem.encode()).decode(),
                       "client-key-data": base64.b64encode(key_pem.encode()).decode()}
    elif token is not None:
        credentials = {"token": token}
    else:
        raise ValueError("a kubeconfig needs a client certificate and key, or a token")
    return plain_yaml({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kilonode", "cluster": {
            "server": server,
            **({"certificate-authority": ca_file} if ca_file else
               {"certificate-authority-data": base64.b64encode(ca_pem.encode()).decode()}),
            **({"tls-server-name": tls_server_name} if tls_server_name else {}),
        }}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "kilonode", "context": {"cluster": "kilonode", "user": user}}],
        "current-context": "kilonode",
    })
