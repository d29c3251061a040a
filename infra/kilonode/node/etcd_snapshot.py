#!/usr/bin/python3
"""Snapshot this member's etcd cluster when this member leads it; keep the newest snapshots
on the local disk; upload the new one to Azure Blob Storage when an Azure config is present.

Delivered by kilonode.render.etcd_snapshot to every etcd member (both clusters) and run by
kilonode-etcd-snapshot.service, as the etcd user, from a timer that fires on every member at
the same wall-clock minutes: only the member that is the cluster's leader at that moment takes
the snapshot, so a cluster gets one per interval, not one per member. It runs on the image's
python3 (which cloud-init needs anyway).

Config (--config, JSON, rendered): endpoint (the local member, https://127.0.0.1:2379),
caFile/certFile/keyFile (the member's own server certificate, which carries clientAuth),
etcdctl/etcdutl (binaries; etcdutl is used for `snapshot status` where it exists, 3.5+),
directory (local snapshots), keep (how many stay there), saveTimeoutSeconds, blockBytes,
requestTimeoutSeconds, and azureConfig: the path of a second JSON file that the Pulumi program
delivers in Azure with blobEndpoint, container (this etcd cluster's own, etcd-snapshots-<role>),
clientId (this cluster's user-assigned identity's) and ageRecipient. No such file: no upload.
`age` is the path of age (Debian's package, in the etcd image: node-image/packages/control.txt).

Each run, in order: ask the local member for its status; not the leader -> exit 0, nothing
done. Else `etcdctl snapshot save` into a hidden partial file in the directory, read its
revision (`snapshot status`), rename it into place (atomic: a reader never sees half a
snapshot), delete the oldest beyond `keep`, then encrypt it with `age` to the Azure config's
recipient into a hidden file beside it and upload only that (`<name>.db.age`): an IMDS token
for Azure Storage, one Put Blob when the file fits in one block, else Put Block per block and
Put Block List, each creating a blob only where none is (`If-None-Match: *`; the container's
retention policy refuses an overwrite anyway); then its manifest (`<name>.db.age.manifest`,
manifest()): the SHA-256 of the snapshot and of the ciphertext, signed with this member's etcd
server key, its certificate appended. The encrypted copy is deleted afterwards. An Azure config
without a recipient uploads nothing: a plaintext snapshot never leaves the member.

Why a signed manifest: age gives confidentiality only, since anyone holding the public recipient
can encrypt a snapshot of their choosing, and a digest written by the same identity as the
snapshot proves it was not corrupted, not who wrote it. A signature by a key only this cluster's
members hold, under a certificate of this cluster's own etcd CA, is what a member of another
cluster (another CA), an apiserver (a client certificate only) or anyone who can merely write to
the container cannot produce; the restore (docs/runbooks/etcd-restore-from-snapshot.md) checks
it with openssl before it decrypts anything. It cannot tell one member of the cluster from
another: a member that is compromised already holds the cluster's data and keys.

Why age and not AES-GCM written here: age is a reviewed format (C2SP age.md) that streams in
64 KiB chunks, each with its own nonce (an 8 GiB snapshot never sits in memory, and no nonce
bookkeeping is ours to get wrong), and it encrypts to a public X25519 key, so the members
never hold what decrypts the snapshots (the stack output etcdSnapshotIdentity does).
Any failure exits 1 with the reason (the unit fails, visibly); a snapshot that was saved stays
on the local disk even when its upload fails. Standard library only, but for the signature:
python3-cryptography (in the etcd image, node-image/packages/control.txt), imported only when
there is something to upload, so a local run needs nothing more.
"""

from __future__ import annotations

import argparse
import base64
import email.utils
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

