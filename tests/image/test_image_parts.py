"""Fast tests of the image build's parts: archives, the pause program, GPT/debugfs access,
hygiene, the mirror scrubber, the cache key, the verify report and the CLI's errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from kilonode.image import cache, mirror, rootfs
from kilonode.image.containers import compile_pause, describe_archive, single_binary_image
from kilonode.image.disk import ESP_TYPE, LINUX_ROOT_X86_64, ImageFs, assemble, gpt_partitions, make_esp
from kilonode.image.recipe import load_recipe
from kilonode.image.verify import SshTarget, VerifyReport, merge
from kilonode.paths import REPO_ROOT

RECIPE = load_recipe()


@pytest.fixture(scope="module")
def pause_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_pause(RECIPE.pause_source, tmp_path_factory.mktemp("pause") / "pause")


@pytest.mark.parametrize("signo", [signal.SIGTERM, signal.SIGINT])
def test_pause_exits_zero_at_once_on_stop_signals(pause_binary: Path, signo: int) -> None:
    proc = subprocess.Popen([str(pause_binary)], stderr=subprocess.PIPE)
    time.sleep(0.3)
    assert proc.poll() is None, "pause must keep running until signalled"
    proc.send_signal(signo)
    assert proc.wait(timeout=5) == 0


def elf_segment_types(binary: Path) -> tuple[int, set[int]]:
    """(e_type, the p_type of every program header) of a 64-bit little-endian ELF file."""
    data = binary.read_bytes()
    assert data[:6] == b"\x7fELF\x02\x01", "not a 64-bit little-endian ELF file"
    e_type = int.from_bytes(data[16:18], "little")
    phoff, phentsize, phnum = (int.from_bytes(data[32:40], "little"), int.from_bytes(data[54:56], "little"),
                               int.from_bytes(data[56:58], "little"))
    return e_type, {int.from_bytes(data[phoff + i * phentsize:][:4], "little") for i in range(phnum)}


def test_pause_is_static(pause_binary: Path) -> None:
    """The image holds nothing but /pause: no program interpreter, no dynamic section."""
    e_type, segments = elf_segment_types(pause_binary)
    pt_load, pt_dynamic, pt_interp = 1, 2, 3
    assert e_type == 2  # ET_EXEC
    assert pt_load in segments and not {pt_dynamic, pt_interp} & segments, sorted(segments)


def test_pause_archive_is_docker_and_oci_and_deterministic(pause_binary: Path, tmp_path: Path) -> None:
    a = single_binary_image("registry.k8s.io/pause:3.10", pause_binary, "/pause", tmp_path / "a.tar")
    b = single_binary_image("registry.k8s.io/pause:3.10", pause_binary, "/pause", tmp_path / "b.tar")
    assert a.sha256 == b.sha256 and a.image_id == b.image_id
    with tarfile.open(a.path) as tar:
        names = set(tar.getnames())
        docker = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        config_blob = tar.extractfile(docker[0]["Config"]).read()  # type: ignore[union-attr]
        layer = tar.extractfile(docker[0]["Layers"][0])
        with tarfile.open(fileobj=layer) as inner:
            pause = inner.getmember("pause")
    assert {"manifest.json", "index.json", "oci-layout"} <= names
    assert docker[0]["RepoTags"] == ["registry.k8s.io/pause:3.10"]
    assert index["manifests"][0]["annotations"]["io.containerd.image.name"] == "registry.k8s.io/pause:3.10"
    assert json.loads(config_blob)["config"]["Entrypoint"] == ["/pause"]
    assert a.image_id == "sha256:" + __import__("hashlib").sha256(config_blob).hexdigest()
    assert pause.mode == 0o755 and pause.uid == 0
    assert describe_archive("registry.k8s.io/pause:3.10", a.path).image_id == a.image_id


def test_user_archive_must_be_docker_archive_of_that_image(pause_binary: Path, tmp_path: Path) -> None:
    archive = single_binary_image("example.com/big:1", pause_binary, "/pause", tmp_path / "a.tar")
    with pytest.raises(ValueError, match=r"not example\.com/other:1"):
        describe_archive("example.com/other:1", archive.path)
    oci_only = tmp_path / "oci.tar"
    with tarfile.open(archive.path) as src, tarfile.open(oci_only, "w") as dst:
        for member in src.getmembers():
            if member.name != "manifest.json":
                dst.addfile(member, src.extractfile(member))
    with pytest.raises(ValueError, match="docker-archive"):
        describe_archive("example.com/big:1", oci_only)


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("disk")
    tree = work / "tree"
    (tree / "etc/ssh").mkdir(parents=True)
    (tree / "etc/hostname").write_text("builder\n")
    (tree / "etc/ssh/ssh_host_ed25519_key").write_text("secret")
    (tree / "etc/sysctl.d").mkdir()
    (tree / "etc/sysctl.d/90-kilonode.conf").write_text("net.ipv4.neigh.default.gc_thresh3 = 100000\n")
    esp = make_esp(work / "esp.img", 40, "0b3f6a52-5d0b-4d5e-9a44-2f0a8f1f0c11", work)
    disk = work / "disk.raw"
    assemble(disk, tree, esp, size_mib=96, esp_size_mib=40, root_uuid="0b3f6a52-5d0b-4d5e-9a44-2f0a8f1f0c11",
             root_label="kn-root")
    return disk


def test_gpt_has_esp_and_root(small_disk: Path) -> None:
    parts = gpt_partitions(small_disk)
    assert [p.type_guid for p in parts] == [ESP_TYPE, LINUX_ROOT_X86_64]
    assert parts[0].start == 1 << 20 and parts[0].size == 40 << 20
    assert parts[1].start == parts[0].start + parts[0].size
    listing = subprocess.run(["mdir", "-b", "-i", f"{small_disk}@@{parts[0].start}", "::/EFI/BOOT"],
                             capture_output=True, text=True, check=True).stdout
    assert "BOOTX64.EFI" in listing


def test_image_fs_reads_and_edits_in_place(small_disk: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.raw"
    subprocess.run(["cp", "--sparse=always", str(small_disk), str(copy)], check=True)
    fs = ImageFs(copy)
    assert fs.read_text("/etc/sysctl.d/90-kilonode.conf") == "net.ipv4.neigh.default.gc_thresh3 = 100000\n"
    assert fs.read("/etc/nope") is None
    assert "ssh_host_ed25519_key" in fs.listdir("/etc/ssh")
    fs.write("/etc/sysctl.d/90-kilonode.conf", b"net.ipv4.neigh.default.gc_thresh3 = 1024\n", 0o600)
    assert fs.read("/etc/sysctl.d/90-kilonode.conf") == b"net.ipv4.neigh.default.gc_thresh3 = 1024\n"
    assert fs.stat("/etc/sysctl.d/90-kilonode.conf")["mode"] in ("0600", "600")  # type: ignore[index]
    fs.remove("/etc/hostname")
    assert fs.read("/etc/hostname") is None
    # the original is untouched
    assert ImageFs(small_disk).read("/etc/hostname") == b"builder\n"


def test_scrub_image_removes_identity_and_sources(tmp_path: Path) -> None:
    root = tmp_path
    for path, text in {
        "etc/machine-id": "0123456789abcdef0123456789abcdef\n",
        "var/lib/dbus/machine-id": "0123456789abcdef0123456789abcdef\n",
        "etc/ssh/ssh_host_rsa_key": "k",
        "etc/apt/sources.list.d/0000debian.sources": "URIs: http://mirror.invalid/debian\n",
        "etc/apt/apt.conf.d/99mmdebstrap": "x",
        "etc/hostname": "builder\n",
        "etc/shadow": "root:$6$abc$def:1::::::\ndebian:!:1::::::\nnobody:*:1::::::\n",
        "var/lib/apt/lists/mirror.invalid_debian_dists_bookworm_InRelease": "x",
    }.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    rootfs.scrub_image(root)
    assert (root / "etc/machine-id").read_text() == ""
    assert not (root / "var/lib/dbus/machine-id").exists()
    assert not list((root / "etc/ssh").iterdir())
    assert not list((root / "etc/apt/sources.list.d").iterdir())
    assert not (root / "etc/apt/apt.conf.d/99mmdebstrap").exists()
    assert not (root / "etc/hostname").exists()
    assert [p.name for p in (root / "var/lib/apt/lists").iterdir()] == ["partial"]
    assert (root / "etc/shadow").read_text().splitlines()[0].startswith("root:*:")


def test_mirror_names_found_and_scrubbed(tmp_path: Path) -> None:
    sources = tmp_path / "debian.sources"
    sources.write_text("Types: deb\n# http://snap.mirror.invalid/archive/x\nURIs: http://deb.mirror.invalid/debian\n")
    hosts = mirror.mirror_hosts(sources)
    assert hosts == ["deb.mirror.invalid", "snap.mirror.invalid"]
    scrubbed = mirror.scrub("Get:1 http://DEB.mirror.invalid/debian bookworm", hosts)
    assert scrubbed == "Get:1 http://<mirror>/debian bookworm"
    root = tmp_path / "root"
    (root / "etc/apt").mkdir(parents=True)
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("")
    (root / "etc/apt/leftover.conf").write_text("Acquire::http::Proxy http://deb.mirror.invalid;\n")
    assert rootfs.find_mirror_names(root, hosts) == ["/etc/apt/leftover.conf"]


def test_cache_key_follows_inputs() -> None:
    inputs = RECIPE.base_inputs("docker", "0" * 64)
    assert cache.key_of(inputs) == cache.key_of(dict(reversed(list(inputs.items()))))
    assert cache.key_of(inputs) != cache.key_of(RECIPE.base_inputs("containerd", "0" * 64))
    assert cache.key_of(inputs) != cache.key_of({**inputs, "packages": [*inputs["packages"], "htop"]})  # type: ignore[list-item]
    assert "docker.io" in RECIPE.package_list("docker") and "docker.io" not in RECIPE.package_list("containerd")


def test_cache_root_honours_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_root() == tmp_path / "kilonode"


def test_verify_report_names_failed_checks_by_phase(tmp_path: Path) -> None:
    junit = tmp_path / "junit-first-boot.xml"
    junit.write_text(
        '<testsuites><testsuite name="first-boot">'
        '<testcase classname="tests.image.suite.test_kernel_params" '
        'name="test_sysctl_live_value_matches_plan[net.ipv4.neigh.default.gc_thresh3]">'
        '<failure message="AssertionError: gc_thresh3 is 1024">x</failure></testcase>'
        '<testcase classname="tests.image.suite.test_services" name="test_no_failed_units"/>'
        "</testsuite></testsuites>"
    )
    report = VerifyReport(junit=tmp_path / "out.xml")
    merge([junit], report.junit, report)
    assert not report.passed
    assert report.failures == [
        "first-boot: test_kernel_params::test_sysctl_live_value_matches_plan[net.ipv4.neigh.default.gc_thresh3]"
        " — AssertionError: gc_thresh3 is 1024"
    ]
    assert report.counts == {"first-boot": {"failed": 1, "passed": 1}}


def test_ssh_target_parse() -> None:
    assert SshTarget.parse("azureuser@10.0.2.4:2222") == SshTarget("azureuser", "10.0.2.4", 2222)
    assert SshTarget.parse("10.0.2.4").user == "debian"


def kilonode(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kilonode.cli", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          check=False, env={**os.environ, "COLUMNS": "200"})


def test_build_bad_stack_exits_2_with_problems(tmp_path: Path) -> None:
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text("config:\n  kilonode:cluster:\n    name: x\n    nodePools: nope\n")
    result = kilonode("image", "build", str(bad), "--pool", "cpu", "--out", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"kilonode: 1 problem in {bad}; nothing was written\n"
                             f"{bad}:4: nodePools: Input should be a valid tuple (got 'nope')\n")
    assert not (tmp_path / "out").exists()


def test_build_unknown_pool_names_the_pools(tmp_path: Path) -> None:
    result = kilonode("image", "build", "local", "--pool", "gpu", "--out", str(tmp_path / "out"))
    assert result.returncode == 2  # bad input, not a failed check
    assert result.stderr == "kilonode image build: no node pool 'gpu' in cluster local; its pools: cpu\n"
    assert not (tmp_path / "out").exists()


def test_verify_missing_image_exits_2(tmp_path: Path) -> None:
    result = kilonode("image", "verify", str(tmp_path / "nope.raw"))
    assert result.returncode == 2
    assert result.stderr == f"kilonode image verify: {tmp_path / 'nope.raw'} not found\n"


@pytest.mark.parametrize(("args", "message"), [
    ([], "give --pool NAME (a node pool's image) or --role etcd|control-plane (the control plane's), not both or "
         "neither"),
    (["--pool", "cpu", "--role", "etcd"], "not both or neither"),
    (["--role", "etcd-main"], "--role 'etcd-main': the roles are etcd (etcd members of both clusters"),
])
def test_build_needs_a_pool_or_a_control_plane_role(tmp_path: Path, args: list[str], message: str) -> None:
    result = kilonode("image", "build", "local", *args, "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert message in " ".join(result.stderr.split())
    assert not (tmp_path / "out").exists()
