"""Vendor apt repositories (node-image/recipe.toml [apt_repositories.*]): packages that Debian
does not carry, fetched from their vendor's signed apt repository with apt itself.

Each repository is declared by its URL, suite and components, its signing key pinned by
**fingerprint** (the key is a file committed beside the recipe, or fetched from `key_url`; either
way the key is refused unless it holds exactly one primary key, with that fingerprint), and the
**exact versions** of the packages taken from it. The fetch:

1. exports that one key into a private keyring (gpg, a throwaway GNUPGHOME);
2. runs apt-get with a private configuration (nothing of the host's apt configuration, sources,
   trusted keys or state is read or written) and a deb822 sources file whose `Signed-By:` names
   only that keyring, so apt verifies the repository's InRelease against that key and no other
   (`apt-get update` fails on a repository signed by another key);
3. `apt-get download package=version` for each declared package (apt refuses a version the
   repository's signed index does not list, and checks each .deb against the index's SHA256);
4. verifies each .deb's sha256 against the pin the data gives (copied from the vendor's published
   index, with its source) or else against node-image/apt.lock.toml, the lock the first fetch wrote
   (trust on first use, like binaries.lock.toml: written atomically, sorted, a change visible in
   review); a mismatch is refused naming both digests.

Nothing here installs anything: kilonode.image.gpu installs the verified .debs into the image.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kilonode.digest import sha256_file
from kilonode.image.lockfile import write_lock
from kilonode.problems import BuildError

LOCK_NAME = "apt.lock.toml"
LOCK_FORMAT = 1
# Seconds apt and gpg may take (apt's own per-connection timeout is Acquire::*::Timeout).
APT_TIMEOUT_S = 900.0
GPG_TIMEOUT_S = 60.0
_FINGERPRINT = re.compile(r"[0-9A-F]{40}")


class VendorAptError(BuildError):
    """A vendor repository, its key or one of its packages was refused."""


class KeyRefused(VendorAptError):
    """The signing key is not the pinned one."""


class RepositoryRefused(VendorAptError):
    """apt refused the repository (signature, index) or a package version it does not list."""


class RepositoryUnreachable(VendorAptError):
    """The repository (or its key) could not be downloaded at all."""


class LockMismatch(VendorAptError):
    """A .deb differs from its pinned or locked sha256."""


# --- the data ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PackagePin:
    name: str
    version: str  # the exact Debian version, revision included ("535.309.01-1")
    sha256: str | None = None  # published digest of the .deb (the vendor's signed index), if copied
    source: str | None = None  # where that digest was read


@dataclass(frozen=True)
class Repository:
    name: str
    url: str  # the archive root (a flat repository: the directory holding InRelease)
    suite: str  # "/" for a flat repository
    components: tuple[str, ...]
    fingerprint: str  # 40 hex digits, upper case, of the primary key that signs it
    packages: tuple[PackagePin, ...]
    key_file: Path | None = None  # the key committed in the repository
    key_url: str | None = None  # or fetched, then checked against the fingerprint
    architecture: str = "amd64"
    source: str = ""  # where the URL, key and package names were read

    def pin(self, package: str) -> PackagePin:
        for pin in self.packages:
            if pin.name == package:
                return pin
        raise KeyError(package)

    def deb822(self, keyring: Path) -> str:
        """The repository's deb822 stanza, trusting only `keyring`."""
        lines = [
            "Types: deb",
            f"URIs: {self.url}",
            f"Suites: {self.suite}",
            *([f"Components: {' '.join(self.components)}"] if self.components else []),
            f"Architectures: {self.architecture}",
            f"Signed-By: {keyring}",
        ]
        return "\n".join(lines) + "\n"


def normalise_fingerprint(text: str) -> str:
    fingerprint = re.sub(r"\s+", "", text).upper()
    if not _FINGERPRINT.fullmatch(fingerprint):
        raise ValueError(f"not a 40-digit OpenPGP v4 fingerprint: {text!r}")
    return fingerprint


