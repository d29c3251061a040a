"""The approver's decision, pure: one CSR, the pool table, the names already taken in; approve,
deny or leave alone, with the reason, out. No I/O: tests feed it hostile requests directly.

What kube-controller-manager's csrapproving controller checks for a `nodeclient` CSR, and so
what this replaces (pkg/controller/certificates/approver/sarapprove.go, isNodeClientCert, and
pkg/apis/certificates/helpers.go ValidateKubeletClientCSR, in kubernetes/kubernetes): signer
kubernetes.io/kube-apiserver-client-kubelet; Organization exactly [system:nodes]; no DNS, email,
IP or URI SAN; CommonName *starting with* system:node:; usages {digital signature, client auth}
or {digital signature, key encipherment, client auth}; then a SubjectAccessReview that the
requester may `create` certificatesigningrequests/nodeclient. Nothing ties the name to the
requester, so any bootstrap token could mint `system:node:<any name>`, an existing node's or
an apiserver's included. Here, on top of all of that:

- the requester holds exactly one registration group's bootstrap group
  (system:bootstrappers:kilonode:pool:<pool> for a pool's shared shards, ...:pool:<pool>:team:<team>
  for a team's: the extra group of that group's join tokens, kilonode.k8s.bootstrap; the table's
  "pools" are these groups) and is a bootstrap token user (system:bootstrap:<token id>);
- the subject is exactly CN=system:node:<name>, O=system:nodes (no other attribute) and the
  request carries no extension at all (the kubelet's has none: certutil.MakeCSR with no SANs,
  pkg/kubelet/certificate/bootstrap/bootstrap.go requestNodeCertificate);
- <name> is one of the pool's scale-set computer-name prefixes followed by the six base-36
  characters Azure appends to a Uniform scale set's instances (Microsoft Learn, "Understand
  names and instance IDs for Azure Virtual Machine Scale Set VMs": computer name =
  {computer-name-prefix}{base-36-instance-id}, always six digits, zero-padded, e.g.
  nsgvmss00002D for instance 85), lower-cased as the kubelet lower-cases its hostname
  (pkg/util/node GetHostname: strings.ToLower); and no other pool's prefix also gives it;
- no Node of that name exists, and no other CSR for that name is already approved: a stolen
  token cannot take over a node that has joined, nor a name another request already holds;
- the usages are one of the two sets above, key encipherment only with an RSA key.

Requests for other signers, already decided, or from requesters in no pool group are left
alone (`skip`): kube-controller-manager still approves renewals (selfnodeclient), and nothing
approves a first certificate for a requester outside the pools.
"""

from __future__ import annotations

import json
import re
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
NODE_USER_PREFIX = "system:node:"
NODES_GROUP = "system:nodes"
# cluster-bootstrap token/api/types.go: BootstrapUserPrefix, BootstrapTokenIDPattern
BOOTSTRAP_USER = re.compile(r"system:bootstrap:[a-z0-9]{6}")
POOL_GROUP_PREFIX = "system:bootstrappers:kilonode:pool:"
# Azure Uniform scale sets: computer name = computerNamePrefix + the instance ID in base 36,
# zero-padded to six characters (upper case in Azure; the kubelet lower-cases its hostname).
SUFFIX = "[0-9a-z]{6}"

DIGITAL_SIGNATURE, KEY_ENCIPHERMENT, CLIENT_AUTH = "digital signature", "key encipherment", "client auth"
USAGES = frozenset({DIGITAL_SIGNATURE, CLIENT_AUTH})
USAGES_RSA = frozenset({DIGITAL_SIGNATURE, KEY_ENCIPHERMENT, CLIENT_AUTH})

Verdict = Literal["approve", "deny", "skip"]

# The pool table: a ConfigMap in kube-system that kilonode.k8s.bootstrap writes from the plan,
# {"pools": [{"name": <pool>, "prefixes": [<computerNamePrefix>, ...]}, ...]} under POOLS_KEY.
POOLS_CONFIGMAP = "kilonode-node-client-approver"
POOLS_NAMESPACE = "kube-system"
POOLS_KEY = "pools.json"


@dataclass(frozen=True)
class Request:
    """What the approver reads of one CertificateSigningRequest (spec fields the apiserver sets
    from the authenticated requester: username, groups)."""

    name: str
    signer_name: str
    username: str
    groups: Sequence[str]
    usages: Sequence[str]
    request_pem: bytes
    decided: bool = False  # an Approved or Denied condition is already there


@dataclass(frozen=True)
class Pool:
    name: str
    prefixes: Sequence[str]  # its scale sets' computerNamePrefix, as the plan names them

    @property
    def group(self) -> str:
        return pool_group(self.name)


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str
    node: str | None = None  # the node name the request asks for, once read


