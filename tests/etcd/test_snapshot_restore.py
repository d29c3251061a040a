"""Scheduled etcd snapshots and the restore runbook.

The slow test runs the local stack's main cluster as real etcd (Debian's 3.4) from the rendered
units, runs the snapshot script as the etcd image carries it on every member with its rendered
config (local-path mode: no Azure config),
loses the whole cluster, and restores it with the commands of
docs/runbooks/etcd-restore-from-snapshot.md, the manifest authenticated with openssl first. The
fast tests read the rendered job against its consumers (systemd-analyze), the Azure upload's
requests against Azure's documented Blob and IMDS formats, without any server, and the runbook's
authentication against manifests signed by another cluster's member or altered in transit.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import importlib.util
import itertools
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kilonode.azure.backup import age_keys
from kilonode.image.recipe import load_recipe
from kilonode.node.ship import ETCD_SNAPSHOT, programs_for
from kilonode.paths import REPO_ROOT
from kilonode.plan import ClusterPlan, defaults
from kilonode.render.etcd_snapshot import (
    AGE,
    CONFIG_PATH,
    PYTHON,
    SCRIPT_PATH,
    SERVICE_PATH,
    TIMER_PATH,
    UNITS_TO_ENABLE,
    on_calendar,
    snapshot_files,
)
from tests import shared
from tests.etcd.snapshot_harness import ETCD, SnapshotCluster
from tests.render.consumers import verify_rendered_units
from tests.render.local_pki import TestCA

assert REPO_ROOT is not None, "runs from a source checkout"
RUNBOOK = REPO_ROOT / "docs/runbooks/etcd-restore-from-snapshot.md"
# (step, etcd version or None when one command serves both) -> the block the test runs
STEPS = {
    ("settings", None), ("pick-local", None), ("authenticate", None), ("decrypt", None), ("check", "3.4"),
    ("check", "3.5"),
    ("set-aside", None), ("restore", "3.4"), ("restore", "3.5"), ("own", None), ("verify", None),
}
BLOCK = re.compile(r"^```sh step=(?P<step>[a-z-]+)(?: etcd=(?P<etcd>[\d.]+))?\n(?P<body>.*?)^```$", re.M | re.S)


# --- the runbook ---------------------------------------------------------------------------


def runbook_steps(text: str) -> dict[tuple[str, str | None], str]:
    steps: dict[tuple[str, str | None], str] = {}
    for match in BLOCK.finditer(text):
        key = (match["step"], match["etcd"])
        assert key not in steps, f"step {key} appears twice in the runbook"
        steps[key] = match["body"]
    return steps


def test_the_runbook_has_every_step_the_test_runs_and_the_35_commands_mirror_the_34_ones() -> None:
    steps = runbook_steps(RUNBOOK.read_text())
    assert set(steps) == STEPS
    # etcd 3.5 reads and restores snapshot files with etcdutl; the restore adds etcd's revision
    # bump for Kubernetes (op-guide/recovery.md v3.5), which 3.4 does not have
    assert steps["check", "3.5"] == steps["check", "3.4"].replace("etcdctl ", "etcdutl ")
    bump = " --bump-revision 1000000000 --mark-compacted"
    assert steps["restore", "3.5"] == steps["restore", "3.4"].replace("etcdctl ", "etcdutl ").rstrip() + bump + "\n"


def test_a_runbook_without_a_step_or_with_one_twice_is_caught() -> None:
    text = RUNBOOK.read_text()
    without = re.sub(r"```sh step=own\n.*?```\n", "", text, flags=re.S)
    assert STEPS - set(runbook_steps(without)) == {("own", None)}
    with pytest.raises(AssertionError, match="appears twice"):
        runbook_steps(text + "\n```sh step=own\nchown -R etcd:etcd \"$DATA_DIR\"\n```\n")


def bash(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=60,
                          check=False, env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", **env})


def test_the_runbook_reads_each_members_restore_settings_from_its_rendered_unit(
    plans: dict[str, ClusterPlan], tmp_path: Path
) -> None:
    plan = plans["research-7500"]
    rendered = shared.rendered("research-7500")
    settings = runbook_steps(RUNBOOK.read_text())["settings", None]
    for cluster in plan.etcd_clusters:
        member = cluster.members[-1]
        unit = tmp_path / f"{member.name}.service"
        unit.write_text(rendered[member.name]["etc/systemd/system/etcd.service"].content)
        done = bash(settings, {"UNIT": str(unit)})
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            f"NAME={member.name}", f"DATA_DIR={cluster.data_dir}", f"PEER_URL={member.peer_url}",
            f"INITIAL_CLUSTER={cluster.initial_cluster}", f"TOKEN={cluster.token}",
        ]
    # a unit without the flags (the wrong file) stops the runbook before anything is restored
    (tmp_path / "other.service").write_text("[Service]\nExecStart=/bin/true\n")
    done = bash(settings, {"UNIT": str(tmp_path / "other.service")})
    assert done.returncode == 1 and "no value for NAME" in done.stderr


# --- the rendered job ----------------------------------------------------------------------


def test_every_member_of_both_clusters_gets_the_job_with_its_own_name_and_cluster(
    plans: dict[str, ClusterPlan],
) -> None:
    for plan in plans.values():
        for cluster in plan.etcd_clusters:
            for member in cluster.members:
                files = snapshot_files(plan, cluster, member)
                # the script is the etcd image's, not the member's custom data's (kilonode.node.ship)
                assert set(files) == {TIMER_PATH, SERVICE_PATH, CONFIG_PATH}
                config = json.loads(files[CONFIG_PATH].content)
                assert (config["member"], config["role"], config["cluster"]) == (member.name, cluster.role,
                                                                                 plan.cluster)
                # the container is the Azure config's, one per cluster (kilonode.azure.backup): no prefix
                assert "blobPrefix" not in config
                # the member itself, with its own server certificate as the client and the
                # manifest's signer
                assert config["endpoint"] == "https://127.0.0.1:2379"
                assert config["certFile"] == "/etc/etcd/pki/server.crt"
                assert config["keyFile"] == "/etc/etcd/pki/server.key"
                # the service runs the image's script with the delivered config, as etcd
                service = files[SERVICE_PATH].content
                assert f"ExecStart=/usr/bin/python3 /{SCRIPT_PATH} \\\n    --config=/{CONFIG_PATH}\n" in service
                assert "\nUser=etcd\n" in service
    assert UNITS_TO_ENABLE == ("kilonode-etcd-snapshot.timer",)
    # where the unit runs it, executable, in the etcd image and no other
    assert ETCD_SNAPSHOT.machine_path == f"/{SCRIPT_PATH}" and ETCD_SNAPSHOT.mode & 0o111
    assert ETCD_SNAPSHOT in programs_for("etcd")
    assert ETCD_SNAPSHOT not in programs_for("control-plane") + programs_for(None, ("gpu", "infiniband"))


def test_the_snapshot_units_pass_systemd_analyze_verify(plans: dict[str, ClusterPlan], tmp_path: Path) -> None:
    plan = plans["research-7500"]
    files = snapshot_files(plan, plan.etcd_events, plan.etcd_events.members[0])
    assert verify_rendered_units(tmp_path, files, (SERVICE_PATH, TIMER_PATH)) == []


def test_the_timer_fires_on_the_same_wall_clock_minutes_on_every_member() -> None:
    spec = on_calendar(defaults.ETCD_SNAPSHOT_INTERVAL_MIN)
    result = subprocess.run(["systemd-analyze", "calendar", "--iterations=5", spec],
                            capture_output=True, text=True, timeout=30, check=True)
    elapses = re.findall(r"(?:Next elapse|Iter\. #\d+):\s+\w+ \S+ (\d\d):(\d\d):(\d\d)", result.stdout)
    assert len(elapses) == 5, result.stdout
    # on the second 0 of minutes that are multiples of the interval, one interval apart
    assert all(s == "00" and int(m) % defaults.ETCD_SNAPSHOT_INTERVAL_MIN == 0 for _, m, s in elapses)
    starts = [int(h) * 60 + int(m) for h, m, _ in elapses]
    assert {(b - a) % (24 * 60) for a, b in itertools.pairwise(starts)} == {defaults.ETCD_SNAPSHOT_INTERVAL_MIN}
    with pytest.raises(ValueError, match="does not divide the hour"):
        on_calendar(7)


# --- the script, imported as the etcd image carries it -------------------------------------------


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    [(_target, data, _mode)] = ETCD_SNAPSHOT.files()
    path = tmp_path_factory.mktemp("script") / "etcd_snapshot.py"
    path.write_bytes(data)
    spec = importlib.util.spec_from_file_location("shipped_etcd_snapshot", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_prune_keeps_the_newest_snapshots_and_touches_nothing_else(script: ModuleType, tmp_path: Path) -> None:
    names = [f"2026112{d}T101500Z-rev{100 + d}-etcd-main-1.db" for d in range(6)]
    for name in [*names, "notes.txt", ".partial-20261127T101500Z.db"]:
        (tmp_path / name).write_bytes(b"x")
    deleted = script.prune(tmp_path, 4)
    assert [p.name for p in deleted] == names[:2]
    kept = [*names[2:], "notes.txt", ".partial-20261127T101500Z.db"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)


class Recorder:
    """Stands in for the HTTP sender: records each request and answers with the status Azure
    documents for success (IMDS 200, Put Blob / Put Block / Put Block List 201)."""

    def __init__(self, script: ModuleType, fail_at: int | None = None) -> None:
        self.script, self.fail_at, self.requests = script, fail_at, []

    def __call__(self, request: Any) -> Any:
        self.requests.append(request)
        if len(self.requests) - 1 == self.fail_at:
            return self.script.HttpResponse(403, b"<Error><Code>AuthorizationPermissionMismatch</Code></Error>")
        if request.method == "GET":
            token = {"access_token": "token-1", "expires_in": "86399", "resource": "https://storage.azure.com/"}
            return self.script.HttpResponse(200, json.dumps(token).encode())
        return self.script.HttpResponse(201)


AZURE = {"blobEndpoint": "https://kn0local1a2b3c4d.blob.core.windows.net/", "container": "etcd-snapshots-main",
         "clientId": "11111111-2222-3333-4444-555555555555"}
CONFIG = {"blockBytes": 1000}
BLOBS = "https://kn0local1a2b3c4d.blob.core.windows.net/etcd-snapshots-main/"
DATE = "Mon, 23 Nov 2026 17:45:00 GMT"


def check_common_headers(request: Any) -> None:
    """What every Blob request must carry (learn.microsoft.com rest/api/storageservices put-blob,
    put-block, put-block-list: Authorization, x-ms-date, x-ms-version, Content-Length)."""
    headers = request.headers
    assert headers["Authorization"] == "Bearer token-1"
    # 4,000 MiB blocks from 2019-12-12; Microsoft Entra tokens from 2017-11-09
    assert headers["x-ms-version"] >= "2019-12-12"
    assert email.utils.parsedate_to_datetime(headers["x-ms-date"]).utcoffset().total_seconds() == 0
    assert headers["x-ms-date"].endswith(" GMT")
    assert int(headers["Content-Length"]) == len(request.body)


def test_a_snapshot_larger_than_one_block_goes_up_as_put_blocks_then_one_put_block_list(
    script: ModuleType, tmp_path: Path
) -> None:
    snapshot = tmp_path / "20261123T174500Z-rev4242-etcd-main-1.db"
    data = os.urandom(2500)
    snapshot.write_bytes(data)
    send = Recorder(script)
    url = script.upload(CONFIG, AZURE, snapshot, {"member": "etcd-main-1", "revision": "4242"}, send, lambda: DATE)
    blob = BLOBS + snapshot.name
    assert url == blob
    token, *blocks, commit = send.requests
    assert token.method == "GET" and token.url.startswith("http://169.254.169.254/")
    # Put Block: PUT <blob>?comp=block&blockid=<url-encoded base64>, one per 1000 bytes
    assert len(blocks) == 3
    ids = []
    for request in blocks:
        check_common_headers(request)
        assert request.method == "PUT"
        base, _, query = request.url.partition("?")
        assert base == blob
        params = urllib.parse.parse_qs(query, strict_parsing=True)
        assert params["comp"] == ["block"]
        [block_id] = params["blockid"]
        # base64 of at most 64 bytes, every ID of the blob the same length
        assert len(base64.b64decode(block_id, validate=True)) <= 64
        assert urllib.parse.quote(block_id, safe="") in request.url
        ids.append(block_id)
        assert request.headers["Content-MD5"] == base64.b64encode(hashlib.md5(request.body).digest()).decode()
        assert "x-ms-meta-member" not in request.headers  # metadata goes with the commit
        assert "If-None-Match" not in request.headers  # uncommitted blocks replace nothing
    assert len(set(ids)) == 3 and len({len(i) for i in ids}) == 1
    assert b"".join(r.body for r in blocks) == data
    assert [len(r.body) for r in blocks] == [1000, 1000, 500]
    # Put Block List: PUT <blob>?comp=blocklist, <BlockList> naming the blocks in order
    check_common_headers(commit)
    assert (commit.method, commit.url) == ("PUT", f"{blob}?comp=blocklist")
    assert commit.body.startswith(b'<?xml version="1.0" encoding="utf-8"?>')
    root = ET.fromstring(commit.body)
    assert root.tag == "BlockList"
    assert [(child.tag, child.text) for child in root] == [("Latest", i) for i in ids]
    assert commit.headers["x-ms-blob-content-md5"] == base64.b64encode(hashlib.md5(data).digest()).decode()
    assert commit.headers["x-ms-meta-revision"] == "4242"
    assert commit.headers["x-ms-meta-member"] == "etcd-main-1"
    # the commit creates the blob only where none is: never a snapshot replaced
    assert commit.headers["If-None-Match"] == "*"


def test_a_snapshot_within_one_block_goes_up_as_a_single_put_blob(script: ModuleType, tmp_path: Path) -> None:
    snapshot = tmp_path / "20261123T174500Z-rev7-etcd-events-0.db"
    snapshot.write_bytes(b"snapshot" * 100)
    send = Recorder(script)
    events = AZURE | {"container": "etcd-snapshots-events"}
    script.upload(CONFIG, events, snapshot, {"revision": "7"}, send, lambda: DATE)
    [_, put] = send.requests
    check_common_headers(put)
    assert put.url == "https://kn0local1a2b3c4d.blob.core.windows.net/etcd-snapshots-events/" + snapshot.name
    assert put.headers["If-None-Match"] == "*"
    assert put.headers["x-ms-blob-type"] == "BlockBlob"
    assert put.body == snapshot.read_bytes()
    assert put.headers["x-ms-meta-revision"] == "7"


def test_the_imds_token_request_names_the_storage_resource_and_the_identity(script: ModuleType) -> None:
    request = script.imds_token_request(AZURE["clientId"])
    url = urllib.parse.urlsplit(request.url)
    assert (request.method, url.scheme, url.netloc, url.path) == (
        "GET", "http", "169.254.169.254", "/metadata/identity/oauth2/token")
    assert urllib.parse.parse_qs(url.query) == {
        "api-version": ["2018-02-01"], "resource": ["https://storage.azure.com/"], "client_id": [AZURE["clientId"]],
    }
    assert request.headers == {"Metadata": "true"}


def test_a_refused_block_fails_the_upload_and_nothing_is_committed(script: ModuleType, tmp_path: Path) -> None:
    snapshot = tmp_path / "20261123T174500Z-rev9-etcd-main-0.db"
    snapshot.write_bytes(os.urandom(2500))
    send = Recorder(script, fail_at=2)  # the second Put Block
    refused = r"PUT https://\S+/etcd-snapshots-main/\S+ answered 403: .*AuthorizationPermissionMismatch"
    with pytest.raises(RuntimeError, match=refused):
        script.upload(CONFIG, AZURE, snapshot, {}, send, lambda: DATE)
    assert not any("comp=blocklist" in r.url for r in send.requests)


def test_a_snapshot_needing_more_than_50000_blocks_is_refused_before_any_request(
    script: ModuleType, tmp_path: Path
) -> None:
    snapshot = tmp_path / "big.db"
    snapshot.write_bytes(b"x" * 50_001)
    with pytest.raises(ValueError, match="needs 50001 blocks"):
        list(script.upload_requests(snapshot, "https://a/c/b", "t", 1, {}, lambda: DATE))


def test_the_sender_gives_up_after_bounded_retries_on_a_refused_connection(script: ModuleType) -> None:
    waits: list[float] = []
    send = script.http_send(timeout=2, sleep=waits.append)
    # nothing listens on port 9 of this loopback address: every attempt is refused
    request = script.HttpRequest("PUT", "http://127.0.0.1:9/etcd-snapshots-main/x.db?comp=blocklist", {}, b"x")
    with pytest.raises(RuntimeError, match=r"PUT http://127.0.0.1:9/etcd-snapshots-main/x.db: "):
        send(request)
    assert waits == [2.0, 4.0]  # three attempts, backing off


# --- encrypted before upload ----------------------------------------------------------------

# bbolt's meta page magic 0xED0CDAED (etcd's backend, bbolt db.go `magic`), little-endian as
# amd64 writes it: in every snapshot file, twice.
BOLT_MAGIC = (0xED0CDAED).to_bytes(4, "little")
AGE_HEADER = b"age-encryption.org/v1\n"


def age_key(tmp_path: Path) -> tuple[Path, str]:
    """A fresh age key as the Pulumi program derives it: (identity file, recipient)."""
    identity, recipient = age_keys(base64.b64encode(os.urandom(32)).decode())
    path = tmp_path / "identity.txt"
    path.write_text(identity + "\n")
    path.chmod(0o600)
    return path, recipient


def uploaded(requests: list[Any]) -> dict[str, bytes]:
    """Blob name -> what the requests leave there (a Put Blob's body, or the blocks in order), in
    the order they were written."""
    blobs: dict[str, bytes] = {}
    for request in requests:
        if request.method == "PUT" and "comp=blocklist" not in request.url:
            name = urllib.parse.unquote(request.url.split("?", 1)[0].rpartition("/")[2])
            blobs[name] = blobs.get(name, b"") + request.body
    return blobs


def decrypt(data: bytes, identity: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([AGE, "--decrypt", "--identity", str(identity)], input=data, capture_output=True,
                          timeout=60, check=False)


def member_config(tmp_path: Path, role: str = "main", client_only: bool = False) -> tuple[dict[str, Any], Path]:
    """The job's config for member 0 of cluster `role`, holding a certificate of a CA of that
    cluster's own (as kilonode.plan.pki gives each etcd cluster): (config, the CA's file)."""
    ca = TestCA(tmp_path / f"pki-{role}", f"etcd-{role}-ca")
    member = f"etcd-{role}-0"
    cert, key = ca.issue(member, ["127.0.0.1"], client_only=client_only)
    # blocks of 1 MiB: each of its uploads is one Put Blob (the block uploads have their own tests)
    return CONFIG | {"blockBytes": 1 << 20, "age": AGE, "saveTimeoutSeconds": 60, "cluster": "local", "role": role,
                     "member": member, "certFile": str(cert), "keyFile": str(key)}, ca.ca_file


def upload_one(script: ModuleType, tmp_path: Path, recipient: str, config: dict[str, Any],
               plain: bytes = BOLT_MAGIC + b"/registry/namespaces/default") -> tuple[Path, dict[str, bytes]]:
    """A snapshot of `plain` uploaded by the member of `config` to a recorder: (its path, the
    blobs it wrote)."""
    work = tmp_path / f"snapshots-{config['role']}"
    work.mkdir(exist_ok=True)
    snapshot = work / f"20261123T174500Z-rev42-{config['member']}.db"
    snapshot.write_bytes(plain)
    send = Recorder(script)
    azure = AZURE | {"container": f"etcd-snapshots-{config['role']}", "ageRecipient": recipient}
    script.upload_encrypted(config, azure, snapshot, {"revision": "42"}, send)
    return snapshot, uploaded(send.requests)


def test_the_upload_sends_only_age_ciphertext_that_the_stacks_identity_decrypts(
    script: ModuleType, tmp_path: Path
) -> None:
    if not Path(AGE).exists():
        pytest.fail("age missing: run `make setup` (installs .ci/debian-packages.txt)")
    identity, recipient = age_key(tmp_path)
    config, _ = member_config(tmp_path)
    work = tmp_path / "snapshots"
    work.mkdir()
    snapshot = work / "20261123T174500Z-rev42-etcd-main-0.db"
    plain = BOLT_MAGIC + b"/registry/secrets/kube-system/bootstrap-token-abcdef" + os.urandom(2500)
    snapshot.write_bytes(plain)
    send = Recorder(script)
    url = script.upload_encrypted(config, AZURE | {"ageRecipient": recipient}, snapshot, {"revision": "42"}, send)
    assert url == BLOBS + f"{snapshot.name}.age"
    # one token, the ciphertext, then its manifest (a manifest names only an object that is there)
    token, put, put_manifest = send.requests
    assert token.method == "GET" and put.method == put_manifest.method == "PUT"
    blobs = uploaded(send.requests)
    assert list(blobs) == [f"{snapshot.name}.age", f"{snapshot.name}.age.manifest"]
    sent = blobs[f"{snapshot.name}.age"]
    assert sent.startswith(AGE_HEADER)
    assert BOLT_MAGIC not in sent and b"bootstrap-token" not in sent
    assert decrypt(sent, identity).stdout == plain
    assert put.headers["x-ms-meta-encryption"] == "age"
    assert put.headers["If-None-Match"] == put_manifest.headers["If-None-Match"] == "*"
    # the ciphertext and the manifest are gone from the disk, the snapshot stays
    assert sorted(p.name for p in work.iterdir()) == [snapshot.name]
    # seeded: the plain upload (what the job did before) is caught by the same checks
    send = Recorder(script)
    script.upload(config, AZURE, snapshot, {}, send)
    assert BOLT_MAGIC in uploaded(send.requests)[snapshot.name]


def test_the_manifest_names_both_digests_and_is_signed_by_the_members_server_key(
    script: ModuleType, tmp_path: Path
) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    _, recipient = age_key(tmp_path)
    config, _ = member_config(tmp_path)
    plain = BOLT_MAGIC + os.urandom(3000)
    snapshot, blobs = upload_one(script, tmp_path, recipient, config, plain)
    ciphertext, manifest = blobs[f"{snapshot.name}.age"], blobs[f"{snapshot.name}.age.manifest"]
    body, _, rest = manifest.partition(b"signature=")
    header, *lines = body.decode().splitlines()
    assert header == "kilonode etcd snapshot manifest v1"
    assert dict(line.split("=", 1) for line in lines) == {
        "cluster": "local", "role": "main", "member": "etcd-main-0", "revision": "42",
        "snapshot": snapshot.name, "object": f"{snapshot.name}.age",
        "plaintext-sha256": hashlib.sha256(plain).hexdigest(), "plaintext-bytes": str(len(plain)),
        "ciphertext-sha256": hashlib.sha256(ciphertext).hexdigest(), "ciphertext-bytes": str(len(ciphertext)),
    }
    signature, _, certificate = rest.partition(b"\n")
    assert certificate == Path(config["certFile"]).read_bytes()
    # an ECDSA-SHA256 signature of the lines above it, by the certificate's key
    public = x509.load_pem_x509_certificate(certificate).public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    public.verify(base64.b64decode(signature, validate=True), body, ec.ECDSA(hashes.SHA256()))
    # a value that would add a line of its own is refused before anything is signed
    with pytest.raises(ValueError, match="not one line of printable ASCII"):
        script.manifest_body({"member": "etcd-main-0\nrole=events"})


def authenticate(tmp_path: Path, ciphertext: bytes, manifest: bytes, ca: Path, role: str,
                 then: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    """The runbook's authenticate step (and `then`, the steps after it) on these downloads."""
    where = tmp_path / "restore"
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir()
    (where / "restore.db.age").write_bytes(ciphertext)
    (where / "restore.db.age.manifest").write_bytes(manifest)
    steps = runbook_steps(RUNBOOK.read_text())
    return bash(steps["authenticate", None] + then, {
        "ENCRYPTED": str(where / "restore.db.age"), "ETCD_CA": str(ca), "ROLE": role, **env})


