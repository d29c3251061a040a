"""Pinned upstream binaries (node-image/binaries.toml): which machines need which, where
each comes from, and the download that verifies its digest or refuses it.

The data names, per component, a release URL and per (version, arch) the digest of that
download with the source it was copied from. This module resolves a role's components for
a Kubernetes version, downloads them (`fetch`: streamed to a temporary file, verified,
renamed into place only when the digest matches), takes members out of release tarballs,
and places the files into an image tree (`place_role`), recording for the manifest what
came from where, or why a binary is absent.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import shutil
import tarfile
import tempfile
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from kilonode.digest import sha256_file
from kilonode.image.rootfs import BuildError, host_path
from kilonode.paths import NODE_IMAGE_DIR

BINARIES_FILE = NODE_IMAGE_DIR / "binaries.toml"
DATA_NAME = "node-image/binaries.toml"  # how messages name the file
FORMAT = 1
# Seconds one socket operation (connect, a read) may take, and the whole download.
SOCKET_TIMEOUT_S = 30.0
DOWNLOAD_TIMEOUT_S = 1800.0
CHUNK = 1 << 20
DIGEST_LENGTHS = {"sha256": 64, "sha512": 128}
Follows = Literal["kubernetes", "kubernetes-minor"]


class PinError(BuildError):
    """The data is malformed, or holds no pin for what was asked."""


class FetchError(BuildError):
    """A download could not be had or was refused."""


class Unreachable(FetchError):
    """The URL could not be downloaded (connection, HTTP status, timeout)."""


class DigestMismatch(FetchError):
    """The download's digest differs from the pin: refused, nothing kept."""


class MemberMissing(FetchError):
    """A verified tarball lacks a file the data says it holds."""


# --- the data -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    key: str
    repo: str
    path: str
    commit: str
    what: str

    def describe(self) -> str:
        return f"{self.repo}@{self.commit[:12]}:{self.path}"


@dataclass(frozen=True)
class Pin:
    version: str
    arch: str
    algorithm: str  # "sha256" or "sha512"
    digest: str  # lowercase hex
    source: str  # a key of Catalog.sources

    @property
    def expected(self) -> str:
        return f"{self.algorithm}:{self.digest}"


@dataclass(frozen=True)
class FileSpec:
    path: str  # where it lands on the machine; may hold {version}/{arch}
    member: str | None = None  # path inside the tarball; None: the download is the file


@dataclass(frozen=True)
class Component:
    name: str
    url: str  # template: {version}, {arch}
    files: tuple[FileSpec, ...]
    pins: tuple[Pin, ...]
    follows: Follows | None = None
    version: str | None = None  # fixed version, when it does not follow Kubernetes
    unit: str | None = None  # the systemd unit skipped (ConditionPathExists=) while absent
    # A file written beside the binaries when they are placed, and only then (a systemd
    # drop-in that points a packaged unit at them): (path, text)
    activate: tuple[str, str] | None = None
    absent_means: str | None = None  # what the machine runs instead while it is absent
    # Why no digest is pinned (none is published): never downloaded, only taken from
    # --binaries; None for every pinned component
    unpinned: str | None = None

    def versions(self, arch: str) -> list[str]:
        return [p.version for p in self.pins if p.arch == arch]

    def pin_for(self, kubernetes_version: str, arch: str) -> Pin:
        """The pin this component uses next to `kubernetes_version`. Raises PinError."""
        pins = [p for p in self.pins if p.arch == arch]
        if self.follows == "kubernetes":
            wanted = kubernetes_version
            found = [p for p in pins if p.version == wanted]
        elif self.follows == "kubernetes-minor":
            minor = minor_of(kubernetes_version)
            wanted = f"{minor} (the newest pin of Kubernetes {kubernetes_version}'s minor)"
            found = sorted((p for p in pins if minor_of(p.version) == minor), key=lambda p: version_key(p.version))[-1:]
        else:
            wanted = str(self.version)
            found = [p for p in pins if p.version == wanted]
        if not found:
            have = summarise(p.version for p in pins) or "none"
            raise PinError(
                f"{self.name}: no {arch} pin for version {wanted} in {DATA_NAME} (pinned: {have}); "
                "add one copied from a published source, as its header says, naming that source"
            )
        return found[0]


