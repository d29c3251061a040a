"""A side's snapshot kept by the content of what it was taken from, so a review whose base has
been seen before (the same main under every pull request, a branch reviewed again) skips that
side's checkout and its child process: about five CPU-seconds for research-7500.

The key covers everything the child's output depends on: the files rendering reads (each as
mode, git blob id and path: the same listing for a commit and for a working tree holding the
same content), the stacks asked for, the snapshot script that runs (the reviewing checkout's,
on both sides: its FORMAT and its bytes), and the interpreter and the installed distributions
that run it.

Entries live in ${XDG_CACHE_HOME:-~/.cache}/kilonode/diff/<key>.json: a header line (the key
and the body's sha256) and the child's output as it wrote it. An entry that does not match
its header (cut short, edited, another format) is a miss, and is removed. The newest
KEPT entries stay, the rest are deleted after each write.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kilonode.digest import sha256_bytes
from kilonode.image.cache import cache_root, key_of
from kilonode.review import snapshot as snapshot_module

KIND = "diff"
# research-7500 alone is about 2 MB; every shipped stack at once about 6 MB.
KEPT = 24
# A writer that died leaves its temporary file: removed once this old.
STALE_TEMPORARY_S = 3600
MAGIC = b"kilonode-diff-snapshot"


def directory() -> Path:
    return cache_root() / KIND


def _distributions() -> list[str]:
    """The installed distributions the child can import, as their metadata folders name them
    (name and version): a new pulumi or pulumi-azure-native can change the recorded graph.
    Listing folders costs under a millisecond; importlib.metadata takes ~0.2 s."""
    found: set[str] = set()
    for entry in sys.path:
        with contextlib.suppress(OSError):
            found |= {n for n in os.listdir(entry or ".") if n.endswith((".dist-info", ".egg-info"))}
    return sorted(found)


def key(inputs: Sequence[str], stacks: Sequence[str]) -> str:
    """The key of a side's snapshot of `stacks`, rendered from the files `inputs` lists
    ("<mode> <blob id> <path>" lines)."""
    script = Path(snapshot_module.__file__)
    return key_of({
        "format": snapshot_module.FORMAT,
        "script": sha256_bytes(script.read_bytes()),
        "python": sys.version, "executable": sys.executable,
        # the child runs with the side's infra/ first, then this process's PYTHONPATH
        "pythonpath": os.environ.get("PYTHONPATH", ""),
        "distributions": _distributions(),
        "stacks": sorted(stacks),
        "inputs": sorted(inputs, key=lambda line: line.split(" ", 2)[-1]),
    })


def _path(entry_key: str) -> Path:
    return directory() / f"{entry_key}.json"


def load(entry_key: str) -> dict[str, Any] | None:
    """The snapshot stored under `entry_key`, or None (absent, or not whole: then removed). A
    hit is marked as just used, so pruning keeps it."""
    path = _path(entry_key)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    header, _, body = data.partition(b"\n")
    snapshot = _parsed(body) if header == _header(entry_key, body) else None
    if snapshot is None:
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    with contextlib.suppress(OSError):
        os.utime(path)
    return snapshot


def _header(entry_key: str, body: bytes) -> bytes:
    return b" ".join([MAGIC, entry_key.encode(), sha256_bytes(body).encode()])


def _parsed(body: bytes) -> dict[str, Any] | None:
    try:
        snapshot = json.loads(body)
    except ValueError:
        return None
    return snapshot if isinstance(snapshot, dict) and snapshot.get("format") == snapshot_module.FORMAT else None


def store(entry_key: str, body: bytes) -> None:
    """Keep `body` under `entry_key`: written beside its place and renamed, so a reader sees
    the whole entry or none. The cache only saves time: a failure to write is no error."""
    path = _path(entry_key)
    partial = path.with_name(f".{entry_key}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(_header(entry_key, body) + b"\n" + body)
        partial.replace(path)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink()
        return
    prune()


def prune(kept: int = KEPT) -> None:
    """Delete all but the `kept` most recently used entries, and temporary files left by
    writers that died."""
    try:
        listed = list(directory().iterdir())
    except OSError:
        return
    entries: list[tuple[float, Path]] = []
    now = time.time()
    for path in listed:
        with contextlib.suppress(OSError):
            modified = path.stat().st_mtime
            if path.name.endswith(".json"):
                entries.append((modified, path))
            elif path.name.endswith(".tmp") and now - modified > STALE_TEMPORARY_S:
                path.unlink()
    for _, path in sorted(entries, reverse=True)[kept:]:
        with contextlib.suppress(OSError):
            path.unlink()

