"""Pinned upstream binaries (node-image/binaries.toml, which stays beside the recipe it
serves and ships with it): which machines need which, where each comes from, and per
(version, arch) the digest of its download with the source it was copied from.

The data model and its loader; kilonode.image.binaries downloads, verifies and places them.
The file's checks are by hand, each problem named with its entry (tests pin the messages).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from kilonode.paths import NODE_IMAGE_DIR, node_image_lock
from kilonode.problems import BuildError

BINARIES_FILE = NODE_IMAGE_DIR / "binaries.toml"
DATA_NAME = "node-image/binaries.toml"  # how messages name the file
# The lock beside it: the sha256 the first --fetch recorded of each `lock = true` download.
LOCK_NAME = "binaries.lock.toml"
FORMAT = 1
DIGEST_LENGTHS = {"sha256": 64, "sha512": 128}
Follows = Literal["kubernetes", "kubernetes-minor"]



class PinError(BuildError):
    """The data is malformed, or holds no pin for what was asked."""


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
    # --binaries, unless `lock`; None for every pinned component
    unpinned: str | None = None
    # An unpinned download trusted on first use: --fetch downloads it and records its sha256
    # in the lock file, later builds verify against that entry (LockEntry)
    lock: bool = False
    cni_versions: tuple[str, ...] = ()  # the CNI spec versions a CNI plugin component accepts
    # the oldest Docker Engine API each version talks to (cri-dockerd), version -> "1.26"
    docker_api: dict[str, str] = field(default_factory=dict)

    @property
    def required(self) -> bool:
        """A machine of its role cannot do its job without it (no `absent_means`)."""
        return self.absent_means is None

    def expanded_files(self, arch: str) -> tuple[FileSpec, ...]:
        """Its files at its fixed version (an unpinned component's, which no pin resolves)."""
        return tuple(FileSpec(expand(f.path, str(self.version), arch),
                              None if f.member is None else expand(f.member, str(self.version), arch))
                     for f in self.files)

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
class DebianPath:
    """A program a Debian package of the recipe puts at `path` (binaries.toml [debian])."""

    path: str
    packages: tuple[str, ...]  # any of these in the image's package lists brings it
    source: str
    units: tuple[str, ...] = ()  # the package's own systemd units
    essential: bool = False  # Essential: yes, in every Debian root filesystem
    docker_api: str | None = None  # dockerd: the newest Engine API it serves


@dataclass(frozen=True)
class LockEntry:
    """What the first --fetch of a `lock = true` component downloaded (binaries.lock.toml)."""

    component: str
    version: str
    arch: str
    url: str
    sha256: str
    recorded: str  # when, UTC ISO 8601

    def key(self) -> tuple[str, str, str]:
        return (self.component, self.version, self.arch)


@dataclass(frozen=True)
class Catalog:
    arch: str
    sources: dict[str, Source]
    roles: dict[str, tuple[str, ...]]
    components: dict[str, Component]
    debian: dict[str, DebianPath] = field(default_factory=dict)
    # binaries.lock.toml's entries by (component, version, arch)
    locked: dict[tuple[str, str, str], LockEntry] = field(default_factory=dict)
    lock_file: Path | None = None

    def lock_entry(self, component: Component) -> LockEntry | None:
        return self.locked.get((component.name, str(component.version), self.arch))

    def docker_api_problem(self, kubernetes_version: str, packages: Iterable[str]) -> str | None:
        """Why the image's cri-dockerd cannot talk to its Docker (None: it can, or no
        cri-dockerd): the cri-dockerd release's minimum Engine API against the one the
        Debian docker.io package serves."""
        cri = self.components.get("cri-dockerd")
        dockerd = next((d for d in self.debian.values() if d.docker_api), None)
        if cri is None or dockerd is None or not set(dockerd.packages) & set(packages):
            return None
        version = cri.pin_for(kubernetes_version, self.arch).version if cri.pins else str(cri.version)
        needed = cri.docker_api.get(version)
        if needed is None:
            return (f"cri-dockerd {version}: {DATA_NAME} records no minimum Docker API for it "
                    "([components.cri-dockerd.docker_api]); add it from that release's libdocker/client.go")
        if version_key(needed) > version_key(dockerd.docker_api or "0"):
            return (f"cri-dockerd {version} needs Docker Engine API {needed} or later, and the image's Docker "
                    f"({', '.join(dockerd.packages)}) serves {dockerd.docker_api}: cri-dockerd refuses to start "
                    "(\"docker API version is older than ...\"), the kubelet has no runtime and the node never "
                    f"registers; pin a cri-dockerd whose minimum is at most {dockerd.docker_api} in {DATA_NAME}")
        return None

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


def pool_roles(runtime: str, nccl_topology: str | None) -> list[str]:
    """Every binaries.toml role a pool's image takes: its runtime's, and its size's NCCL
    topology (`nccl-<family>`) where the plan names one. A GPU pool's container toolkit is no
    component: it comes from NVIDIA's apt repository (recipe.toml [apt_repositories.*])."""
    roles = [pool_role(runtime)]
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
    debian = {p: d for p, raw in data.get("debian", {}).items() if (d := _debian(p, raw, problems))}
    if problems:
        raise PinError(f"{path}: " + "; ".join(problems))
    # the packaged recipe's lock is the user's project's own file where kilonode runs in one
    lock_file = node_image_lock(LOCK_NAME, path.parent)
    return Catalog(arch, sources, roles, components, debian, load_lock(lock_file), lock_file)


def _debian(path: str, raw: dict[str, Any], problems: list[str]) -> DebianPath | None:
    if not path.startswith("/") or not raw.get("packages") or not raw.get("source"):
        problems.append(f"debian {path}: an absolute path with packages and a source")
        return None
    return DebianPath(path, tuple(raw["packages"]), raw["source"], tuple(raw.get("units", ())),
                      bool(raw.get("essential", False)), raw.get("docker_api"))


def load_lock(path: Path) -> dict[tuple[str, str, str], LockEntry]:
    """binaries.lock.toml's entries (none when the file does not exist yet). Raises PinError."""
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise PinError(f"{path}: {error}") from error
    entries: dict[tuple[str, str, str], LockEntry] = {}
    for index, raw in enumerate(data.get("lock", [])):
        try:
            entry = LockEntry(raw["component"], raw["version"], raw["arch"], raw["url"], raw["sha256"], raw["recorded"])
        except (KeyError, TypeError):
            raise PinError(f"{path}: lock[{index}] needs component, version, arch, url, sha256 and recorded") from None
        if not re.fullmatch(r"[0-9a-f]{64}", entry.sha256):
            raise PinError(f"{path}: lock[{index}] ({entry.component}): sha256 must be 64 lowercase hex digits")
        entries[entry.key()] = entry
    return entries


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
    if raw.get("lock") and unpinned is None:
        problems.append(f"{where}: lock = true is for an unpinned component (no published digest)")
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
        bool(raw.get("lock", False)), tuple(raw.get("cni_versions", ())), dict(raw.get("docker_api", {})),
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
