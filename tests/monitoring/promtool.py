"""promtool, Prometheus' own checker, and the Prometheus server itself, taken from Debian's
`prometheus` package (2.42 on bookworm) without installing it: installing the package would start
a Prometheus server as a system service. Only usr/bin/promtool and usr/bin/prometheus are unpacked,
into the cache, keyed by the package's version; a test that runs the server starts it itself, on
127.0.0.1, and stops it by its PID (tests/monitoring/test_live_etcd_quota.py).

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

from tests.render.consumers import CACHE

TOOLS = CACHE / "tools"
PACKAGE = "prometheus"
TOOLS_IN_PACKAGE = ("promtool", "prometheus")


def _apt(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # apt-get's own timeouts bound the download; 300 s bounds the call.
    return subprocess.run(["apt-get", *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def candidate_version(package: str = PACKAGE) -> str:
    """The version apt would install, from this machine's package lists ('' when unknown)."""
    policy = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True, check=False)
    version = next((line.split()[-1] for line in policy.stdout.splitlines() if "Candidate:" in line), "")
    return "" if version == "(none)" else version


def cached(version: str, tool: str = "promtool") -> Path:
    return TOOLS / f"{tool}-{version}"


def tool_path(tool: str, fetch: bool = False, package: str = PACKAGE,
              tools_in_package: tuple[str, ...] = TOOLS_IN_PACKAGE) -> Path:
    """`tool` (one of `tools_in_package`: promtool or prometheus of Debian's `prometheus` by default) in the
    cache, for the candidate version of Debian's `package`.

    Without package lists (no candidate) the newest one already in the cache serves.
    Raises RuntimeError naming `make test-artefacts` when there is none and fetch is False.
    """
    if tool not in tools_in_package:
        raise ValueError(f"{tool}: not one of {tools_in_package}")
    version = candidate_version(package)
    if not version and fetch:
        _apt("update", "-qq")
        version = candidate_version(package)
    if not version:
        present = sorted(TOOLS.glob(f"{tool}-*"))
        if present:
            return present[-1]
        raise RuntimeError(f"no {tool} under {TOOLS} and no candidate version of Debian's {package}: "
                           "run `make test-artefacts` (python -m tests.artefacts)")
    target = cached(version, tool)
    if target.is_file() and os.access(target, os.X_OK):
        return target
    if not fetch:
        raise RuntimeError(f"{tool} from Debian's {package} {version} is not unpacked under {TOOLS}: "
                           "run `make test-artefacts` (python -m tests.artefacts)")
    _unpack(package, version, tools_in_package)
    return target


def _unpack(package: str, version: str, tools: tuple[str, ...]) -> None:
    """Download the package once and unpack each of `tools` (usr/bin/<tool>) into the cache."""
    with tempfile.TemporaryDirectory() as work:
        result = _apt("download", f"{package}={version}", cwd=Path(work))
        if result.returncode != 0:
            raise RuntimeError(f"apt-get download {package}={version} failed: {result.stderr}")
        [deb] = Path(work).glob(f"{package}_*.deb")
        tar = Path(work) / "data.tar"
        with tar.open("wb") as out:
            subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=out, check=True, timeout=300)
        TOOLS.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tar) as archive:
            for tool in tools:
                member = f"./usr/bin/{tool}"
                source = archive.extractfile(archive.getmember(member))
                if source is None:
                    raise RuntimeError(f"{deb.name}: {member} is not a regular file")
                target = cached(version, tool)
                partial = target.with_name(target.name + ".partial")
                with partial.open("wb") as out:
                    shutil.copyfileobj(source, out)
                partial.chmod(0o755)
                partial.replace(target)  # whole or absent: a cut-off run leaves no half binary


def promtool_path(fetch: bool = False) -> Path:
    return tool_path("promtool", fetch)


def prometheus_path(fetch: bool = False) -> Path:
    return tool_path("prometheus", fetch)


def promtool_version(path: Path) -> str:
    """The first line of `--version` (promtool and prometheus print alike)."""
    result = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60, check=True)
    return (result.stdout or result.stderr).splitlines()[0]
