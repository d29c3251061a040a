"""The build host's Debian mirror: read from its apt configuration, never written down.

The recipe passes the host's own deb822 sources file to mmdebstrap, so which mirror the
image is built from is a property of the machine, not of the repository. Mirror host names
must not leak into the image, the build's output or its logs: `scrub` replaces them.
"""

from __future__ import annotations

import re
from pathlib import Path

HOST_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
_URL_HOST = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://([^/\s:]+)")


def sources_file() -> Path:
    """The host's deb822 sources file that mmdebstrap builds from."""
    if not HOST_SOURCES.is_file():
        raise FileNotFoundError(
            f"{HOST_SOURCES} not found: the image is built from this machine's Debian mirror "
            "(a deb822 sources file); configure apt first"
        )
    return HOST_SOURCES


def mirror_hosts(path: Path = HOST_SOURCES) -> list[str]:
    """Every host name in the sources file, comments included (they name hosts too)."""
    if not path.is_file():
        return []
    hosts = {m.group(1).lower() for m in _URL_HOST.finditer(path.read_text(errors="replace"))}
    return sorted(hosts)


def scrub(text: str, hosts: list[str] | None = None) -> str:
    """Replace every mirror host name in `text` with <mirror>, for logs and errors."""
    for host in hosts if hosts is not None else mirror_hosts():
        text = re.sub(re.escape(host), "<mirror>", text, flags=re.IGNORECASE)
    return text