@dataclass(frozen=True)
class Resolved:
    """One component at the version a machine uses: what to download and what it must be."""

    component: Component
    pin: Pin
    source: Source
    arch: str

    @property
    def name(self) -> str:
        return self.component.name

    @property
    def version(self) -> str:
        return self.pin.version

    @property
    def url(self) -> str:
        return expand(self.component.url, self.version, self.arch)

    @property
    def files(self) -> list[FileSpec]:
        return [
            FileSpec(expand(f.path, self.version, self.arch),
                     None if f.member is None else expand(f.member, self.version, self.arch))
            for f in self.component.files
        ]


@dataclass(frozen=True)
class Catalog:
    arch: str
    sources: dict[str, Source]
    roles: dict[str, tuple[str, ...]]
    components: dict[str, Component]

    def role(self, role: str) -> list[Component]:
        if role not in self.roles:
            raise PinError(f"no role {role!r} in {DATA_NAME}; its roles: {', '.join(self.roles)}")
        return [self.components[name] for name in self.roles[role]]

    def resolve_component(self, component: Component, kubernetes_version: str) -> Resolved:
        pin = component.pin_for(kubernetes_version, self.arch)
        return Resolved(component, pin, self.sources[pin.source], self.arch)

    def unpinned(self, role: str) -> list[Component]:
        """Components `role` needs that no published digest pins (see Component.unpinned)."""
        return [c for c in self.role(role) if c.unpinned]

    def resolve(self, role: str, kubernetes_version: str) -> list[Resolved]:
        """Every pinned component `role` needs, at the versions Kubernetes
        `kubernetes_version` uses. Raises PinError naming every component without a pin for
        it (an `unpinned` component is left out: `unpinned(role)` lists those)."""
        resolved, missing = [], []
        for component in self.role(role):
            if component.unpinned:
                continue
            try:
                resolved.append(self.resolve_component(component, kubernetes_version))
            except PinError as error:
                missing.append(str(error))
        if missing:
            raise PinError(f"{role} at Kubernetes {kubernetes_version}: " + "; ".join(missing))
        return resolved


def pool_role(runtime: str) -> str:
    """The role of a node pool's machines with this container runtime."""
    return f"pool-{runtime}"


# The role added for a pool whose size has GPUs (the container toolkit).
GPU_ROLE = "gpu"


def pool_roles(runtime: str, gpus_per_node: int, nccl_topology: str | None) -> list[str]:
    """Every binaries.toml role a pool's image takes: its runtime's, the GPU one where the size
    has GPUs, and its size's NCCL topology (`nccl-<family>`) where the plan names one."""
    roles = [pool_role(runtime)]
    if gpus_per_node > 0:
        roles.append(GPU_ROLE)
    if nccl_topology:
        roles.append(f"nccl-{nccl_topology}")
    return roles