def test_the_restore_authenticates_a_snapshot_before_it_decrypts_it_and_refuses_a_forgery(
    script: ModuleType, tmp_path: Path
) -> None:
    identity, recipient = age_key(tmp_path)
    main, main_ca = member_config(tmp_path, "main")
    plain = BOLT_MAGIC + b"/registry/namespaces/default" + os.urandom(500)
    snapshot, blobs = upload_one(script, tmp_path, recipient, main, plain)
    ciphertext, manifest = blobs[f"{snapshot.name}.age"], blobs[f"{snapshot.name}.age.manifest"]
    decrypt_step = runbook_steps(RUNBOOK.read_text())["decrypt", None]
    restored = tmp_path / "restored.db"
    done = authenticate(tmp_path, ciphertext, manifest, main_ca, "main", decrypt_step,
                        IDENTITY=str(identity), SNAPSHOT=str(restored))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"authentic: {snapshot.name}, revision 42, taken by etcd-main-0 of the main cluster" in done.stdout
    assert restored.read_bytes() == plain

    def refused(ciphertext: bytes, manifest: bytes, ca: Path = main_ca, role: str = "main") -> str:
        result = authenticate(tmp_path, ciphertext, manifest, ca, role)
        assert result.returncode != 0, result.stdout
        return result.stderr

    # an events member (its own cluster's CA), uploading a snapshot it calls main's: not the main CA's
    events, events_ca = member_config(tmp_path, "events")
    forged, forged_blobs = upload_one(script, tmp_path, recipient, events | {"role": "main"})
    assert "not a server certificate of the main cluster's etcd CA" in refused(
        forged_blobs[f"{forged.name}.age"], forged_blobs[f"{forged.name}.age.manifest"])
    # a genuine events snapshot offered for the main cluster: its CA, but not its cluster
    real, real_blobs = upload_one(script, tmp_path, recipient, events)
    assert "is not a main snapshot signed by its own member" in refused(
        real_blobs[f"{real.name}.age"], real_blobs[f"{real.name}.age.manifest"], events_ca)
    # an apiserver's etcd client certificate (the main CA's, for clients only)
    client, _ = member_config(tmp_path / "client", "main", client_only=True)
    client_ca = tmp_path / "client" / "pki-main" / "ca.crt"
    by_client, client_blobs = upload_one(script, tmp_path / "client", recipient, client)
    assert "not a server certificate" in refused(
        client_blobs[f"{by_client.name}.age"], client_blobs[f"{by_client.name}.age.manifest"], client_ca)
    # anyone with the public recipient can encrypt a snapshot of their own: not the bytes signed
    other = tmp_path / "other.db"
    other.write_bytes(BOLT_MAGIC + b"/registry/namespaces/evil")
    swapped = subprocess.run([AGE, "--encrypt", "--recipient", recipient, str(other)], capture_output=True,
                             timeout=60, check=True).stdout
    assert "is not the ciphertext the manifest names" in refused(swapped, manifest)
    # one byte of the ciphertext changed in transit or at rest
    flipped = ciphertext[:-1] + bytes([ciphertext[-1] ^ 1])
    assert "is not the ciphertext the manifest names" in refused(flipped, manifest)
    # a signed line changed (another revision): the signature no longer holds
    assert "signature does not hold" in refused(ciphertext, manifest.replace(b"revision=42", b"revision=43"))
    # seeded: a manifest whose plaintext digest is not the snapshot's stops the decrypt step
    done = authenticate(tmp_path, ciphertext, manifest, main_ca, "main",
                        "sed -i 's/^plaintext-sha256=.*/plaintext-sha256=00/' \"$ENCRYPTED.manifest.signed\"\n"
                        + decrypt_step, IDENTITY=str(identity), SNAPSHOT=str(restored))
    assert done.returncode == 1 and "not the one the manifest names: not restoring it" in done.stderr


