"""Vendor apt repositories, for real: a signed apt repository built here with real gpg,
dpkg-deb and apt-ftparchive, served on loopback by python's http.server, fetched by real
apt-get through kilonode.image.vendor_apt (private apt configuration, Signed-By the pinned key).

Each refusal is seeded: a wrong fingerprint, a repository signed by another key, a version the
repository does not list, a package whose content changed after it was locked, a published pin
that does not match."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from kilonode.digest import sha256_file
from kilonode.image import vendor_apt
from kilonode.image.vendor_apt import (
    KeyRefused,
    LockMismatch,
    PackagePin,
    Repository,
    RepositoryRefused,
)

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


@pytest.fixture(autouse=True)
def _tools() -> None:
    """gpg, apt-ftparchive (apt-utils), apt-get and dpkg-deb: set-up installs them, so a missing one
    fails the test (scripts/check-bare-debian proves the list on a bare Debian 12)."""
    missing = [t for t in ("gpg", "apt-get", "apt-ftparchive", "dpkg-deb") if not shutil.which(t)]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: run `make setup` (installs .ci/debian-packages.txt)")


def gpg(home: Path, *args: str) -> str:
    return subprocess.run(["gpg", "--batch", "--no-tty", "--homedir", str(home), *args],
                          capture_output=True, text=True, check=True, timeout=60).stdout


def new_key(home: Path, name: str) -> tuple[str, bytes]:
    """A throwaway signing key in its own GNUPGHOME: (fingerprint, armored public key)."""
    home.mkdir(mode=0o700)
    gpg(home, "--passphrase", "", "--pinentry-mode", "loopback", "--quick-gen-key",
        f"{name} <{name}@example.invalid>", "ed25519", "sign", "never")
    fingerprint = next(line.split(":")[9] for line in gpg(home, "--with-colons", "--list-keys").splitlines()
                       if line.startswith("fpr:"))
    return fingerprint, gpg(home, "--armor", "--export", fingerprint).encode()


def fake_deb(repo: Path, name: str, version: str, payload: str) -> None:
    """A tiny real .deb (dpkg-deb --build): one file whose text is `payload`."""
    tree = repo.parent / f"build-{name}-{version}"
    shutil.rmtree(tree, ignore_errors=True)
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: amd64\nMaintainer: kilonode test <t@example.invalid>\n"
        f"Description: stand-in for a vendor package\n")
    (tree / f"usr/share/{name}").mkdir(parents=True)
    (tree / f"usr/share/{name}/payload").write_text(payload)
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(repo / f"{name}_{version}_amd64.deb")],
                   capture_output=True, check=True, timeout=60)


def publish(repo: Path, home: Path, fingerprint: str) -> None:
    """A flat repository's Packages, Release and InRelease (signed by `fingerprint`)."""
    packages = subprocess.run(["apt-ftparchive", "packages", "."], cwd=repo, capture_output=True, text=True,
                              check=True, timeout=60).stdout
    (repo / "Packages").write_text(packages)
    release = subprocess.run(["apt-ftparchive", "-o", "APT::FTPArchive::Release::Origin=kilonode-test",
                              "release", "."], cwd=repo, capture_output=True, text=True, check=True, timeout=60).stdout
    (repo / "Release").write_text(release)
    (repo / "InRelease").unlink(missing_ok=True)
    gpg(home, "--local-user", fingerprint, "--clearsign", "--output", str(repo / "InRelease"), str(repo / "Release"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    def __init__(self, root: Path, signer: tuple[Path, str], other: tuple[Path, str, bytes], key: bytes,
                 port: int) -> None:
        self.root, self.signer, self.other, self.key, self.port = root, signer, other, key, port

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}/"

    def repo(self, name: str, packages: dict[str, str], **changes: object) -> Repository:
        key_file = self.root / "signer.asc"
        key_file.write_bytes(self.key)
        repo = Repository(name="test", url=self.url(name), suite="/", components=(), fingerprint=self.signer[1],
                          packages=tuple(PackagePin(n, v) for n, v in packages.items()), key_file=key_file,
                          source="built by this test")
        return replace(repo, **changes)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("vendor-apt")
    signer_home, other_home = root / "gnupg-signer", root / "gnupg-other"
    signer_fpr, signer_key = new_key(signer_home, "signer")
    other_fpr, other_key = new_key(other_home, "other")
    www = root / "www"
    # "good": signed by the signer; "foreign": the same packages signed by the other key
    for name, (home, fpr) in {"good": (signer_home, signer_fpr), "foreign": (other_home, other_fpr)}.items():
        (www / name).mkdir(parents=True)
        fake_deb(www / name, "nvidia-fabricmanager-535", "535.309.01-1", "fabric manager")
        fake_deb(www / name, "libnvidia-nscq-535", "535.309.01-1", "nscq")
        publish(www / name, home, fpr)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(www),
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the loopback http.server did not start within 10 s") from None
                time.sleep(0.05)
        yield Served(root, (signer_home, signer_fpr), (other_home, other_fpr, other_key), signer_key, port)
    finally:
        os.kill(server.pid, 15)
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(server.pid, 9)
            server.wait(timeout=5)


PACKAGES = {"nvidia-fabricmanager-535": "535.309.01-1", "libnvidia-nscq-535": "535.309.01-1"}


def test_the_pinned_key_and_versions_fetch_and_the_first_fetch_writes_the_lock(served: Served, tmp_path: Path) -> None:
    lock = tmp_path / "node-image" / "apt.lock.toml"
    result = vendor_apt.fetch([served.repo("good", PACKAGES)], tmp_path / "work", lock,
                              now=lambda: "2026-11-30T00:00:00+00:00")
    got = {f.package: f for f in result.fetched}
    assert set(got) == set(PACKAGES)
    for fetched in got.values():
        assert fetched.path.is_file() and fetched.version == "535.309.01-1"
        assert fetched.verified_by.startswith("first fetch")
        assert sha256_file(fetched.path) == fetched.sha256
    # the lock: written once, whole, sorted, and nothing half-written left beside it
    data = tomllib.loads(lock.read_text())
    assert data["format"] == 1
    assert [(e["package"], e["sha256"]) for e in data["lock"]] == sorted((p, got[p].sha256) for p in PACKAGES)
    assert [p.name for p in lock.parent.iterdir()] == ["apt.lock.toml"]
    # a second fetch verifies against the lock and writes nothing
    before = lock.read_text()
    again = vendor_apt.fetch([served.repo("good", PACKAGES)], tmp_path / "work2", lock)
    assert {f.verified_by for f in again.fetched} == {"lock apt.lock.toml"} and not again.lock_written
    assert lock.read_text() == before
    # apt ran on its private root: the host's apt lists were not touched by it
    assert (tmp_path / "work/apt/state/lists").is_dir()


def test_a_wrong_fingerprint_is_refused_before_apt_runs(served: Served, tmp_path: Path) -> None:
    repo = served.repo("good", PACKAGES, fingerprint=served.other[1])
    with pytest.raises(KeyRefused, match=f"expected exactly the key {served.other[1]}.*holds {served.signer[1]}"):
        vendor_apt.fetch([repo], tmp_path / "work", tmp_path / "apt.lock.toml")
    assert not (tmp_path / "work/apt").exists()
    assert not (tmp_path / "apt.lock.toml").exists()


def test_a_repository_signed_by_another_key_is_refused_by_apt(served: Served, tmp_path: Path) -> None:
    # the pinned key is fine; the repository's InRelease is signed by the other key
    with pytest.raises(RepositoryRefused, match=r"apt-get update[\s\S]*NO_PUBKEY[\s\S]*is not signed"):
        vendor_apt.fetch([served.repo("foreign", PACKAGES)], tmp_path / "work", tmp_path / "apt.lock.toml")
    assert not (tmp_path / "apt.lock.toml").exists()


def test_a_version_the_repository_does_not_list_is_refused(served: Served, tmp_path: Path) -> None:
    wanted = {**PACKAGES, "libnvidia-nscq-535": "535.261.03-1"}
    with pytest.raises(RepositoryRefused, match=r"libnvidia-nscq-535=535\.261\.03-1[\s\S]*not found"):
        vendor_apt.fetch([served.repo("good", wanted)], tmp_path / "work", tmp_path / "apt.lock.toml")
    assert not (tmp_path / "apt.lock.toml").exists()


def test_a_package_changed_after_it_was_locked_is_refused(served: Served, tmp_path: Path) -> None:
    # its own copy of the repository, so the others keep theirs
    www = served.root / "www"
    shutil.copytree(www / "good", www / "republished")
    lock = tmp_path / "apt.lock.toml"
    vendor_apt.fetch([served.repo("republished", PACKAGES)], tmp_path / "w1", lock)
    locked = lock.read_text()
    # the vendor re-publishes the same version with other content, and signs the index again
    fake_deb(www / "republished", "libnvidia-nscq-535", "535.309.01-1", "nscq, changed")
    publish(www / "republished", served.signer[0], served.signer[1])
    with pytest.raises(LockMismatch, match=r"libnvidia-nscq-535 535\.309\.01-1.*apt\.lock\.toml locked"):
        vendor_apt.fetch([served.repo("republished", PACKAGES)], tmp_path / "w2", lock)
    assert lock.read_text() == locked


def test_a_published_pin_that_does_not_match_is_refused(served: Served, tmp_path: Path) -> None:
    repo = served.repo("good", PACKAGES)
    pins = tuple(replace(p, sha256="0" * 64, source="a seeded wrong digest") if p.name == "libnvidia-nscq-535" else p
                 for p in repo.packages)
    with pytest.raises(LockMismatch, match=r"published digest pinned in recipe\.toml is 0{64}"):
        vendor_apt.fetch([replace(repo, packages=pins)], tmp_path / "work", tmp_path / "apt.lock.toml")
    # nothing recorded: the lock is written only when every package verified
    assert not (tmp_path / "apt.lock.toml").exists()


def test_the_key_file_must_hold_only_the_pinned_key(served: Served, tmp_path: Path) -> None:
    both = tmp_path / "both.asc"
    both.write_bytes(served.key + served.other[2])
    repo = served.repo("good", PACKAGES, key_file=both)
    with pytest.raises(KeyRefused, match=rf"holds {served.signer[1]}, {served.other[1]}"):
        vendor_apt.fetch([repo], tmp_path / "work", tmp_path / "apt.lock.toml")


# --- version equality (pure) -----------------------------------------------------------------------

EQUAL = {"driver": "nvidia-kernel-dkms", "fabric_manager": "nvidia-fabricmanager-535", "nscq": "libnvidia-nscq-535"}


def test_the_driver_fabric_manager_and_nscq_of_one_release_pass() -> None:
    installed = {"nvidia-kernel-dkms": "535.309.01-0+deb12u1", "nvidia-fabricmanager-535": "535.309.01-1",
                 "libnvidia-nscq-535": "1:535.309.01-1"}
    assert vendor_apt.version_problems(installed, EQUAL) == []
    assert vendor_apt.upstream_version("535.309.01-0+deb12u1") == "535.309.01"
    assert vendor_apt.upstream_version("1:535.309.01-1") == "535.309.01"
    assert vendor_apt.upstream_version("535.309.01") == "535.309.01"


@pytest.mark.parametrize(("package", "version"), [
    ("nvidia-fabricmanager-535", "535.261.03-1"),  # an older FM of the same branch
    ("libnvidia-nscq-535", "535.309.02-1"),  # one digit off
    ("nvidia-fabricmanager-535", "550.309.01-1"),  # another branch
])
def test_a_seeded_version_mismatch_is_named(package: str, version: str) -> None:
    installed = {"nvidia-kernel-dkms": "535.309.01-0+deb12u1", "nvidia-fabricmanager-535": "535.309.01-1",
                 "libnvidia-nscq-535": "535.309.01-1", package: version}
    problems = vendor_apt.version_problems(installed, EQUAL)
    assert len(problems) == 1
    assert package in problems[0] and version in problems[0] and "535.309.01" in problems[0]


def test_an_absent_package_is_missing_not_mismatched() -> None:
    # the build lists an absent FM as missing (and refuses without --allow-incomplete)
    assert vendor_apt.version_problems({"nvidia-kernel-dkms": "535.309.01-0+deb12u1"}, EQUAL) == []
    assert vendor_apt.version_problems({"nvidia-fabricmanager-535": "535.1-1"}, EQUAL) == []


# --- the build's side: what an image without NVIDIA's repositories says, Fabric Manager's unit ----------


def test_without_fetch_the_vendor_packages_are_listed_missing_by_name(tmp_path: Path) -> None:
    from kilonode.image import gpu as accel
    from kilonode.image.recipe import load_recipe

    recipe = load_recipe()
    vendor = accel.install_vendor(recipe, ("gpu", "infiniband"), tmp_path / "tree", tmp_path / "work", fetch=False)
    assert vendor.installed == {}
    named = {line.split(" ", 1)[0] for line in vendor.missing}
    assert named == {"nvidia-fabricmanager-535", "libnvidia-nscq-535", "libnvidia-container1",
                     "libnvidia-container-tools", "nvidia-container-toolkit-base", "nvidia-container-toolkit"}
    assert all("no --fetch" in line for line in vendor.missing)
    # a pool without GPUs takes nothing from them
    assert accel.install_vendor(recipe, ("infiniband",), tmp_path / "t", tmp_path / "w", fetch=True).missing == []


def test_an_unreachable_repository_makes_the_packages_missing_not_a_crash(tmp_path: Path) -> None:
    from kilonode.image import gpu as accel
    from kilonode.image.recipe import load_recipe

    recipe = load_recipe()
    port = free_port()  # nothing listens there
    repos = {name: replace(repo, url=f"http://127.0.0.1:{port}/{name}/", key_url=f"http://127.0.0.1:{port}/key")
             for name, repo in recipe.apt_repositories.items()}
    vendor = accel.install_vendor(replace(recipe, apt_repositories=repos), ("gpu",), tmp_path / "tree",
                                  tmp_path / "work", fetch=True)
    assert vendor.installed == {} and len(vendor.missing) == 6
    assert all("absent:" in line and "signing key" in line for line in vendor.missing)


@pytest.mark.parametrize(("vm_size", "enabled"), [("Standard_ND96isr_H100_v5", True),
                                                  ("Standard_ND96asr_v4", True),
                                                  ("Standard_NC24ads_A100_v4", False)])
def test_fabric_manager_is_enabled_on_nvswitch_sizes_only(tmp_path: Path, vm_size: str, enabled: bool) -> None:
    from types import SimpleNamespace

    from kilonode.image import gpu as accel
    from kilonode.image.recipe import load_recipe

    recipe = load_recipe()
    unit = recipe.extras["gpu"].fabric_manager_unit
    tree = tmp_path / "tree"
    (tree / "lib/systemd/system").mkdir(parents=True)
    (tree / "etc/systemd/system").mkdir(parents=True)
    (tree / f"lib/systemd/system/{unit}").write_text(
        "[Unit]\nDescription=stand-in\n[Service]\nExecStart=/usr/bin/nv-fabricmanager\n[Install]\n"
        "WantedBy=multi-user.target\n")
    from kilonode.catalog.vm import nvswitch_of

    vendor = accel.VendorInstall(installed={"nvidia-fabricmanager-535": "535.309.01-1"})
    pool = SimpleNamespace(vm_size=vm_size, nvswitch=nvswitch_of(vm_size))
    record = accel.fabric_manager_unit(recipe, ("gpu",), pool, vendor, tree)  # type: ignore[arg-type]
    assert record is not None and record["enabled"] is enabled and record["nvswitch"] is enabled
    link = tree / f"etc/systemd/system/multi-user.target.wants/{unit}"
    assert link.is_symlink() is enabled
    # not installed: never enabled, whatever the size
    absent = accel.fabric_manager_unit(recipe, ("gpu",), pool,  # type: ignore[arg-type]
                                       accel.VendorInstall(), tmp_path / "other")
    assert absent is not None and absent["enabled"] is False and absent["present"] is False


def test_the_gpu_health_agent_starts_after_fabric_manager() -> None:
    """On NVSwitch sizes CUDA initialises only once Fabric Manager runs: the agent's first active
    check must come after it, ordered by the unit the recipe enables (one name for both)."""
    import configparser

    from kilonode.image.recipe import NODE_IMAGE_DIR, load_recipe

    unit = load_recipe().extras["gpu"].fabric_manager_unit
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read(NODE_IMAGE_DIR / "gpu/rootfs/etc/systemd/system/kilonode-gpu-health.service")
    assert unit in parser["Unit"]["After"].split()