def load_repositories(tables: dict[str, Any], root: Path) -> dict[str, Repository]:
    """recipe.toml's [apt_repositories.<name>] tables; a key_file is relative to `root`."""
    repos = {}
    for name, table in tables.items():
        where = f"recipe.toml [apt_repositories.{name}]"
        if ("key_file" in table) == ("key_url" in table):
            raise ValueError(f"{where}: give exactly one of key_file (committed) and key_url (fetched)")
        suite = table["suite"]
        components = tuple(table.get("components", ()))
        if (suite.endswith("/")) == bool(components):
            raise ValueError(f"{where}: a flat repository (suite ending in '/') has no components; "
                             "any other suite needs them")
        pins = []
        for package, spec in table.get("packages", {}).items():
            spec = {"version": spec} if isinstance(spec, str) else spec
            if not spec.get("version"):
                raise ValueError(f"{where}: package {package} has no exact version")
            if spec.get("sha256") and not re.fullmatch(r"[0-9a-f]{64}", spec["sha256"]):
                raise ValueError(f"{where}: package {package}: sha256 is not 64 hex digits")
            pins.append(PackagePin(package, spec["version"], spec.get("sha256"), spec.get("source")))
        try:
            fingerprint = normalise_fingerprint(table["fingerprint"])
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from error
        repos[name] = Repository(
            name=name, url=table["url"], suite=suite, components=components, fingerprint=fingerprint,
            packages=tuple(pins), key_file=root / table["key_file"] if "key_file" in table else None,
            key_url=table.get("key_url"), architecture=table.get("architecture", "amd64"),
            source=table.get("source", ""),
        )
    return repos


# --- the signing key ----------------------------------------------------------------------------


def _gpg(home: Path, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["gpg", "--batch", "--no-tty", "--homedir", str(home), *args],
        input=data, capture_output=True, timeout=GPG_TIMEOUT_S, check=False,
    )


def primary_fingerprints(key: bytes) -> list[str]:
    """The fingerprint of each primary key in `key` (armored or binary), read by gpg itself."""
    with tempfile.TemporaryDirectory(prefix="kilonode-gnupg-") as home:
        os.chmod(home, 0o700)
        result = _gpg(Path(home), "--with-colons", "--show-keys", data=key)
    if result.returncode != 0:
        raise KeyRefused(f"gpg cannot read the key: {result.stderr.decode(errors='replace').strip()[-500:]}")
    fingerprints, after_pub = [], False
    for line in result.stdout.decode(errors="replace").splitlines():
        fields = line.split(":")
        if fields[0] == "pub":
            after_pub = True
        elif fields[0] == "fpr" and after_pub:
            fingerprints.append(fields[9].upper())
            after_pub = False
        elif fields[0] in ("sub", "ssb", "sec"):
            after_pub = False
    return fingerprints


