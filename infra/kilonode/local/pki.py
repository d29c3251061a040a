"""The project's trust layout (kilonode.plan.pki), issued with `cryptography` into a state
directory: the local twin of kilonode.azure.tls, reading the same layout object.

What differs from Azure, and only this: each IP SAN that names a host of the plan carries
that host's loopback address instead (kilonode.local.addresses), and files are not chowned
(the rehearsal runs every member as the invoking user; the layout's owners are what Azure
applies). Certificates are built the way pulumi-tls builds them (terraform-provider-tls,
internal/provider/common_cert.go `createCertificate` and resource_self_signed_cert.go):
basic constraints on every certificate, key usages from `allowed_uses`, extended key usages
from the same list, a subject key identifier on CAs, SHA-256 signatures.

Layout of the directory (keys 0600, directories 0700):

    pki/ca/<ca>.crt|.key            the CAs
    pki/certs/<leaf>.crt|.key       every leaf certificate of the layout
    pki/keys/<key>.key|.pub         bare key pairs (the service-account key)
    pki/bootstrap-token             the nodes' bootstrap token (<id>.<secret>)
    pki/<admin|super-admin>.kubeconfig
    hosts/<host>/<path>             each host's delivered files at their host paths
    hosts/node/<path>               what every pool node receives

Idempotent: a second run reuses every key and certificate that is still valid (its key
matches, its CA signed it, it is outside its renewal window, its subject, SANs and uses are
what the layout says) and reissues the rest, naming why.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kilonode.local.addresses import address_map
from kilonode.plan import pki
from kilonode.plan.model import ClusterPlan

_EXTENDED = {"server_auth": ExtendedKeyUsageOID.SERVER_AUTH, "client_auth": ExtendedKeyUsageOID.CLIENT_AUTH}
_KEY_USAGE_FIELDS = {
    "digital_signature": "digital_signature",
    "key_encipherment": "key_encipherment",
    "cert_signing": "key_cert_sign",
    "crl_signing": "crl_sign",
}
_TOKEN = re.compile(r"[a-z0-9]{6}\.[a-z0-9]{16}")
_IP = re.compile(r"(?<![\d.])(\d{1,3}(?:\.\d{1,3}){3})(?![\d.])")


@dataclass(frozen=True)
class _Profile:
    """What the layout decides about a certificate; compared with what a file holds."""

    common_name: str
    organization: str | None
    is_ca: bool
    dns_names: frozenset[str]
    ip_addresses: frozenset[str]
    key_usage: frozenset[str]
    extended: frozenset[str]


@dataclass
class IssueReport:
    created: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    reissued: list[tuple[str, str]] = field(default_factory=list)  # (name, why)
    files_written: int = 0

    def line(self) -> str:
        parts = [f"{len(self.reused)} reused", f"{len(self.created)} created"]
        if self.reissued:
            parts.append(f"{len(self.reissued)} reissued ({'; '.join(f'{n}: {w}' for n, w in self.reissued[:3])})")
        return ", ".join(parts)


class LocalPki:
    """Where the issued layout lives under `root` (the rehearsal's state directory)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pki = root / "pki"

    def cert(self, name: str, kind: str) -> Path:
        return self.pki / ("ca" if kind == "authority" else "certs") / f"{name}.crt"

    def key(self, name: str, kind: str) -> Path:
        sub = {"authority": "ca", "leaf": "certs", "key": "keys"}[kind]
        return self.pki / sub / f"{name}.key"

    def public_key(self, name: str) -> Path:
        return self.pki / "keys" / f"{name}.pub"

    def host_dir(self, host: str) -> Path:
        return self.root / "hosts" / host

    def host_file(self, host: str, path: str) -> Path:
        """Where host `host`'s file `path` (a wellknown absolute path) is written."""
        return self.host_dir(host) / path.lstrip("/")

    def host_files(self, host: str, layout: pki.PkiLayout) -> dict[str, Path]:
        files = layout.node_files if host == "node" else layout.hosts[host]
        return {f.path: self.host_file(host, f.path) for f in files}

    @property
    def token_file(self) -> Path:
        return self.pki / "bootstrap-token"

    def kubeconfig(self, name: str) -> Path:
        return self.pki / f"{name}.kubeconfig"


def local_ips(values: tuple[str, ...], addresses: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(addresses.get(ip, ip) for ip in values)


def local_url(url: str, addresses: Mapping[str, str]) -> str:
    return _IP.sub(lambda m: addresses.get(m.group(1), m.group(1)), url)


def issue_plan(plan: ClusterPlan, root: Path) -> tuple[pki.PkiLayout, IssueReport]:
    """The plan's trust layout (the one kilonode.azure.tls creates), issued under `root`."""
    layout = pki.pki_layout(plan)
    return layout, issue(layout, root, address_map(plan))


def issue(layout: pki.PkiLayout, root: Path, addresses: Mapping[str, str],
          now: datetime.datetime | None = None) -> IssueReport:
    """Materialise `layout` under `root` (see the module's docstring); `addresses` maps each
    host's Azure address to its loopback address."""
    now = now or datetime.datetime.now(datetime.UTC)
    where = LocalPki(root)
    report = IssueReport()
    for directory in (where.pki, where.pki / "ca", where.pki / "certs", where.pki / "keys", root / "hosts"):
        _mkdir(directory)
    keys: dict[str, ec.EllipticCurvePrivateKey] = {}
    certs: dict[str, x509.Certificate] = {}

    for authority in layout.authorities:
        profile = _Profile(authority.common_name, authority.organization, True, frozenset(), frozenset(),
                           *_uses(authority.uses))
        key_path, cert_path = where.key(authority.name, "authority"), where.cert(authority.name, "authority")
        # a CA is kept until it expires: reissuing it reissues everything it signed
        why = _reusable(cert_path, key_path, profile, None, now, renew_hours=0)
        if why is None:
            keys[authority.name], certs[authority.name] = _load(key_path), _load_cert(cert_path)
            report.reused.append(authority.name)
            continue
        key = _new_key()
        cert = _build(profile, key.public_key(), key, None, now, pki.CA_HOURS)
        _store(key_path, cert_path, key, cert)
        keys[authority.name], certs[authority.name] = key, cert
        _account(report, authority.name, why)

    for leaf in layout.leaves:
        profile = _Profile(leaf.common_name, leaf.organization, False, frozenset(leaf.dns_names),
                           frozenset(local_ips(leaf.ip_addresses, addresses)), *_uses(leaf.uses))
        key_path, cert_path = where.key(leaf.name, "leaf"), where.cert(leaf.name, "leaf")
        issuer = certs[leaf.ca]
        why = _reusable(cert_path, key_path, profile, issuer, now, renew_hours=pki.early_renewal_hours(leaf))
        if why is None:
            keys[leaf.name], certs[leaf.name] = _load(key_path), _load_cert(cert_path)
            report.reused.append(leaf.name)
            continue
        key = _load(key_path) if why == _ABSENT_CERT else _new_key()
        cert = _build(profile, key.public_key(), keys[leaf.ca], issuer, now, pki.validity_hours(leaf))
        _store(key_path, cert_path, key, cert)
        keys[leaf.name], certs[leaf.name] = key, cert
        _account(report, leaf.name, why)

    for bare in layout.keys:
        key_path = where.key(bare.name, "key")
        try:
            keys[bare.name] = _load(key_path)
            report.reused.append(bare.name)
        except (OSError, ValueError, TypeError):
            keys[bare.name] = _new_key()
            report.files_written += _write(key_path, _key_pem(keys[bare.name]), pki.KEY_MODE)
            report.created.append(bare.name)
        report.files_written += _write(where.public_key(bare.name), _public_pem(keys[bare.name]), pki.CERT_MODE)

    token = _token(where.token_file)
    report.files_written += _write(where.token_file, token.encode(), pki.KEY_MODE)

    def content(item: pki.Content) -> str:
        match item:
            case pki.Cert(of=name):
                return _cert_pem(certs[name]).decode()
            case pki.PrivateKey(of=name):
                return _key_pem(keys[name]).decode()
            case pki.PublicKey(of=name):
                return _public_pem(keys[name]).decode()
            case pki.Bundle(cas=cas):
                return pki.bundle_text([_cert_pem(certs[ca]).decode() for ca in cas])
            case pki.Kubeconfig(server=server, user=user, ca=ca, client=client, ca_file=ca_file):
                ca_pem = _cert_pem(certs[ca]).decode()
                if client is None:
                    return pki.kubeconfig_text(local_url(server, addresses), ca_pem, user, token=token)
                return pki.kubeconfig_text(local_url(server, addresses), ca_pem, user,
                                           cert_pem=_cert_pem(certs[client]).decode(),
                                           key_pem=_key_pem(keys[client]).decode(), ca_file=ca_file)
        raise TypeError(f"unknown PKI file content {item!r}")

    for host, files in (*layout.hosts.items(), ("node", layout.node_files)):
        for file in files:
            report.files_written += _write(where.host_file(host, file.path), content(file.content).encode(), file.mode)
    for name, spec in (("admin", layout.admin_kubeconfig), ("super-admin", layout.super_admin_kubeconfig)):
        report.files_written += _write(where.kubeconfig(name), content(spec).encode(), pki.KEY_MODE)
    return report


def renew_host(layout: pki.PkiLayout, root: Path, addresses: Mapping[str, str], host: str) -> IssueReport:
    """Issue `host`'s leaves again with new keys (the same CAs, new serials), as a new
    generation of that host does in Azure, and rewrite its files; every other host's files are
    rewritten unchanged. The report's `created` names the renewed leaves."""
    leaves = pki.host_leaves(layout, host)
    if not leaves:
        raise ValueError(f"{host} holds no certificate of its own in this layout (hosts: "
                         f"{', '.join(h for h in layout.hosts)})")
    where = LocalPki(root)
    for leaf in leaves:
        # absent key and certificate: `issue` makes a new key and has the CA sign it
        where.key(leaf.name, "leaf").unlink(missing_ok=True)
        where.cert(leaf.name, "leaf").unlink(missing_ok=True)
    return issue(layout, root, addresses)


_ABSENT_CERT = "no certificate for its key"


def _account(report: IssueReport, name: str, why: str) -> None:
    if why in ("absent", _ABSENT_CERT):
        report.created.append(name)
    else:
        report.reissued.append((name, why))


def _uses(uses: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str]]:
    unknown = set(uses) - set(_KEY_USAGE_FIELDS) - set(_EXTENDED)
    if unknown:
        raise ValueError(f"no local mapping for allowed_uses {sorted(unknown)}")
    return frozenset(u for u in uses if u in _KEY_USAGE_FIELDS), frozenset(u for u in uses if u in _EXTENDED)


def _new_key() -> ec.EllipticCurvePrivateKey:
    assert pki.KEY_ALGORITHM == "ECDSA" and pki.KEY_CURVE == "P256", "update the local issuer with the layout"
    return ec.generate_private_key(ec.SECP256R1())


def _build(profile: _Profile, public: ec.EllipticCurvePublicKey, signer: ec.EllipticCurvePrivateKey,
           issuer: x509.Certificate | None, now: datetime.datetime, hours: int) -> x509.Certificate:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, profile.common_name)]
    if profile.organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, profile.organization))
    subject = x509.Name(attributes)
    usage = {field: name in profile.key_usage for name, field in _KEY_USAGE_FIELDS.items()}
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.subject if issuer else subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(hours=hours))
        # Go's x509 writes basic constraints and key usage as critical extensions
        .add_extension(x509.BasicConstraints(ca=profile.is_ca, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            content_commitment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False, **usage,
        ), critical=True)
    )
    if profile.extended:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([_EXTENDED[u] for u in sorted(profile.extended)]), critical=False
        )
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in sorted(profile.dns_names)]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in sorted(profile.ip_addresses)]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    if profile.is_ca:
        builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
    if issuer is not None:
        # Go copies the parent's subject key identifier into the child (crypto/x509 CreateCertificate)
        ski = issuer.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
    return builder.sign(signer, hashes.SHA256())