# Azure Instance Metadata Service, managed identity token (learn.microsoft.com, "How to use
# managed identities for Azure resources on an Azure VM to acquire an access token": GET with
# `Metadata: true`, api-version 2018-02-01, resource, and client_id to pick a user-assigned
# identity when a VM may carry several). Link-local, never through a proxy.
IMDS_TOKEN_URL = "http://169.254.169.254/metadata/identity/oauth2/token"
IMDS_API_VERSION = "2018-02-01"
STORAGE_RESOURCE = "https://storage.azure.com/"
# Blob service REST version: 2019-12-12 or later for 4,000 MiB blocks (Put Block, Content-Length)
# and Microsoft Entra (OAuth) tokens need 2017-11-09 or later; 2021-12-02 is a stable version
# of the Blob REST spec (Azure/azure-rest-api-specs specification/storage/data-plane/
# Microsoft.BlobStorage/stable/2021-12-02).
BLOB_API_VERSION = "2021-12-02"
# Put Block: at most 50,000 blocks per blob, each at most 4,000 MiB (version 2019-12-12+);
# block IDs are Base64 of at most 64 bytes, all of one length within a blob, URL-encoded in
# the query (learn.microsoft.com rest/api/storageservices/put-block). One Put Blob takes a whole
# blob only up to a version-dependent limit (256 MiB from 2016-05-31, the Put Blob page's
# remarks; larger in later versions, never near the 8 GiB of a DB at etcd's quota ceiling):
# Put Blob is used only for a file that fits in one block (blockBytes, 64 MiB), far below it.
MAX_BLOCKS = 50_000
MAX_BLOCK_BYTES = 4000 * 1024 * 1024
# Statuses worth another try: the service's throttling and server errors (Azure Storage asks
# clients to retry 500 and 503 with exponential back-off: "Scalability and performance targets
# for Blob storage"); IMDS answers 429 while throttling and 5xx while it starts.
RETRY_STATUSES = {408, 429, 500, 502, 503, 504}
ATTEMPTS = 3

# Put Blob and Put Block List create the blob only where none exists: "If-None-Match: *" makes
# the write conditional on the blob's absence (learn.microsoft.com rest/api/storageservices
# "Specifying conditional headers for Blob service operations"; Put Blob and Put Block List take
# them), so a job never replaces a snapshot, even one its own earlier run left.
CREATE_ONLY = {"If-None-Match": "*"}
# The manifest uploaded beside each snapshot (manifest()): what the restore authenticates.
MANIFEST_HEADER = "kilonode etcd snapshot manifest v1"
MANIFEST_SUFFIX = ".manifest"
# A manifest value: printable ASCII, no space (one line, no field can add another).
MANIFEST_VALUE = re.compile(r"[!-~]+")

SNAPSHOT_NAME = re.compile(r"^\d{8}T\d{6}Z-rev\d+-[A-Za-z0-9._-]+\.db$")
PARTIAL_PREFIX = ".partial-"


def log(message: str) -> None:
    print(message, flush=True)