def load(path: Path = BINARIES_FILE) -> Catalog:
    """Read and check the data file. Raises PinError naming the file and the entry."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise PinError(f"{path}: {error}") from error
    problems: list[str] = []
    if data.get("format") != FORMAT:
        problems.append(f"format must be {FORMAT}")
    arch = data.get("arch", "")
    sources = _sources(data.get("sources", {}), problems)
    components = {name: c for name, raw in data.get("components", {}).items()
                  if (c := _component(name, raw, arch, sources, problems)) is not None}
    roles: dict[str, tuple[str, ...]] = {}
    for role, names in data.get("roles", {}).items():
        roles[role] = tuple(names)
        for name in names:
            if name not in components:
                problems.append(f"role {role}: no component {name!r}")
    if not roles:
        problems.append("no [roles]")
    if problems:
        raise PinError(f"{path}: " + "; ".join(problems))
    return Catalog(arch, sources, roles, components)


def _sources(raw: dict[str, Any], problems: list[str]) -> dict[str, Source]:
    sources = {}
    for key, s in raw.items():
        missing = [k for k in ("repo", "path", "commit", "what") if not s.get(k)]
        if missing:
            problems.append(f"source {key}: missing {', '.join(missing)}")
            continue
        if not re.fullmatch(r"[0-9a-f]{40}", s["commit"]):
            problems.append(f"source {key}: commit must be 40 hex digits")
        sources[key] = Source(key, s["repo"], s["path"], s["commit"], s["what"])
    return sources


def _component(
    name: str, raw: dict[str, Any], arch: str, sources: dict[str, Source], problems: list[str]
) -> Component | None:
    where = f"component {name}"
    url = raw.get("url", "")
    if not url.startswith("https://"):
        problems.append(f"{where}: url must be https")
    follows, version = raw.get("follows"), raw.get("version")
    if (follows is None) == (version is None):
        problems.append(f"{where}: give exactly one of follows and version")
    if follows not in (None, "kubernetes", "kubernetes-minor"):
        problems.append(f"{where}: follows must be 'kubernetes' or 'kubernetes-minor'")
    files: list[FileSpec] = []
    for spec in raw.get("files", []):
        if "members" in spec:
            files += [FileSpec(f"{spec['dir'].rstrip('/')}/{PurePosixPath(m).name}", m) for m in spec["members"]]
        else:
            files.append(FileSpec(spec["path"], spec.get("member")))
    if not files:
        problems.append(f"{where}: no files")
    for f in files:
        if not f.path.startswith("/") or ".." in PurePosixPath(f.path).parts:
            problems.append(f"{where}: {f.path} must be an absolute path")
    if any(f.member is None for f in files) and len(files) != 1:
        problems.append(f"{where}: a download that is the file itself has exactly one file")
    pins: list[Pin] = []
    for pin_arch, entries in raw.get("pins", {}).items():
        seen: set[str] = set()
        for entry in entries:
            pin = _pin(where, pin_arch, entry, sources, problems)
            if pin is None:
                continue
            if pin.version in seen:
                problems.append(f"{where}: {pin_arch} {pin.version} pinned twice")
            seen.add(pin.version)
            pins.append(pin)
    unpinned = raw.get("unpinned")
    if unpinned is not None:
        if pins or version is None:
            problems.append(f"{where}: an unpinned component has a fixed version and no pins")
    elif not any(p.arch == arch for p in pins):
        problems.append(f"{where}: no {arch} pins")
    elif version is not None and version not in {p.version for p in pins if p.arch == arch}:
        problems.append(f"{where}: version {version} has no {arch} pin")
    activate = raw.get("activate")
    if activate is not None and (
        not str(activate.get("path", "")).startswith("/etc/") or not activate.get("text")
    ):
        problems.append(f"{where}: activate needs a path under /etc/ and a text")
    return Component(
        name, url, tuple(files), tuple(pins), follows, version, raw.get("unit"),
        (activate["path"], activate["text"]) if activate else None, raw.get("absent_means"), unpinned,
    )


def _pin(where: str, arch: str, entry: dict[str, Any], sources: dict[str, Source], problems: list[str]) -> Pin | None:
    version = str(entry.get("version", ""))
    algorithms = [a for a in DIGEST_LENGTHS if a in entry]
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        problems.append(f"{where}: pin version {version!r} must look like 1.2.3")
        return None
    if len(algorithms) != 1:
        problems.append(f"{where} {version}: give exactly one of {', '.join(DIGEST_LENGTHS)}")
        return None
    algorithm = algorithms[0]
    digest = entry[algorithm]
    if not re.fullmatch(rf"[0-9a-f]{{{DIGEST_LENGTHS[algorithm]}}}", digest):
        problems.append(f"{where} {version}: {algorithm} must be {DIGEST_LENGTHS[algorithm]} lowercase hex digits")
        return None
    if entry.get("source") not in sources:
        problems.append(f"{where} {version}: source {entry.get('source')!r} is not in [sources]")
        return None
    return Pin(version, arch, algorithm, digest, entry["source"])


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def summarise(versions: Iterable[str]) -> str:
    """'1.34.0-1.34.7, 1.35.4': runs of consecutive patch releases."""
    runs: list[list[str]] = []
    for version in sorted(set(versions), key=version_key):
        last = runs[-1][-1] if runs else None
        if last and minor_of(last) == minor_of(version) and version_key(version)[-1] == version_key(last)[-1] + 1:
            runs[-1].append(version)
        else:
            runs.append([version])
    return ", ".join(run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def minor_of(version: str) -> str:
    return ".".join(version.split(".")[:2])


def expand(template: str, version: str, arch: str) -> str:
    return template.replace("{version}", version).replace("{arch}", arch)


# --- download and extraction ----------------------------------------------------------------


def parse_digest(expected: str) -> tuple[str, str]:
    """'sha256:<hex>' / 'sha512:<hex>', or a bare 64-digit hex (sha256)."""
    algorithm, _, digest = expected.rpartition(":")
    algorithm = algorithm or "sha256"
    if algorithm not in DIGEST_LENGTHS or not re.fullmatch(rf"[0-9a-f]{{{DIGEST_LENGTHS[algorithm]}}}", digest):
        raise ValueError(f"not a sha256/sha512 digest: {expected!r}")
    return algorithm, digest


def fetch(
    url: str,
    sha256: str,
    dest: Path,
    *,
    timeout: float = SOCKET_TIMEOUT_S,
    deadline: float = DOWNLOAD_TIMEOUT_S,
) -> str:
    """Download `url` to `dest` if and only if its digest is `sha256` ('<hex>' or
    'sha256:<hex>'; 'sha512:<hex>' where the source publishes only that). Returns the
    file's sha256.

    Streams into a temporary file beside `dest` and renames it into place only after the
    digest matched, so `dest` is never partial and never the wrong file. `timeout` bounds
    each socket operation, `deadline` the whole download. Raises Unreachable (connection,
    HTTP status, timeout) or DigestMismatch, each a one-line message naming the URL.
    """
    algorithm, expected = parse_digest(sha256)
    if urllib.parse.urlsplit(url).scheme not in ("https", "http"):
        raise Unreachable(f"cannot download {url}: only http(s) URLs are fetched")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(name)
    try:
        wanted, sha = hashlib.new(algorithm), hashlib.sha256()
        stop = time.monotonic() + deadline
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    while chunk := response.read(CHUNK):
                        if time.monotonic() > stop:
                            raise Unreachable(f"cannot download {url}: not done after {deadline:.0f} s")
                        wanted.update(chunk)
                        sha.update(chunk)
                        out.write(chunk)
            except urllib.error.HTTPError as error:
                raise Unreachable(f"cannot download {url}: HTTP {error.code} {error.reason}") from error
            except urllib.error.URLError as error:
                raise Unreachable(f"cannot download {url}: {error.reason}") from error
            except (OSError, http.client.HTTPException) as error:  # TimeoutError, resets, truncation
                raise Unreachable(f"cannot download {url}: {type(error).__name__}: {error}") from error
        actual = wanted.hexdigest()
        if actual != expected:
            raise DigestMismatch(f"refused {url}: {algorithm} mismatch: expected {expected}, got {actual}")
        os.replace(tmp, dest)
        return sha.hexdigest()
    finally:
        tmp.unlink(missing_ok=True)


def _member_name(name: str) -> str:
    return str(PurePosixPath(name.removeprefix("./")))


def extract_members(tarball: Path, members: dict[str, Path]) -> dict[str, str]:
    """Copy each tarball member (its path in the archive, a leading './' optional) to its
    destination, in one pass over the archive. Returns the sha256 of each member written.
    Raises MemberMissing (nothing is left behind) when one is missing or not a regular file."""
    wanted = {_member_name(m): m for m in members}
    written: dict[str, str] = {}
    try:
        with tarfile.open(tarball, "r|*") as tar:
            for info in tar:
                key = _member_name(info.name)
                if key not in wanted or wanted[key] in written or not info.isfile():
                    continue
                source = tar.extractfile(info)
                assert source is not None  # a regular file
                written[wanted[key]] = _write_stream(source, members[wanted[key]])
                if len(written) == len(wanted):
                    break
    except (tarfile.TarError, OSError, EOFError) as error:
        _remove(members[m] for m in written)
        raise MemberMissing(f"{tarball.name}: not a readable tarball: {error}") from error
    missing = [m for m in members if m not in written]
    if missing:
        _remove(members[m] for m in written)
        raise MemberMissing(f"{tarball.name} holds no regular file {', '.join(missing)}")
    return written


def _write_stream(source: Any, dest: Path) -> str:
    dest.parent.mkdir(parents=True, exist_ok=True)
    sha = hashlib.sha256()
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := source.read(CHUNK):
                sha.update(chunk)
                out.write(chunk)
        os.replace(name, dest)
    finally:
        Path(name).unlink(missing_ok=True)
    return sha.hexdigest()


def _remove(paths: Any) -> None:
    for path in paths:
        Path(path).unlink(missing_ok=True)


# --- into the image -----------------------------------------------------------------------


@dataclass(frozen=True)
class BinaryResult:
    """One component as the manifest records it."""

    name: str
    path: str  # its first file (the binary a unit runs)
    present: bool
    sha256: str | None  # of that file as placed
    origin: str  # "local directory <dir>", the URL, or why it is absent
    version: str | None = None
    url: str | None = None
    pinned: str | None = None  # the pinned digest of the download, "sha256:<hex>"
    pin_source: str | None = None
    unit: str | None = None
    files: dict[str, str] = field(default_factory=dict)  # path -> sha256, every file placed
    activated: str | None = None  # the component's `activate` file, written because it is present

    def manifest_entry(self) -> dict[str, Any]:
        return {
            "name": self.name, "path": self.path, "present": self.present, "sha256": self.sha256,
            "origin": self.origin, "version": self.version, "url": self.url, "pinned": self.pinned,
            "pin_source": self.pin_source, "unit": self.unit,
            "files": [{"path": p, "sha256": s} for p, s in self.files.items()],
            "activated": self.activated,
        }


class Downloads:
    """Verified downloads of one build, each fetched once (several components may share one)."""

    def __init__(self, directory: Path, fetcher: Callable[[str, str, Path], str] = fetch) -> None:
        self.directory = directory
        self.fetcher = fetcher
        self.done: dict[str, Path] = {}

    def get(self, item: Resolved) -> Path:
        if item.url not in self.done:
            dest = self.directory / f"{item.pin.digest[:16]}-{PurePosixPath(item.url).name}"
            self.fetcher(item.url, item.pin.expected, dest)
            self.done[item.url] = dest
        return self.done[item.url]


def place_role(
    root: Path,
    catalog: Catalog,
    role: str,
    kubernetes_version: str,
    *,
    local_dir: Path | None,
    allow_fetch: bool,
    downloads: Downloads,
) -> list[BinaryResult]:
    """Place every component of `role` into the tree at `root`: from `local_dir` (files by
    name, taken as given), else downloaded and verified when `allow_fetch`, else recorded absent
    with the reason. A digest mismatch, or --fetch without a pin, raises; an unreachable
    download is recorded as absent."""
    results = []
    for component in catalog.role(role):
        if component.unpinned:
            # never downloaded: only a file the user gives is placed, recorded as given
            item: Resolved | None = None
            no_pin = f"{component.name} {component.version}: not pinned: {component.unpinned}"
            # its file names may hold {version}/{arch} like a pinned one's (taken by that name)
            component = replace(component, files=tuple(
                FileSpec(expand(f.path, str(component.version), catalog.arch), f.member) for f in component.files
            ))
            result = _place(root, component, None, no_pin, local_dir, False, downloads)
            if result.present:
                result = replace(result, origin=f"{result.origin} (taken as given: no digest is pinned)")
            elif component.absent_means:
                result = replace(result, origin=f"{result.origin}; meanwhile {component.absent_means}")
            version = str(component.version)
            results.append(replace(result, version=version, url=expand(component.url, version, catalog.arch)))
            continue
        try:
            item = catalog.resolve_component(component, kubernetes_version)
            no_pin = ""
        except PinError as error:
            item, no_pin = None, str(error)
        result = _place(root, component, item, no_pin, local_dir, allow_fetch, downloads)
        if result.present and component.activate:
            path, text = component.activate
            target = host_path(root, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            os.chmod(target, 0o644)
            result = replace(result, activated=path)
        elif not result.present and component.absent_means:
            result = replace(result, origin=f"{result.origin}; meanwhile {component.absent_means}")
        results.append(result)
    return results


def _place(
    root: Path,
    component: Component,
    item: Resolved | None,
    no_pin: str,
    local_dir: Path | None,
    allow_fetch: bool,
    downloads: Downloads,
) -> BinaryResult:
    specs = item.files if item else list(component.files)
    first = specs[0].path
    about: dict[str, Any] = {"unit": component.unit}
    if item:
        about |= {"version": item.version, "url": item.url, "pinned": item.pin.expected,
                  "pin_source": item.source.describe()}
    names = [PurePosixPath(s.path).name for s in specs]
    if local_dir is not None and all((local_dir / n).is_file() for n in names):
        files = {s.path: _install(root, s.path, local_dir / n) for s, n in zip(specs, names, strict=True)}
        origin = f"local directory {local_dir}"
        if item and item.pin.algorithm == "sha256" and specs[0].member is None:
            matches = files[first] == item.pin.digest
            origin += " (the pinned file)" if matches else " (not the pinned file: taken as given)"
        elif item:
            origin += " (taken as given: the pin is the release archive's digest, not a file's)"
        return BinaryResult(component.name, first, True, files[first], origin, files=files, **about)
    if allow_fetch and item is None:
        raise PinError(f"--fetch: {no_pin}")
    if allow_fetch and item is not None:
        try:
            download = downloads.get(item)
        except Unreachable as error:
            return BinaryResult(component.name, first, False, None, f"absent: {error}", **about)
        if specs[0].member is None:
            files = {first: _install(root, first, download)}
        else:
            staged = download.parent / f"{download.name}.members"
            members = {s.member: staged / _member_name(s.member) for s in specs if s.member}
            extract_members(download, members)
            files = {s.path: _install(root, s.path, members[s.member]) for s in specs if s.member}
        return BinaryResult(component.name, first, True, files[first], item.url, files=files, **about)
    given = ", ".join(f"`{n}`" for n in names[:3]) + (f" and {len(names) - 3} more files" if len(names) > 3 else "")
    if item is None:
        reason = f"absent: {no_pin}; or pass --binaries DIR holding {given}"
    else:
        reason = (
            f"absent: not downloaded (no --fetch): pass --fetch to download {item.url} and check its "
            f"pinned {item.pin.algorithm} ({item.source.key}), or --binaries DIR holding {given}"
        )
    return BinaryResult(component.name, first, False, None, reason, **about)


def _install(root: Path, path: str, src: Path) -> str:
    """Copy `src` to `path` inside the tree (root-owned, 0755); returns its sha256."""
    target = host_path(root, path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.exists():
        target.unlink()
    shutil.copyfile(src, target)
    os.chmod(target, 0o755)
    os.chown(target, 0, 0)
    return sha256_file(target)
