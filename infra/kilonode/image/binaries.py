"""Pinned upstream binaries (node-image/binaries.toml, modelled and loaded by
kilonode.catalog.binaries): the download that verifies a digest or refuses it.

The data names, per component, a release URL and per (version, arch) the digest of that
download with the source it was copied from. This module downloads a role's components
(`fetch`: streamed to a temporary file, verified, renamed into place only when the digest
matches), takes members out of release tarballs, and places the files into an image tree
(`place_role`), recording for the manifest what came from where, or why a binary is absent.
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
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from kilonode.catalog.binaries import (
    DIGEST_LENGTHS,
    LOCK_NAME,
    Catalog,
    Component,
    FileSpec,
    LockEntry,
    Pin,
    PinError,
    Resolved,
    expand,
    load_lock,
)
from kilonode.digest import sha256_file
from kilonode.image.cache import cache_root
from kilonode.image.lockfile import write_lock
from kilonode.image.rootfs import BuildError, host_path

# Seconds one socket operation (connect, a read) may take, and the whole download.
SOCKET_TIMEOUT_S = 30.0
DOWNLOAD_TIMEOUT_S = 1800.0
CHUNK = 1 << 20


class FetchError(BuildError):
    """A download could not be had or was refused."""


class Unreachable(FetchError):
    """The URL could not be downloaded (connection, HTTP status, timeout)."""


class DigestMismatch(FetchError):
    """The download's digest differs from the pin: refused, nothing kept."""


class MemberMissing(FetchError):
    """A verified tarball lacks a file the data says it holds."""


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
    sha256: str | None,
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
    `sha256` None: nothing to verify against yet (the first fetch of a locked component,
    which records the returned digest).
    """
    algorithm, expected = parse_digest(sha256) if sha256 else ("sha256", None)
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
        if expected is not None and actual != expected:
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


def download_cache() -> Path:
    """Where `kilonode image build --fetch` keeps its verified pinned downloads between builds
    (${XDG_CACHE_HOME:-~/.cache}/kilonode/downloads), and where other commands look for one
    (`kilonode gpu nccl-job`'s NCCL topology file)."""
    return cache_root() / "downloads"


def download_name(item: Resolved) -> str:
    """A pinned download's file name in the cache: its pinned digest names it, so a changed pin
    never reads an old file."""
    return f"{item.pin.digest[:16]}-{PurePosixPath(item.url).name}"


def matches_pin(path: Path, pin: Pin) -> bool:
    """The file exists and its digest is the pin's."""
    if not path.is_file():
        return False
    digest = hashlib.new(pin.algorithm)
    with path.open("rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest() == pin.digest


class Downloads:
    """Verified downloads of one build, each fetched once (several components may share one);
    a pinned one already in `directory` with the pinned digest is reused, not fetched again."""

    def __init__(self, directory: Path, fetcher: Callable[[str, str | None, Path], str] = fetch) -> None:
        self.directory = directory
        self.fetcher = fetcher
        self.done: dict[str, Path] = {}

    def get(self, item: Resolved) -> Path:
        if item.url not in self.done:
            dest = self.directory / download_name(item)
            if not matches_pin(dest, item.pin):
                self.fetcher(item.url, item.pin.expected, dest)
            self.done[item.url] = dest
        return self.done[item.url]

    def get_locked(self, catalog: Catalog, component: Component) -> tuple[Path, str]:
        """A `lock = true` component's download, verified against its lock entry, or (first
        fetch) recorded in the lock file. Returns the file and its origin. Raises
        DigestMismatch naming both digests."""
        version = str(component.version)
        url = expand(component.url, version, catalog.arch)
        dest = self.directory / f"locked-{PurePosixPath(url).name}"
        entry = catalog.lock_entry(component)
        lock_file = catalog.lock_file or Path(LOCK_NAME)
        if entry is not None and entry.url != url:
            raise DigestMismatch(f"refused {component.name} {version}: {lock_file} locked it from {entry.url}, "
                                 f"and {url} is what node-image/binaries.toml names now; review the change and "
                                 "delete the entry to lock the new URL at the next --fetch")
        try:
            got = self.fetcher(url, entry.sha256 if entry else None, dest)
        except DigestMismatch as error:
            raise DigestMismatch(f"{error} (the sha256 {lock_file} recorded at {entry.recorded if entry else '?'}; "
                                 "the download changed since it was locked: review it before deleting the "
                                 "entry)") from error
        self.done[url] = dest
        if entry is not None:
            return dest, f"{url} (sha256 {got} as locked in {lock_file.name})"
        record_lock(lock_file, LockEntry(component.name, version, catalog.arch, url, got,
                                         datetime.now(UTC).isoformat(timespec="seconds")))
        return dest, f"{url} (first fetch: sha256 {got} recorded in {lock_file}; commit it and review it)"


def record_lock(path: Path, entry: LockEntry) -> None:
    """Add `entry` to the lock file (or replace the one of its component, version and arch):
    sorted, written to a temporary file beside it and renamed into place, so the file is
    never half written."""
    entries = load_lock(path) | {entry.key(): entry}
    header = ""
    if path.is_file():  # keep the file's own comment block
        header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    write_lock(path, header, 1, (
        {"component": e.component, "version": e.version, "arch": e.arch, "url": e.url, "sha256": e.sha256,
         "recorded": e.recorded} for _, e in sorted(entries.items())))


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
        if component.lock and allow_fetch and not _all_given(component, catalog, local_dir):
            results.append(_place_locked(root, catalog, component, downloads))
            continue
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


def _all_given(component: Component, catalog: Catalog, local_dir: Path | None) -> bool:
    return local_dir is not None and all(
        (local_dir / PurePosixPath(f.path).name).is_file() for f in component.expanded_files(catalog.arch))


def _place_locked(root: Path, catalog: Catalog, component: Component, downloads: Downloads) -> BinaryResult:
    """A `lock = true` component under --fetch: downloaded, verified against (or recorded in)
    the lock file, its files installed."""
    specs = component.expanded_files(catalog.arch)
    version = str(component.version)
    about: dict[str, Any] = {"unit": component.unit, "version": version,
                             "url": expand(component.url, version, catalog.arch)}
    try:
        download, origin = downloads.get_locked(catalog, component)
    except Unreachable as error:
        return BinaryResult(component.name, specs[0].path, False, None, f"absent: {error}", **about)
    files = _install_download(root, list(specs), download)
    return BinaryResult(component.name, specs[0].path, True, files[specs[0].path], origin, files=files,
                        pinned=f"sha256:{sha256_file(download)}", pin_source=f"lock {LOCK_NAME}", **about)


def _install_download(root: Path, specs: list[FileSpec], download: Path) -> dict[str, str]:
    """The download itself, or its tarball's members, at their paths in the tree."""
    if specs[0].member is None:
        return {specs[0].path: _install(root, specs[0].path, download)}
    staged = download.parent / f"{download.name}.members"
    members = {s.member: staged / _member_name(s.member) for s in specs if s.member}
    extract_members(download, members)
    return {s.path: _install(root, s.path, members[s.member]) for s in specs if s.member}


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
        files = _install_download(root, specs, download)
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
