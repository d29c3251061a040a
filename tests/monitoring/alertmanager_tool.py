"""amtool, Alertmanager's own checker, taken from Debian's `prometheus-alertmanager` package (0.25 on
bookworm) without installing it: installing the package would start an Alertmanager as a system
service. Only usr/bin/amtool is unpacked, into the cache beside promtool, keyed by the package's
version, as tests.monitoring.promtool does for Debian's `prometheus`.

Tests only read the cache (they never reach the package mirror); `make test-artefacts`
(python -m tests.artefacts) fetches it with fetch=True, once per package version.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.monitoring.promtool import tool_path

PACKAGE = "prometheus-alertmanager"
TOOL = "amtool"


def amtool_path(fetch: bool = False) -> Path:
    """amtool in the cache, for the candidate version of Debian's `prometheus-alertmanager`
    (tests.monitoring.promtool's fetcher, for this package and its one tool)."""
    return tool_path(TOOL, fetch, package=PACKAGE, tools_in_package=(TOOL,))


def amtool_version(path: Path) -> str:
    """The first line of `amtool --version`."""
    result = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60, check=True)
    return (result.stdout or result.stderr).splitlines()[0]