@dataclass(frozen=True)
class HttpRequest:
    """One HTTP request, built before it is sent, so the sequence can be read back in tests."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes = b""
    expect: int = 201  # the status that means success


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


Send = Callable[[HttpRequest], HttpResponse]
Run = Callable[[list[str], int], subprocess.CompletedProcess[str]]


# --- etcd ----------------------------------------------------------------------------------


def run_command(argv: list[str], timeout: int) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "ETCDCTL_API": "3"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=env)


def etcdctl(config: dict[str, Any], *args: str) -> list[str]:
    return [
        config["etcdctl"], f"--endpoints={config['endpoint']}", f"--cacert={config['caFile']}",
        f"--cert={config['certFile']}", f"--key={config['keyFile']}", *args,
    ]


def checked(result: subprocess.CompletedProcess[str], what: str) -> str:
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {result.returncode}): {(result.stderr or result.stdout).strip()}")
    return result.stdout


def is_leader(config: dict[str, Any], run: Run = run_command) -> tuple[bool, dict[str, Any]]:
    """(whether the local member leads its cluster, its status) from `endpoint status`."""
    out = checked(run(etcdctl(config, "--command-timeout=5s", "endpoint", "status", "-w", "json"), 30),
                  "etcdctl endpoint status")
    [entry] = json.loads(out)
    status = entry["Status"]
    return status["leader"] == status["header"]["member_id"], status


def snapshot_status(config: dict[str, Any], path: Path, run: Run = run_command) -> dict[str, Any]:
    """hash, revision, totalKey, totalSize of a snapshot file; also checks it reads back.

    etcdutl from 3.5 (etcdctl's `snapshot status` is deprecated there in its favour);
    etcdctl where there is no etcdutl (3.4)."""
    tool = config.get("etcdutl")
    argv = [tool] if tool and Path(tool).exists() else [config["etcdctl"]]
    out = checked(run([*argv, "snapshot", "status", str(path), "-w", "json"], 300), "snapshot status")
    return dict(json.loads(out))


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_snapshot(
    config: dict[str, Any], member: str, now: float, run: Run = run_command
) -> tuple[Path, dict[str, Any]]:
    """Save into a hidden partial file, read its revision, rename it into place: the final
    name only ever holds a whole snapshot that reads back."""
    directory = Path(config["directory"])
    directory.mkdir(parents=True, exist_ok=True)
    # a run killed earlier (timeout, reboot) leaves its partial file; this unit never runs twice at once
    for stale in directory.glob(f"{PARTIAL_PREFIX}*"):
        stale.unlink()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    partial = directory / f"{PARTIAL_PREFIX}{stamp}.db"
    checked(run(etcdctl(config, "snapshot", "save", str(partial)), int(config["saveTimeoutSeconds"])),
            "etcdctl snapshot save")
    status = snapshot_status(config, partial, run)
    final = directory / f"{stamp}-rev{status['revision']}-{member}.db"
    with partial.open("rb") as f:
        os.fsync(f.fileno())
    partial.rename(final)
    fsync_directory(directory)
    return final, status


def prune(directory: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` snapshots (names sort by time); other files stay."""
    snapshots = sorted(p for p in directory.iterdir() if SNAPSHOT_NAME.match(p.name))
    doomed = snapshots[:-keep] if keep > 0 else snapshots
    for path in doomed:
        path.unlink()
    return doomed


# --- Azure ---------------------------------------------------------------------------------


def imds_token_request(client_id: str) -> HttpRequest:
    query = urllib.parse.urlencode(
        {"api-version": IMDS_API_VERSION, "resource": STORAGE_RESOURCE, "client_id": client_id}
    )
    return HttpRequest("GET", f"{IMDS_TOKEN_URL}?{query}", {"Metadata": "true"}, expect=200)


def block_id(index: int) -> str:
    """Base64 of a fixed-length string: every ID of a blob has the same length (Put Block)."""
    return base64.b64encode(f"kilonode-{index:06d}".encode()).decode()


def _headers(token: str, date: str, body: bytes) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "x-ms-version": BLOB_API_VERSION,
        "x-ms-date": date,
        "Content-Length": str(len(body)),
    }


def _md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


def block_list_body(ids: list[str]) -> bytes:
    """Put Block List's body: every block as <Latest> (the most recent upload of that ID)."""
    items = "".join(f"<Latest>{escape(i)}</Latest>" for i in ids)
    return f'<?xml version="1.0" encoding="utf-8"?><BlockList>{items}</BlockList>'.encode()


