"""The pinned upstream binaries: node-image/binaries.toml's shape and coverage, and the
download that verifies a digest or refuses it, against a real HTTP server on loopback
(nothing here reaches the internet)."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import io
import os
import re
import socket
import tarfile
import threading
import tomllib
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from kilonode.catalog import binaries
from kilonode.catalog.binaries import PinError
from kilonode.config import available_stacks, load_stack
from kilonode.config.model import SUPPORTED_KUBERNETES_MINORS
from kilonode.image.binaries import (
    DigestMismatch,
    Downloads,
    MemberMissing,
    Unreachable,
    download_cache,
    download_name,
    extract_members,
    fetch,
    place_role,
)
from kilonode.image.cache import cache_root

CATALOG = binaries.load()
RAW = tomllib.loads(binaries.BINARIES_FILE.read_text())
RIGHT = b"\x7fELF the pinned file\n" * 4096
WRONG = b"\x7fELF another file\n" * 4096
Served = tuple[str, Path, list[str]]  # the server fixture: base URL, served directory, paths requested


def sha(data: bytes, algorithm: str = "sha256") -> str:
    return hashlib.new(algorithm, data).hexdigest()


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def tarball(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Served]:
    """A real HTTP server on 127.0.0.1 (ephemeral port) serving tmp_path/www; yields its base
    URL, the directory and the paths requested."""
    www = tmp_path / "www"
    www.mkdir()
    requests: list[str] = []

    class Handler(Quiet):
        def do_GET(self) -> None:
            requests.append(self.path)
            super().do_GET()

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(www)))
    # a short poll interval: shutdown() waits up to one interval (0.5 s by default)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", www, requests
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def dead_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- fetch ------------------------------------------------------------------------------------


def test_fetch_accepts_the_right_file_and_returns_its_sha256(server: Served, tmp_path: Path) -> None:
    url, www, _ = server
    (www / "right").write_bytes(RIGHT)
    dest = tmp_path / "got" / "right"
    assert fetch(f"{url}/right", sha(RIGHT), dest) == sha(RIGHT)
    assert dest.read_bytes() == RIGHT
    assert [p.name for p in dest.parent.iterdir()] == ["right"]  # no temporary file left
    # the sha256: prefix, and a sha512 pin (the Kubernetes server tarball's kind)
    assert fetch(f"{url}/right", f"sha256:{sha(RIGHT)}", tmp_path / "b") == sha(RIGHT)
    assert fetch(f"{url}/right", f"sha512:{sha(RIGHT, 'sha512')}", tmp_path / "c") == sha(RIGHT)


def test_fetch_refuses_the_wrong_file_and_keeps_nothing(server: Served, tmp_path: Path) -> None:
    url, www, requests = server
    (www / "wrong").write_bytes(WRONG)
    got = tmp_path / "got"
    got.mkdir()
    dest = got / "kubelet"
    with pytest.raises(DigestMismatch) as refused:
        fetch(f"{url}/wrong", sha(RIGHT), dest)
    message = str(refused.value)
    assert "\n" not in message
    assert f"{url}/wrong" in message and sha(RIGHT) in message and sha(WRONG) in message
    assert message == f"refused {url}/wrong: sha256 mismatch: expected {sha(RIGHT)}, got {sha(WRONG)}"
    assert requests == ["/wrong"]  # it was downloaded, then refused
    assert list(got.iterdir()) == []  # neither the file nor a partial one
    # a file already at the destination is left as it was
    dest.write_bytes(b"earlier")
    with pytest.raises(DigestMismatch):
        fetch(f"{url}/wrong", sha(RIGHT), dest)
    assert dest.read_bytes() == b"earlier" and [p.name for p in got.iterdir()] == ["kubelet"]


def test_fetch_of_an_unreachable_url_says_so(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{dead_port()}/kubelet"
    with pytest.raises(Unreachable, match=rf"^cannot download {re.escape(url)}: .*[Cc]onnection refused"):
        fetch(url, sha(RIGHT), tmp_path / "kubelet")
    assert list(tmp_path.iterdir()) == []


def test_fetch_of_a_missing_file_names_the_status(server: Served, tmp_path: Path) -> None:
    url, _, _ = server
    with pytest.raises(Unreachable, match=rf"^cannot download {re.escape(url)}/nope: HTTP 404"):
        fetch(f"{url}/nope", sha(RIGHT), tmp_path / "nope")
    assert [p.name for p in tmp_path.iterdir()] == ["www"]  # nothing beside the served directory


def test_fetch_gives_up_on_a_server_that_never_answers(tmp_path: Path) -> None:
    with socket.socket() as listener:  # accepts connections (the backlog) but never replies
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/kubelet"
        with pytest.raises(Unreachable, match=rf"^cannot download {re.escape(url)}: .*timed out"):
            fetch(url, sha(RIGHT), tmp_path / "kubelet", timeout=0.2)
    assert list(tmp_path.iterdir()) == []


def test_fetch_takes_only_http_urls(tmp_path: Path) -> None:
    (tmp_path / "local").write_bytes(RIGHT)
    with pytest.raises(Unreachable, match="only http"):
        fetch(f"file://{tmp_path}/local", sha(RIGHT), tmp_path / "copy")


# --- tarball members ----------------------------------------------------------------------------


def test_extract_members_takes_what_is_asked_in_one_pass(tmp_path: Path) -> None:
    archive = tmp_path / "cri-dockerd.tgz"
    archive.write_bytes(tarball({"./cri-dockerd/cri-dockerd": RIGHT, "./cri-dockerd/LICENSE": b"text"}))
    dest = tmp_path / "out" / "cri-dockerd"
    assert extract_members(archive, {"cri-dockerd/cri-dockerd": dest}) == {"cri-dockerd/cri-dockerd": sha(RIGHT)}
    assert dest.read_bytes() == RIGHT
    with pytest.raises(MemberMissing, match="holds no regular file bin/containerd"):
        extract_members(archive, {"cri-dockerd/LICENSE": tmp_path / "l", "bin/containerd": tmp_path / "c"})
    assert not (tmp_path / "l").exists() and not (tmp_path / "c").exists()


# --- into the image -------------------------------------------------------------------------------


def synthetic_catalog(tmp_path: Path, url: str, tool_sha: str, bundle_sha: str) -> binaries.Catalog:
    """Two components served from `url`: a plain binary and a tarball with two members."""
    data = f"""