def profile_of(cert: x509.Certificate) -> _Profile:
    """The layout-relevant facts a certificate carries (what the tests compare too)."""

    def extension(kind: type[x509.ExtensionType]) -> x509.ExtensionType | None:
        try:
            return cert.extensions.get_extension_for_class(kind).value
        except x509.ExtensionNotFound:
            return None

    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    org = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    basic = extension(x509.BasicConstraints)
    san = extension(x509.SubjectAlternativeName)
    usage = extension(x509.KeyUsage)
    extended = extension(x509.ExtendedKeyUsage)
    key_usage: set[str] = set()
    if isinstance(usage, x509.KeyUsage):
        key_usage = {name for name, attr in _KEY_USAGE_FIELDS.items() if getattr(usage, attr)}
    by_oid = {oid: name for name, oid in _EXTENDED.items()}
    return _Profile(
        common_name=str(cn[0].value) if cn else "",
        organization=str(org[0].value) if org else None,
        is_ca=bool(isinstance(basic, x509.BasicConstraints) and basic.ca),
        dns_names=frozenset(san.get_values_for_type(x509.DNSName)) if isinstance(san, x509.SubjectAlternativeName)
        else frozenset(),
        ip_addresses=frozenset(str(ip) for ip in san.get_values_for_type(x509.IPAddress))
        if isinstance(san, x509.SubjectAlternativeName) else frozenset(),
        key_usage=frozenset(key_usage),
        extended=frozenset(by_oid.get(oid, oid.dotted_string) for oid in extended)
        if isinstance(extended, x509.ExtendedKeyUsage) else frozenset(),
    )


