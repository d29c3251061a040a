"""Lock files (node-image/binaries.lock.toml, node-image/apt.lock.toml): TOML written whole or
not at all, by one writer for both."""

from __future__ import annotations

import os
import tempfile
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

import tomli_w


def write_toml_atomically(path: Path, text: str) -> None:
    """A lock file's new text: parsed back first (what it writes, it can read), written to a
    temporary file beside it and renamed into place, so the file is never half written."""
    tomllib.loads(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(name, 0o644)
        os.replace(name, path)
    finally:
        Path(name).unlink(missing_ok=True)


def write_lock(path: Path, header: str, version: int, entries: Iterable[Mapping[str, str]]) -> None:
    """A lock file: `header` (comment lines), `format = version`, then one [[lock]] table per
    entry, in the order given, serialised by tomli_w (every string escaped as TOML wants)."""
    write_toml_atomically(path, header + tomli_w.dumps({"format": version, "lock": [dict(e) for e in entries]}))