format = 1
arch = "amd64"
[sources.test]
repo = "example/test"
path = "checksums"
commit = "{'0' * 40}"
what = "test data"
[roles]
pool-docker = ["tool", "bundle"]
[components.tool]
follows = "kubernetes"
url = "https://example.invalid/tool"
unit = "tool.service"
files = [{{ path = "/usr/local/bin/tool" }}]
[components.tool.pins]
amd64 = [{{ version = "1.34.2", sha256 = "{tool_sha}", source = "test" }}]
[components.bundle]
version = "2.0.0"
url = "https://example.invalid/bundle-{{version}}.tgz"
files = [{{ dir = "/opt/bundle", members = ["bundle-{{version}}/a", "bundle-{{version}}/b"] }}]
[components.bundle.pins]
amd64 = [{{ version = "2.0.0", sha256 = "{bundle_sha}", source = "test" }}]
"""
    path = tmp_path / "binaries.toml"
    path.write_text(data)
    catalog = binaries.load(path)
    # the data's URLs must be https; the test serves the same names from loopback
    https = {name: c.url for name, c in catalog.components.items()}
    components = {
        name: binaries.Component(c.name, https[name].replace("https://example.invalid", url), c.files, c.pins,
                                 c.follows, c.version, c.unit)
        for name, c in catalog.components.items()
    }
    return binaries.Catalog(catalog.arch, catalog.sources, catalog.roles, components)


def test_place_role_downloads_verifies_and_installs(server: Served, tmp_path: Path) -> None:
    url, www, requests = server
    bundle = tarball({"bundle-2.0.0/a": b"A" * 100, "bundle-2.0.0/b": b"B" * 100, "bundle-2.0.0/README": b"r"})
    (www / "tool").write_bytes(RIGHT)
    (www / "bundle-2.0.0.tgz").write_bytes(bundle)
    catalog = synthetic_catalog(tmp_path, url, sha(RIGHT), sha(bundle))
    root = tmp_path / "root"
    results = place_role(root, catalog, "pool-docker", "1.34.2", local_dir=None, allow_fetch=True,
                         downloads=Downloads(tmp_path / "downloads"))
    tool, placed = results
    assert tool.present and tool.origin == f"{url}/tool" and tool.sha256 == sha(RIGHT)
    assert tool.pinned == f"sha256:{sha(RIGHT)}" and tool.version == "1.34.2" and tool.unit == "tool.service"
    assert (root / "usr/local/bin/tool").read_bytes() == RIGHT
    assert os.access(root / "usr/local/bin/tool", os.X_OK)
    assert placed.files == {"/opt/bundle/a": sha(b"A" * 100), "/opt/bundle/b": sha(b"B" * 100)}
    assert (root / "opt/bundle/b").read_bytes() == b"B" * 100 and not (root / "opt/bundle/README").exists()
    assert sorted(requests) == ["/bundle-2.0.0.tgz", "/tool"]
    entry = placed.manifest_entry()
    assert entry["present"] and entry["path"] == "/opt/bundle/a" and entry["pin_source"].startswith("example/test@")


def test_place_role_refuses_a_mismatch_and_places_nothing(server: Served, tmp_path: Path) -> None:
    url, www, _ = server
    (www / "tool").write_bytes(WRONG)
    catalog = synthetic_catalog(tmp_path, url, sha(RIGHT), "0" * 64)
    root = tmp_path / "root"
    expected = f"refused {url}/tool: sha256 mismatch: expected {sha(RIGHT)}, got {sha(WRONG)}"
    with pytest.raises(DigestMismatch, match=re.escape(expected)):
        place_role(root, catalog, "pool-docker", "1.34.2", local_dir=None, allow_fetch=True,
                   downloads=Downloads(tmp_path / "downloads"))
    assert not root.exists()
    assert list((tmp_path / "downloads").iterdir()) == []


def test_place_role_records_an_unreachable_download_as_absent(tmp_path: Path) -> None:
    catalog = synthetic_catalog(tmp_path, f"http://127.0.0.1:{dead_port()}", sha(RIGHT), "0" * 64)
    results = place_role(tmp_path / "root", catalog, "pool-docker", "1.34.2", local_dir=None, allow_fetch=True,
                         downloads=Downloads(tmp_path / "downloads"))
    assert [r.present for r in results] == [False, False]
    assert all(r.origin.startswith("absent: cannot download http://127.0.0.1:") for r in results)
    assert not (tmp_path / "root").exists()


def test_a_download_shared_by_components_is_fetched_once(tmp_path: Path) -> None:
    calls: list[str] = []

    def fake_fetch(url: str, digest: str, dest: Path) -> str:
        calls.append(url)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(b"x")
        return sha(b"x")

    downloads = Downloads(tmp_path, fetcher=fake_fetch)
    item = CATALOG.resolve("control-plane", "1.34.2")[0]
    assert item.name == "kubernetes-server"
    assert downloads.get(item) == downloads.get(item) and calls == [item.url]


def test_a_kept_download_is_reused_only_while_it_matches_its_pin(tmp_path: Path) -> None:
    """The build keeps its downloads (kilonode.image.binaries.download_cache): a file there with
    the pinned digest is not fetched again; one that differs is fetched over."""
    calls: list[str] = []

    def fake_fetch(url: str, digest: str, dest: Path) -> str:
        calls.append(url)
        dest.write_bytes(b"fetched")
        return sha(b"fetched")

    item = CATALOG.resolve("control-plane", "1.34.2")[0]
    kept = tmp_path / download_name(item)
    kept.write_bytes(b"not the pinned file")
    assert Downloads(tmp_path, fetcher=fake_fetch).get(item) == kept and calls == [item.url]
    pinned_item = dataclasses.replace(item, pin=dataclasses.replace(item.pin, algorithm="sha256",
                                                                    digest=sha(b"fetched")))
    kept_pinned = tmp_path / download_name(pinned_item)
    kept_pinned.write_bytes(b"fetched")
    assert Downloads(tmp_path, fetcher=fake_fetch).get(pinned_item) == kept_pinned and calls == [item.url]
    assert download_cache() == cache_root() / "downloads"


def test_without_fetch_or_a_directory_the_pool_binaries_are_absent_with_the_reason(tmp_path: Path) -> None:
    root = tmp_path / "root"
    results = place_role(root, CATALOG, "pool-docker", "1.34.2", local_dir=None, allow_fetch=False,
                         downloads=Downloads(tmp_path / "downloads"))
    assert [r.name for r in results] == ["kubelet", "cri-dockerd", "crictl", "cni-plugins", "azure-cni"]
    *pinned, azure_cni = results
    # unpinned: never downloaded, absent with the reason and the way to supply it
    assert not azure_cni.present and azure_cni.pinned is None and azure_cni.version == "1.6.21"
    assert azure_cni.origin.startswith("absent: azure-cni 1.6.21: not pinned: no published digest")
    assert "--binaries DIR holding `azure-vnet`, `azure-vnet-ipam`" in azure_cni.origin
    for r in pinned:
        assert not r.present and r.sha256 is None
        assert r.origin.startswith("absent: not downloaded (no --fetch): pass --fetch to download https://")
        assert "--binaries DIR" in r.origin and r.pinned and r.pin_source
    assert "https://dl.k8s.io/release/v1.34.2/bin/linux/amd64/kubelet" in results[0].origin
    assert not root.exists() and not (tmp_path / "downloads").exists()


def test_binaries_from_a_local_directory_are_taken_as_given(tmp_path: Path) -> None:
    local = tmp_path / "bin"
    local.mkdir()
    (local / "kubelet").write_bytes(b"\x7fELF fake kubelet")
    root = tmp_path / "root"
    kubelet, cri_dockerd, *_ = place_role(root, CATALOG, "pool-docker", "1.34.2", local_dir=local,
                                          allow_fetch=False, downloads=Downloads(tmp_path / "downloads"))
    assert kubelet.present and kubelet.origin == f"local directory {local} (not the pinned file: taken as given)"
    assert kubelet.sha256 == sha(b"\x7fELF fake kubelet")
    assert (root / "usr/local/bin/kubelet").read_bytes() == b"\x7fELF fake kubelet"
    assert os.access(root / "usr/local/bin/kubelet", os.X_OK)
    assert not cri_dockerd.present and "`cri-dockerd`" in cri_dockerd.origin


DROPIN = "etc/systemd/system/containerd.service.d/20-kilonode-pinned-containerd.conf"


def test_placed_containerd_is_activated_and_an_absent_one_says_what_runs_instead(tmp_path: Path) -> None:
    local = tmp_path / "bin"
    local.mkdir()
    for name in ("containerd", "containerd-shim-runc-v2", "ctr"):
        (local / name).write_bytes(b"\x7fELF fake " + name.encode())
    placed = {r.name: r for r in place_role(tmp_path / "with", CATALOG, "pool-containerd", "1.34.2",
                                            local_dir=local, allow_fetch=False,
                                            downloads=Downloads(tmp_path / "d"))}
    containerd = placed["containerd"]
    assert containerd.present and containerd.activated == "/" + DROPIN
    dropin = (tmp_path / "with" / DROPIN).read_text()
    # systemd needs the empty ExecStart= to replace the package's, not to add a second one
    assert "[Service]\nExecStart=\nExecStart=/usr/local/bin/containerd\n" in dropin
    assert (tmp_path / "with" / "usr/local/bin/containerd").read_bytes() == b"\x7fELF fake containerd"
    assert containerd.manifest_entry()["activated"] == "/" + DROPIN
    assert placed["runc"].activated is None  # runc needs no switch: /usr/local/sbin is first on PATH

    absent = {r.name: r for r in place_role(tmp_path / "without", CATALOG, "pool-containerd", "1.34.2",
                                            local_dir=None, allow_fetch=False,
                                            downloads=Downloads(tmp_path / "d"))}["containerd"]
    assert not absent.present and absent.activated is None
    assert not (tmp_path / "without" / DROPIN).exists()
    assert "meanwhile containerd.service runs Debian's containerd 1.6 (/usr/bin/containerd)" in absent.origin


def test_an_unpinned_component_is_never_downloaded_even_with_fetch(tmp_path: Path) -> None:
    """A component with no digest and no lock (none in the shipped data: azure-cni's lock taken
    off here) is never downloaded: absent with the reason, or taken as given from --binaries."""
    from dataclasses import replace

    calls: list[str] = []

    def fetcher(url: str, expected: str | None, dest: Path) -> str:
        calls.append(url)
        raise Unreachable(f"{url}: offline")

    unlocked = replace(CATALOG.components["azure-cni"], lock=False)
    assert unlocked.unpinned and not unlocked.pins
    catalog = replace(CATALOG, roles={"pool-docker": ("azure-cni",)}, components={"azure-cni": unlocked})
    [absent] = place_role(tmp_path / "r", catalog, "pool-docker", "1.34.2", local_dir=None, allow_fetch=True,
                          downloads=Downloads(tmp_path / "d", fetcher))
    assert calls == [] and not absent.present and "not pinned" in absent.origin
    local = tmp_path / "bin"
    local.mkdir()
    for name in ("azure-vnet", "azure-vnet-ipam"):
        (local / name).write_bytes(b"given")
    [placed] = place_role(tmp_path / "r", catalog, "pool-docker", "1.34.2", local_dir=local, allow_fetch=True,
                          downloads=Downloads(tmp_path / "d", fetcher))
    assert calls == [] and placed.present and placed.origin.endswith("(taken as given: no digest is pinned)")


def test_a_locked_component_given_as_files_is_taken_as_given_even_with_fetch(tmp_path: Path) -> None:
    calls: list[str] = []

    def fetcher(url: str, expected: str | None, dest: Path) -> str:
        calls.append(url)
        raise Unreachable(f"{url}: offline")

    local = tmp_path / "bin"
    local.mkdir()
    (local / "azure-vnet").write_bytes(b"vnet")
    (local / "azure-vnet-ipam").write_bytes(b"ipam")
    given = place_role(tmp_path / "r2", CATALOG, "pool-docker", "1.34.2", local_dir=local, allow_fetch=True,
                       downloads=Downloads(tmp_path / "d", fetcher))[-1]
    assert not [url for url in calls if "azure-cni" in url]
    assert given.present and given.origin.endswith("(taken as given: no digest is pinned)")
    assert (tmp_path / "r2/opt/cni/bin/azure-vnet-ipam").read_bytes() == b"ipam"


def test_fetch_without_a_pin_is_refused_and_without_fetch_recorded(tmp_path: Path) -> None:
    with pytest.raises(PinError, match=r"--fetch: kubelet: no amd64 pin for version 1\.31\.4"):
        place_role(tmp_path / "r", CATALOG, "pool-docker", "1.31.4", local_dir=None, allow_fetch=True,
                   downloads=Downloads(tmp_path / "d"))
    kubelet = place_role(tmp_path / "r", CATALOG, "pool-docker", "1.31.4", local_dir=None, allow_fetch=False,
                         downloads=Downloads(tmp_path / "d"))[0]
    assert not kubelet.present and kubelet.origin.startswith("absent: kubelet: no amd64 pin for version 1.31.4")


# --- the data ---------------------------------------------------------------------------------------


def shipped_versions() -> set[str]:
    return {load_stack(name).config.kubernetes_version for name in available_stacks()}


def test_the_shipped_stacks_version_is_pinned_for_every_role() -> None:
    assert shipped_versions() == {"1.34.2"}
    for version in shipped_versions():
        for role in CATALOG.roles:
            resolved = CATALOG.resolve(role, version)
            unpinned = [c.name for c in CATALOG.unpinned(role)]
            assert [r.name for r in resolved] == [n for n in CATALOG.roles[role] if n not in unpinned]
    assert set(CATALOG.components) == {n for names in CATALOG.roles.values() for n in names}


def test_every_supported_minor_has_a_fully_pinned_patch_release() -> None:
    for minor in SUPPORTED_KUBERNETES_MINORS:
        versions = [v for v in CATALOG.components["kubernetes-server"].versions("amd64") if v.startswith(f"1.{minor}.")]
        assert versions, f"1.{minor}"
        for role in CATALOG.roles:
            CATALOG.resolve(role, max(versions, key=version_key))


def test_every_digest_is_well_formed_and_names_its_source() -> None:
    sources = RAW["sources"]
    for key, source in sources.items():
        assert source["repo"] and source["path"] and source["what"], key
        assert len(source["commit"]) == 40 and set(source["commit"]) <= set("0123456789abcdef"), key
    pins = [(name, pin) for name, c in RAW["components"].items() for pin in c.get("pins", {}).get("amd64", [])]
    # a component without pins says why, and is never downloaded
    assert {name for name, c in RAW["components"].items() if "pins" not in c} == {
        c.name for c in CATALOG.components.values() if c.unpinned} == {"azure-cni"}
    # ... and is locked: every shipped component has a delivery path (the NVIDIA container
    # toolkit is no component: it comes from NVIDIA's apt repository, recipe.toml)
    assert all(c.lock for c in CATALOG.components.values() if c.unpinned)
    assert len(pins) > 100
    for name, pin in pins:
        assert pin["source"] in sources, (name, pin)
        digests = {k: v for k, v in pin.items() if k in ("sha256", "sha512")}
        assert len(digests) == 1, (name, pin)
        ((algorithm, value),) = digests.items()
        assert len(value) == {"sha256": 64, "sha512": 128}[algorithm], (name, pin["version"])
        assert set(value) <= set("0123456789abcdef"), (name, pin["version"])
    # every URL is the upstream release over https
    assert all(c["url"].startswith("https://") for c in RAW["components"].values())


def test_the_roles_carry_what_each_machine_needs() -> None:
    def files(role: str) -> set[str]:
        return {Path(f.path).name for r in CATALOG.resolve(role, "1.34.2") for f in r.files}

    assert {"kubelet", "cri-dockerd", "crictl", "bridge", "loopback", "portmap"} <= files("pool-docker")
    containerd_pool = files("pool-containerd")
    assert {"kubelet", "containerd", "containerd-shim-runc-v2", "runc", "crictl", "loopback"} <= containerd_pool
    assert "cri-dockerd" not in files("pool-containerd") and "containerd" not in files("pool-docker")
    assert files("control-plane") == {"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"}
    assert {"etcd", "etcdctl"} <= files("etcd")
    assert {c.name: c.unit for c in CATALOG.components.values() if c.unit} == {
        "kubelet": "kubelet.service", "cri-dockerd": "cri-docker.service", "etcd": "etcd.service",
        "kubernetes-server": "kube-apiserver.service",
    }


def test_etcd_and_containerd_are_new_enough() -> None:
    etcd = CATALOG.resolve("etcd", "1.34.2")[0]
    assert etcd.name == "etcd" and version_key(etcd.version) >= (3, 5, 13)
    containerd = next(r for r in CATALOG.resolve("pool-containerd", "1.34.2") if r.name == "containerd")
    # image_pull_progress_timeout is a containerd 1.7 option; the config is the version-2 schema
    assert (1, 7) <= version_key(containerd.version)[:2] < (2, 0)
    assert "etcd-v3.5.33-linux-amd64/etcd" in {f.member for f in etcd.files}


def test_an_unpinned_version_is_refused_naming_what_is_pinned() -> None:
    with pytest.raises(PinError) as error:
        CATALOG.resolve("control-plane", "1.34.9")
    message = str(error.value)
    assert message.startswith("control-plane at Kubernetes 1.34.9: kubernetes-server: no amd64 pin for version 1.34.9")
    assert "1.34.0-1.34.7" in message and "kubectl" not in message  # kubespray lists kubectl 1.34.9
    with pytest.raises(PinError, match="no role 'tpu'"):
        CATALOG.resolve("tpu", "1.34.2")


def test_malformed_data_is_refused_naming_the_entry(tmp_path: Path) -> None:
    text = binaries.BINARIES_FILE.read_text()
    kubelet_1342 = "9c5e717b774ee9b9285ce47e7d2150c29e84837eb19a7eaa24b60b1543c9d58f"
    assert kubelet_1342 in text
    bad = tmp_path / "binaries.toml"
    bad.write_text(text.replace(kubelet_1342, kubelet_1342.upper()))
    with pytest.raises(PinError, match=r"component kubelet 1\.34\.2: sha256 must be 64 lowercase hex digits"):
        binaries.load(bad)
    bad.write_text(text.replace('source = "kubespray@57364f4"', 'source = "nowhere"', 1))
    with pytest.raises(PinError, match=r"source 'nowhere' is not in \[sources\]"):
        binaries.load(bad)


def locked_catalog(tmp_path: Path, url: str) -> binaries.Catalog:
    """The shipped data's pool-docker role with its locked azure-cni served from loopback, and
    a lock file of its own."""
    from dataclasses import replace

    azure = CATALOG.components["azure-cni"]
    assert azure.lock and not azure.pins
    served = replace(azure, url=azure.url.replace("https://packages.aks.azure.com", url))
    lock_file = tmp_path / "binaries.lock.toml"
    return replace(CATALOG, roles={"pool-docker": ("azure-cni",)}, components={"azure-cni": served},
                   locked=binaries.load_lock(lock_file), lock_file=lock_file)


def test_a_locked_download_is_recorded_at_first_fetch_then_verified_and_a_change_refused(
        server: Served, tmp_path: Path) -> None:
    url, www, requests = server
    name = "azure-vnet-cni-linux-amd64-v1.6.21.tgz"
    (www / "azure-cni" / "v1.6.21" / "binaries").mkdir(parents=True)
    served = www / "azure-cni" / "v1.6.21" / "binaries" / name
    first = tarball({"azure-vnet": b"vnet", "azure-vnet-ipam": b"ipam", "10-azure.conflist": b"{}"})
    served.write_bytes(first)

    def build(catalog: binaries.Catalog, at: str) -> list[Any]:
        return place_role(tmp_path / at, catalog, "pool-docker", "1.34.2", local_dir=None, allow_fetch=True,
                          downloads=Downloads(tmp_path / f"downloads-{at}"))

    catalog = locked_catalog(tmp_path, url)
    [placed] = build(catalog, "one")
    assert placed.present and "first fetch: sha256" in placed.origin
    assert (tmp_path / "one/opt/cni/bin/azure-vnet-ipam").read_bytes() == b"ipam"
    lock = tomllib.loads(catalog.lock_file.read_text())  # type: ignore[union-attr]
    [entry] = lock["lock"]
    assert entry["component"] == "azure-cni" and entry["version"] == "1.6.21" and entry["arch"] == "amd64"
    assert entry["url"] == f"{url}/azure-cni/v1.6.21/binaries/{name}" and entry["sha256"] == sha(first)
    assert entry["recorded"] and not list(tmp_path.glob(".binaries.lock.toml.*"))

    # a later build verifies against the entry (and leaves the lock as it was)
    before = catalog.lock_file.read_text()  # type: ignore[union-attr]
    [again] = build(locked_catalog(tmp_path, url), "two")
    assert again.present and f"sha256 {sha(first)} as locked" in again.origin
    assert catalog.lock_file.read_text() == before  # type: ignore[union-attr]

    # the same URL serving something else is refused, naming both digests
    changed = tarball({"azure-vnet": b"evil", "azure-vnet-ipam": b"ipam"})
    served.write_bytes(changed)
    with pytest.raises(DigestMismatch, match=f"expected {sha(first)}, got {sha(changed)}"):
        build(locked_catalog(tmp_path, url), "three")
    assert not (tmp_path / "three").exists() and requests.count(f"/azure-cni/v1.6.21/binaries/{name}") == 3


def test_without_fetch_a_locked_component_is_absent_saying_how_to_lock_it(tmp_path: Path) -> None:
    catalog = locked_catalog(tmp_path, "http://127.0.0.1:9")
    [absent] = place_role(tmp_path / "root", catalog, "pool-docker", "1.34.2", local_dir=None, allow_fetch=False,
                          downloads=Downloads(tmp_path / "downloads"))
    assert not absent.present and "locked at the first --fetch" in absent.origin
