"""Content-addressed cache for expensive build products (the base root filesystem).

Entries live under ${XDG_CACHE_HOME:-$HOME/.cache}/kilonode/<kind>/<key>.<ext>, where the
key is a sha256 over everything that went into the product. A changed package list,
suite or recipe version gives a new key; stale entries are simply never read again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kilonode.digest import sha256_text


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kilonode"


def key_of(inputs: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of `inputs` (sorted keys, so order never matters)."""
    return sha256_text(json.dumps(inputs, sort_keys=True, separators=(",", ":")))


def entry(kind: str, key: str, ext: str) -> Path:
    path = cache_root() / kind / f"{key}.{ext}"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path

