#!/usr/bin/python3
"""The notAfter of every certificate a control-plane host serves and uses, as Prometheus metrics.

Neither etcd 3.5 nor kube-apiserver exports its own certificates' expiry (kube-apiserver's
apiserver_client_certificate_expiration_seconds is a histogram of the certificates clients
present to it; etcd has no such metric, etcd-io/etcd#21622), so this program reads the files.
It runs once per scrape under systemd socket activation (kilonode-cert-metrics.socket,
Accept=yes): the HTTP request on stdin, the response on stdout, the files read at that moment.
With --print it writes the metrics alone to stdout (by hand, or for node_exporter's textfile
collector). Standard library only: the notAfter is read from the certificate's DER
(RFC 5280 4.1: Certificate -> tbsCertificate -> validity -> notAfter).

Its config (/etc/kilonode/certificates.json, rendered from the PKI layout) lists the files:
{"host": "etcd-main-0", "files": ["/etc/etcd/pki/ca.crt", ...]}: PEM files (and kubeconfigs, whose
client-certificate-data and certificate-authority-data hold base64 PEM, are read too). Each
certificate of each file (a bundle holds several) is one series; a file that cannot be read or
parsed is one kilonode_certificate_unreadable series, never silence.

The answer runs as a dynamic user that can read no key file, and the co-located components'
kubeconfigs embed their keys (0600, root's): so where the config names "copies" (a directory),
each listed kubeconfig is read from its copy there, <name>.crt for <name>.kubeconfig (the series
keep the kubeconfig's path), and --extract-client-certs (the unit's ExecStartPre=+, as root,
reading no byte of the connection) makes those copies: each kubeconfig's client certificate, and
nothing else, in a 0644 PEM file.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import re
import sys
from typing import BinaryIO

CONFIG = "/etc/kilonode/certificates.json"
PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n(.+?)-----END CERTIFICATE-----", re.S)
# A kubeconfig's embedded certificates (the components' client certificates and the CA they
# trust): base64 of PEM, as kilonode.plan.pki.kubeconfig_text writes them.
EMBEDDED = re.compile(rb"^\s*(?:client-certificate|certificate-authority)-data:\s*([A-Za-z0-9+/=]+)\s*$", re.M)
MAX_REQUEST = 8192  # a scrape's request line and headers; anything longer is not Prometheus
HELP = (
    "# HELP kilonode_certificate_not_after_seconds The certificate's notAfter, in seconds since the epoch.\n"
    "# TYPE kilonode_certificate_not_after_seconds gauge\n"
    "# HELP kilonode_certificate_unreadable A certificate file that could not be read or parsed (1).\n"
    "# TYPE kilonode_certificate_unreadable gauge\n"
)


def _tlv(data: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of content, end of content) of the DER element at `at`."""
    tag, length = data[at], data[at + 1]
    at += 2
    if length & 0x80:
        count = length & 0x7F
        if not 1 <= count <= 4:
            raise ValueError("unsupported DER length")
        length = int.from_bytes(data[at:at + count], "big")
        at += count
    if at + length > len(data):
        raise ValueError("truncated DER")
    return tag, at, at + length


def _time(tag: int, text: bytes) -> datetime.datetime:
    # UTCTime YYMMDDHHMMSSZ (years 1950-2049) or GeneralizedTime YYYYMMDDHHMMSSZ (RFC 5280 4.1.2.5)
    value = text.decode("ascii")
    if tag == 0x17:
        year = int(value[:2])
        value = f"{1900 + year if year >= 50 else 2000 + year}{value[2:]}"
    elif tag != 0x18:
        raise ValueError(f"not a time (tag {tag:#x})")
    return datetime.datetime.strptime(value, "%Y%m%d%H%M%SZ").replace(tzinfo=datetime.UTC)


