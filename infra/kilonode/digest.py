"""sha256 in one place: of text, of bytes, of a file (hex digests, as the manifests, the
render marker and the image cache keys record them). Standard library only."""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 1 << 20  # a file is read in pieces: disk images and archives can be gigabytes


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    """Of the text's UTF-8 encoding."""
    return sha256_bytes(text.encode())


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()
