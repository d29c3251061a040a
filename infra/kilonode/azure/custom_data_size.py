"""How large each machine's custom data is, as Azure receives it: composed the way the program
composes it (kilonode.azure.custom_data: the same compose_mime and base64), with every file
Pulumi creates at its real size. The program refuses a stack whose custom data would be over
before it creates anything (kilonode.azure.program), every command that plans does the same
(kilonode.cli.common.load_and_plan), and preflight's custom-data-size warns as it nears the cap.

Each etcd member and apiserver VM, and each pool's scale sets (one custom data per registration
group: the pool's shared shards, each team's), gets one cloud-init document: the role's rendered
`user-data`, then a part whose `write_files` carries what Pulumi creates. For an etcd member: its
cluster's CA and client CA bundle, its server and peer certificates and keys, and the snapshot
upload's Azure config; for an apiserver: the Kubernetes CA and its key, its serving, etcd
client, kubelet client, scheduler and controller manager serving certificates and keys, the
service-account key pair, the etcd CA bundle, a kubeconfig with an embedded client certificate
per co-located component, and the Secrets' EncryptionConfiguration; for a pool: the Kubernetes
CA and the bootstrap kubeconfig with the pool's join token.

The recorded graph and a render hold no real PEM (the mock engine's placeholders are a few
bytes), so each is replaced by one of the size a real one has: ECDSA P-256
(kilonode.plan.pki), a private key as pulumi-tls writes it (SEC1 "EC PRIVATE KEY", 121 bytes of
DER: 227 bytes of PEM), a public key (SubjectPublicKeyInfo, 91 bytes: 178), and a certificate
of CERT_DER_OVERHEAD bytes plus its names (subject, issuer, SANs, extended key usages), an
upper bound that tests/preflight/test_custom_data_size.py holds against every certificate the
local issuer (kilonode.local.pki, built as pulumi-tls builds them) makes for the shipped stacks.
The Azure values (the backup account's blob endpoint, a client ID, an age recipient, a 32-byte
Secrets key) are written at their real lengths.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from kilonode.azure.backup import (
    age_keys,
    backup_account_name,
    blob_endpoint,
    snapshot_azure_config,
    snapshot_container,
)
from kilonode.azure.custom_data import (
    AZURE_CUSTOM_DATA_MAX_BYTES,
    KEY_MODE,
    ROOT,
    FileEntry,
    compose_mime,
)
from kilonode.config import Stack
from kilonode.config.load import with_lines
from kilonode.plan import defaults, pki
from kilonode.plan.encryption import KEY_BYTES, encryption_configuration
from kilonode.plan.model import ClusterPlan
from kilonode.plan.wellknown import ENCRYPTION_CONFIG
from kilonode.problems import PlanError, Problem
from kilonode.render.files import USER_DATA, RenderedFile

# ECDSA P-256 in the PEM forms pulumi-tls writes: SEC1 "EC PRIVATE KEY" (RFC 5915: the version,
# the 32-byte scalar, the curve's OID and the 65-byte public point) and "PUBLIC KEY"
# (SubjectPublicKeyInfo, RFC 5480): the same size for every key.
PRIVATE_KEY_DER_BYTES = 121
PUBLIC_KEY_DER_BYTES = 91
# A certificate's DER beyond the names counted by _certificate_der: version, serial, signature
# algorithm, validity, the public key, basic constraints, key usage, key identifiers, the
# extensions' framing and the ECDSA signature. The local issuer's certificates for the three
# shipped stacks have 327 to 346 bytes of it; 360 bounds them, its serial (up to 20 bytes) and
# signature (70 to 72) at their longest.
CERT_DER_OVERHEAD = 360
# DER bytes each name costs beyond its own characters: a subject or issuer attribute
# (SET, SEQUENCE, its OID, the string's tag and length), a DNS or IPv4 SAN (tag and length),
# an extended key usage (its OID), the SAN extension's own framing.
NAME_ATTRIBUTE_DER = 11
SAN_DER = 2
IPV4_DER = 4 + SAN_DER
EXTENDED_USAGE_DER = 10
SAN_EXTENSION_DER = 11
EXTENDED_USES = ("server_auth", "client_auth")
# What the Azure values are, at their real lengths: a client ID is a GUID; an age recipient is
# bech32 of a 32-byte key; the subscription only names the account (its name's length is fixed).
GUID = "00000000-0000-0000-0000-000000000000"
JOIN_TOKEN = "abcdef.0123456789abcdef"  # [a-z0-9]{6}.[a-z0-9]{16} (kilonode.azure.tls)


def pem(label: str, der_bytes: int) -> str:
    """A PEM of `der_bytes` of DER, shaped as a real one: base64 in 64-character lines."""
    text = base64.b64encode(bytes(der_bytes)).decode()
    lines = "".join(f"{text[i:i + 64]}\n" for i in range(0, len(text), 64))
    return f"-----BEGIN {label}-----\n{lines}-----END {label}-----\n"


def _names(common_name: str, organization: str | None) -> int:
    return NAME_ATTRIBUTE_DER + len(common_name) + (NAME_ATTRIBUTE_DER + len(organization) if organization else 0)


def _certificate_der(layout: pki.PkiLayout, name: str) -> int:
    """An upper bound on the DER size of certificate `name` of the layout."""
    if layout.kind(name) == "authority":
        ca = layout.authority(name)
        return CERT_DER_OVERHEAD + 2 * _names(ca.common_name, ca.organization)  # subject = issuer
    leaf = layout.leaf(name)
    issuer = layout.authority(leaf.ca)
    size = CERT_DER_OVERHEAD + _names(leaf.common_name, leaf.organization) + _names(issuer.common_name,
                                                                                    issuer.organization)
    size += sum(SAN_DER + len(n) for n in leaf.dns_names) + IPV4_DER * len(leaf.ip_addresses)
    size += SAN_EXTENSION_DER if leaf.dns_names or leaf.ip_addresses else 0
    return size + EXTENDED_USAGE_DER * sum(u in EXTENDED_USES for u in leaf.uses)


def certificate_pem(layout: pki.PkiLayout, name: str) -> str:
    return pem("CERTIFICATE", _certificate_der(layout, name))


def _content(layout: pki.PkiLayout, content: pki.Content) -> str:
    """A file of the PKI layout at its real size."""
    match content:
        case pki.Cert(of=name):
            return certificate_pem(layout, name)
        case pki.PrivateKey():
            return pem("EC PRIVATE KEY", PRIVATE_KEY_DER_BYTES)
        case pki.PublicKey():
            return pem("PUBLIC KEY", PUBLIC_KEY_DER_BYTES)
        case pki.Bundle(cas=cas):
            return pki.bundle_text([certificate_pem(layout, ca) for ca in cas])
        case pki.Kubeconfig(server=server, user=user, ca=ca, client=None):
            return pki.kubeconfig_text(server, certificate_pem(layout, ca), user, token=JOIN_TOKEN)
        case pki.Kubeconfig(server=server, user=user, ca=ca, client=str(client), ca_file=ca_file):
            return pki.kubeconfig_text(server, certificate_pem(layout, ca), user,
                                       cert_pem=certificate_pem(layout, client),
                                       key_pem=pem("EC PRIVATE KEY", PRIVATE_KEY_DER_BYTES), ca_file=ca_file)
    raise TypeError(f"unknown PKI file content {content!r}")


def delivered(plan: ClusterPlan, layout: pki.PkiLayout, host: str) -> list[FileEntry]:
    """What the Pulumi program adds to `host`'s rendered user-data (kilonode.azure.cluster,
    node_pool), at its real size: `host` is a render role (etcd-main-0, apiserver-1, pool-<name>,
    pool-<name>.<team>)."""
    files = layout.hosts.get(host, layout.node_files)
    entries = [(f.path, _content(layout, f.content), f.mode, f.owner) for f in files]
    if host.startswith("etcd-"):
        recipient = age_keys(base64.b64encode(bytes(32)).decode())[1]
        endpoint = blob_endpoint(backup_account_name(plan.cluster, GUID))
        [role] = [e.role for e in plan.etcd_clusters if host in {m.name for m in e.members}]
        config = snapshot_azure_config(endpoint, snapshot_container(role), GUID, recipient)
        entries.append((defaults.ETCD_SNAPSHOT_AZURE_CONFIG, config, 0o644, ROOT))
    elif host in layout.hosts:  # an apiserver
        key = base64.b64encode(bytes(KEY_BYTES)).decode()
        entries.append((ENCRYPTION_CONFIG, encryption_configuration(key), KEY_MODE, ROOT))
    return entries


def encoded_size(user_data: str, files: Sequence[FileEntry]) -> int:
    """The base64 size of the custom data kilonode.azure.custom_data composes from these."""
    return 4 * math.ceil(len(compose_mime(user_data, files).encode()) / 3)


def largest_files(user_data: str, files: Sequence[FileEntry], count: int = 3) -> str:
    """The host's largest files, in either part, by their content's size."""
    sizes = [(len(content), path) for path, content, _mode, _owner in files]
    try:
        document = yaml.safe_load(user_data)
    except yaml.YAMLError:
        document = None
    written = document.get("write_files") if isinstance(document, dict) else None
    sizes += [(len(str(f.get("content", ""))), str(f.get("path"))) for f in written or [] if isinstance(f, dict)]
    return ", ".join(f"{path} ({size:,} B)" for size, path in sorted(sizes, reverse=True)[:count])


def measure(plan: ClusterPlan, user_data: Mapping[str, str]) -> dict[str, int]:
    """Each machine role's custom data size, base64 as Azure receives it, from its rendered
    user-data (role -> text; roles that are no machine's custom data are skipped): what
    preflight's custom-data-size judges, and what oversized refuses above the limit. (Which files
    make a role large, largest_files, is read only for a role over it: it parses the YAML.)"""
    layout = pki.pki_layout(plan)
    pools = {role for p in plan.node_pools for role in (p.role(), *(p.role(t) for t in p.teams))}
    return {host: encoded_size(text, delivered(plan, layout, host))
            for host, text in user_data.items() if host in layout.hosts or host in pools}


# The stack values that grow a role's custom data (kilonode.config.model.CUSTOM_DATA_BOUNDS), as
# paths in the stack: every machine's, then a pool's own ("{pool}": its index in nodePools).
_EVERY_ROLE_GROWS = (("sysctl", "overrides"), ("bootImageArchives",))
_POOL_GROWS = (("labels",), ("taints",), ("preloadImages",))


def user_data(rendered: Mapping[str, Mapping[str, RenderedFile]]) -> dict[str, str]:
    """Each role's rendered user-data (kilonode.render.render_cluster's output, role -> files)."""
    return {role: files[USER_DATA].content for role, files in rendered.items() if USER_DATA in files}


def refuse_oversized(stack: Stack, plan: ClusterPlan, user_data: Mapping[str, str]) -> None:
    """Raise the stack's problems (with their lines in the stack file) where a role's custom data
    would be over: the program calls this before it creates anything, every command that plans
    (kilonode.cli.common.load_and_plan) the same, so both refuse with the same lines."""
    problems = oversized(stack, plan, user_data)
    if problems:
        raise with_lines(stack, PlanError(problems))


def oversized(stack: Stack, plan: ClusterPlan, user_data: Mapping[str, str]) -> list[Problem]:
    """A problem for every machine role whose custom data, from its rendered user-data (role ->
    text) composed as the program composes it (measure), is above what
    kilonode.azure.custom_data.encode takes: the program would otherwise stop half-way, in an
    apply, with a traceback. Each at the stack value that grows that role's custom data most (the
    largest of those it carries)."""
    problems = []
    for role, size in measure(plan, user_data).items():
        if size <= AZURE_CUSTOM_DATA_MAX_BYTES:
            continue
        largest = largest_files(user_data[role], delivered(plan, pki.pki_layout(plan), role))
        loc, grown = _largest_grower(stack, plan, role)
        problems.append(Problem(loc, (
            f"{role}'s custom data would be {size:,} bytes base64-encoded, {size - AZURE_CUSTOM_DATA_MAX_BYTES:,} "
            f"over the {AZURE_CUSTOM_DATA_MAX_BYTES:,} kilonode.azure.custom_data takes (Azure's cap on custom data); "
            f"{grown}; its largest files: {largest}")))
    return problems


def _largest_grower(stack: Stack, plan: ClusterPlan, role: str) -> tuple[tuple[str | int, ...], str]:
    """The stack value that grows `role`'s custom data most, and what to do, in words."""
    pools = {r: i for i, p in enumerate(plan.node_pools) for r in (p.role(), *(p.role(t) for t in p.teams))}
    paths: list[tuple[str | int, ...]] = list(_EVERY_ROLE_GROWS)
    if role in pools:
        paths += [("nodePools", pools[role], *path) for path in _POOL_GROWS]
    sizes = []
    for path in paths:
        value: Any = stack.raw
        for part in path:
            value = value.get(part) if isinstance(value, dict) else (
                value[part] if isinstance(value, list) and isinstance(part, int) and part < len(value) else None)
        if value:
            sizes.append((len(json.dumps(value)), len(value), path))
    if not sizes:
        return (("nodePools", pools[role]) if role in pools else ()), "no stack value grows it: report this"
    text, entries, path = max(sizes, key=lambda item: item[0])
    return path, (f"of the stack values it carries this one is the largest ({entries:,} entries, {text:,} characters): "
                  "keep fewer of them")
