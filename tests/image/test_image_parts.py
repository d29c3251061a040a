"""Fast tests of the image build's parts: archives, the pause program, GPT/debugfs access,
hygiene, the mirror scrubber, the cache key, the verify report and the CLI's errors."""

from __future__ import annotations

import io
import json
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kilonode.cli import main
from kilonode.config import load_stack
from kilonode.config.model import ROLE_IMAGES
from kilonode.digest import sha256_file
from kilonode.image import cache, mirror, needs, rootfs, vendor_apt
from kilonode.image import gpu as accel
from kilonode.image.containers import compile_pause, describe_archive, single_binary_image
from kilonode.image.disk import ESP_TYPE, LINUX_ROOT_X86_64, ImageFs, assemble, gpt_partitions, make_esp
from kilonode.image.recipe import BaseSpec, load_recipe, read_list
from kilonode.image.verify import SshTarget, VerifyReport, merge
from kilonode.node import ship
from kilonode.node.ship import (
    CERT_EXPIRY,
    ETCD_SNAPSHOT,
    GPU_HEALTH,
    LOCAL_DISK_SETUP,
    NODE_CLIENT_APPROVER,
    POD_TRAFFIC,
    PROGRAMS,
)
from kilonode.paths import REPO_ROOT
from kilonode.plan import ClusterPlan
from kilonode.plan.resolve.pools import image_extras
from kilonode.render import pool as render_pool
from tests import shared

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

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
    with pytest.raises(ValueError, match=r"must hold example\.com/other:1 alone"):
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


@dataclass(frozen=True)
class Exited:
    returncode: int
    stderr: str


Kilonode = Callable[..., Exited]


