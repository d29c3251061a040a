"""amtool, Alertmanager's own checker, taken from Debian's `prometheus-alertmanager` package (0.25 on
bookworm) without installing it: installing the package would start an Alertmanager as a system
service. Only usr/bin/amtool is unpacked, into the cache beside promtool, keyed by the package's
version, as tests.monitoring.promtool does for Debian's `prometheus`.

Tests only read the cache (they never reach the package mirror); `make test-artefacts`
(python -m tests.artefacts) fetches it with fetch=True, once per package version.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from tests.monitoring.promtool import TOOLS, _apt

PACKAGE = "prometheus-alertmanager"
TOOL = "amtool"


def candidate_version() -> str:
    """The version apt would install, from this machine's package lists ('' when unknown)."""
    policy = subprocess.run(["apt-cache", "policy", PACKAGE], capture_output=True, text=True, check=False)
    version = next((line.split()[-1] for line in policy.stdout.splitlines() if "Candidate:" in line), "")
    return "" if version == "(none)" else version


def cached(version: str) -> Path:
    return TOOLS / f"{TOOL}-{version}"


def amtool_path(fetch: bool = False) -> Path:
    """amtool in the cache, for the candidate version of Debian's `prometheus-alertmanager`.

    Without package lists (no candidate) the newest one already in the cache serves.
    Raises RuntimeError naming `make test-artefacts` when there is none and fetch is False.
    """
    version = candidate_version()
    if not version and fetch:
        _apt("update", "-qq")
        version = candidate_version()
    if not version:
        present = sorted(TOOLS.glob(f"{TOOL}-*"))
        if present:
            return present[-1]
        raise RuntimeError(f"no {TOOL} under {TOOLS} and no candidate version of Debian's {PACKAGE}: "
                           "run `make test-artefacts` (python -m tests.artefacts)")
    target = cached(version)
    if target.is_file() and os.access(target, os.X_OK):
        return target
    if not fetch:
        raise RuntimeError(f"{TOOL} from Debian's {PACKAGE} {version} is not unpacked under {TOOLS}: "
                           "run `make test-artefacts` (python -m tests.artefacts)")
    _unpack(version)
    return target


def _unpack(version: str) -> None:
    """Download the package once and unpack usr/bin/amtool into the cache."""
    with tempfile.TemporaryDirectory() as work:
        result = _apt("download", f"{PACKAGE}={version}", cwd=Path(work))
        if result.returncode != 0:
            raise RuntimeError(f"apt-get download {PACKAGE}={version} failed: {result.stderr}")
        [deb] = Path(work).glob(f"{PACKAGE}_*.deb")
        tar = Path(work) / "data.tar"
        with tar.open("wb") as out:
            subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=out, check=True, timeout=300)
        TOOLS.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tar) as archive:
            member = f"./usr/bin/{TOOL}"
            source = archive.extractfile(archive.getmember(member))
            if source is None:
                raise RuntimeError(f"{deb.name}: {member} is not a regular file")
            target = cached(version)
            partial = target.with_name(target.name + ".partial")
            with partial.open("wb") as out:
                shutil.copyfileobj(source, out)
            partial.chmod(0o755)
            partial.replace(target)  # whole or absent: a cut-off run leaves no half binary


def amtool_version(path: Path) -> str:
    """The first line of `amtool --version`."""
    result = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60, check=True)
    return (result.stdout or result.stderr).splitlines()[0]