def not_after(der: bytes) -> datetime.datetime:
    """A DER certificate's notAfter."""
    _, start, _ = _tlv(der, 0)  # Certificate
    _, at, _ = _tlv(der, start)  # tbsCertificate
    if der[at] == 0xA0:  # [0] version, present from v2 on
        at = _tlv(der, at)[2]
    for _field in ("serialNumber", "signature", "issuer"):
        at = _tlv(der, at)[2]
    _, at, _ = _tlv(der, at)  # validity
    at = _tlv(der, at)[2]  # notBefore
    tag, start, end = _tlv(der, at)
    return _time(tag, der[start:end])


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics(config: dict[str, object]) -> str:
    host = _label(str(config["host"]))
    lines = []
    for path in config["files"]:  # type: ignore[attr-defined]
        where = f'host="{host}",path="{_label(str(path))}"'
        try:
            with open(copy_of(config, str(path)) or path, "rb") as handle:
                text = handle.read()
            blocks = PEM.findall(text) + [block for data in EMBEDDED.findall(text)
                                          for block in PEM.findall(base64.b64decode(data))]
            if not blocks:
                raise ValueError("no certificate")
            found = [not_after(base64.b64decode(block)) for block in blocks]
        except (OSError, ValueError, IndexError) as error:
            lines.append(f'kilonode_certificate_unreadable{{{where},error="{_label(type(error).__name__)}"}} 1')
            continue
        # a bundle holds several certificates: one series each, told apart by their place in the file
        lines += [f'kilonode_certificate_not_after_seconds{{{where},index="{i}"}} {int(when.timestamp())}'
                  for i, when in enumerate(found)]
    return HELP + "\n".join(lines) + "\n"


def serve(stdin: BinaryIO, stdout: BinaryIO, config: dict[str, object]) -> None:
    """Answer one HTTP request (socket activation: the connection is stdin and stdout)."""
    request = stdin.readline(MAX_REQUEST)
    method = request.split(b" ", 1)[0]
    for _header in range(100):  # the headers, bounded: nothing in them changes the answer
        if stdin.readline(MAX_REQUEST) in (b"", b"\r\n", b"\n"):
            break
    if method not in (b"GET", b"HEAD"):
        stdout.write(b"HTTP/1.0 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
        return
    body = metrics(config).encode()
    stdout.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + (body if method == b"GET" else b""))
    stdout.flush()


def copy_of(config: dict[str, object], path: str) -> str | None:
    """Where a kubeconfig's client certificate is copied ("copies"), or None (read it as it is)."""
    copies = config.get("copies")
    if not copies or not path.endswith(".kubeconfig"):
        return None
    return os.path.join(str(copies), os.path.basename(path).removesuffix(".kubeconfig") + ".crt")


def extract_client_certs(config: dict[str, object]) -> None:
    """Each listed kubeconfig's client certificate (the PEM in client-certificate-data) written to
    its copy (copy_of), 0644, replaced whole (a reader never sees half a file). A kubeconfig that
    cannot be read leaves no copy: the answer then reports it unreadable."""
    for source in config["files"]:  # type: ignore[attr-defined]
        target = copy_of(config, str(source))
        if target is None:
            continue
        try:
            with open(source, "rb") as handle:
                text = handle.read()
            data = re.search(rb"^\s*client-certificate-data:\s*([A-Za-z0-9+/=]+)\s*$", text, re.M)
            blocks = PEM.findall(base64.b64decode(data.group(1))) if data else []
        except (OSError, ValueError):
            blocks = []
        if not blocks:
            if os.path.exists(target):
                os.remove(target)
            continue
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        partial = f"{target}.{os.getpid()}.partial"  # answers may run side by side (the socket's Accept=yes)
        with open(partial, "wb") as out:
            out.write(b"".join(b"-----BEGIN CERTIFICATE-----\n" + b + b"-----END CERTIFICATE-----\n" for b in blocks))
        os.chmod(partial, 0o644)
        os.replace(partial, target)


def main(argv: list[str]) -> int:
    path = argv[argv.index("--config") + 1] if "--config" in argv else CONFIG
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    if "--extract-client-certs" in argv:
        extract_client_certs(config)
        return 0
    if "--print" in argv:
        sys.stdout.write(metrics(config))
        return 0
    serve(sys.stdin.buffer, sys.stdout.buffer, config)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
