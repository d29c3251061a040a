"""Tls: the cluster's certificate authorities and certificates, created with pulumi-tls.

What to create and where each file goes is kilonode.plan.pki's layout (the trust rules are
explained there); this component only materialises it. The local rehearsal
(kilonode.local.pki) materialises the same layout with `cryptography`. Resource names derive
from the layout's names (`<component>-<name>`, `-key`, `-csr`): renaming an entry there
replaces it, and every VM that carries it, in Azure.

Private keys leave this component only as Pulumi secrets (`Output.secret`), and only inside
the files handed to custom data. pulumi-tls marks them secret as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_random as random
import pulumi_tls as tls

from kilonode.azure.custom_data import DeliveredFile
from kilonode.plan import pki
from kilonode.plan.model import ClusterPlan


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
    `pool_node_files[(pool, team)]` go to every node of that registration group (team None: the
    pool's shared shards), each with its group's join token.
    """

    host_files: dict[str, list[DeliveredFile]]
    pool_node_files: dict[tuple[str, str | None], list[DeliveredFile]]  # (pool, team) -> its nodes' files
    # (pool, generation) -> the join token's id and secret (secret), for the token Secrets
    join_tokens: dict[tuple[str, str | None, int], tuple[pulumi.Output[str], pulumi.Output[str]]]
    admin_kubeconfig: pulumi.Output[str]  # secret; kilonode:cluster-admins, through the load balancer
    super_admin_kubeconfig: pulumi.Output[str]  # secret; system:masters, for the program's own provider
    etcd_ca_certs: dict[str, pulumi.Output[str]]  # etcd cluster role -> its CA certificate (public)

    def __init__(self, name: str, args: TlsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:azure:Tls", name, None, opts)
        self._name = name
        self._child = pulumi.ResourceOptions(parent=self)
        layout = pki.pki_layout(args.plan)
        self._layout = layout

        self._pairs: dict[str, _Pair] = {}
        for authority in layout.authorities:
            self._pairs[authority.name] = self._ca(authority)
        for leaf in layout.leaves:
            self._pairs[leaf.name] = self._signed(leaf)
        self._bare: dict[str, tls.PrivateKey] = {key.name: self._key(key.name) for key in layout.keys}

        # TLS bootstrap, as kubeadm, with one token per pool and generation (the plan's
        # join_tokens): `<id>.<secret>` ([a-z0-9]{6}.[a-z0-9]{16}, the format the apiserver's
        # bootstrap authenticator accepts) in the Pulumi state only. Named by pool and generation:
        # a new generation in the stack is a new token, a generation no longer named is deleted.
        # Each pool's custom data carries its current one (docs/azure.md, "Node join credentials").
        self.join_tokens = {}
        current: dict[tuple[str, str | None], pulumi.Output[str]] = {}
        for token in args.plan.join_tokens:
            # a pool's shared token keeps the name it had before teams got tokens of their own
            group = token.pool if token.team is None else f"{token.pool}-team-{token.team}"
            which = f"{name}-join-token-{group}-g{token.generation}"
            # The ID is public (it names the token's Secret, bootstrap-token-<id>). The secret part
            # is a RandomPassword: pulumi-random marks its `result` a secret output
            # (additional_secret_outputs, random_password.py), so the state stores it encrypted,
            # and its resource ID is "none". A RandomString's result, and its ID (the string
            # itself), sit in the state in plain text whatever later wraps them in Output.secret.
            token_id = random.RandomString(f"{which}-id", length=6, upper=False, special=False, opts=self._child)
            token_secret = random.RandomPassword(f"{which}-secret", length=16, upper=False, special=False,
                                                 opts=self._child)
            self.join_tokens[(token.pool, token.team, token.generation)] = (
                token_id.result, pulumi.Output.secret(token_secret.result))
            if token.current:
                current[(token.pool, token.team)] = pulumi.Output.secret(
                    pulumi.Output.concat(token_id.result, ".", token_secret.result))

        self.host_files = {host: [self._delivered(f) for f in files] for host, files in layout.hosts.items()}
        self.pool_node_files = {
            group: [self._delivered(f, token) for f in layout.node_files] for group, token in current.items()
        }
        self.admin_kubeconfig = self._kubeconfig(layout.admin_kubeconfig)
        self.super_admin_kubeconfig = self._kubeconfig(layout.super_admin_kubeconfig)

        # role -> that etcd cluster's CA certificate: what a snapshot's signer must chain to (the restore)
        self.etcd_ca_certs = {etcd.role: self._pairs[pki.etcd_ca_name(etcd.role)].cert_pem
                              for etcd in args.plan.etcd_clusters}
        self.register_outputs({
            **{f"etcd{role.capitalize()}CaCert": cert for role, cert in self.etcd_ca_certs.items()},
            "kubernetesCaCert": self._pairs[pki.KUBERNETES_CA].cert_pem,
        })

    def _delivered(self, file: pki.HostFile, token: pulumi.Output[str] | None = None) -> DeliveredFile:
        return DeliveredFile(file.path, self._content(file.content, token), file.mode, file.owner)

    def _content(self, content: pki.Content, token: pulumi.Output[str] | None = None) -> pulumi.Output[str]:
        match content:
            case pki.Cert(of=name):
                return self._pairs[name].cert_pem
            case pki.PrivateKey(of=name) if name in self._bare:
                return pulumi.Output.secret(self._bare[name].private_key_pem)
            case pki.PrivateKey(of=name):
                return self._pairs[name].key_pem
            case pki.PublicKey(of=name):
                return self._bare[name].public_key_pem
            case pki.Bundle(cas=cas):
                return _bundle([self._pairs[ca].cert_pem for ca in cas])
            case pki.Kubeconfig():
                return self._kubeconfig(content, token=token)
        raise TypeError(f"unknown PKI file content {content!r}")

    def _kubeconfig(self, spec: pki.Kubeconfig, server: pulumi.Input[str] | None = None,
                    tls_server_name: str | None = None, token: pulumi.Output[str] | None = None) -> pulumi.Output[str]:
        ca = self._pairs[spec.ca].cert_pem
        where = spec.server if server is None else server
        if spec.client is None:
            if token is None:
                raise ValueError(f"kubeconfig for {spec.user} has no client certificate and no pool's join token")
            return kubeconfig(where, ca, spec.user, token=token, tls_server_name=tls_server_name)
        return kubeconfig(where, ca, spec.user, cert=self._pairs[spec.client], tls_server_name=tls_server_name,
                          ca_file=spec.ca_file)

    def through(self, endpoint: pulumi.Output[str], public: bool) -> None:
        """Point the admin and super-admin kubeconfigs at the endpoint the machine running `pulumi
        up` uses (kilonode.azure.control_plane, `deployer_endpoint`). The public frontend's
        address is Azure's to choose and no apiserver certificate names it: `public` kubeconfigs
        ask for DEPLOYER_TLS_SERVER_NAME instead."""
        name = pki.DEPLOYER_TLS_SERVER_NAME if public else None
        self.admin_kubeconfig = self._kubeconfig(self._layout.admin_kubeconfig, endpoint, name)
        self.super_admin_kubeconfig = self._kubeconfig(self._layout.super_admin_kubeconfig, endpoint, name)

    def _key(self, name: str, opts: pulumi.ResourceOptions | None = None) -> tls.PrivateKey:
        return tls.PrivateKey(f"{self._name}-{name}-key", algorithm=pki.KEY_ALGORITHM, ecdsa_curve=pki.KEY_CURVE,
                              opts=opts or self._child)

    def _ca(self, authority: pki.Authority) -> _Pair:
        key = self._key(authority.name)
        cert = tls.SelfSignedCert(
            f"{self._name}-{authority.name}",
            private_key_pem=key.private_key_pem,
            subject=tls.SelfSignedCertSubjectArgs(common_name=authority.common_name,
                                                  organization=authority.organization),
            is_ca_certificate=True,
            validity_period_hours=pki.CA_HOURS,
            allowed_uses=list(authority.uses),
            opts=self._child,
        )
        return _Pair(cert.cert_pem, pulumi.Output.secret(key.private_key_pem))

    def _renewal(self, leaf: pki.Leaf) -> pulumi.ResourceOptions:
        """A host's leaf is replaced (key, request and certificate) when its host's generation
        changes, and only then. `replacement_trigger` (pulumi/pulumi PR #20936, in the pinned SDK
        3.272; the CLI running `pulumi up` must know it too, which the runbook has preview show):
        the engine compares the value with the one the last deployment recorded and replaces the
        resource when both are set and differ. A trigger set for the first time (a stack deployed
        before this option) replaces nothing, so the generation is always given, 0 included. The
        exported admin credential's leaf likewise, by the stack's adminGeneration (its revocation)."""
        if leaf.host is None and leaf.name != pki.ADMIN:
            return self._child
        return pulumi.ResourceOptions(parent=self, replacement_trigger=leaf.generation)

    def _signed(self, leaf: pki.Leaf) -> _Pair:
        renewal = self._renewal(leaf)
        key = self._key(leaf.name, renewal)
        ca = self._pairs[leaf.ca]
        csr = tls.CertRequest(
            f"{self._name}-{leaf.name}-csr",
            private_key_pem=key.private_key_pem,
            subject=tls.CertRequestSubjectArgs(common_name=leaf.common_name, organization=leaf.organization),
            dns_names=list(leaf.dns_names) or None,
            ip_addresses=list(leaf.ip_addresses) or None,
            opts=renewal,
        )
        cert = tls.LocallySignedCert(
            f"{self._name}-{leaf.name}",
            cert_request_pem=csr.cert_request_pem,
            ca_cert_pem=ca.cert_pem,
            ca_private_key_pem=ca.key_pem,
            validity_period_hours=pki.validity_hours(leaf),
            # 0 for a host's leaves: renewed by generation, never all at once (kilonode.plan.defaults)
            early_renewal_hours=pki.early_renewal_hours(leaf),
            allowed_uses=list(leaf.uses),
            opts=renewal,
        )
        return _Pair(cert.cert_pem, pulumi.Output.secret(key.private_key_pem))


def kubeconfig(server: pulumi.Input[str], ca_pem: pulumi.Output[str], user: str, *, cert: _Pair | None = None,
               token: pulumi.Output[str] | None = None, tls_server_name: str | None = None,
               ca_file: str | None = None) -> pulumi.Output[str]:
    """A kubeconfig (secret): the cluster CA, and a client certificate and key or a token
    (kilonode.plan.pki.kubeconfig_text writes the document)."""

    def text(values: list[str]) -> str:
        if cert is not None:
            return pki.kubeconfig_text(values[0], values[1], user, cert_pem=values[2], key_pem=values[3],
                                       tls_server_name=tls_server_name, ca_file=ca_file)
        return pki.kubeconfig_text(values[0], values[1], user, token=values[2], tls_server_name=tls_server_name)

    parts = [server, ca_pem, cert.cert_pem, cert.key_pem] if cert is not None else [server, ca_pem, token]
    return pulumi.Output.secret(pulumi.Output.all(*parts).apply(text))


def _bundle(pems: Sequence[pulumi.Output[str]]) -> pulumi.Output[str]:
    return pulumi.Output.all(*pems).apply(pki.bundle_text)
