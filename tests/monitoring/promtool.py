"""promtool, Prometheus' own checker, taken from Debian's `prometheus` package (2.42 on bookworm)
without installing it: installing the package would start a Prometheus server. Only
usr/bin/promtool is unpacked, into the cache, keyed by the package's version.

Tests only read the cache (they never reach the package mirror); `make test-artefacts`
(python -m tests.artefacts) fetches it with fetch=True, once per package version.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
import tempfile
from pathlib import Path

from tests.render.consumers import CACHE

TOOLS = CACHE / "tools"
PACKAGE = "prometheus"
MEMBER = "./usr/bin/promtool"


def _apt(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # apt-get's own timeouts bound the download; 300 s bounds the call.
    return subprocess.run(["apt-get", *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def candidate_version() -> str:
    """The version apt would install, from this machine's package lists ('' when unknown)."""
    policy = subprocess.run(["apt-cache", "policy", PACKAGE], capture_output=True, text=True, check=False)
    version = next((line.split()[-1] for line in policy.stdout.splitlines() if "Candidate:" in line), "")
    return "" if version == "(none)" else version


def cached(version: str) -> Path:
    return TOOLS / f"promtool-{version}"


def promtool_path(fetch: bool = False) -> Path:
    """The promtool binary in the cache, for the candidate version of Debian's `prometheus`.

    Without package lists (no candidate) the newest promtool already in the cache serves.
    Raises RuntimeError naming `make test-artefacts` when there is none and fetch is False.
    """
    version = candidate_version()
    if not version and fetch:
        _apt("update", "-qq")
        version = candidate_version()
    if not version:
        present = sorted(TOOLS.glob("promtool-*"))
        if present:
            return present[-1]
        raise RuntimeError(f"no promtool under {TOOLS} and no candidate version of Debian's {PACKAGE}: "
                           "run `make test-artefacts` (python -m tests.artefacts)")
    target = cached(version)
    if target.is_file() and os.access(target, os.X_OK):
        return target
    if not fetch:
        raise RuntimeError(f"promtool from Debian's {PACKAGE} {version} is not unpacked under {TOOLS}: "
                           "run `make test-artefacts` (python -m tests.artefacts)")
    with tempfile.TemporaryDirectory() as work:
        result = _apt("download", f"{PACKAGE}={version}", cwd=Path(work))
        if result.returncode != 0:
            raise RuntimeError(f"apt-get download {PACKAGE}={version} failed: {result.stderr}")
        [deb] = Path(work).glob(f"{PACKAGE}_*.deb")
        tar = Path(work) / "data.tar"
        with tar.open("wb") as out:
            subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=out, check=True, timeout=300)
        with tarfile.open(tar) as archive:
            member = archive.getmember(MEMBER)
            source = archive.extractfile(member)
            if source is None:
                raise RuntimeError(f"{deb.name}: {MEMBER} is not a regular file")
            TOOLS.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".partial")
            partial.write_bytes(source.read())
        partial.chmod(0o755)
        partial.replace(target)  # whole or absent: a cut-off run leaves no half binary
    return target


def promtool_version(path: Path) -> str:
    result = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60, check=True)
    return (result.stdout or result.stderr).splitlines()[0]