def test_without_a_recipient_nothing_is_uploaded(script: ModuleType, tmp_path: Path) -> None:
    snapshot = tmp_path / "20261123T174500Z-rev42-etcd-main-0.db"
    snapshot.write_bytes(BOLT_MAGIC)
    send = Recorder(script)
    config = CONFIG | {"age": AGE, "saveTimeoutSeconds": 60}
    with pytest.raises(ValueError, match="no ageRecipient: not uploading a plaintext snapshot"):
        script.upload_encrypted(config, AZURE, snapshot, {}, send)
    with pytest.raises(ValueError, match="not an age X25519 recipient"):
        script.upload_encrypted(config, AZURE | {"ageRecipient": "ssh-ed25519 AAAA"}, snapshot, {}, send)
    assert send.requests == []


def test_the_etcd_image_carries_the_age_the_job_runs(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["research-7500"]
    config = json.loads(snapshot_files(plan, plan.etcd_main, plan.etcd_main.members[0])[CONFIG_PATH].content)
    assert config["age"] == AGE == "/usr/bin/age"  # where Debian's package puts it (dpkg -L age)
    assert "age" in load_recipe().package_list("control")


# --- the real cluster: snapshot, total loss, restore by the runbook ----------------------------


def upload_like_azure(etcd: SnapshotCluster, script: ModuleType, leader: str, recipient: str,
                      tmp_path: Path) -> tuple[bytes, bytes]:
    """Run the job's main() for the leader with an Azure config (the stack's recipient) and a
    recorder for the blob service: what it uploaded (the ciphertext, its manifest)."""
    azure = tmp_path / "azure.json"
    azure.write_text(json.dumps(AZURE | {"ageRecipient": recipient}))
    config_path = etcd.snapshot_config(leader)
    config = json.loads(config_path.read_text()) | {"azureConfig": str(azure)}
    config_path.write_text(json.dumps(config))
    send = Recorder(script)
    assert script.main(["--config", str(config_path)], send=send) == 0
    # one Put Blob each: the snapshot fits in one 64 MiB block
    [_token, put, put_manifest] = send.requests
    assert put.url.endswith(".db.age") and put_manifest.url == put.url + ".manifest"
    return put.body, put_manifest.body


def kvs(etcd: SnapshotCluster, prefix: str) -> dict[str, str]:
    out = etcd.etcdctl("get", "--prefix", prefix, "-w", "json")
    assert out.returncode == 0, out.stderr
    return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv["value"]).decode()
            for kv in json.loads(out.stdout).get("kvs", [])}


