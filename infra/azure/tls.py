"""Tls: the cluster's certificate authorities and certificates, created with pulumi-tls.

Trust layout (infra/plan/wellknown.py): one CA per etcd cluster signs its members' server and
peer certificates; kube-apiserver has one etcd client certificate, signed by the main etcd
CA, which both clusters accept (each `client-ca.crt` holds the main CA; the events one also
its own CA for local etcdctl); the apiserver's etcd CA bundle holds both etcd CAs. A
Kubernetes CA signs the apiserver serving and kubelet-client certificates.

Private keys leave this component only as Pulumi secrets (`Output.secret`), and only inside
the files handed to custom data. pulumi-tls marks them secret as well.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_random as random
import pulumi_tls as tls
import yaml

from kilonode.azure.custom_data import KEY_MODE, DeliveredFile
from kilonode.plan import defaults, wellknown
from kilonode.plan.model import ClusterPlan, EtcdClusterPlan

# ECDSA P-256: etcd and Kubernetes accept it, and PEMs a tenth the size of RSA-4096 keep
# an apiserver's custom data (ten PEM files) far below Azure's 64 KiB limit.
ALGORITHM = "ECDSA"
CURVE = "P256"
# Lifetimes: kilonode.plan.defaults (CAs ten years; leaves one year, renewed in their last 30 days).
CA_HOURS = defaults.CA_VALIDITY_HOURS
LEAF_HOURS = defaults.LEAF_VALIDITY_HOURS
RENEW_HOURS = defaults.LEAF_RENEW_BEFORE_HOURS

SERVER_USES = ["digital_signature", "key_encipherment", "server_auth"]
CLIENT_USES = ["digital_signature", "key_encipherment", "client_auth"]
PEER_USES = ["digital_signature", "key_encipherment", "server_auth", "client_auth"]
CA_USES = ["cert_signing", "crl_signing", "digital_signature"]

# etcd.service runs as User=etcd (templates/etc/systemd/system/etcd.service.j2), so its
# keys must be readable by etcd alone.
ETCD_OWNER = "etcd:etcd"

# The names every client uses for the in-cluster apiserver Service.
KUBERNETES_SERVICE_NAMES = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
]


@dataclass(frozen=True)
class TlsArgs:
    plan: ClusterPlan


@dataclass(frozen=True)
class _Pair:
    cert_pem: pulumi.Output[str]
    key_pem: pulumi.Output[str]  # always secret


class Tls(pulumi.ComponentResource):
    """CAs and certificates, and the per-host file sets they land in.

    `host_files` is keyed like render_cluster's output (`etcd-main-0`, `apiserver-0`);
    `node_files` go to every pool node.
    """

    host_files: dict[str, list[DeliveredFile]]
    node_files: list[DeliveredFile]
    admin_ssh_public_key: pulumi.Output[str]
    admin_ssh_private_key: pulumi.Output[str]
    bootstrap_token_id: pulumi.Output[str]
    bootstrap_token_secret: pulumi.Output[str]  # secret
    admin_kubeconfig: pulumi.Output[str]  # secret; kilonode:cluster-admins, through the load balancer
    super_admin_kubeconfig: pulumi.Output[str]  # secret; system:masters, for the program's own provider

    def __init__(self, name: str, args: TlsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:azure:Tls", name, None, opts)
        self._name = name
        self._child = pulumi.ResourceOptions(parent=self)
        plan = args.plan

        # RSA: every Azure Linux image and API version accepts it (Ed25519 only lately).
        ssh = tls.PrivateKey(f"{name}-admin-ssh-key", algorithm="RSA", rsa_bits=4096, opts=self._child)
        self.admin_ssh_public_key = ssh.public_key_openssh
        self.admin_ssh_private_key = pulumi.Output.secret(ssh.private_key_openssh)

        main_ca = self._ca("etcd-main-ca", f"{plan.cluster} etcd main CA")
        events_ca = self._ca("etcd-events-ca", f"{plan.cluster} etcd events CA")
        k8s_ca = self._ca("kubernetes-ca", f"{plan.cluster} Kubernetes CA")

        self.host_files = {}
        cas = {"main": main_ca, "events": events_ca}
        for etcd in plan.etcd_clusters:
            # Each cluster accepts clients signed by the main CA (the apiserver's one
            # client cert); events also trusts its own CA for local etcdctl.
            client_ca = [main_ca.cert_pem] if etcd.role == "main" else [main_ca.cert_pem, events_ca.cert_pem]
            self._etcd_members(etcd, cas[etcd.role], client_ca)

        etcd_client = self._signed(
            "apiserver-etcd-client", main_ca, "kube-apiserver-etcd-client", None, [], [], CLIENT_USES
        )
        # kubeadm's identity for this certificate: the apiserver acts on kubelets as an
        # administrator (logs, exec, port-forward).
        kubelet_client = self._signed(
            "apiserver-kubelet-client", k8s_ca, "kube-apiserver-kubelet-client", "system:masters", [], [],
            CLIENT_USES,
        )
        # kube-scheduler and kube-controller-manager run beside each apiserver and reach it
        # on 127.0.0.1: an Azure internal load balancer does not route a backend's own
        # traffic back to itself (no hairpin), and localhost needs no LB at all.
        component_kubeconfigs = {
            wellknown.SCHEDULER_KUBECONFIG: self._signed(
                "kube-scheduler", k8s_ca, "system:kube-scheduler", None, [], [], CLIENT_USES
            ),
            wellknown.CONTROLLER_MANAGER_KUBECONFIG: self._signed(
                "kube-controller-manager", k8s_ca, "system:kube-controller-manager", None, [], [], CLIENT_USES
            ),
        }
        # The GPU health taint controller runs beside each apiserver too, only where there
        # are GPU pools: its own identity, bound to its own ClusterRole (kilonode.k8s.gpu).
        if plan.gpu_pools:
            component_kubeconfigs[wellknown.GPU_HEALTH_CONTROLLER_KUBECONFIG] = self._signed(
                "gpu-health-controller", k8s_ca, defaults.GPU_HEALTH_CONTROLLER_USER, None, [], [], CLIENT_USES
            )
        sa = tls.PrivateKey(f"{name}-service-account-key", algorithm=ALGORITHM, ecdsa_curve=CURVE,
                            opts=self._child)
        cp = plan.control_plane
        for instance in cp.instances:
            serving = self._signed(
                f"{instance.name}-serving", k8s_ca, "kube-apiserver", None,
                [*KUBERNETES_SERVICE_NAMES, instance.name, instance.vm_name, "localhost"],
                [str(instance.ip), str(cp.load_balancer_ip), str(cp.kubernetes_service_ip), "127.0.0.1"],
                SERVER_USES,
            )
            self.host_files[instance.name] = [
                DeliveredFile(wellknown.K8S_CA, k8s_ca.cert_pem),
                DeliveredFile(wellknown.K8S_CA_KEY, k8s_ca.key_pem, KEY_MODE),
                DeliveredFile(wellknown.APISERVER_CERT, serving.cert_pem),
                DeliveredFile(wellknown.APISERVER_KEY, serving.key_pem, KEY_MODE),
                DeliveredFile(wellknown.APISERVER_ETCD_CA_BUNDLE, _bundle([main_ca.cert_pem, events_ca.cert_pem])),
                DeliveredFile(wellknown.APISERVER_ETCD_CLIENT_CERT, etcd_client.cert_pem),
                DeliveredFile(wellknown.APISERVER_ETCD_CLIENT_KEY, etcd_client.key_pem, KEY_MODE),
                DeliveredFile(wellknown.APISERVER_KUBELET_CLIENT_CERT, kubelet_client.cert_pem),
                DeliveredFile(wellknown.APISERVER_KUBELET_CLIENT_KEY, kubelet_client.key_pem, KEY_MODE),
                DeliveredFile(wellknown.SERVICE_ACCOUNT_KEY, pulumi.Output.secret(sa.private_key_pem), KEY_MODE),
                DeliveredFile(wellknown.SERVICE_ACCOUNT_PUB, sa.public_key_pem),
                *[
                    DeliveredFile(path, _kubeconfig(user, k8s_ca.cert_pem), KEY_MODE)
                    for path, user in component_kubeconfigs.items()
                ],
            ]
        # TLS bootstrap, as kubeadm: a token `<id>.<secret>` ([a-z0-9]{6}.[a-z0-9]{16}, the
        # format the apiserver's bootstrap authenticator accepts) in the Pulumi state only.
        # No expiry: scale sets add nodes at any time. Rotate it with
        # `pulumi up --replace <urn of the token secret>` (README), which updates the Secret and
        # the pools' custom data (new instances join with the new token).
        token_id = random.RandomString(f"{name}-bootstrap-token-id", length=6, upper=False, special=False,
                                       opts=self._child)
        token_secret = random.RandomString(f"{name}-bootstrap-token-secret", length=16, upper=False,
                                           special=False, opts=self._child)
        self.bootstrap_token_id = token_id.result
        self.bootstrap_token_secret = pulumi.Output.secret(token_secret.result)
        token = pulumi.Output.secret(pulumi.Output.concat(token_id.result, ".", token_secret.result))
        endpoint = cp.endpoint  # the load balancer: what kubelets and operators use

        # Nodes get the cluster CA and the bootstrap kubeconfig; their kubelet client and
        # serving certificates come from TLS bootstrapping (CSRs), not from here.
        self.node_files = [
            DeliveredFile(wellknown.K8S_CA, k8s_ca.cert_pem),
            DeliveredFile(wellknown.KUBELET_BOOTSTRAP_KUBECONFIG,
                          kubeconfig(endpoint, k8s_ca.cert_pem, "kubelet-bootstrap", token=token), KEY_MODE),
        ]
        admin = self._signed("admin", k8s_ca, "kilonode-admin", defaults.CLUSTER_ADMINS_GROUP, [], [],
                             CLIENT_USES)
        super_admin = self._signed("super-admin", k8s_ca, "kilonode-super-admin", defaults.SUPER_ADMIN_GROUP,
                                   [], [], CLIENT_USES)
        self.admin_kubeconfig = kubeconfig(endpoint, k8s_ca.cert_pem, "kilonode-admin", cert=admin)
        self.super_admin_kubeconfig = kubeconfig(endpoint, k8s_ca.cert_pem, "kilonode-super-admin",
                                                 cert=super_admin)

        self.register_outputs({
            "etcdMainCaCert": main_ca.cert_pem,
            "etcdEventsCaCert": events_ca.cert_pem,
            "kubernetesCaCert": k8s_ca.cert_pem,
        })

    def _etcd_members(self, etcd: EtcdClusterPlan, ca: _Pair, client_ca: Sequence[pulumi.Output[str]]) -> None:
        for m in etcd.members:
            names = [m.name, m.vm_name, "localhost"]
            ips = [str(m.ip), "127.0.0.1"]
            # The server cert also authenticates local etcdctl health checks as a client.
            server = self._signed(f"{m.name}-server", ca, m.name, None, names, ips, PEER_USES)
            peer = self._signed(f"{m.name}-peer", ca, m.name, None, names, [str(m.ip)], PEER_USES)
            self.host_files[m.name] = [
                DeliveredFile(wellknown.ETCD_CA, ca.cert_pem),
                DeliveredFile(wellknown.ETCD_CLIENT_CA, _bundle(client_ca)),
                DeliveredFile(wellknown.ETCD_SERVER_CERT, server.cert_pem),
                DeliveredFile(wellknown.ETCD_SERVER_KEY, server.key_pem, KEY_MODE, ETCD_OWNER),
                DeliveredFile(wellknown.ETCD_PEER_CERT, peer.cert_pem),
                DeliveredFile(wellknown.ETCD_PEER_KEY, peer.key_pem, KEY_MODE, ETCD_OWNER),
            ]

    def _key(self, name: str) -> tls.PrivateKey:
        return tls.PrivateKey(f"{self._name}-{name}-key", algorithm=ALGORITHM, ecdsa_curve=CURVE, opts=self._child)

    def _ca(self, name: str, common_name: str) -> _Pair:
        key = self._key(name)
        cert = tls.SelfSignedCert(
            f"{self._name}-{name}",
            private_key_pem=key.private_key_pem,
            subject=tls.SelfSignedCertSubjectArgs(common_name=common_name, organization="kilonode"),
            is_ca_certificate=True,
            validity_period_hours=CA_HOURS,
            allowed_uses=CA_USES,
            opts=self._child,
        )
        return _Pair(cert.cert_pem, pulumi.Output.secret(key.private_key_pem))

    def _signed(
        self,
        name: str,
        ca: _Pair,
        common_name: str,
        organization: str | None,
        dns_names: list[str],
        ip_addresses: list[str],
        uses: list[str],
    ) -> _Pair:
        key = self._key(name)
        csr = tls.CertRequest(
            f"{self._name}-{name}-csr",
            private_key_pem=key.private_key_pem,
            subject=tls.CertRequestSubjectArgs(common_name=common_name, organization=organization),
            dns_names=dns_names or None,
            ip_addresses=ip_addresses or None,
            opts=self._child,
        )
        cert = tls.LocallySignedCert(
            f"{self._name}-{name}",
            cert_request_pem=csr.cert_request_pem,
            ca_cert_pem=ca.cert_pem,
            ca_private_key_pem=ca.key_pem,
            validity_period_hours=LEAF_HOURS,
            early_renewal_hours=RENEW_HOURS,
            allowed_uses=uses,
            opts=self._child,
        )
        return _Pair(cert.cert_pem, pulumi.Output.secret(key.private_key_pem))


LOCAL_APISERVER = "https://127.0.0.1:6443"


def kubeconfig(server: str, ca_pem: pulumi.Output[str], user: str, *, cert: _Pair | None = None,
               token: pulumi.Output[str] | None = None) -> pulumi.Output[str]:
    """A kubeconfig (secret): the cluster CA, and a client certificate and key or a token."""

    def text(values: list[str]) -> str:
        ca = base64.b64encode(values[0].encode()).decode()
        if cert is not None:
            credentials = {"client-certificate-data": base64.b64encode(values[1].encode()).decode(),
                           "client-key-data": base64.b64encode(values[2].encode()).decode()}
        else:
            credentials = {"token": values[1]}
        return yaml.safe_dump({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kilonode", "cluster": {"server": server, "certificate-authority-data": ca}}],
            "users": [{"name": user, "user": credentials}],
            "contexts": [{"name": "kilonode", "context": {"cluster": "kilonode", "user": user}}],
            "current-context": "kilonode",
        }, sort_keys=False)

    parts = [ca_pem, cert.cert_pem, cert.key_pem] if cert is not None else [ca_pem, token]
    return pulumi.Output.secret(pulumi.Output.all(*parts).apply(text))


def _kubeconfig(user: _Pair, ca_pem: pulumi.Output[str]) -> pulumi.Output[str]:
    """A kubeconfig for a co-located component: it reaches its own apiserver on 127.0.0.1."""
    return kubeconfig(LOCAL_APISERVER, ca_pem, "component", cert=user)


def _bundle(pems: Sequence[pulumi.Output[str]]) -> pulumi.Output[str]:
    """Concatenated PEM certificates, one after another, each ending in a newline."""
    return pulumi.Output.all(*pems).apply(lambda texts: "".join(t if t.endswith("\n") else t + "\n" for t in texts))