def pools_from_json(text: str) -> list[Pool]:
    """The pool table as the ConfigMap holds it. Raises ValueError on anything else."""
    document = json.loads(text)
    pools = [Pool(str(entry["name"]), tuple(str(p) for p in entry["prefixes"])) for entry in document["pools"]]
    if any(not p.prefixes or "" in p.prefixes for p in pools):
        raise ValueError("a pool in the table has no (or an empty) computer-name prefix")
    return pools


def pools_to_json(pools: Sequence[Pool]) -> str:
    return json.dumps({"pools": [{"name": p.name, "prefixes": list(p.prefixes)} for p in pools]}, indent=2) + "\n"


def pool_group(pool: str) -> str:
    """The extra group of a pool's join tokens; matches cluster-bootstrap's BootstrapGroupPattern
    (\\Asystem:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]\\z) for kilonode's pool names."""
    return f"{POOL_GROUP_PREFIX}{pool}"


def name_pool(node: str, pools: Sequence[Pool]) -> list[str]:
    """The pools whose scale sets can give a VM this (lower-case) computer name."""
    return [p.name for p in pools
            if any(re.fullmatch(re.escape(prefix.lower()) + SUFFIX, node) for prefix in p.prefixes)]


def decide(request: Request, pools: Sequence[Pool], nodes: Container[str],
           approved: Mapping[str, str]) -> Decision:
    """`nodes`: the names of the Nodes that exist; `approved`: node name -> the name of a CSR
    already approved for it (other than this one)."""
    if request.signer_name != SIGNER:
        return Decision("skip", f"signer {request.signer_name} is not {SIGNER}")
    if request.decided:
        return Decision("skip", "already approved or denied")
    by_group = {p.group: p for p in pools}
    held = sorted({g for g in request.groups if g in by_group})
    if not held:
        return Decision("skip", "the requester holds no pool's bootstrap group")
    if len(held) > 1:
        return Decision("deny", f"the requester holds several pools' bootstrap groups ({', '.join(held)})")
    pool = by_group[held[0]]
    if not BOOTSTRAP_USER.fullmatch(request.username):
        return Decision("deny", f"{request.username!r} holds {pool.group} but is not a bootstrap token user")
    try:
        csr = x509.load_pem_x509_csr(request.request_pem)
    except ValueError as error:
        return Decision("deny", f"the request is not a PEM certificate request ({error})")
    problem = _subject_problem(csr) or _usage_problem(csr, request.usages)
    if problem:
        return Decision("deny", problem)
    node = str(csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value).removeprefix(NODE_USER_PREFIX)
    return _name_decision(node, pool, pools, nodes, approved, request.name)


def _subject_problem(csr: x509.CertificateSigningRequest) -> str | None:
    if not csr.is_signature_valid:
        return "the request's signature does not verify"
    attributes = [(a.oid, a.value) for a in csr.subject]
    cns = [v for oid, v in attributes if oid == NameOID.COMMON_NAME]
    if sorted(oid.dotted_string for oid, _ in attributes) != sorted(
            (NameOID.COMMON_NAME.dotted_string, NameOID.ORGANIZATION_NAME.dotted_string)) \
            or (NameOID.ORGANIZATION_NAME, NODES_GROUP) not in attributes:
        return f"subject {csr.subject.rfc4514_string()!r} is not exactly CN=system:node:<name>, O={NODES_GROUP}"
    if not isinstance(cns[0], str) or not cns[0].startswith(NODE_USER_PREFIX):
        return f"common name {cns[0]!r} does not start with {NODE_USER_PREFIX}"
    if len(csr.extensions) > 0:
        oids = ", ".join(e.oid.dotted_string for e in csr.extensions)
        return f"the request carries extensions ({oids}); a kubelet client request has none (no SANs)"
    return None


def _usage_problem(csr: x509.CertificateSigningRequest, usages: Sequence[str]) -> str | None:
    asked = frozenset(usages)
    allowed = USAGES_RSA if isinstance(csr.public_key(), rsa.RSAPublicKey) else USAGES
    if asked != allowed or len(usages) != len(asked):
        return f"usages {sorted(usages)} are not the kubelet client's {sorted(allowed)}"
    return None


def _name_decision(node: str, pool: Pool, pools: Sequence[Pool], nodes: Container[str],
                   approved: Mapping[str, str], csr_name: str) -> Decision:
    owners = name_pool(node, pools)
    if pool.name not in owners:
        where = f"pool {owners[0]}'s" if owners else "no pool's"
        return Decision("deny", f"node name {node!r} is {where} scale-set name, not pool {pool.name}'s "
                                f"(prefixes {', '.join(pool.prefixes)} + 6 base-36 characters)", node)
    if len(owners) > 1:
        return Decision("deny", f"node name {node!r} could be a VM of pools {', '.join(owners)}", node)
    if node in nodes:
        return Decision("deny", f"Node {node} already exists: a joining VM's name is new", node)
    other = approved.get(node)
    if other is not None and other != csr_name:
        return Decision("deny", f"CSR {other} is already approved for node {node}", node)
    return Decision("approve", f"pool {pool.name} join token, new node {node} of its scale sets", node)