def _reusable(cert_path: Path, key_path: Path, profile: _Profile, issuer: x509.Certificate | None,
              now: datetime.datetime, *, renew_hours: int) -> str | None:
    """None when the pair on disk can stay; else why it must be (re)issued."""
    if not key_path.exists():
        return "absent"
    try:
        key = _load(key_path)
    except (ValueError, TypeError):
        return "its key does not parse"
    if not cert_path.exists():
        return _ABSENT_CERT
    try:
        cert = _load_cert(cert_path)
    except ValueError:
        return "its certificate does not parse"
    if cert.public_key() != key.public_key():
        return "its certificate is not for its key"
    try:
        cert.verify_directly_issued_by(issuer or cert)
    except (ValueError, TypeError, InvalidSignature):
        return "its CA did not sign it (the CA was reissued)"
    if cert.not_valid_after_utc - datetime.timedelta(hours=renew_hours) <= now:
        return f"it expires {cert.not_valid_after_utc:%Y-%m-%d}, inside its renewal window"
    found = profile_of(cert)
    if found != profile:
        changed = [f for f in profile.__dataclass_fields__ if getattr(found, f) != getattr(profile, f)]
        return f"the layout changed its {', '.join(changed)}"
    return None


def _load(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{path} is not an ECDSA key")
    return key


def _load_cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    # SEC1 ("EC PRIVATE KEY"), the form pulumi-tls's private_key_pem has for ECDSA keys
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def _public_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _store(key_path: Path, cert_path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
    _write(key_path, _key_pem(key), pki.KEY_MODE)
    _write(cert_path, _cert_pem(cert), pki.CERT_MODE)


def _token(path: Path) -> str:
    """The bootstrap token `<id>.<secret>`, kept across runs (the format kubeadm's and the
    apiserver's bootstrap authenticator accept, as kilonode.azure.tls makes it)."""
    if path.exists() and _TOKEN.fullmatch(text := path.read_text().strip()):
        return text
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(6)) + "." + "".join(
        secrets.choice(alphabet) for _ in range(16))


def _mkdir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)


def _write(path: Path, data: bytes, mode: int) -> int:
    """Write `data` atomically with `mode` unless the file already holds it; 1 if written."""
    try:
        if path.read_bytes() == data and (path.stat().st_mode & 0o777) == mode:
            return 0
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    # created with its final mode: a key is never readable by others, not even for a moment
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    return 1