@pytest.mark.slow
def test_a_total_loss_of_the_main_cluster_is_restored_by_the_runbook_from_the_leaders_scheduled_snapshot(
    plans: dict[str, ClusterPlan], script: ModuleType, tmp_path: Path
) -> None:
    if not Path(ETCD).exists():
        pytest.fail("etcd missing: run `make setup` (installs Debian's etcd-server)")
    if os.geteuid() != 0:
        pytest.fail("the runbook runs as root (it gives the restored data dir to the etcd user)")
    etcd = SnapshotCluster(plans["local"], tmp_path)
    members = [m.name for m in etcd.cluster.members]
    try:
        etcd.start_all()
        health = etcd.wait_healthy()
        assert health.returncode == 0, health.stdout + health.stderr + etcd.logs()
        written = {f"/kilonode/restore/{i:03d}": f"value-{i}" for i in range(30)}
        # a few larger values (one argument stays under the kernel's 128 KiB per-argument limit)
        written |= {f"/kilonode/restore/large-{i}": str(i) * 100_000 for i in range(3)}
        for key, value in written.items():
            assert etcd.etcdctl("put", key, value).returncode == 0
        cluster_id = etcd.statuses()[members[0]]["header"]["cluster_id"]

        # the timer fires on every member at once: each runs the rendered script
        script_path, leader = etcd.snapshot_script(), etcd.leader()
        runs = {name: subprocess.run([PYTHON, str(script_path), "--config", str(etcd.snapshot_config(name))],
                                     capture_output=True, text=True, timeout=120, check=False) for name in members}
        assert {n: r.returncode for n, r in runs.items()} == dict.fromkeys(members, 0), {
            n: r.stderr for n, r in runs.items()}
        taken = {name: sorted((etcd.home(name) / "snapshots").glob("*")) for name in members}
        assert [n for n, files in taken.items() if files] == [leader], runs  # one snapshot, by the leader
        for name in set(members) - {leader}:
            assert "is not the leader" in runs[name].stdout
        [snapshot] = taken[leader]
        assert re.fullmatch(rf"\d{{8}}T\d{{6}}Z-rev\d+-{leader}\.db", snapshot.name)
        assert "not uploading" in runs[leader].stdout  # no Azure config: local path only

        # The leader's next run as in Azure: its Azure config names the stack's age recipient.
        # No Azure here: the job runs in this process with a recorder for the blob service.
        identity, recipient = age_key(tmp_path)
        blob, manifest = upload_like_azure(etcd, script, leader, recipient, tmp_path)
        newest = sorted((etcd.home(leader) / "snapshots").glob("*.db"))[-1]
        plain = newest.read_bytes()
        assert BOLT_MAGIC in plain and b"/kilonode/restore/000" in plain  # what the checks look for
        assert blob.startswith(AGE_HEADER)
        assert BOLT_MAGIC not in blob and b"/kilonode/restore/" not in blob and b"value-1" not in blob

        # a write after the snapshot: gone after the restore
        assert etcd.etcdctl("put", "/kilonode/restore/after-snapshot", "lost").returncode == 0
        # a member whose etcd is down cannot tell whether it leads: its run fails, visibly
        follower = next(n for n in members if n != leader)
        etcd.stop(follower)
        down = subprocess.run([PYTHON, str(script_path), "--config", str(etcd.snapshot_config(follower))],
                              capture_output=True, text=True, timeout=120, check=False)
        assert down.returncode == 1 and "etcdctl endpoint status failed" in down.stderr, down.stderr

        # what survives a total loss: the copy kept off the members, the uploaded ciphertext and
        # its manifest
        kept = tmp_path / "kept"
        kept.mkdir()
        (kept / f"{newest.name}.age").write_bytes(blob)
        (kept / f"{newest.name}.age.manifest").write_bytes(manifest)
        etcd.stop_all()
        for name in members:
            shutil.rmtree(etcd.data_dir(name))
            shutil.rmtree(etcd.home(name) / "snapshots", ignore_errors=True)

        steps = runbook_steps(RUNBOOK.read_text())
        ca, cert, key = etcd.tls
        tls = {"ETCDCTL_CACERT": str(ca), "ETCDCTL_CERT": str(cert), "ETCDCTL_KEY": str(key)}
        # authenticated against the cluster's etcd CA, then decrypted off the members, with the
        # identity only the stack holds
        decrypted = kept / newest.name
        encrypted = kept / f"{newest.name}.age"
        done = bash(steps["authenticate", None] + steps["decrypt", None], {
            "ENCRYPTED": str(encrypted), "ETCD_CA": str(etcd.ca.ca_file), "ROLE": "main",
            "IDENTITY": str(identity), "SNAPSHOT": str(decrypted)})
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"authentic: {newest.name}, revision " in done.stdout and f"taken by {leader} of the main" in done.stdout
        assert decrypted.read_bytes() == plain
        for leftover in kept.glob(f"{newest.name}.age*"):
            leftover.unlink()
        restore = [steps[s] for s in (("settings", None), ("pick-local", None), ("check", "3.4"),
                                      ("set-aside", None), ("restore", "3.4"), ("own", None))]
        etcd_uid = pwd.getpwnam("etcd").pw_uid
        for name in members:
            env = tls | {"UNIT": str(etcd.units[name]), "SNAPSHOT_DIR": str(kept),
                         "ETCDCTL_ENDPOINTS": etcd.endpoints[name]}
            done = bash("\n".join(restore), env)
            assert done.returncode == 0, done.stdout + done.stderr
            assert f"NAME={name}\n" in done.stdout and f"SNAPSHOT={decrypted}\n" in done.stdout
            data = etcd.data_dir(name)
            assert data.stat().st_uid == etcd_uid and stat.S_IMODE(data.stat().st_mode) == 0o700

        etcd.start_all()
        health = etcd.wait_healthy()
        assert health.returncode == 0, health.stdout + health.stderr + etcd.logs()
        env = tls | {"UNIT": str(etcd.units[members[0]]), "ETCDCTL_ENDPOINTS": etcd.endpoints[members[0]],
                     "CHECK_PREFIX": "/kilonode/restore/"}
        verify = bash(steps["settings", None] + steps["verify", None], env)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        # etcdctl prints endpoint health on stderr
        assert (verify.stdout + verify.stderr).count("is healthy") == len(members)
        # the snapshot's keys, and nothing written after it
        assert kvs(etcd, "/kilonode/restore/") == written
        listed = json.loads(etcd.etcdctl("member", "list", "-w", "json").stdout)["members"]
        assert sorted(m["name"] for m in listed) == sorted(members)
        # The restore rewrites cluster and member IDs, but etcd derives them from the peer URLs
        # and the token, which the rendered flags keep: the same IDs as before the loss. So a
        # member still holding the old data could join the restored cluster; the runbook
        # stops every member and sets every old data dir aside first.
        assert etcd.statuses()[members[0]]["header"]["cluster_id"] == cluster_id
    finally:
        etcd.close()