@pytest.fixture
def kilonode(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Kilonode:
    """`kilonode ARGS` run in this process, as the console script runs it (a real process per
    call would start the interpreter and import the package each time; tests/test_cli_help.py
    and tests/test_cli_errors.py start the real entry point)."""
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(REPO_ROOT)

    def run(*args: str) -> Exited:
        monkeypatch.setattr(sys, "argv", ["kilonode", *args])
        with pytest.raises(SystemExit) as done:
            main()
        return Exited(int(done.value.code or 0), capsys.readouterr().err)

    return run


def test_build_bad_stack_exits_2_with_problems(kilonode: Kilonode, tmp_path: Path) -> None:
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text("config:\n  kilonode:cluster:\n    name: x\n    nodePools: nope\n"
                   "    joinTokens: {current: {generation: 1, expires: '2027-11-30T00:00:00Z'}}\n")
    result = kilonode("image", "build", str(bad), "--pool", "cpu", "--out", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"kilonode: 1 problem in {bad}; nothing was written\n"
                             f"{bad}:4: nodePools: Input should be a valid tuple (got 'nope')\n")
    assert not (tmp_path / "out").exists()


def test_build_unknown_pool_names_the_pools(kilonode: Kilonode, tmp_path: Path) -> None:
    result = kilonode("image", "build", "local", "--pool", "gpu", "--out", str(tmp_path / "out"))
    assert result.returncode == 2  # bad input, not a failed check
    assert result.stderr == "kilonode image build: no node pool 'gpu' in cluster local; its pools: cpu\n"
    assert not (tmp_path / "out").exists()


def test_verify_missing_image_exits_2(kilonode: Kilonode, tmp_path: Path) -> None:
    result = kilonode("image", "verify", str(tmp_path / "nope.raw"))
    assert result.returncode == 2
    assert result.stderr == f"kilonode image verify: {tmp_path / 'nope.raw'} not found\n"


@pytest.mark.parametrize(("args", "message"), [
    ([], "give one of --pool NAME (a node pool's image), --role etcd|control-plane (the control plane's) or --all "
         "(every image the stack boots)"),
    (["--pool", "cpu", "--role", "etcd"], "give one of --pool NAME"),
    (["--pool", "cpu", "--all"], "give one of --pool NAME"),
    (["--role", "etcd-main"], "--role 'etcd-main': the roles are etcd (etcd members of both clusters"),
])
def test_build_needs_a_pool_or_a_control_plane_role(kilonode: Kilonode, tmp_path: Path, args: list[str],
                                                    message: str) -> None:
    result = kilonode("image", "build", "local", *args, "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert message in " ".join(result.stderr.split())
    assert not (tmp_path / "out").exists()


def test_build_all_builds_every_image_the_program_uploads_in_order(
        kilonode: Kilonode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--all builds what `pulumi up` uploads (ClusterPlan.boot_images, the program's gallery_images),
    each pool's then the roles', and stops at the first failure saying which were built."""
    from kilonode.azure.node_image import gallery_images
    from kilonode.cli import image as image_cli
    from kilonode.config import load_stack
    from kilonode.image import build as image_build
    from kilonode.image.rootfs import BuildError
    from kilonode.plan import plan_stack

    asked: list[str] = []

    def fake_build(inputs: image_build.ImageInputs, out_dir: Path, **_: object) -> None:
        asked.append(inputs.pool.name if inputs.pool is not None else str(inputs.role))
        if inputs.role == "control-plane":
            raise BuildError("stopped here")  # the last image fails

    monkeypatch.setattr(image_build, "build_image", fake_build)
    monkeypatch.setattr(image_cli, "_print_built", lambda *_: None)
    result = kilonode("image", "build", "research-7500", "--all", "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    uploaded = [image.name for image in gallery_images(plan_stack(load_stack("research-7500")))]
    assert asked == uploaded
    assert " ".join(result.stderr.split()) == (
        f"kilonode image build: control-plane: stopped here (built: {', '.join(uploaded[:-1])})")
    assert {"system", "monitoring", "a100-ib", "h100-ib"} <= set(uploaded)


# --- GPU and InfiniBand pools: which base, its cache key, the runtime's NVIDIA configuration ---

PLAIN_INPUT_KEYS = {"recipe_version", "suite", "variant", "flavour", "packages", "package_files", "sources_sha256"}


def test_extras_follow_the_pools_size(plans: dict[str, ClusterPlan]) -> None:
    """GPU software only where the size has GPUs, RDMA only where it has InfiniBand."""
    chosen = {
        (stack, p.name): BaseSpec(p.runtime, p.image_extras).label
        for stack, plan in plans.items() for p in plan.node_pools
    }
    assert chosen == {
        ("local", "cpu"): "docker",
        ("research-2500", "nc-a100"): "containerd+gpu",
        ("research-7500", "a100-ib"): "docker+gpu+infiniband",
        ("research-7500", "h100-ib"): "docker+gpu+infiniband",
        ("research-2500", "system"): "containerd",
        ("research-7500", "system"): "docker",
        # the Prometheus pools: memory-optimised E sizes, no GPU, no InfiniBand
        ("research-2500", "monitoring"): "containerd",
        ("research-7500", "monitoring"): "docker",
    }
    assert image_extras(0, True) == ("infiniband",)  # an HPC size: InfiniBand, no GPU
    with pytest.raises(ValueError, match="no extras"):
        BaseSpec("control", ("gpu",))


def test_plain_bases_keep_their_cache_keys() -> None:
    """A base without extras hashes exactly what it hashed before extras existed (the same
    dict the earlier code built), so no machine rebuilds its plain bases for this change."""
    for flavour in ("docker", "containerd", "control"):
        inputs = RECIPE.base_inputs(flavour, "0" * 64)
        before = {
            "recipe_version": RECIPE.version, "suite": RECIPE.suite, "variant": RECIPE.variant, "flavour": flavour,
            "packages": read_list(RECIPE.package_files["base"]) + read_list(RECIPE.package_files[flavour]),
            "package_files": {n: sha256_file(RECIPE.package_files[n]) for n in ("base", flavour)},
            "sources_sha256": "0" * 64,
        }
        assert set(inputs) == PLAIN_INPUT_KEYS
        assert cache.key_of(inputs) == cache.key_of(before)


def test_gpu_base_key_hashes_every_input(tmp_path: Path) -> None:
    keys = {
        extras: cache.key_of(RECIPE.base_inputs("docker", "0" * 64, extras, hook_sha256="1" * 64))
        for extras in ((), ("gpu",), ("infiniband",), ("gpu", "infiniband"))
    }
    assert len(set(keys.values())) == 4
    gpu = RECIPE.base_inputs("docker", "0" * 64, ("gpu",), hook_sha256="1" * 64)
    assert cache.key_of(gpu) != cache.key_of(RECIPE.base_inputs("docker", "0" * 64, ("gpu",), hook_sha256="2" * 64))
    # an edit of gpu.txt (even a comment) is a new key
    copy = tmp_path / "node-image"
    shutil.copytree(RECIPE.root, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "packages/gpu.txt").write_text((copy / "packages/gpu.txt").read_text() + "# edited\n")
    edited = load_recipe(copy).base_inputs("docker", "0" * 64, ("gpu",), hook_sha256="1" * 64)
    assert cache.key_of(edited) != cache.key_of(gpu)
    # and the DKMS hook's text enters through hook_sha256
    assert rootfs.dkms_hook(("nvidia",)) != rootfs.dkms_hook(("nvidia", "nvidia-uvm"))


def test_gpu_package_list_pins_one_driver_version_headless() -> None:
    gpu = read_list(RECIPE.extras["gpu"].package_file)
    pinned = {name: version for name, _, version in (p.partition("=") for p in gpu) if version}
    driver = {accel.DRIVER_MODULE_PACKAGE, "nvidia-open-kernel-support", "firmware-nvidia-gsp", "nvidia-smi",
              "libcuda1", "libnvidia-ml1", "nvidia-alternative"}
    assert driver <= set(pinned) and "nvidia-modprobe" in pinned
    # the driver's own packages are one version (nvidia-modprobe is a source of its own)
    assert len({v for p, v in pinned.items() if p != "nvidia-modprobe"}) == 1, pinned
    names = {p.partition("=")[0] for p in gpu}
    assert not names & {"nvidia-driver", "xserver-xorg-video-nvidia", "xserver-xorg-core"}, "not headless"
    # the open module, for GPUDirect RDMA by DMA-BUF, and never beside the proprietary one
    assert accel.DRIVER_MODULE_PACKAGE == "nvidia-open-kernel-dkms" and "nvidia-kernel-dkms" not in names
    # DKMS builds against the headers of the kernel flavour the base boots: the recipe adds them
    assert "linux-image-cloud-amd64" in read_list(RECIPE.package_files["base"])
    assert "linux-headers-cloud-amd64" in RECIPE.package_list("docker", ("gpu",))
    assert {"linux-image-amd64", "linux-headers-amd64"} <= set(RECIPE.package_list("docker", ("gpu", "infiniband")))
    assert "linux-image-cloud-amd64" not in RECIPE.package_list("docker", ("gpu", "infiniband"))
    names = set(RECIPE.package_list("docker", ("gpu",)))
    assert {"libcublas11", "libcudart11.0", "python3-numpy"} <= names
    assert read_list(RECIPE.extras["infiniband"].package_file) == ["rdma-core", "ibverbs-utils", "infiniband-diags",
                                                                   "perftest"]
    assert RECIPE.components(("gpu",)) == ("contrib", "non-free", "non-free-firmware")
    assert RECIPE.components(("infiniband",)) == ()


# A driver-branch version (535.261.03, 535.309.01-0+deb12u1) in the manual or the catalogue.
DRIVER_LIKE = re.compile(r"\b5\d\d\.\d{2,3}\.\d{2}\b")
# What may name another release of the branch nearby: nvidia-modprobe (a source of its own,
# pinned to the newest) and the security update the open module lacks (packages/gpu.txt).
OTHER_RELEASE_CONTEXT = ("nvidia-modprobe", "security", "proprietary")


def test_the_manual_and_the_catalogue_name_the_driver_the_image_pins() -> None:
    """Independent trace: docs said 535.309.01 after the image moved to the open module's
    535.261.03. Any other release of the branch must say why it is there (within its line and
    the one before)."""
    gpu = read_list(RECIPE.extras["gpu"].package_file)
    pinned = dict(p.partition("=")[::2] for p in gpu)
    driver = vendor_apt.upstream_version(pinned[accel.DRIVER_MODULE_PACKAGE])
    root = REPO_ROOT or Path()
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md")),
             *sorted((root / "infra/kilonode/catalog").glob("*.yaml"))]
    stale: list[str] = []
    for page in pages:
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines):
            context = " ".join(lines[max(0, number - 1):number + 1])
            for found in DRIVER_LIKE.findall(line):
                if found != driver and not any(word in context for word in OTHER_RELEASE_CONTEXT):
                    stale.append(f"{page.relative_to(root)}:{number + 1}: {found} (the driver is {driver})")
    assert stale == []


def test_derived_sources_add_components_and_change_nothing_else() -> None:
    host = (
        "Types: deb\n# http://deb.mirror.invalid/archive/debian/20250520T000000Z\n"
        "URIs: http://deb.mirror.invalid/debian\nSuites: bookworm bookworm-updates\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: http://deb.mirror.invalid/debian-security\nSuites: bookworm-security\n"
        "Components: main non-free\n"
    )
    derived = rootfs.derive_sources(host, ("contrib", "non-free", "non-free-firmware"))
    # each missing component once, after those the stanza has (order kept)
    assert "Components: main contrib non-free non-free-firmware\n" in derived
    assert "Components: main non-free contrib non-free-firmware\n" in derived
    assert [line for line in derived.splitlines() if not line.startswith("Components:")] == [
        line for line in host.splitlines() if not line.startswith("Components:")
    ]


def test_a_gpu_the_driver_cannot_drive_is_refused(plans: dict[str, ClusterPlan]) -> None:
    pool = next(p for p in plans["research-7500"].node_pools if p.name == "h100-ib")
    assert accel.unsupported_gpu(RECIPE, pool) is None
    amd = pool.model_copy(update={"vm_size": "Standard_ND96isr_MI300X_v5", "gpu_model": "AMD Instinct MI300X 192GB"})
    refused = accel.unsupported_gpu(RECIPE, amd)
    assert refused and "AMD" in refused and "h100-ib" in refused and "unsupported_models" in refused
    cpu = plans["local"].node_pools[0]
    assert accel.unsupported_gpu(RECIPE, cpu) is None


# Docker 20.10's daemon.json keys kilonode writes, each read off moby's daemon/config
# (config.go CommonConfig / config_unix.go) at v20.10: an unknown key stops dockerd.
DOCKER_20_10_KEYS = {
    "data-root", "storage-driver", "max-concurrent-downloads", "exec-opts", "live-restore", "log-driver", "log-opts",
    "runtimes", "default-runtime",
    # moby 20.10 daemon/config/config_unix.go: Ulimits `json:"default-ulimits"` (InfiniBand pools: memlock)
    "default-ulimits",
}


def test_gpu_pools_render_the_nvidia_runtime_beside_the_plain_config(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["research-7500"]
    pool = next(p for p in plan.node_pools if p.name == "h100-ib")
    files = shared.rendered("research-7500")["pool-h100-ib"]
    plain = json.loads(files[render_pool.DOCKER_DAEMON_JSON].content)
    nvidia = json.loads(files[render_pool.DOCKER_DAEMON_NVIDIA_JSON].content)
    assert set(nvidia) <= DOCKER_20_10_KEYS and set(plain) <= DOCKER_20_10_KEYS
    assert "runtimes" not in plain and "default-runtime" not in plain
    assert nvidia["runtimes"] == {"nvidia": {"path": "/usr/bin/nvidia-container-runtime"}}
    assert nvidia["default-runtime"] == "nvidia"
    assert {k: v for k, v in nvidia.items() if k not in ("runtimes", "default-runtime")} == plain
    # both reach the node through its user-data too (cloud-init rewrites them at first boot)
    assert "/etc/docker/daemon-nvidia.json" in files["user-data"].content
    # the drop-in the build writes with the toolkit starts dockerd on that file, nothing else changed
    config = accel.nvidia_runtime_config(pool, files)
    assert config == "/" + render_pool.DOCKER_DAEMON_NVIDIA_JSON
    path, text = accel.runtime_dropin(pool, config, "/usr/bin/containerd")
    assert path == "/etc/systemd/system/docker.service.d/30-kilonode-nvidia-runtime.conf"
    execs = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    assert execs == ["ExecStart=", "ExecStart=/usr/sbin/dockerd -H fd:// --containerd=/run/containerd/containerd.sock "
                     "--config-file=/etc/docker/daemon-nvidia.json $DOCKER_OPTS"]
    assert render_pool.DOCKER_DAEMON_NVIDIA_JSON not in shared.rendered("local")["pool-cpu"]


def test_containerd_gpu_pool_config_parses_and_defaults_to_nvidia(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["research-2500"]
    pool = plan.node_pools[0]
    files = shared.rendered("research-2500")[f"pool-{pool.name}"]
    plain = tomllib.loads(files[render_pool.CONTAINERD_CONFIG].content)
    nvidia = tomllib.loads(files[render_pool.CONTAINERD_NVIDIA_CONFIG].content)
    cri = nvidia["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert cri["default_runtime_name"] == "nvidia"
    assert cri["runtimes"]["nvidia"] == {
        "runtime_type": "io.containerd.runc.v2",
        "options": {"BinaryName": "/usr/bin/nvidia-container-runtime", "SystemdCgroup": True},
    }
    assert cri["runtimes"]["runc"] == plain["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"]
    assert plain["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["default_runtime_name"] == "runc"
    assert "nvidia" not in files[render_pool.CONTAINERD_CONFIG].content
    # the rest of the config is the plain one: the variant only adds the runtime
    nvidia["plugins"]["io.containerd.grpc.v1.cri"]["containerd"] = plain["plugins"]["io.containerd.grpc.v1.cri"][
        "containerd"]
    assert nvidia == plain
    # with the pinned containerd placed, the drop-in runs it (it replaces the 20- drop-in's ExecStart)
    config = accel.nvidia_runtime_config(pool, files)
    assert config == "/" + render_pool.CONTAINERD_NVIDIA_CONFIG
    assert accel.nvidia_runtime_config(pool, {k: v for k, v in files.items() if "nvidia" not in k}) is None
    path, text = accel.runtime_dropin(pool, config, "/usr/local/bin/containerd")
    assert path.endswith("containerd.service.d/30-kilonode-nvidia-runtime.conf")
    assert "ExecStart=\nExecStart=/usr/local/bin/containerd --config /etc/containerd/config-nvidia.toml\n" in text


def test_the_node_programs_are_placed_where_ship_says(tmp_path: Path) -> None:
    entries = rootfs.place_program(tmp_path, GPU_HEALTH)
    paths = {e["path"] for e in entries}
    shipped = [p for p in GPU_HEALTH.path.iterdir() if p.suffix in (".py", ".toml")]
    expected = {f"{GPU_HEALTH.machine_path}/{p.name}" for p in shipped}
    assert paths == expected | {f"{GPU_HEALTH.pythonpath}/kilonode/__init__.py"}
    assert any(p.endswith(".toml") for p in paths)
    # the node's python3, not this virtualenv: only the standard library (numpy is imported by
    # the active check when it runs, not at import)
    pythonpath = tmp_path / str(GPU_HEALTH.pythonpath).lstrip("/")
    result = subprocess.run(
        ["/usr/bin/python3", "-c", "import kilonode.gpu.agent, kilonode.gpu.rules; print(kilonode.gpu.__file__)"],
        env={"PYTHONPATH": str(pythonpath), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(str(pythonpath))
    # the local-disk setup: one executable file, the node program's bytes, at the unit's path
    [entry] = rootfs.place_program(tmp_path, LOCAL_DISK_SETUP)
    placed = tmp_path / LOCAL_DISK_SETUP.machine_path.lstrip("/")
    assert entry["path"] == "/usr/local/lib/kilonode/local-disk-setup" and entry["mode"] == "0755"
    assert placed.read_bytes() == LOCAL_DISK_SETUP.path.read_bytes() and placed.stat().st_mode & 0o777 == 0o755
    unit = (REPO_ROOT or Path()) / "node-image/rootfs/etc/systemd/system/kilonode-local-disk.service"
    assert LOCAL_DISK_SETUP.machine_path in unit.read_text()


def test_which_images_carry_which_node_programs(plans: dict[str, ClusterPlan]) -> None:
    """Written out by hand: every image the local-disk setup; GPU pools the health agent and the
    apiservers its taint controller; the apiservers the node client approver; the etcd members
    the snapshot job; every control-plane host the certificate expiry; every pool node the pod
    traffic counters. The image build and the image needs read the same answer."""
    from kilonode.image.build import ImageInputs, role_inputs

    stack = load_stack("research-7500")
    plan = plans["research-7500"]
    pool = ImageInputs(stack=stack, plan=plan, pool=plan.node_pools[0], files={}, project_dir=REPO_ROOT or Path())
    assert pool.carries_gpu_agent and pool.base.label == "docker+gpu+infiniband"
    control = role_inputs(stack, plan, "control-plane", Path())
    etcd = role_inputs(stack, plan, "etcd", Path())
    assert control.carries_gpu_agent and not etcd.carries_gpu_agent
    cpu = ImageInputs(stack=load_stack("local"), plan=plans["local"], pool=plans["local"].node_pools[0], files={},
                      project_dir=Path())
    assert not cpu.carries_gpu_agent and cpu.base.label == "docker"
    assert pool.node_programs == (LOCAL_DISK_SETUP, GPU_HEALTH, POD_TRAFFIC)
    assert cpu.node_programs == (LOCAL_DISK_SETUP, POD_TRAFFIC)
    assert control.node_programs == (LOCAL_DISK_SETUP, GPU_HEALTH, NODE_CLIENT_APPROVER, CERT_EXPIRY)
    assert etcd.node_programs == (LOCAL_DISK_SETUP, ETCD_SNAPSHOT, CERT_EXPIRY)
    # what the image needs count as provided is what the build places, program for program
    recipe = load_recipe()
    for inputs in (pool, cpu, control, etcd):
        spec = needs.ImageSpec((), inputs.flavour, inputs.extras, plan.kubernetes_version)
        placed = {path for program in inputs.node_programs for path, _, _ in program.files()}
        provided = needs.overlay_paths(recipe, spec, inputs.role)
        others = {path for program in PROGRAMS if program.delivery == "image" and program not in inputs.node_programs
                  for path, _, _ in program.files()}
        assert placed <= provided and not others & provided, inputs.target


def test_ship_names_the_role_images_the_stack_builds() -> None:
    assert ship.ROLE_IMAGES == ROLE_IMAGES
    with pytest.raises(ValueError, match="no role image 'apiserver'"):
        ship.programs_for("apiserver")
    with pytest.raises(ValueError, match="no image pools"):
        ship.NodeProgram("x.py", "image", target="/x", images=("pools",))


def test_a_boot_archive_must_hold_the_image_id_the_stack_names(pause_binary: Path, tmp_path: Path) -> None:
    """Independent trace of issue 37, round 4, finding 2: a component's archive (bootImageArchives)
    was baked on the strength of its tag alone; it runs privileged on every node."""
    from types import SimpleNamespace

    from kilonode.image import rootfs
    from kilonode.image.build import preload
    from kilonode.plan.model import PreloadImage

    image = "quay.io/calico/node:v3.31.7"
    archive = single_binary_image(image, pause_binary, "/pause", tmp_path / "node.tar")

    def baked(image_id: str) -> list[dict[str, str]]:
        item = PreloadImage(image=image, source="archive", archive=str(archive.path),
                            baked_path="/var/lib/kilonode/preload/node.tar", image_id=image_id)
        tree = tmp_path / f"tree-{image_id[-4:]}"
        tree.mkdir()
        return preload(SimpleNamespace(preload_images=[item]), None, tree, tmp_path / "work", tmp_path)  # type: ignore[arg-type]

    assert baked(archive.image_id)[0]["image_id"] == archive.image_id
    with pytest.raises(rootfs.BuildError, match="not the sha256:0000"):
        baked("sha256:" + "0" * 64)


def _rewritten(source: Path, target: Path, manifest: Any, extra: dict[str, bytes] | None = None) -> Path:
    """`source` with its manifest.json replaced (and `extra` files added)."""
    with tarfile.open(source) as src, tarfile.open(target, "w") as dst:
        for member in src.getmembers():
            if member.name != "manifest.json":
                dst.addfile(member, src.extractfile(member))
        for name, data in {"manifest.json": json.dumps(manifest).encode(), **(extra or {})}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    return target


def test_an_archive_that_would_load_more_or_other_than_it_says_is_refused(pause_binary: Path, tmp_path: Path) -> None:
    """Independent trace of issue 37, round 5, finding 1: `docker load` takes every tag of every
    entry, and computes the ID from the config's bytes; the check read the tag list loosely and the
    ID from the config's file name."""
    image = "example.com/tools/x:1"
    archive = single_binary_image(image, pause_binary, "/pause", tmp_path / "a.tar")
    with tarfile.open(archive.path) as tar:
        [entry] = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        config = tar.extractfile(entry["Config"]).read()  # type: ignore[union-attr]
    # a second tag in the same entry: a component's, taken over at load
    extra_tag = _rewritten(archive.path, tmp_path / "b.tar",
                           [{**entry, "RepoTags": [image, "quay.io/calico/node:v3.31.7"]}])
    with pytest.raises(ValueError, match="alone"):
        describe_archive(image, extra_tag)
    # a second entry
    extra_entry = _rewritten(archive.path, tmp_path / "c.tar",
                             [entry, {**entry, "RepoTags": ["registry.k8s.io/pause:3.10"]}])
    with pytest.raises(ValueError, match="in 2 image"):
        describe_archive(image, extra_entry)
    # the config under a name that is not its digest (the reviewed image's ID, say)
    forged = "blobs/sha256/" + "1" * 64
    renamed = _rewritten(archive.path, tmp_path / "d.tar", [{**entry, "Config": forged}], {forged: config})
    with pytest.raises(ValueError, match="not the ID its name says"):
        describe_archive(image, renamed)
    assert describe_archive(image, archive.path).image_id == archive.image_id