def upload_requests(
    path: Path, blob_url: str, token: str, block_bytes: int, metadata: dict[str, str], date: Callable[[], str]
) -> Iterator[HttpRequest]:
    """The requests that upload `path` to `blob_url`, one block read at a time: one Put Blob
    when the file fits in one block, else a Put Block per block, then Put Block List."""
    if not 0 < block_bytes <= MAX_BLOCK_BYTES:
        raise ValueError(f"block size {block_bytes} is outside 1..{MAX_BLOCK_BYTES} bytes")
    size = path.stat().st_size
    blocks = max(1, -(-size // block_bytes))
    if blocks > MAX_BLOCKS:
        raise ValueError(f"{path} needs {blocks} blocks of {block_bytes} bytes; a blob holds at most {MAX_BLOCKS}")
    meta = {f"x-ms-meta-{k}": v for k, v in sorted(metadata.items())}
    with path.open("rb") as f:
        if blocks == 1:
            body = f.read()
            yield HttpRequest("PUT", blob_url, _headers(token, date(), body) | meta | CREATE_ONLY | {
                "x-ms-blob-type": "BlockBlob",
                "Content-Type": "application/octet-stream",
                "Content-MD5": _md5(body),
            }, body)
            return
        whole = hashlib.md5(usedforsecurity=False)
        ids = []
        for index in range(blocks):
            body = f.read(block_bytes)
            whole.update(body)
            ids.append(block_id(index))
            url = f"{blob_url}?comp=block&blockid={urllib.parse.quote(ids[-1], safe='')}"
            yield HttpRequest("PUT", url, _headers(token, date(), body) | {
                "Content-Type": "application/octet-stream",
                "Content-MD5": _md5(body),
            }, body)
    body = block_list_body(ids)
    yield HttpRequest("PUT", f"{blob_url}?comp=blocklist", _headers(token, date(), body) | meta | CREATE_ONLY | {
        "Content-Type": "application/xml",
        "x-ms-blob-content-type": "application/octet-stream",
        # stored as the blob's Content-MD5: a download can be checked against it
        "x-ms-blob-content-md5": base64.b64encode(whole.digest()).decode(),
    }, body)


def http_send(timeout: float, sleep: Callable[[float], None] = time.sleep) -> Send:
    """A sender over urllib, bounded retries on throttling, server errors and broken connections;
    never through a proxy (IMDS must not be, and the blob endpoint needs none)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def send(request: HttpRequest) -> HttpResponse:
        for attempt in range(1, ATTEMPTS + 1):
            req = urllib.request.Request(request.url, data=request.body if request.method != "GET" else None,
                                         headers=request.headers, method=request.method)
            try:
                with opener.open(req, timeout=timeout) as response:
                    return HttpResponse(response.status, response.read(), dict(response.headers))
            except urllib.error.HTTPError as error:
                answer = HttpResponse(error.code, error.read(), dict(error.headers))
                if error.code not in RETRY_STATUSES or attempt == ATTEMPTS:
                    return answer
            except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
                if attempt == ATTEMPTS:
                    raise RuntimeError(f"{request.method} {redact(request.url)}: {error}") from error
            sleep(2.0 ** attempt)
        raise AssertionError("unreachable")

    return send


def redact(url: str) -> str:
    return url.split("?", 1)[0]


def expect(response: HttpResponse, request: HttpRequest) -> HttpResponse:
    if response.status != request.expect:
        detail = response.body.decode(errors="replace")[:500]
        raise RuntimeError(f"{request.method} {redact(request.url)} answered {response.status}: {detail}")
    return response


def storage_token(client_id: str, send: Send) -> str:
    request = imds_token_request(client_id)
    return str(json.loads(expect(send(request), request).body)["access_token"])


def blob_url(azure: dict[str, Any], name: str) -> str:
    endpoint = azure["blobEndpoint"].rstrip("/")
    return f"{endpoint}/{azure['container']}/{urllib.parse.quote(name)}"


def upload(config: dict[str, Any], azure: dict[str, Any], snapshot: Path, metadata: dict[str, str],
           send: Send, date: Callable[[], str] = lambda: email.utils.formatdate(usegmt=True),
           name: str | None = None, token: str | None = None) -> str:
    """Upload the file as it is to the container's blob <name> (its own name by default), with
    a token of the Azure config's identity (asked for when not given)."""
    token = token or storage_token(azure["clientId"], send)
    url = blob_url(azure, name or snapshot.name)
    for request in upload_requests(snapshot, url, token, int(config["blockBytes"]), metadata, date):
        expect(send(request), request)
    return url


def sha256_file(path: Path) -> tuple[str, int]:
    """(hex SHA-256, size in bytes) of a file, read 1 MiB at a time (a snapshot can be 8 GiB)."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def manifest_body(fields: dict[str, str]) -> bytes:
    """The signed part of a manifest: MANIFEST_HEADER, then one `key=value` line per field."""
    lines = [MANIFEST_HEADER]
    for key, value in fields.items():
        if not re.fullmatch(r"[a-z0-9-]+", key) or not MANIFEST_VALUE.fullmatch(value):
            raise ValueError(f"manifest field {key}={value!r}: not one line of printable ASCII without spaces")
        lines.append(f"{key}={value}")
    return ("\n".join(lines) + "\n").encode()


def sign(key_file: str, body: bytes) -> bytes:
    """An ECDSA-SHA256 signature (DER, what `openssl dgst -sha256 -verify` reads) of `body` with
    the member's etcd server key (ECDSA P-256: kilonode.plan.pki). python3-cryptography is
    imported here, not at the top: only an upload needs it."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = serialization.load_pem_private_key(Path(key_file).read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_file} is not an ECDSA key: the manifest is signed with ECDSA-SHA256")
    return key.sign(body, ec.ECDSA(hashes.SHA256()))


def manifest(config: dict[str, Any], snapshot: Path, encrypted: Path, revision: str, object_name: str) -> bytes:
    """What the restore authenticates a snapshot by: which cluster, member and revision, the
    SHA-256 of the snapshot and of the uploaded ciphertext, signed with this member's server key
    (`signature=`, base64), then the member's certificate, which the restore checks against the
    cluster's etcd CA."""
    plain_sha, plain_bytes = sha256_file(snapshot)
    cipher_sha, cipher_bytes = sha256_file(encrypted)
    body = manifest_body({
        "cluster": str(config["cluster"]), "role": str(config["role"]), "member": str(config["member"]),
        "revision": revision, "snapshot": snapshot.name, "object": object_name,
        "plaintext-sha256": plain_sha, "plaintext-bytes": str(plain_bytes),
        "ciphertext-sha256": cipher_sha, "ciphertext-bytes": str(cipher_bytes),
    })
    signature = base64.b64encode(sign(config["keyFile"], body)).decode()
    certificate = Path(config["certFile"]).read_text()
    if "-----BEGIN CERTIFICATE-----" not in certificate:
        raise ValueError(f"{config['certFile']} holds no PEM certificate")
    return body + f"signature={signature}\n{certificate.rstrip()}\n".encode()


def encrypt(config: dict[str, Any], recipient: str, snapshot: Path, run: Run = run_command) -> Path:
    """`age` encrypts the snapshot to the recipient into a hidden file beside it (0600: age
    creates it with the umask; the directory is the etcd user's own)."""
    if not recipient.startswith("age1"):
        raise ValueError(f"ageRecipient {recipient[:20]!r} is not an age X25519 recipient (age1...)")
    encrypted = snapshot.parent / f"{PARTIAL_PREFIX}{snapshot.name}.age"
    checked(run([config["age"], "--encrypt", "--recipient", recipient, "--output", str(encrypted), str(snapshot)],
                int(config["saveTimeoutSeconds"])), "age --encrypt")
    return encrypted


def upload_encrypted(config: dict[str, Any], azure: dict[str, Any], snapshot: Path, metadata: dict[str, str],
                     send: Send, run: Run = run_command) -> str:
    """Encrypt, upload the ciphertext as <snapshot name>.age, then its signed manifest as
    <snapshot name>.age.manifest (after the ciphertext: a manifest names only an object that is
    there), delete both local copies; no recipient: refuse (ValueError), nothing is sent."""
    recipient = azure.get("ageRecipient")
    if not recipient:
        raise ValueError("the Azure config names no ageRecipient: not uploading a plaintext snapshot")
    encrypted = encrypt(config, str(recipient), snapshot, run)
    signed = encrypted.with_name(encrypted.name + MANIFEST_SUFFIX)
    name = f"{snapshot.name}.age"
    try:
        signed.write_bytes(manifest(config, snapshot, encrypted, metadata["revision"], name))
        token = storage_token(azure["clientId"], send)
        url = upload(config, azure, encrypted, metadata | {"encryption": "age"}, send, name=name, token=token)
        upload(config, azure, signed, metadata | {"content": "manifest"}, send, name=name + MANIFEST_SUFFIX,
               token=token)
        return url
    finally:
        encrypted.unlink(missing_ok=True)
        signed.unlink(missing_ok=True)


# --- main ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None, send: Send | None = None) -> int:
    """`send`: the HTTP sender (a test's recorder); urllib by default."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--config", required=True, type=Path)
    args = parser.parse_args(argv)
    config = json.loads(args.config.read_text())
    member = config["member"]
    try:
        leader, status = is_leader(config)
        if not leader:
            log(f"{member} is not the leader of the {config['role']} cluster (leader {status['leader']:x}): "
                "nothing to do")
            return 0
        snapshot, info = save_snapshot(config, member, time.time())
        log(f"saved {snapshot} (revision {info['revision']}, {info['totalKey']} keys, {info['totalSize']} bytes)")
        for path in prune(Path(config["directory"]), int(config["keep"])):
            log(f"deleted {path} (keeping the newest {config['keep']})")
        azure_file = Path(config["azureConfig"])
        if not azure_file.exists():
            log(f"no {azure_file}: not uploading")
            return 0
        azure = json.loads(azure_file.read_text())
        metadata = {"member": member, "revision": str(info["revision"]), "cluster": config["cluster"]}
        sender = send or http_send(float(config["requestTimeoutSeconds"]))
        url = upload_encrypted(config, azure, snapshot, metadata, sender)
        log(f"uploaded {snapshot.name} to {url}")
        return 0
    except (RuntimeError, ValueError, OSError, KeyError, subprocess.TimeoutExpired) as error:
        print(f"etcd snapshot of the {config.get('role')} cluster on {member} failed: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