def keyring(key: bytes, fingerprint: str, dest: Path, *, what: str) -> Path:
    """Check that `key` is exactly the key with `fingerprint` (one primary key, that one) and
    write it as a binary keyring at `dest` for apt's Signed-By. Raises KeyRefused naming both."""
    found = primary_fingerprints(key)
    if found != [fingerprint]:
        raise KeyRefused(
            f"{what}: refused the signing key: expected exactly the key {fingerprint}, "
            f"the key file holds {', '.join(found) or 'no key'}"
        )
    with tempfile.TemporaryDirectory(prefix="kilonode-gnupg-") as home:
        os.chmod(home, 0o700)
        imported = _gpg(Path(home), "--import", data=key)
        exported = _gpg(Path(home), "--export", fingerprint)
    if imported.returncode != 0 or exported.returncode != 0 or not exported.stdout:
        raise KeyRefused(f"{what}: gpg could not export the key {fingerprint}: "
                         f"{(imported.stderr + exported.stderr).decode(errors='replace').strip()[-500:]}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(exported.stdout)
    os.chmod(dest, 0o644)
    return dest


def download(url: str, _digest: str | None, dest: Path, timeout: float = 30.0) -> str:
    """Fetch `url` (http or https) to `dest`: the signing key, checked by fingerprint afterwards.
    Raises RepositoryUnreachable with one line naming the URL."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise RepositoryUnreachable(f"cannot download {url}: only http(s) URLs are fetched")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data = response.read(1 << 20)  # a public key is a few KiB
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise RepositoryUnreachable(f"cannot download {url}: {getattr(error, 'reason', error)}") from error
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def key_bytes(repo: Repository, work: Path, fetcher: Callable[[str, str | None, Path], str]) -> bytes:
    if repo.key_file is not None:
        return repo.key_file.read_bytes()
    assert repo.key_url is not None
    dest = work / f"{repo.name}.key"
    try:
        fetcher(repo.key_url, None, dest)
    except BuildError as error:
        raise RepositoryUnreachable(f"{repo.name}: cannot download its signing key: {error}") from error
    return dest.read_bytes()


# --- apt, private ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AptRoot:
    """A private apt configuration and state under one directory: the host's apt configuration,
    sources, trusted keys, lists and caches are neither read nor written."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "apt.conf"

    @property
    def sources(self) -> Path:
        return self.root / "etc/sources.list.d/vendor.sources"

    def prepare(self, architecture: str) -> None:
        for sub in ("etc/apt.conf.d", "etc/sources.list.d", "etc/preferences.d", "etc/trusted.gpg.d",
                    "state/lists/partial", "cache/archives/partial", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "state/status").write_text("")
        r = self.root
        # Read first (APT_CONFIG), before apt looks for Dir::Etc::parts and Dir::Etc::main: both
        # point into this root, so no host file (proxies, hooks, trust overrides) applies.
        self.config.write_text(
            f'Dir::Etc "{r}/etc/";\nDir::Etc::main "apt.conf.d/none";\nDir::Etc::parts "{r}/etc/apt.conf.d/";\n'
            f'Dir::Etc::sourcelist "{r}/etc/sources.list.d/none.list";\n'
            f'Dir::Etc::sourceparts "{r}/etc/sources.list.d/";\n'
            f'Dir::Etc::trusted "{r}/etc/trusted.gpg";\nDir::Etc::trustedparts "{r}/etc/trusted.gpg.d/";\n'
            f'Dir::Etc::preferences "{r}/etc/preferences";\nDir::Etc::preferencesparts "{r}/etc/preferences.d/";\n'
            f'Dir::State "{r}/state/";\nDir::State::status "{r}/state/status";\nDir::Cache "{r}/cache/";\n'
            f'Dir::Log "{r}/log/";\n'
            f'APT::Architecture "{architecture}";\nAPT::Architectures {{ "{architecture}"; }};\n'
            'Acquire::Languages "none";\nAcquire::AllowInsecureRepositories "false";\n'
            'Acquire::AllowDowngradeToInsecureRepositories "false";\nAPT::Get::AllowUnauthenticated "false";\n'
            'Acquire::Retries "0";\nDebug::NoLocking "true";\nAPT::Sandbox::User "root";\n'
        )

    def run(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k.startswith(("http_proxy", "https_proxy", "no_proxy",
                                                                        "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"))}
        env |= {"APT_CONFIG": str(self.config), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "LC_ALL": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
        try:
            return subprocess.run(["apt-get", "-q", *args], cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=APT_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as error:
            raise RepositoryUnreachable(f"apt-get {' '.join(args)}: not done after {APT_TIMEOUT_S:.0f} s") from error


# --- the fetch --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LockEntry:
    repository: str
    package: str
    version: str
    arch: str
    sha256: str
    recorded: str

    def key(self) -> tuple[str, str, str, str]:
        return (self.repository, self.package, self.version, self.arch)


@dataclass(frozen=True)
class Fetched:
    """One package as the build (and the manifest) records it."""

    repository: str
    package: str
    version: str
    path: Path  # the verified .deb
    sha256: str
    verified_by: str  # "pin (<source>)", "lock <file>", or "first fetch: recorded in <file>"

    def manifest_entry(self) -> dict[str, Any]:
        return {"repository": self.repository, "package": self.package, "version": self.version,
                "sha256": self.sha256, "verified_by": self.verified_by, "file": self.path.name}


@dataclass
class FetchResult:
    fetched: list[Fetched] = field(default_factory=list)
    lock_written: list[LockEntry] = field(default_factory=list)


def load_lock(path: Path) -> dict[tuple[str, str, str, str], LockEntry]:
    if not path.is_file():
        return {}
    data = tomllib.loads(path.read_text())
    if data.get("format") != LOCK_FORMAT:
        raise VendorAptError(f"{path}: format {data.get('format')!r}, expected {LOCK_FORMAT}")
    entries = [LockEntry(**{k: str(v) for k, v in e.items()}) for e in data.get("lock", [])]
    return {e.key(): e for e in entries}


LOCK_HEADER = (
    "# kilonode vendor apt lock: the sha256 of each .deb a vendor apt repository of\n"
    "# node-image/recipe.toml supplied, for packages whose data pins no published digest,\n"
    "# recorded by the first `kilonode image build --fetch` that downloaded it (trust on first\n"
    "# use). Commit it and review every change: later builds refuse a .deb whose sha256 differs.\n"
    "# Written by kilonode (sorted, atomically).\n"
)


def record_lock(path: Path, new: Iterable[LockEntry]) -> None:
    """Add entries to the lock (replacing those of the same repository, package, version and
    arch): written to a temporary file beside it, read back, and renamed into place."""
    entries = load_lock(path) | {e.key(): e for e in new}
    write_lock(path, LOCK_HEADER, LOCK_FORMAT, (
        {"repository": e.repository, "package": e.package, "version": e.version, "arch": e.arch,
         "sha256": e.sha256, "recorded": e.recorded} for _, e in sorted(entries.items())))


def _apt_failure(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith(("E:", "W:", "Err"))]
    return "\n".join(lines[-12:]) or (result.stdout + result.stderr).strip()[-1500:]


def fetch(
    repos: Iterable[Repository],
    work: Path,
    lock_file: Path,
    *,
    fetcher: Callable[[str, str | None, Path], str] | None = None,
    now: Callable[[], str] = lambda: datetime.now(UTC).isoformat(timespec="seconds"),
) -> FetchResult:
    """Download every declared package of `repos` into work/debs, each verified (signature by
    the pinned key, the exact version, the sha256 pin or lock). Raises KeyRefused,
    RepositoryRefused, LockMismatch or RepositoryUnreachable; writes the lock (atomically) only
    after every package of every repository was verified."""
    if fetcher is None:
        fetcher = download
    repos = list(repos)
    if not repos:
        return FetchResult()
    if shutil.which("apt-get") is None or shutil.which("gpg") is None:
        raise VendorAptError("apt-get and gpg are needed to fetch from vendor apt repositories")
    architectures = {r.architecture for r in repos}
    if len(architectures) != 1:
        raise VendorAptError(f"one architecture per fetch, got {sorted(architectures)}")
    # every key is checked before apt runs at all
    stanzas = []
    for repo in repos:
        ring = keyring(key_bytes(repo, work, fetcher), repo.fingerprint, work / "keyrings" / f"{repo.name}.gpg",
                       what=f"apt repository {repo.name}")
        stanzas.append(repo.deb822(ring))
    apt = AptRoot(work / "apt")
    apt.prepare(architectures.pop())
    apt.sources.write_text("\n".join(stanzas))
    update = apt.run("update")
    failure = _apt_failure(update)
    if update.returncode != 0 or re.search(r"^(W|E): .*(GPG error|NO_PUBKEY|not signed|Failed to fetch)",
                                           update.stdout + update.stderr, re.M):
        kind = RepositoryUnreachable if re.search(r"Could not (connect|resolve)|Failed to fetch|"
                                                  r"Connection failed|Temporary failure", failure) and \
            "GPG error" not in failure and "not signed" not in failure else RepositoryRefused
        raise kind(f"apt refused the vendor repositories {', '.join(r.name for r in repos)} "
                   f"(apt-get update):\n{failure}")
    debs = work / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    wanted = [f"{p.name}={p.version}" for r in repos for p in r.packages]
    got_debs = apt.run("download", *wanted, cwd=debs)
    if got_debs.returncode != 0:
        raise RepositoryRefused(f"apt refused a declared package or version ({' '.join(wanted)}):\n"
                                f"{_apt_failure(got_debs)}")
    locked = load_lock(lock_file)
    result = FetchResult()
    pending: list[LockEntry] = []
    for repo in repos:
        for pin in repo.packages:
            deb = _downloaded(debs, pin, repo.architecture)
            got = sha256_file(deb)
            key = (repo.name, pin.name, pin.version, repo.architecture)
            if pin.sha256:
                if got != pin.sha256:
                    raise LockMismatch(f"refused {pin.name} {pin.version} from {repo.name}: sha256 {got}, "
                                       f"the published digest pinned in recipe.toml is {pin.sha256} ({pin.source})")
                how = f"pin ({pin.source})"
            elif key in locked:
                if got != locked[key].sha256:
                    raise LockMismatch(
                        f"refused {pin.name} {pin.version} from {repo.name}: sha256 {got}, but {lock_file.name} "
                        f"locked {locked[key].sha256} at {locked[key].recorded}: the package changed since it was "
                        "locked; review it before deleting the lock entry")
                how = f"lock {lock_file.name}"
            else:
                pending.append(LockEntry(repo.name, pin.name, pin.version, repo.architecture, got, now()))
                how = f"first fetch: sha256 recorded in {lock_file}; commit it and review it"
            result.fetched.append(Fetched(repo.name, pin.name, pin.version, deb, got, how))
    if pending:
        record_lock(lock_file, pending)
        result.lock_written = pending
    return result


def _downloaded(debs: Path, pin: PackagePin, arch: str) -> Path:
    """The .deb apt-get download wrote for pin (apt names it name_version_arch.deb, an epoch's
    colon escaped as %3a)."""
    version = pin.version.replace(":", "%3a")
    for candidate in (debs / f"{pin.name}_{version}_{arch}.deb", debs / f"{pin.name}_{version}_all.deb"):
        if candidate.is_file():
            return candidate
    raise RepositoryRefused(f"apt-get download left no .deb for {pin.name} {pin.version} in {debs}")


# --- version equality --------------------------------------------------------------------------------

# The roles recipe.toml [extras.gpu.vendor] equal_versions maps to a package each: the driver's
# kernel module, Fabric Manager and NSCQ must be one driver release.
DRIVER = "driver"
FABRIC_MANAGER = "fabric_manager"
NSCQ = "nscq"
# An exact Debian version: [epoch:]upstream[-revision], the upstream part starting with a digit,
# of letters, digits and . + ~ (and - only before the revision) (Debian Policy 5.6.12,
# "Version"). Anything else (empty, a glob such as 535.*, a relation, a suite) lets apt choose.
EXACT_VERSION = re.compile(r"^(\d+:)?\d[A-Za-z0-9.+~-]*$")


def exact_version(version: str | None) -> bool:
    """Whether `version` names one Debian version, as apt's `package=version` takes it."""
    return bool(version) and EXACT_VERSION.match(version or "") is not None and not (version or "").endswith("-")


def upstream_version(version: str) -> str:
    """A Debian version without its epoch and revision: '535.309.01-0+deb12u1' -> '535.309.01'."""
    version = version.split(":", 1)[1] if ":" in version else version
    return version.rsplit("-", 1)[0] if "-" in version else version


def version_problems(installed: dict[str, str], equal: dict[str, str]) -> list[str]:
    """The driver, Fabric Manager and NSCQ must be one driver release: `equal` maps a role
    (driver, fabric_manager, nscq) to its package; each installed package's upstream version
    must be the driver's. Returns one line per mismatch (an absent package is not a mismatch:
    the build lists it as missing). Pure: the caller gives the resolved versions."""
    driver_package = equal.get(DRIVER)
    if driver_package is None or driver_package not in installed:
        return []
    driver = upstream_version(installed[driver_package])
    problems = []
    for role, package in equal.items():
        if role == DRIVER or package not in installed:
            continue
        if upstream_version(installed[package]) != driver:
            problems.append(
                f"{role} {package} {installed[package]} is not the driver's release {driver} "
                f"({driver_package} {installed[driver_package]}): Fabric Manager and NSCQ refuse a driver of "
                "another version, and without them CUDA cannot initialise on an NVSwitch system")
    return problems
