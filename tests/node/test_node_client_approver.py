"""The node client approver's rule, on real CSRs built with `cryptography`, hostile ones first.
The rule's reference is kube-controller-manager's nodeclient check plus the name rule
(kilonode.node.node_client_approver.rules says where each part comes from)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from kilonode.node.node_client_approver.rules import (
    CLIENT_AUTH,
    DIGITAL_SIGNATURE,
    KEY_ENCIPHERMENT,
    SIGNER,
    Pool,
    Request,
    decide,
    pool_group,
)

POOLS = (Pool("h100", ("r7500-h100-000", "r7500-h100-001")), Pool("cpu", ("r7500-cpu-000",)),
         # a prefix that is another's prefix plus one character: names must still be one pool's
         Pool("h1", ("r7500-h1",)))
TOKEN_USER = "system:bootstrap:abc123"
KUBELET_USAGES = (DIGITAL_SIGNATURE, CLIENT_AUTH)
NEW = "r7500-h100-00100002d"  # prefix r7500-h100-001 + Azure's instance 85 in base 36


def csr_pem(common_name: str = f"system:node:{NEW}", organizations: Sequence[str] = ("system:nodes",),
            key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | None = None,
            sans: Sequence[str] = (), extra: Sequence[x509.NameAttribute] = ()) -> bytes:
    key = key or ec.generate_private_key(ec.SECP256R1())
    names = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    names += [x509.NameAttribute(NameOID.COMMON_NAME, common_name), *extra]
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(names))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(s) for s in sans]), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def request(pem: bytes | None = None, groups: Sequence[str] = ("system:bootstrappers", pool_group("h100")),
            usages: Sequence[str] = KUBELET_USAGES, username: str = TOKEN_USER, signer: str = SIGNER,
            decided: bool = False) -> Request:
    return Request("node-csr-x", signer, username, tuple(groups), tuple(usages), pem or csr_pem(), decided)


def verdict(req: Request, nodes: Sequence[str] = (), approved: dict[str, str] | None = None) -> tuple[str, str]:
    decision = decide(req, POOLS, set(nodes), approved or {})
    return decision.verdict, decision.reason


def test_a_kubelets_first_request_from_its_pools_token_is_approved() -> None:
    assert verdict(request())[0] == "approve"
    # the older kubelet's set with an RSA key, and the other shard's prefix
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = csr_pem("system:node:r7500-h100-000zzzzzz", key=rsa_key)
    assert verdict(request(pem, usages=(DIGITAL_SIGNATURE, KEY_ENCIPHERMENT, CLIENT_AUTH)))[0] == "approve"


@pytest.mark.parametrize(("pem", "found"), [
    (csr_pem("system:node:r7500-cpu-000000001"), "pool cpu's scale-set name, not pool h100's"),
    (csr_pem("system:node:apiserver-0"), "no pool's scale-set name"),
    (csr_pem("system:node:r7500-etcd-main-0"), "no pool's scale-set name"),
    (csr_pem("system:node:r7500-h100-00100002"), "no pool's scale-set name"),  # five suffix characters
    (csr_pem("system:node:r7500-h100-00100002d1"), "no pool's scale-set name"),  # seven
    (csr_pem("system:node:r7500-h100-001-0002d"), "no pool's scale-set name"),  # not base 36
    (csr_pem("system:node:R7500-H100-00100002D"), "no pool's scale-set name"),  # the kubelet lower-cases
    (csr_pem("system:node:r7500-h1000000"), "pool h1's scale-set name, not pool h100's"),
    (csr_pem("system:admin"), "does not start with system:node:"),
    (csr_pem(organizations=("system:masters",)), "is not exactly CN=system:node:<name>"),
    (csr_pem(organizations=("system:nodes", "system:masters")), "is not exactly CN=system:node:<name>"),
    (csr_pem(organizations=()), "is not exactly CN=system:node:<name>"),
    (csr_pem(extra=(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "x"),)), "is not exactly"),
    (csr_pem(sans=("kubernetes.default",)), "carries extensions (2.5.29.17)"),
    (b"-----BEGIN CERTIFICATE REQUEST-----\nnot base64\n-----END CERTIFICATE REQUEST-----\n",
     "not a PEM certificate request"),
])
def test_a_hostile_request_is_denied_with_its_reason(pem: bytes, found: str) -> None:
    result, reason = verdict(request(pem))
    assert (result, found in reason) == ("deny", True), reason


@pytest.mark.parametrize(("usages", "found"), [
    ((DIGITAL_SIGNATURE, KEY_ENCIPHERMENT, CLIENT_AUTH), "not the kubelet client's"),  # KE with an EC key
    ((DIGITAL_SIGNATURE, CLIENT_AUTH, "server auth"), "not the kubelet client's"),
    ((DIGITAL_SIGNATURE, CLIENT_AUTH, "code signing"), "not the kubelet client's"),
    ((CLIENT_AUTH,), "not the kubelet client's"),
    ((DIGITAL_SIGNATURE, CLIENT_AUTH, CLIENT_AUTH), "not the kubelet client's"),
])
def test_usages_other_than_the_kubelet_clients_are_denied(usages: tuple[str, ...], found: str) -> None:
    result, reason = verdict(request(usages=usages))
    assert (result, found in reason) == ("deny", True), reason


def test_an_existing_node_cannot_be_impersonated_nor_a_name_approved_twice() -> None:
    assert verdict(request(), nodes=[NEW]) == ("deny", f"Node {NEW} already exists: a joining VM's name is new")
    result, reason = verdict(request(), approved={NEW: "node-csr-other"})
    assert (result, "CSR node-csr-other is already approved" in reason) == ("deny", True)
    # its own earlier approval (a watch event of the CSR it approved) is no obstacle
    assert verdict(request(), approved={NEW: "node-csr-x"})[0] == "approve"


def test_the_requester_must_be_one_pools_bootstrap_token() -> None:
    two = request(groups=(pool_group("h100"), pool_group("cpu")))
    assert verdict(two)[0] == "deny"
    assert "not a bootstrap token user" in verdict(request(username="system:node:r7500-h100-00100002d"))[1]
    assert "not a bootstrap token user" in verdict(request(username="mallory"))[1]


def test_a_signature_that_does_not_verify_is_denied() -> None:
    """Another key's signature over the same body (RSA: both signatures are 256 bytes, so the
    DER keeps its shape)."""
    import base64

    key, other = (rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in range(2))
    good = x509.load_pem_x509_csr(csr_pem(key=key))
    forged = good.public_bytes(serialization.Encoding.DER).replace(
        good.signature, x509.load_pem_x509_csr(csr_pem(key=other)).signature)
    pem = (b"-----BEGIN CERTIFICATE REQUEST-----\n" + base64.encodebytes(forged)
           + b"-----END CERTIFICATE REQUEST-----\n")
    rsa_usages = (DIGITAL_SIGNATURE, KEY_ENCIPHERMENT, CLIENT_AUTH)
    assert verdict(request(pem, usages=rsa_usages)) == ("deny", "the request's signature does not verify")


@pytest.mark.parametrize("req", [
    request(signer="kubernetes.io/kubelet-serving"),
    request(decided=True),
    request(groups=("system:bootstrappers", "system:bootstrappers:kubeadm:default-node-token")),
    request(groups=("system:nodes", "system:authenticated"), username="system:node:r7500-h100-00100002d"),
])
def test_what_is_not_a_pools_first_request_is_left_alone(req: Request) -> None:
    assert verdict(req)[0] == "skip"
