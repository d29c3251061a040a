"""Record planned subnets in the stack file (`kilonode allocate`), keeping its comments and layout.

A recorded subnet is an input from then on, so no change to another pool or role can move
it (kilonode.plan.resolve.network). The file is rewritten atomically (a sibling temp file, then a
rename): an interrupted write leaves the old file whole.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ruamel.yaml.comments import CommentedMap

from kilonode.problems import Loc
from kilonode.yamlio import roundtrip_dump, roundtrip_yaml

RECORDED = "recorded by `kilonode allocate`; moving it recreates what sits in it"
RECORDED_SHARD = "recorded by `kilonode allocate`; moving it re-registers the team's nodes"
# a recorded value goes right after these keys, where a reader looks for the size
AFTER = ("maxNodes", "nodes", "name")


def record_values(file: Path, cluster_key: str, entries: Sequence[tuple[Loc, str | int, str]]) -> None:
    """Set each `loc` (under config.<cluster_key>) to its value, with its comment saying why;
    one atomic write, comments and layout kept."""
    document_yaml = roundtrip_yaml()
    document = document_yaml.load(file.read_text(encoding="utf-8"))
    cluster = document["config"][cluster_key]
    for loc, value, comment in entries:
        node = cluster
        for part in loc[:-1]:
            if isinstance(part, str) and part not in node:
                node[part] = CommentedMap()  # e.g. no `network:` map yet
            node = node[part]
        key = str(loc[-1])
        if key not in node:
            anchor = next((k for k in AFTER if k in node), None)
            position = list(node).index(anchor) + 1 if anchor else len(node)
            node.insert(position, key, value, comment=comment)
        else:
            node[key] = value
    _replace(file, roundtrip_dump(document_yaml, document))


def _replace(file: Path, text: str) -> None:
    mode = file.stat().st_mode & 0o777
    fd, tmp = tempfile.mkstemp(prefix=f".{file.name}.", dir=file.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, file)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
