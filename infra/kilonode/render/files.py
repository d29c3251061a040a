"""What a renderer returns: files keyed by the path where they land on the host."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RenderedFile:
    content: str
    mode: int = 0o644


# Path (relative to the host's /) -> file. The one key that is not a host path is
# USER_DATA: the role's cloud-init user-data, which Azure receives as custom data (and a
# NoCloud seed receives locally).
HostFiles = dict[str, RenderedFile]
USER_DATA = "user-data"
